"""Eval runs: items evaluated per second for a 1,000-item suite with k = 4, and the run's overhead over
the raw model calls (the evals issue), against one stub model server with a fixed latency.

    python -m bench.bench_evals [--quick]

Everything runs in this process on a database of its own (`keel_bench_evals`, fresh each run, migrated)
on the benchmarks' embedded PostgreSQL, against `bench/stub_model_server.py` in a process of its own
(OpenAI-compatible, asyncio, fixed latency `STUB_LATENCY_MS`). No Keel web server or worker: the run is
executed with `evals.runs.run_execute`, the Celery task's code path, in this process, so its worker
threads use real, committed data (the gateway stores each sample's spans and trajectory as it records
the sample, so that work is part of the run's figures).

1. **Setup**, through Keel's services: a workspace, an agent (single-level routing, single call only)
   with requirements and a production chat prompt that takes a variable, a model target on the stub and
   the agent's router config (cache off), a dataset of `items` items with subgroup tags (language,
   intent) and the prompt's variable in their metadata, two deterministic evaluators (`regex` and
   `normalised_match`: no judge, so the figures are the runner's, not a judge model's) and a suite with
   k = 4, tier pinned to single_call.
2. **Runs**: one run per concurrency (4, the default; then 8 and 16), each made with `run_create` and
   executed with `run_execute`; wall time -> items/s and samples/s, this process's CPU and PostgreSQL's
   (all its processes, from /proc) per sample. The run's stages are timed by wrapping module functions
   of `evals.runs` (and `routing.providers.attempt`, `tracing.services.ingest_spans_accept`): the time worker
   threads spent in each, as a share of all worker-thread time. Nothing in evals/ or routing/ changes.
3. **Raw model calls**: the same number of calls straight to the stub from a thread pool of the same
   size, (a) by `litellm.completion` with the arguments the gateway passes, (b) by httpx (one keep-alive
   client per thread: the floor; the gateway calls an OpenAI-compatible server such as the stub this way
   too, routing/openai_compatible.py). Overhead = run wall − raw wall, per sample and as a share of the run.
4. **Per-sample latency**: p50/p99 of `RunSample.latency_ms` (the gateway's own time for the sample)
   against the stub's fixed latency and the raw calls' latency at the same concurrency.
5. **Where one sample's CPU goes**: a cProfile of a small run at concurrency 1 (the run's items in the
   calling thread), top functions by own time and by cumulative time.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import pstats
import random
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from bench import stack
from bench.harness import BASE_DIR, VAR_DIR, Report, Stopwatch, load_average, percentile

STUB_LATENCY_MS = 50.0
SAMPLES = 4  # k
DEFAULT_CONCURRENCY = 4  # Suite.concurrency's default
COMPANY = "Acme Rides"
SYSTEM_TEMPLATE = (
    "You are {{company}}'s ride support assistant. Answer in two or three sentences, politely, and never "
    "promise a refund you cannot see in the customer's account."
)
# What the stub answers (bench/stub_model_server.py ANSWER), in other case and punctuation: an item with
# this reference passes `normalised_match`; the others fail it, so the report is not all ones.
PASSING_REFERENCE = "thanks for getting in touch - i have looked at your account and the issue is resolved"
PASSING_SHARE = 0.7


@dataclass(frozen=True)
class Size:
    database: str
    items: int
    concurrencies: tuple[int, ...]
    profile_items: int


FULL = Size(database="keel_bench_evals", items=1000, concurrencies=(4, 8, 16), profile_items=50)
# --quick: every phase, small (a smoke test, not figures).
QUICK = Size(database="keel_bench_evals_quick", items=100, concurrencies=(4,), profile_items=10)

STARTED = time.monotonic()
# Keel's own modules, for the profile's restricted listing (a regular expression on pstats' lines).
KEEL_CODE = r"/(routing|evals|tracing|agent_registry|guardrails|config)/[a-z_]+\.py"


def _progress(message: str) -> None:
    print(f"[{time.monotonic() - STARTED:5.0f} s, load {load_average()}] {message}", flush=True)


def _ms(value: float) -> str:
    return "–" if value != value else f"{value:.1f}"


# --- Fixtures ---------------------------------------------------------------------------------------------

LANGUAGES = ("en", "es", "pt", "de")
QUESTIONS = {
    "receipts": ("Where can I find the receipt for my trip {trip}?", "How do I get an invoice for trip {trip}?"),
    "refunds": ("I was charged twice for trip {trip}, can I get a refund?", "Why was I charged for trip {trip}?"),
    "account": ("How do I change the email on my account?", "The app keeps logging me out after trip {trip}."),
    "safety": ("The driver on trip {trip} was driving too fast.", "I left my phone in the car on trip {trip}."),
}


@dataclass
class Fixtures:
    workspace: Any
    agent: Any
    target: Any
    suite: Any
    evaluator_names: tuple[str, ...]
    api_base: str
    seconds: dict[str, float] = field(default_factory=dict)


def _items(count: int) -> list[Any]:
    from evals import dataset_items

    pick = random.Random(7)  # noqa: S311 - test data, not security
    intents = list(QUESTIONS)
    items = []
    for _ in range(count):
        intent = pick.choice(intents)
        text = pick.choice(QUESTIONS[intent]).format(trip=f"T{pick.randint(100_000, 999_999)}")
        passing = pick.random() < PASSING_SHARE
        items.append(
            dataset_items.ItemData(
                input_messages=({"role": "user", "content": text},),
                reference_output=PASSING_REFERENCE if passing else "Your refund has been issued.",
                metadata={
                    "tags": {"language": pick.choice(LANGUAGES), "intent": intent},
                    "variables": {"company": COMPANY},
                },
            )
        )
    return items


def _fixtures(api_base: str, items: int) -> Fixtures:
    from agent_registry import services as registry
    from agent_registry.models import User
    from agent_registry.tests.factories import requirements_answers
    from config import crypto
    from evals import services
    from routing.models import ModelTarget, RouterConfig

    clock = Stopwatch()
    owner = User.objects.create_user(username="bench-owner", password=None)
    workspace = registry.workspace_create(slug="bench", name="Benchmark", owner=owner)
    target = ModelTarget.objects.create(
        workspace=workspace,
        alias="stub-chat",
        model="openai/stub",
        api_base=api_base,
        api_key_encrypted=crypto.encrypt("sk-bench-stub"),
        tier="single_call",
        timeout_seconds=30.0,
    )
    agent = registry.agent_create(workspace=workspace, slug="ride-faq", name="Ride FAQ")
    registry.requirements_version_create(
        agent=agent,
        answers=requirements_answers(
            **{
                "routing.mode": "single_level",
                "routing.enabled_tiers": ["single_call"],
                "routing.default_tier": "single_call",
                "routing.escalation_rules": [],
                "io_gap.steps_median": 1,
                "io_gap.steps_p95": 1,
            }
        ),
        message="benchmark",
    )
    registry.prompt_create(
        agent=agent,
        name=f"{agent.slug}/system",
        type="chat",
        template=[{"role": "system", "content": SYSTEM_TEMPLATE}, {"role": "user", "content": "{{message}}"}],
        labels=["production"],
    )
    RouterConfig.objects.create(agent=agent, single_call_target=target, cache_enabled=False)
    setup_seconds = clock.seconds()

    clock = Stopwatch()
    dataset = services.dataset_create(workspace=workspace, name="ride-faq-regressions", agent=agent)
    services.dataset_version_create_from_items(dataset=dataset, items=_items(items))
    dataset_seconds = clock.seconds()
    resolved = services.evaluator_create(
        workspace=workspace,
        name="says_resolved",
        config={"type": "regex", "pattern": r"\bresolved\b", "flags": ["IGNORECASE"]},
    )
    matches = services.evaluator_create(
        workspace=workspace, name="matches_reference", config={"type": "normalised_match"}
    )
    suite = services.suite_create(
        workspace=workspace,
        name="ride-faq-answers",
        agent=agent,
        dataset=dataset,
        samples=SAMPLES,
        concurrency=DEFAULT_CONCURRENCY,
        tier="single_call",
        evaluators_used=[resolved, matches],
    )
    return Fixtures(
        workspace,
        agent,
        target,
        suite,
        (resolved.name, matches.name),
        api_base,
        {"setup": setup_seconds, "dataset": dataset_seconds},
    )


# --- Stage timers ---------------------------------------------------------------------------------------------


@dataclass
class Stages:
    """Seconds spent in wrapped functions, summed over threads; outermost call only per thread and name."""

    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    lock: threading.Lock = field(default_factory=threading.Lock)
    local: threading.local = field(default_factory=threading.local)

    def clear(self) -> None:
        with self.lock:
            self.seconds.clear()
            self.calls.clear()

    def wrap(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def timed(*args: Any, **kwargs: Any) -> Any:
            active: set[str] = self.local.__dict__.setdefault("active", set())
            if name in active:
                return function(*args, **kwargs)
            active.add(name)
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - started
                active.discard(name)
                with self.lock:
                    self.seconds[name] += elapsed
                    self.calls[name] += 1

        return timed


def _stages_install(stages: Stages) -> Callable[[], None]:
    """Wrap the run's stage functions; returns the function that puts the originals back."""
    from evals import runs
    from routing import providers
    from tracing import services as tracing_services

    targets: list[tuple[Any, str, str]] = [
        (runs, "_item_claim", "claim"),
        (runs, "_samples", "samples"),
        (runs, "_sample_from_gateway", "gateway"),
        (runs, "_heartbeat", "heartbeat"),
        (runs, "_scores", "scores"),
        (runs, "_item_finish", "finish"),
        (runs, "_still_running", "still_running"),
        (runs, "run_report", "report"),
        (providers, "attempt", "model_call"),
        (tracing_services, "ingest_spans_accept", "ingest_accept"),
    ]
    originals = [(module, attribute, getattr(module, attribute)) for module, attribute, _ in targets]
    for module, attribute, name in targets:
        setattr(module, attribute, stages.wrap(name, getattr(module, attribute)))

    def restore() -> None:
        for module, attribute, original in originals:
            setattr(module, attribute, original)

    return restore


