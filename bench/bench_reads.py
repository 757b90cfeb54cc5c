"""Reads at scale: the filtered trajectory list and a 200-step trajectory, with 1,000,000 spans stored.

    python -m bench.bench_reads [--requests 200] [--reload] [--quick]

Data (database `keel_bench_reads` on the benchmarks' own embedded PostgreSQL, var/bench/pg; loaded
once and reused while its figures match, `--reload` loads it again):
- 100,000 trajectories of 10 spans (1,000,000 spans) and 20 trajectories of 200 steps (401 spans:
  an agent root, 200 chat calls carrying the whole conversation so far as gen_ai input messages, and
  200 tool calls), all written by Keel's own `tracing.services.spans_write` (the worker's path: span
  rows by COPY, trajectories assembled from their spans), 5,000 spans per transaction, from two
  processes at once.
- The 10-span trajectories are the ingest benchmark's (bench/workload.py), decoded and mapped once by
  `tracing.otlp` and then cloned with new trace ids, start times spread evenly over 30 days, one of
  five agents, output token counts (and so cost) drawn per trajectory, and 5 % with a failed tool call
  (status `error`).
- Then `VACUUM ANALYZE` of the two tables, as autovacuum would leave them.

Measured: server time, i.e. the Django test client in this process against the real URLconf,
middleware, API-key auth and JSON rendering (no HTTP or gunicorn in front), DEBUG off; each request a
new random agent and 7-day window. Wall time (the figure the targets are about), and the Python CPU
time of the request (time.process_time), which other processes on a busy machine do not inflate:
wall ≫ CPU + DB time means the request waited for a core. `EXPLAIN (ANALYZE, BUFFERS)` of the list's
main query and of the detail's span query is printed with the figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench import stack
from bench.harness import BASE_DIR, VAR_DIR, Report, Stopwatch, load_average, percentile
from bench.workload import templates_build


@dataclasses.dataclass(frozen=True)
class Size:
    database: str
    trajectories: int
    long_trajectories: int


FULL = Size("keel_bench_reads", 100_000, 20)
# --quick: the same shapes, 50× fewer, in a database of its own (a smoke test, not a figure).
QUICK = Size("keel_bench_reads_quick", 2_000, 2)
LONG_STEPS = 200
AGENTS = ("support", "billing", "returns", "sales", "onboarding")
DAYS = 30
ERROR_SHARE = 0.05
SPANS_PER_TRANSACTION = 5_000
LOAD_PROCESSES = 2
# The read key's rate limit (per second and burst) during the run: the rounds must never be refused.
READ_LIMIT = 1_000_000
LIST_TARGET_MS = 100.0
DETAIL_TARGET_MS = 150.0
# Time zero of the data set: trajectories start between EPOCH - 30 days and EPOCH.
EPOCH = datetime(2026, 11, 1, tzinfo=UTC)


# --- Data --------------------------------------------------------------------------------------------


def _long_trajectory_body(number: int) -> bytes:
    """An OTLP request with one agent run of LONG_STEPS chat calls and as many tool calls."""
    import json

    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind

    from bench.bench_otlp_parse import Pseudo, sentence, text

    rng = Pseudo(7_000 + number)
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "support-agent"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("bench.agent", "1.0.0")
    history: list[dict[str, Any]] = [text("user", sentence(rng, 200))]
    system = json.dumps([{"type": "text", "content": "You are a research agent. " + sentence(rng, 300)}])
    with tracer.start_as_current_span("invoke_agent research") as root:
        root.set_attributes(
            {
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": "research",
                "gen_ai.conversation.id": f"long-{number}",
                "gen_ai.input.messages": json.dumps(history),
            }
        )
        for step in range(LONG_STEPS):
            arguments = {"query": sentence(rng, 40), "page": step}
            output = [
                {
                    "role": "assistant",
                    "parts": [
                        {"type": "text", "content": sentence(rng, 60)},
                        {"type": "tool_call", "id": f"call_{step}", "name": "search", "arguments": arguments},
                    ],
                }
            ]
            with tracer.start_as_current_span("chat gpt-4o", kind=SpanKind.CLIENT) as chat:
                chat.set_attributes(
                    {
                        "gen_ai.operation.name": "chat",
                        "gen_ai.provider.name": "openai",
                        "gen_ai.request.model": "gpt-4o",
                        "gen_ai.usage.input_tokens": 500 + 60 * step,
                        "gen_ai.usage.output_tokens": rng.randrange(20, 120),
                        "gen_ai.system_instructions": system,
                        "gen_ai.input.messages": json.dumps(history),
                        "gen_ai.output.messages": json.dumps(output),
                    }
                )
            result = {"hits": [sentence(rng, 60) for _ in range(2)]}
            with tracer.start_as_current_span("execute_tool search") as tool:
                tool.set_attributes(
                    {
                        "gen_ai.operation.name": "execute_tool",
                        "gen_ai.tool.name": "search",
                        "gen_ai.tool.call.id": f"call_{step}",
                        "gen_ai.tool.call.arguments": json.dumps(arguments),
                        "gen_ai.tool.call.result": json.dumps(result),
                    }
                )
            history = [
                *history,
                *output,
                {"role": "tool", "parts": [{"type": "tool_call_response", "id": f"call_{step}", "response": result}]},
            ]
    body: bytes = encode_spans(exporter.get_finished_spans()).SerializeToString()
    provider.shutdown()
    return body


def _template_trajectories(count: int) -> list[list[Any]]:
    """10-span trajectories as mapped spans (tracing.otlp.Span), grouped by trace, in span order."""
    from tracing import otlp

    groups: list[list[Any]] = []
    for template in templates_build(max(1, count // 50)):
        spans, _ = otlp.decode_and_map(template.body, otlp.CONTENT_TYPE_PROTOBUF, None)
        by_trace: dict[str, list[Any]] = {}
        for span in spans:
            by_trace.setdefault(span.trace_id, []).append(span)
        groups += by_trace.values()
    return groups


def _clone(spans: Sequence[Any], number: int, prefix: str, total: int) -> list[Any]:
    """A copy of one template trajectory as trajectory `number` of the data set."""
    from tracing import otlp

    trace_id = f"{prefix}{number:016x}"
    first = min(span.start_time_ns for span in spans)
    start = int((EPOCH - timedelta(days=DAYS)).timestamp() * 1e9) + number * (DAYS * 86_400 * 10**9 // total)
    shift = start - first
    agent = AGENTS[(number * 7919) % len(AGENTS)]
    failed = (number * 104_729) % 1000 < ERROR_SHARE * 1000
    output_factor = 0.5 + ((number * 2_654_435_761) % 1000) / 500  # 0.5 .. 2.5
    cloned = []
    failed_done = False
    for span in spans:
        changes: dict[str, Any] = {
            "trace_id": trace_id,
            "start_time_ns": span.start_time_ns + shift,
            "end_time_ns": span.end_time_ns + shift,
        }
        if span.agent_name:
            changes["agent_name"] = agent
        if span.usage.output_tokens:
            changes["usage"] = dataclasses.replace(
                span.usage, output_tokens=int(span.usage.output_tokens * output_factor)
            )
        if failed and not failed_done and span.span_type == "tool":
            changes["status"], changes["status_message"] = "error", "lookup_order: upstream timeout"
            failed_done = True
        cloned.append(dataclasses.replace(span, **changes))
    assert isinstance(cloned[0], otlp.Span)
    return cloned


def _load_share(
    environment: dict[str, str], workspace_id: int, key_id: int, numbers: range, templates: list[list[Any]], total: int
) -> None:
    """Write trajectories `numbers` with spans_write, SPANS_PER_TRANSACTION spans per transaction."""
    stack.django_setup(environment)
    from django.db import connections, transaction

    from agent_registry.models import ApiKey, Workspace
    from tracing import services

    workspace = Workspace.objects.get(pk=workspace_id)
    api_key = ApiKey.objects.get(pk=key_id)
    prefix = "b0" + os.urandom(7).hex()
    batch: list[Any] = []
    for number in numbers:
        batch += _clone(templates[number % len(templates)], number, prefix, total)
        if len(batch) >= SPANS_PER_TRANSACTION or number == numbers[-1]:
            with transaction.atomic():
                services.spans_write(workspace=workspace, api_key=api_key, spans=batch)
            batch = []
    connections.close_all()


def _data_ready(size: Size, environment: dict[str, str]) -> bool:
    """Whether the database already holds this benchmark's data set, written by the current schema
    (a migration added since means the write path may have changed too: load again)."""
    import subprocess
    import sys

    import psycopg

    database = stack.database_existing(size.database)
    if database is None:
        return False
    unapplied = subprocess.run(
        [sys.executable, str(BASE_DIR / "manage.py"), "migrate", "--check"],
        cwd=BASE_DIR,
        env=environment,
        capture_output=True,
        check=False,
    )
    if unapplied.returncode != 0:
        print("the data set predates a migration: loading it again", flush=True)
        return False
    with psycopg.connect(database.conninfo(), autocommit=True) as connection:
        try:
            row = connection.execute(
                "SELECT (SELECT count(*) FROM tracing_trajectory), (SELECT count(*) FROM tracing_span), "
                "(SELECT count(*) FROM tracing_trajectory WHERE step_count >= %s)",
                [LONG_STEPS],
            ).fetchone()
        except psycopg.Error:
            return False
    if row is None:
        return False
    trajectories, spans, long_ones = (int(value) for value in row)
    return (
        trajectories == size.trajectories + size.long_trajectories
        and spans >= size.trajectories * 10
        and long_ones >= size.long_trajectories
    )


@dataclasses.dataclass
class Loaded:
    reused: bool
    seconds: float = 0.0
    spans: int = 0
    trajectories: int = 0
    vacuum_seconds: float = 0.0


def data_load(environment: dict[str, str], size: Size, reload: bool) -> Loaded:
    if not reload and _data_ready(size, environment):
        return Loaded(reused=True)
    database = stack.database_fresh(size.database)
    stack.keel_migrate(environment)
    templates = _template_trajectories(200)
    long_bodies = [_long_trajectory_body(number) for number in range(size.long_trajectories)]
    # Workspace, owner and key, then the processes that write (each its own Django and connection).
    import psycopg

    setup = (
        "import os; import django; django.setup();"
        "from agent_registry import services; from agent_registry.models import Scope, User;"
        "owner = User.objects.create_user(username='bench-owner', password=None);"
        "ws = services.workspace_create(slug='bench', name='Benchmark', owner=owner);"
        "key, raw = services.apikey_create(workspace=ws, name='bench', scopes=[Scope.INGEST, Scope.READ]);"
        "open(os.environ['BENCH_KEY_FILE'], 'w').write(f'{ws.pk} {key.pk} {raw}')"
    )
    key_file = VAR_DIR / f"{size.database}-key.txt"
    import subprocess
    import sys

    subprocess.run(
        [sys.executable, "-c", setup],
        env={**environment, "BENCH_KEY_FILE": str(key_file)},
        check=True,
        cwd=BASE_DIR,
    )
    workspace_id, key_id, _ = key_file.read_text().split()
    watch = Stopwatch()
    context = multiprocessing.get_context("fork")
    share = size.trajectories // LOAD_PROCESSES
    workers = [
        context.Process(
            target=_load_share,
            args=(
                environment,
                int(workspace_id),
                int(key_id),
                range(index * share, (index + 1) * share),
                templates,
                size.trajectories,
            ),
        )
        for index in range(LOAD_PROCESSES)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
        if worker.exitcode != 0:
            raise RuntimeError(f"a loading process failed with exit code {worker.exitcode}")
    long_loader = context.Process(target=_load_long, args=(environment, int(workspace_id), int(key_id), long_bodies))
    long_loader.start()
    long_loader.join()
    if long_loader.exitcode != 0:
        raise RuntimeError("loading the long trajectories failed")
    seconds = watch.seconds()
    vacuum = Stopwatch()
    with psycopg.connect(database.conninfo(), autocommit=True) as connection:
        connection.execute("VACUUM ANALYZE tracing_trajectory")
        connection.execute("VACUUM ANALYZE tracing_span")
        row = connection.execute(
            "SELECT (SELECT count(*) FROM tracing_span), (SELECT count(*) FROM tracing_trajectory)"
        ).fetchone()
    assert row is not None
    return Loaded(False, seconds, int(row[0]), int(row[1]), vacuum.seconds())


def _load_long(environment: dict[str, str], workspace_id: int, key_id: int, bodies: list[bytes]) -> None:
    stack.django_setup(environment)
    from django.db import connections, transaction

    from agent_registry.models import ApiKey, Workspace
    from tracing import otlp, services

    workspace = Workspace.objects.get(pk=workspace_id)
    api_key = ApiKey.objects.get(pk=key_id)
    base = int((EPOCH - timedelta(days=1)).timestamp() * 1e9)
    for number, body in enumerate(bodies):
        spans, _ = otlp.decode_and_map(body, otlp.CONTENT_TYPE_PROTOBUF, None)
        first = min(span.start_time_ns for span in spans)
        shift = base + number * 3_600 * 10**9 - first
        moved = [
            dataclasses.replace(span, start_time_ns=span.start_time_ns + shift, end_time_ns=span.end_time_ns + shift)
            for span in spans
        ]
        with transaction.atomic():
            services.spans_write(workspace=workspace, api_key=api_key, spans=moved)
    connections.close_all()


# --- Measuring ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class Scenario:
    name: str
    target_ms: float
    times_ms: list[float] = dataclasses.field(default_factory=list)
    cpu_ms: list[float] = dataclasses.field(default_factory=list)
    db_ms: list[float] = dataclasses.field(default_factory=list)
    queries: list[int] = dataclasses.field(default_factory=list)
    items: list[int] = dataclasses.field(default_factory=list)
    sizes: list[int] = dataclasses.field(default_factory=list)


class _DbTimer:
    """A connection execute wrapper that adds up the time spent in the database driver."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.count = 0

    def __call__(self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            self.seconds += time.perf_counter() - started
            self.count += 1


def _timed(client: Any, scenario: Scenario, path: str, params: dict[str, str] | None = None) -> Any:
    from django.db import connection

    timer = _DbTimer()
    with connection.execute_wrapper(timer):
        started, cpu_started = time.perf_counter(), time.process_time()
        response = client.get(path, params or {})
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    if response.status_code != 200:
        raise RuntimeError(f"{path} {params}: {response.status_code} {response.content[:300]!r}")
    payload = response.json()
    scenario.times_ms.append(elapsed * 1000)
    scenario.cpu_ms.append(cpu * 1000)
    scenario.db_ms.append(timer.seconds * 1000)
    scenario.queries.append(timer.count)
    scenario.items.append(len(payload.get("items", payload.get("step_details", []))))
    scenario.sizes.append(len(response.content))
    return payload


class _Windows:
    """Random 7-day windows inside the data set, and random agents: a seeded generator, same every run."""

    def __init__(self, seed: int) -> None:
        from bench.bench_otlp_parse import Pseudo

        self.rng = Pseudo(seed)

    def next(self) -> tuple[str, str, str]:
        start_day = self.rng.randrange(0, DAYS - 7)
        start = EPOCH - timedelta(days=DAYS) + timedelta(days=start_day, hours=self.rng.randrange(0, 24))
        return (
            AGENTS[self.rng.randrange(0, len(AGENTS))],
            start.isoformat(),
            (start + timedelta(days=7)).isoformat(),
        )


def measure(client: Any, requests: int, long_ids: list[str], short_ids: list[str]) -> list[Scenario]:
    path = "/api/v1/trajectories"
    scenarios = {
        name: Scenario(name, target)
        for name, target in (
            ("list: agent + 7 days + status=ok, newest first, page 1", LIST_TARGET_MS),
            ("list: agent + 7 days + status=ok, newest first, page 2", LIST_TARGET_MS),
            ("list: agent + 7 days + status=ok, by cost, page 1", LIST_TARGET_MS),
            ("list: agent + 7 days + status=ok, by cost, page 2", LIST_TARGET_MS),
            ("list: agent + 7 days + status=error, newest first, page 2", LIST_TARGET_MS),
            ("list: no filter, newest first, page 1", LIST_TARGET_MS),
            ("detail: 200-step trajectory", DETAIL_TARGET_MS),
            ("detail: 10-span trajectory", DETAIL_TARGET_MS),
        )
    }
    names = list(scenarios)
    windows = _Windows(42)
    for number in range(requests):
        agent, after, before = windows.next()
        base = {"agent": agent, "started_after": after, "started_before": before, "limit": "50"}
        for order, first_name, second_name in (
            ("-started_at", names[0], names[1]),
            ("-cost", names[2], names[3]),
        ):
            page = _timed(client, scenarios[first_name], path, {**base, "status": "ok", "order": order})
            if page["next_cursor"]:
                _timed(
                    client,
                    scenarios[second_name],
                    path,
                    {**base, "status": "ok", "order": order, "cursor": page["next_cursor"]},
                )
        first = client.get(path, {**base, "status": "error", "order": "-started_at", "limit": "20"}).json()
        if first["next_cursor"]:
            _timed(
                client,
                scenarios[names[4]],
                path,
                {**base, "status": "error", "order": "-started_at", "limit": "20", "cursor": first["next_cursor"]},
            )
        _timed(client, scenarios[names[5]], path, {"limit": "50"})
        if number % 4 == 0:
            _timed(client, scenarios[names[6]], f"{path}/{long_ids[number // 4 % len(long_ids)]}")
            _timed(client, scenarios[names[7]], f"{path}/{short_ids[number % len(short_ids)]}")
    return list(scenarios.values())


def explain_plans(client: Any, short_id: str) -> list[tuple[str, str]]:
    """EXPLAIN ANALYZE of the main query behind a list request (by time, by cost) and a detail request."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    agent, after, before = _Windows(7).next()
    base = {"agent": agent, "started_after": after, "started_before": before, "status": "ok", "limit": "50"}
    plans = []
    for label, params, marker in (
        ("list, newest first, page 2", {**base, "order": "-started_at"}, "ORDER BY"),
        ("list, by cost, page 2", {**base, "order": "-cost"}, "ORDER BY"),
    ):
        page = client.get("/api/v1/trajectories", params).json()
        with CaptureQueriesContext(connection) as captured:
            client.get("/api/v1/trajectories", {**params, "cursor": page["next_cursor"]})
        main = next(
            q["sql"] for q in captured.captured_queries if "tracing_trajectory" in q["sql"] and marker in q["sql"]
        )
        plans.append((label, _explain_raw(main)))
    with CaptureQueriesContext(connection) as captured:
        client.get(f"/api/v1/trajectories/{short_id}")
    spans = next(q["sql"] for q in captured.captured_queries if 'FROM "tracing_span"' in q["sql"])
    plans.append(
        ("detail, 10 spans: the span query (a short trajectory's view is built from its spans)", _explain_raw(spans))
    )
    return plans


def _explain_raw(sql: str) -> str:
    """EXPLAIN ANALYZE a query as Django logged it (parameters already inlined by psycopg)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sql)
        return "\n".join(row[0] for row in cursor.fetchall())