# --- Runs -------------------------------------------------------------------------------------------------------


@dataclass
class RunFigures:
    concurrency: int
    run_id: int
    create_seconds: float
    wall_seconds: float
    cpu_seconds: float
    postgres_cpu_seconds: float
    status: str
    items: int
    items_errored: int
    samples: int
    samples_errored: int
    latencies_ms: list[float]
    stages: dict[str, float]
    stage_calls: dict[str, int]
    pass_at: dict[str, dict[str, float]]


def _postgres_cpu() -> float:
    pid = stack.postmaster_pid()
    return stack.cpu_seconds(stack.process_tree(pid)) if pid else float("nan")


def _run_once(fixtures: Fixtures, concurrency: int, stages: Stages) -> RunFigures:
    from evals import runs, services
    from evals.models import RunSample

    suite = services.suite_update(suite=fixtures.suite, concurrency=concurrency)
    clock = Stopwatch()
    queued = runs.run_create(suite=suite, dispatch=False)
    create_seconds = clock.seconds()
    stages.clear()
    cpu_before, postgres_before = time.process_time(), _postgres_cpu()
    clock = Stopwatch()
    run = runs.run_execute(run_id=queued.pk)
    wall = clock.seconds()
    cpu, postgres = time.process_time() - cpu_before, _postgres_cpu() - postgres_before
    assert run is not None
    rows = list(RunSample.objects.filter(item__run=run).values_list("latency_ms", "error"))
    pass_at = {
        name: {
            key: float(run.report[name]["overall"]["pass_at_k"].get(key, float("nan"))) for key in ("1", str(SAMPLES))
        }
        for name in fixtures.evaluator_names
        if name in (run.report or {})
    }
    with stages.lock:
        seconds, calls = dict(stages.seconds), dict(stages.calls)
    return RunFigures(
        concurrency=concurrency,
        run_id=run.pk,
        create_seconds=create_seconds,
        wall_seconds=wall,
        cpu_seconds=cpu,
        postgres_cpu_seconds=postgres,
        status=str(run.status),
        items=run.items_done,
        items_errored=run.items_errored,
        samples=len(rows),
        samples_errored=sum(1 for _, error in rows if error),
        latencies_ms=[float(latency) for latency, error in rows if latency is not None and not error],
        stages=seconds,
        stage_calls=calls,
        pass_at=pass_at,
    )


# --- Raw model calls ----------------------------------------------------------------------------------------


@dataclass
class RawFigures:
    kind: str
    concurrency: int
    calls: int
    wall_seconds: float
    cpu_seconds: float
    errors: int
    latencies_ms: list[float]


def _messages(number: int) -> list[dict[str, str]]:
    system = SYSTEM_TEMPLATE.replace("{{company}}", COMPANY)
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": f"Where can I find the receipt for my trip T{100_000 + number}?"},
    ]


def _raw(kind: str, fixtures: Fixtures, concurrency: int, calls: int) -> RawFigures:
    import httpx
    import litellm
    from openai import OpenAIError

    local = threading.local()
    clients: list[httpx.Client] = []
    clients_lock = threading.Lock()

    def client() -> httpx.Client:
        found: httpx.Client | None = getattr(local, "client", None)
        if found is None:
            found = httpx.Client(base_url=fixtures.api_base, timeout=30.0)
            local.client = found
            with clients_lock:
                clients.append(found)
        return found

    def call(number: int) -> tuple[float, bool]:
        started = time.perf_counter()
        try:
            if kind == "litellm":
                litellm.completion(
                    model=fixtures.target.model,
                    api_base=fixtures.api_base,
                    api_key="sk-bench-stub",
                    timeout=fixtures.target.timeout_seconds,
                    messages=_messages(number),
                )
            else:
                response = client().post(
                    "/chat/completions",
                    json={"model": "stub", "messages": _messages(number)},
                    headers={"Authorization": "Bearer sk-bench-stub"},
                )
                response.raise_for_status()
                response.json()
        except (OpenAIError, httpx.HTTPError):
            return (time.perf_counter() - started) * 1000, False
        return (time.perf_counter() - started) * 1000, True

    # A short warm-up (imports, connection pools), not counted.
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(call, range(concurrency * 2)))
    cpu_before = time.process_time()
    clock = Stopwatch()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(call, range(calls)))
    wall, cpu = clock.seconds(), time.process_time() - cpu_before
    for open_client in clients:
        open_client.close()
    return RawFigures(
        kind=kind,
        concurrency=concurrency,
        calls=calls,
        wall_seconds=wall,
        cpu_seconds=cpu,
        errors=sum(1 for _, ok in results if not ok),
        latencies_ms=[latency for latency, ok in results if ok],
    )