def _row(scenario: Scenario) -> list[str]:
    p50, p95 = percentile(scenario.times_ms, 0.5), percentile(scenario.times_ms, 0.95)
    verdict = "meets" if p95 <= scenario.target_ms else "**misses**"
    return [
        scenario.name,
        str(len(scenario.times_ms)),
        f"{p50:,.1f} ms",
        f"{p95:,.1f} ms",
        f"{percentile(scenario.cpu_ms, 0.5):,.1f} / {percentile(scenario.cpu_ms, 0.95):,.1f} ms",
        f"{percentile(scenario.db_ms, 0.5):,.1f} ms",
        f"{percentile([float(q) for q in scenario.queries], 0.5):.0f}",
        f"{percentile([float(i) for i in scenario.items], 0.5):.0f}",
        f"{percentile([float(b) for b in scenario.sizes], 0.5) / 1000:,.0f} kB",
        f"≤ {scenario.target_ms:.0f} ms: {verdict}",
    ]


def scenarios_table(report: Report, scenarios: Sequence[Scenario]) -> None:
    report.table(
        [
            "request",
            "n",
            "p50",
            "**p95**",
            "Python CPU p50 / p95",
            "DB time p50",
            "queries",
            "items/steps",
            "body",
            "target (p95)",
        ],
        [_row(scenario) for scenario in scenarios if scenario.times_ms],
    )