# --- Profile ---------------------------------------------------------------------------------------------------


def _profile(fixtures: Fixtures, items: int) -> tuple[int, int, str, str]:
    """cProfile of a run of the first `items` items at concurrency 1 (items in the calling thread), and the
    SQL statements that run sent."""
    from django.db import connection

    from evals import runs, services

    statements = 0

    def counted(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        nonlocal statements
        statements += 1
        return execute(sql, params, many, context)

    dataset = services.dataset_create(workspace=fixtures.workspace, name="profiled", agent=fixtures.agent)
    services.dataset_version_create_from_items(dataset=dataset, items=_items(items))
    suite = services.suite_update(suite=fixtures.suite, concurrency=1, dataset=dataset)
    queued = runs.run_create(suite=suite, dispatch=False)
    profiler = cProfile.Profile()
    with connection.execute_wrapper(counted):
        profiler.enable()
        runs.run_execute(run_id=queued.pk)
        profiler.disable()
    texts = []
    # Keel's own functions by cumulative time (where a sample's time goes, waits included), then every
    # function by its own time (where the CPU goes).
    for order, restriction in (("cumulative", KEEL_CODE), ("tottime", None)):
        output = io.StringIO()
        stats = pstats.Stats(profiler, stream=output).sort_stats(order)
        if restriction is None:
            stats.print_stats(25)
        else:
            stats.print_stats(restriction, 40)
        text = output.getvalue().replace(str(BASE_DIR) + "/", "")
        texts.append(text[text.find("   ncalls") :].rstrip() if "   ncalls" in text else text)
    return items * SAMPLES, statements, texts[0], texts[1]


# --- Report ----------------------------------------------------------------------------------------------------

STAGE_ROWS: tuple[tuple[str, Callable[[dict[str, float]], float] | None], ...] = (
    ("model call (`providers.attempt`, incl. the stub's latency)", lambda s: s.get("model_call", 0.0)),
    ("gateway, outside the model call (plan, prompt, guardrails, record)", None),
    ("… of which the span batch stored (`ingest_spans_accept`)", lambda s: s.get("ingest_accept", 0.0)),
    ("storing the sample (+ reading stored ones, heartbeat)", None),
    ("scoring + storing scores (`_scores`)", lambda s: s.get("scores", 0.0)),
    ("claiming and finishing items (`_item_claim`, `_item_finish`, `_still_running`)", None),
    ("other (thread idle at the end, loop)", None),
)


def _stage_rows(figures: RunFigures) -> list[list[str]]:
    stages = figures.stages
    thread_seconds = figures.wall_seconds * min(figures.concurrency, figures.items or 1)
    gateway_rest = stages.get("gateway", 0.0) - stages.get("model_call", 0.0)
    storing = stages.get("samples", 0.0) - stages.get("gateway", 0.0)
    items = stages.get("claim", 0.0) + stages.get("finish", 0.0) + stages.get("still_running", 0.0)
    accounted = stages.get("samples", 0.0) + stages.get("scores", 0.0) + items + stages.get("report", 0.0)
    values = {
        STAGE_ROWS[1][0]: gateway_rest,
        STAGE_ROWS[3][0]: storing,
        STAGE_ROWS[5][0]: items,
        STAGE_ROWS[6][0]: thread_seconds - accounted,
    }
    rows = []
    for label, getter in STAGE_ROWS:
        value = getter(stages) if getter is not None else values[label]
        per_sample = value / figures.samples * 1000 if figures.samples else float("nan")
        rows.append([label, f"{value:.1f}", f"{100 * value / thread_seconds:.1f} %", f"{per_sample:.2f}"])
    report = stages.get("report", 0.0)
    rows.append(["the run's report (`run_report`, once, in the calling thread)", f"{report:.2f}", "–", "–"])
    return rows


def _report_runs(
    report: Report,
    fixtures: Fixtures,
    runs_done: Sequence[RunFigures],
    raw: dict[tuple[str, int], RawFigures],
) -> None:
    report.line(
        f"**Throughput**: one run per concurrency, {runs_done[0].items:,} items × k = {SAMPLES}, tier pinned to "
        f"single_call, evaluators `regex` + `normalised_match`; stub latency {STUB_LATENCY_MS:g} ms. The "
        "ideal is concurrency / stub latency samples/s (every thread always waiting on the model)."
    )
    report.line()
    rows = []
    for figures in runs_done:
        ideal = figures.concurrency / (STUB_LATENCY_MS / 1000)
        samples_per_second = figures.samples / figures.wall_seconds
        rows.append(
            [
                figures.concurrency,
                figures.status,
                f"{figures.items:,} ({figures.items_errored} errored)",
                f"{figures.samples:,} ({figures.samples_errored} errored)",
                f"{figures.wall_seconds:.1f}",
                f"**{figures.items / figures.wall_seconds:.1f}**",
                f"**{samples_per_second:.1f}**",
                f"{ideal:.0f} ({100 * samples_per_second / ideal:.0f} %)",
                f"{figures.cpu_seconds / figures.samples * 1000:.1f} "
                f"({100 * figures.cpu_seconds / figures.wall_seconds:.0f} %)",
                f"{figures.postgres_cpu_seconds / figures.samples * 1000:.1f}",
                f"{figures.create_seconds:.2f}",
            ]
        )
    report.table(
        [
            "concurrency",
            "status",
            "items",
            "samples",
            "wall s",
            "items/s",
            "samples/s",
            "ideal samples/s (reached)",
            "bench process CPU ms/sample (% of a core)",
            "PostgreSQL CPU ms/sample",
            "run_create s",
        ],
        rows,
    )

    report.line(
        "**Overhead over the raw model calls**: the same number of calls straight to the stub from a thread pool "
        "of the run's concurrency, by `litellm.completion` (same arguments as the gateway's call) and by "
        "httpx (one keep-alive client per thread; the gateway calls the stub this way, without litellm). "
        "Overhead = run wall − raw wall; per sample = that ÷ samples "
        "(amortised wall time) and × concurrency (what each sample's thread spent beyond the raw call)."
    )
    report.line()
    rows = []
    for figures in runs_done:
        for kind in ("litellm", "httpx"):
            baseline = raw.get((kind, figures.concurrency))
            if baseline is None:
                continue
            overhead = figures.wall_seconds - baseline.wall_seconds
            rows.append(
                [
                    figures.concurrency,
                    kind,
                    f"{baseline.calls:,} ({baseline.errors} errors)",
                    f"{baseline.wall_seconds:.1f}",
                    f"{baseline.calls / baseline.wall_seconds:.1f}",
                    f"{baseline.cpu_seconds / baseline.calls * 1000:.2f}",
                    f"{figures.wall_seconds:.1f}",
                    f"{overhead:.1f}",
                    f"{overhead / figures.samples * 1000:.2f}",
                    f"{overhead / figures.samples * 1000 * figures.concurrency:.1f}",
                    f"**{100 * overhead / figures.wall_seconds:.0f} %**",
                ]
            )
    report.table(
        [
            "concurrency",
            "raw calls by",
            "calls",
            "raw wall s",
            "raw calls/s",
            "raw CPU ms/call",
            "run wall s",
            "overhead s",
            "overhead ms/sample (amortised)",
            "overhead ms/sample (per thread)",
            "share of the run",
        ],
        rows,
    )

    report.line(
        f"**Per-sample latency** (`RunSample.latency_ms`, the gateway's own time for the sample) against the stub's "
        f"fixed {STUB_LATENCY_MS:g} ms and the raw calls' latency at the same concurrency, ms:"
    )
    report.line()
    rows = []
    for figures in runs_done:
        rows.append(
            [
                figures.concurrency,
                "run sample",
                _ms(percentile(figures.latencies_ms, 0.5)),
                _ms(percentile(figures.latencies_ms, 0.99)),
                _ms(percentile(figures.latencies_ms, 1.0)),
            ]
        )
        for kind in ("litellm", "httpx"):
            baseline = raw.get((kind, figures.concurrency))
            if baseline is not None:
                rows.append(
                    [
                        figures.concurrency,
                        f"raw, {kind}",
                        _ms(percentile(baseline.latencies_ms, 0.5)),
                        _ms(percentile(baseline.latencies_ms, 0.99)),
                        _ms(percentile(baseline.latencies_ms, 1.0)),
                    ]
                )
    report.table(["concurrency", "what", "p50", "p99", "max"], rows)

    report.line(
        "**Where the run's worker-thread time goes** (wall time inside wrapped functions, summed over threads, as a "
        "share of concurrency × run wall; time waiting for the GIL or a database connection counts where it "
        "happened). Scoring + storing = sample storing + scores + item claim/finish:"
    )
    report.line()
    for figures in runs_done:
        stage_rows = _stage_rows(figures)
        stages = figures.stages
        storing = (
            stages.get("samples", 0.0)
            - stages.get("gateway", 0.0)
            + stages.get("scores", 0.0)
            + stages.get("claim", 0.0)
            + stages.get("finish", 0.0)
            + stages.get("still_running", 0.0)
        )
        thread_seconds = figures.wall_seconds * figures.concurrency
        report.line(
            f"Concurrency {figures.concurrency}: scoring + storing {100 * storing / thread_seconds:.1f} % of "
            f"worker-thread time; the model call {100 * stages.get('model_call', 0.0) / thread_seconds:.1f} %, of "
            "which the stub's fixed latency is "
            f"{100 * figures.samples * STUB_LATENCY_MS / 1000 / thread_seconds:.1f} %."
        )
        report.line()
        report.table(["stage", "thread s", "share", "ms/sample"], stage_rows)

    report.line("**The run's report** (sanity: pass@1 and pass@k from `Run.report`):")
    report.line()
    rows = []
    for figures in runs_done:
        for name, values in figures.pass_at.items():
            rows.append(
                [figures.concurrency, figures.run_id, name, f"{values['1']:.3f}", f"{values[str(SAMPLES)]:.3f}"]
            )
    report.table(["concurrency", "run", "evaluator", "pass@1", f"pass@{SAMPLES}"], rows)
    report.line(
        f"The stub answers the same text every time, so pass@1 = pass@{SAMPLES}: `says_resolved` passes every "
        f"sample, `matches_reference` the ~{PASSING_SHARE:.0%} of items whose reference is the stub's answer."
    )
    report.line()


# --- The run ---------------------------------------------------------------------------------------------------


def run(report: Report, *, quick: bool) -> None:
    size = QUICK if quick else FULL
    clock = Stopwatch()
    database = stack.database_fresh(size.database)
    environment = stack.keel_environment(database, VAR_DIR / "broker-evals")
    _progress(f"migrating {database.name}")
    stack.keel_migrate(environment)
    stack.django_setup(environment)

    stub_port = stack.free_port()
    api_base = f"http://127.0.0.1:{stub_port}/v1"
    stub = stack.Processes()
    stub.start(
        "stub",
        [
            sys.executable,
            "-m",
            "bench.stub_model_server",
            "--port",
            str(stub_port),
            "--latency-ms",
            f"{STUB_LATENCY_MS:g}",
        ],
        environment,
        stack.LOG_DIR / "evals-stub.log",
    )
    try:
        if not stack.wait_for_http(stub_port, "/health", timeout=30):
            raise RuntimeError(f"the stub model server did not start; see {stack.LOG_DIR / 'evals-stub.log'}")
        _progress(f"fixtures: {size.items:,} items")
        fixtures = _fixtures(api_base, size.items)
        report.line(
            f"Setup: {size.items:,} items × k = {SAMPLES} = {size.items * SAMPLES:,} samples per run; "
            "stub model server bench/stub_model_server.py with a fixed "
            f"{STUB_LATENCY_MS:g} ms latency (asyncio, own process); the run "
            "executed by `evals.runs.run_execute` in the benchmark's process (no Celery, no web server), its "
            "threads on the benchmark's own PostgreSQL; agent with single-level routing, tier pinned to "
            "single_call, cache off; evaluators `regex` and `normalised_match` (no judge). "
            f"Setup took {fixtures.seconds['setup']:.2f} s, the dataset version {fixtures.seconds['dataset']:.2f} s."
        )
        report.line()
        stages = Stages()
        restore = _stages_install(stages)
        runs_done: list[RunFigures] = []
        raw: dict[tuple[str, int], RawFigures] = {}
        try:
            # A few samples first, untimed: imports, litellm's first-call setup, connection pools.
            _warm_up(fixtures)
            for concurrency in size.concurrencies:
                _progress(f"run at concurrency {concurrency}")
                figures = _run_once(fixtures, concurrency, stages)
                runs_done.append(figures)
                rate = figures.items / figures.wall_seconds
                _progress(f"  {figures.status}: {figures.wall_seconds:.1f} s, {rate:.1f} items/s")
                for kind in ("litellm", "httpx"):
                    _progress(f"raw calls by {kind} at concurrency {concurrency}")
                    raw[(kind, concurrency)] = _raw(kind, fixtures, concurrency, figures.samples)
        finally:
            restore()
        _report_runs(report, fixtures, runs_done, raw)

        _progress(f"profile: {size.profile_items} items at concurrency 1")
        samples, statements, keel_cumulative, by_own = _profile(fixtures, size.profile_items)
        report.line(
            f"**cProfile** of a run of {size.profile_items} items × k = {SAMPLES} ({samples} samples) at concurrency 1 "
            "(every item in the calling thread; the profiler slows Python down, so read shares, not times). "
            f"That run sent {statements:,} SQL statements, {statements / samples:.1f} per sample (the run's report "
            "included). "
            "Keel's functions, top 40 by cumulative time:"
        )
        report.line()
        report.code(keel_cumulative)
        report.line("All functions, top 25 by own time (the socket wait is the stub's latency):")
        report.line()
        report.code(by_own)
    finally:
        stub.stop()
        stack.server_stop()
    report.line(f"_Whole benchmark: {clock.seconds():.0f} s._")


def _warm_up(fixtures: Fixtures) -> None:
    """Two samples through the gateway and two raw calls, so first-call costs stay out of the figures."""
    from evals import runs
    from routing import gateway
    from routing.chat import ChatCompletionRequest

    key = runs.runner_key(fixtures.workspace)
    for number in range(2):
        gateway.chat_completion(
            api_key=key,
            request=ChatCompletionRequest.model_validate(
                {
                    "model": f"{gateway.AGENT_PREFIX}{fixtures.agent.slug}",
                    "messages": [{"role": "user", "content": f"warm-up {number}"}],
                    "variables": {"company": COMPANY},
                }
            ),
            pin=gateway.Pin(tier="single_call", tags=("eval",)),
        )
    _raw("litellm", fixtures, 1, 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="every phase, small: a smoke test, not figures")
    arguments = parser.parse_args()
    run(Report("bench_evals"), quick=arguments.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