@dataclasses.dataclass(frozen=True)
class Experiment:
    """An index tried on the bench database only: created, measured, dropped again."""

    name: str
    create: str
    drop: str


EXPERIMENTS: tuple[Experiment, ...] = ()


def profile_request(client: Any, path: str, params: dict[str, str] | None = None, top: int = 18) -> str:
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    client.get(path, params or {})
    profiler.disable()
    output = io.StringIO()
    stats = pstats.Stats(profiler, stream=output)
    stats.sort_stats("tottime").print_stats(top)
    lines = [line for line in output.getvalue().splitlines() if line.strip()]
    start = next((i for i, line in enumerate(lines) if "function calls" in line), 0)
    return "\n".join(line.replace(str(BASE_DIR) + "/", "") for line in lines[start:])


def _client(key: str) -> Any:
    from django.test import Client

    return Client(headers={"Authorization": f"Bearer {key}"}, SERVER_NAME="127.0.0.1")


def run(report: Report, *, quick: bool = False, requests: int | None = None, reload: bool = False) -> None:
    requests = requests or (20 if quick else 200)
    size = QUICK if quick else FULL
    database = stack.Database(*stack.server_start(), size.database)
    environment = stack.keel_environment(database, VAR_DIR / "broker-reads")
    # The rounds send one request after another as fast as they are answered, past a key's default read
    # limit (100 per second, bursts of 200) on a fast host. The limit is raised, not switched off, so every
    # request still pays for taking its token.
    environment.update({f"KEEL_RATE_LIMIT_READ_{name}": str(READ_LIMIT) for name in ("PER_SECOND", "BURST")})
    report.line(f"Load average before: {load_average()}")
    report.line()
    report.line(
        f"The read key's rate limit is raised to {READ_LIMIT:,} requests per second for the run: the requests "
        "still take their token, but none is refused."
    )
    report.line()
    try:
        loaded = data_load(environment, size, reload)
        stack.django_setup(environment)
        from django.db import connection

        from tracing.models import Trajectory

        key = (VAR_DIR / f"{size.database}-key.txt").read_text().split()[2]
        if loaded.reused:
            report.line("Data: reused the loaded database (`--reload` loads it again).")
        else:
            report.line(
                f"Data: loaded {loaded.spans:,} spans in {loaded.trajectories:,} trajectories "
                f"in {loaded.seconds:.0f} s "
                f"({loaded.spans / loaded.seconds:,.0f} spans/s through `tracing.services.spans_write`, "
                f"{LOAD_PROCESSES} processes, {SPANS_PER_TRANSACTION:,} spans per transaction), then VACUUM ANALYZE "
                f"in {loaded.vacuum_seconds:.0f} s."
            )
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_size_pretty(pg_total_relation_size('tracing_span')), "
                "pg_size_pretty(pg_total_relation_size('tracing_trajectory'))"
            )
            sizes = cursor.fetchone()
        assert sizes is not None
        report.line(f"Table sizes (with indexes and TOAST): tracing_span {sizes[0]}, tracing_trajectory {sizes[1]}.")
        report.line()
        long_ids = list(Trajectory.objects.filter(step_count__gte=LONG_STEPS).values_list("trace_id", flat=True))
        long_steps = list(Trajectory.objects.filter(step_count__gte=LONG_STEPS).values_list("step_count", "span_count"))
        short_ids = list(
            Trajectory.objects.filter(span_count=10).order_by("pk").values_list("trace_id", flat=True)[:500]
        )
        client = _client(key)
        # Warm up: the first requests pay for imports, connection set-up and cold caches.
        measure(client, 3, long_ids, short_ids)
        # As a web worker does once the app is loaded and again after its first requests (config/gunicorn.py):
        # the objects so far (Django's, litellm's price map) leave the cyclic collector's reach, whose full
        # collections would otherwise walk them all, 200 ms each here, in the middle of measured requests.
        gc.freeze()
        scenarios = measure(client, requests, long_ids, short_ids)
        report.line(
            f"{requests} rounds of random agent + 7-day window; long trajectories have "
            f"{long_steps[0][0]} steps ({long_steps[0][1]} spans). Load average after: {load_average()}."
        )
        report.line()
        scenarios_table(report, scenarios)
        report.line(
            "cProfile of one 200-step detail request (top functions by own time; the total includes "
            "cProfile's overhead):"
        )
        report.line()
        report.code(profile_request(client, f"/api/v1/trajectories/{long_ids[0]}"))
        agent, after, before = _Windows(3).next()
        report.line("cProfile of one list request (agent + 7 days + status=ok, by cost, 50 items):")
        report.line()
        report.code(
            profile_request(
                client,
                "/api/v1/trajectories",
                {"agent": agent, "started_after": after, "started_before": before, "status": "ok", "order": "-cost"},
            )
        )
        for label, plan in explain_plans(client, short_ids[0]):
            report.line(f"EXPLAIN ANALYZE, {label}:")
            report.line()
            report.code(plan)
    finally:
        from django.db import connections

        connections.close_all()
        stack.server_stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer requests (the data set is the same)")
    parser.add_argument("--requests", type=int, help="rounds of requests (200)")
    parser.add_argument("--reload", action="store_true", help="load the data set again")
    parser.add_argument("--output", type=Path, help="also write the markdown section here")
    arguments = parser.parse_args()
    report = Report("Reads: trajectory list and detail with 1,000,000 spans")
    run(report, quick=arguments.quick, requests=arguments.requests, reload=arguments.reload)
    if arguments.output:
        arguments.output.write_text(report.markdown())


if __name__ == "__main__":
    main()
