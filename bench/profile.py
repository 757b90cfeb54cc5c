"""Where ingest time goes: py-spy's collapsed stacks of Keel's web and worker, grouped into stages.

py-spy (`record --format raw --subprocesses`, 100 Hz, on-CPU samples only) writes one line per
distinct stack: `frame;frame;...;leaf count`, each frame `function (file:line)`. Each sample is put in
the first stage (in the order of the rules below: specific before generic) that one of its frames
matches;
its share of the samples, times the CPU the process tree used per stored span (from /proc), gives
microseconds per span for that stage.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import re
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from bench.harness import BASE_DIR, Report

if TYPE_CHECKING:
    from bench.bench_ingest import Phase

# (stage, regex on one frame); the first rule any frame of a stack matches wins.
# py-spy counts a thread blocked in psycopg's wait loop as active; those samples are time waiting for
# PostgreSQL (its CPU is counted under postgres), not Python work, so they get a stage of their own.
WAIT = ("waiting for PostgreSQL (psycopg wait loop)", r"^(\w+\.)?wait(_c|_conn)? \(.*psycopg")
# Decoding, mapping and writing spans: the web's work for an OTLP request, the worker's for a batch.
PIPELINE_STAGES: tuple[tuple[str, str], ...] = (
    (
        "decode protobuf (otlp.decode_request)",
        r"^(decode_request|_decode_protobuf|decode_protobuf_runtime|spans_read|_parse_protobuf|_pb_\w+) ",
    ),
    ("map spans (otlp.map_spans)", r"^(map_spans|map_span|_map) \(.*otlp"),
    ("price spans (_priced, litellm price map)", r"^(_priced|_price_overrides) "),
    ("read back stored spans (trace_spans)", r"^trace_spans "),
    ("assemble trajectories (steps.trajectory_view_build)", r"^trajectory_view_build "),
    ("triage signals (signals.signals_compute)", r"^signals_compute "),
    ("trajectory row values (_trajectory_values, previews)", r"^_trajectory_values "),
    ("span rows: JSON of `data` (records.span_row)", r"^span_row "),
    ("COPY spans (psycopg copy.write_row)", r"^(write_row|write|_write_gen) \(.*psycopg"),
    ("insert and update trajectories (… FROM json_to_recordset)", r"^(_trajectories_insert|_trajectories_update) "),
    ("claim the batch, read its body", r"^_batch_claim "),
    ("other SQL and commit (psycopg)", r"psycopg/"),
    ("other of spans_write", r"^(span_batch_process|spans_write|_batch_spans|ingest_otlp_accept) "),
)
WEB_STAGES: tuple[tuple[str, str], ...] = (
    WAIT,
    ("authenticate the key", r"^(api_key_from_headers|_key_with_scope|apikey_authenticate) "),
    ("read the request body", r"^(_read_body|read) \(.*(otlp_api|wsgi|django/core/handlers)"),
    ("wait for a turn (ingest_gate)", r"^(turn|acquire) \(.*(services|threading)"),
    *PIPELINE_STAGES,
    ("Django request handling (middleware, routing, response)", r"django/"),
    ("gunicorn (HTTP parsing, socket I/O)", r"gunicorn/"),
)
WORKER_STAGES: tuple[tuple[str, str], ...] = (
    WAIT,
    *PIPELINE_STAGES,
    ("Celery / kombu (task fetch, ack, broker polling)", r"(celery|kombu|billiard)/"),
)


def _frames(stack_text: str) -> list[str]:
    return stack_text.split(";")


def stages_count(path: Path, rules: tuple[tuple[str, str], ...]) -> tuple[Counter[str], int]:
    compiled = [(stage, re.compile(pattern)) for stage, pattern in rules]
    counts: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack_text, _, number = line.rpartition(" ")
        if not number.isdigit():
            continue
        samples = int(number)
        total += samples
        frames = _frames(stack_text)
        # The wait loop is an ancestor of psycopg's generators (which do the work): only a sample whose
        # innermost frame is the wait itself is waiting.
        stage = next(
            (
                name
                for name, pattern in compiled
                if (pattern.search(frames[-1]) if name == WAIT[0] else any(pattern.search(f) for f in frames))
            ),
            "other",
        )
        counts[stage] += samples
    return counts, total


def report_profile(report: Report, phase: Phase, directory: Path) -> None:
    report.line(
        "Profile of Keel in the target phase (py-spy 100 Hz, on-CPU samples of the whole process trees; "
        "µs/span = stage share × the tree's CPU per stored span from /proc):"
    )
    report.line()
    durable = max(1, phase.durable_window)
    rows = []
    for name, rules in (("web", WEB_STAGES), ("worker", WORKER_STAGES)):
        path = directory / f"keel-{name}.txt"
        if not path.exists():
            continue
        counts, total = stages_count(path, rules)
        per_span = phase.cpu.get(name, 0.0) / durable * 1e6
        for stage, samples in counts.most_common():
            share = samples / total if total else 0.0
            rows.append([name, stage, f"{share:.0%}", f"{share * per_span:,.1f}"])
    pg = phase.cpu.get("postgres", 0.0) / durable * 1e6
    rows.append(["postgres", "all PostgreSQL processes (from /proc)", "—", f"{pg:,.1f}"])
    report.table(["process", "stage", "share of samples", "µs per stored span"], rows)


KEY_FUNCTIONS = (
    r"\((span_batch_process|_batch_claim|_batch_spans|decode_request|map_spans|spans_write|_priced|trace_spans"
    r"|trajectory_view_build|signals_compute|span_row|_trajectory_values|_trajectories_insert"
    r"|_trajectories_update|_trajectories_reassemble|_prompt_versions|ingest_otlp_accept|turn)\)"
    r"|\(write_row\)|\(commit\)"
)


def _cumulative(profiler: cProfile.Profile) -> str:
    output = io.StringIO()
    stats = pstats.Stats(profiler, stream=output)
    stats.sort_stats("cumulative").print_stats(KEY_FUNCTIONS)
    lines = [line for line in output.getvalue().splitlines() if line.strip()]
    start = next((i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls")), 0)
    return "\n".join(lines[start:])


def batch_profile(report: Report, fresh_body: Callable[[int], bytes], repeat: int = 5) -> None:
    """The web's code path for an OTLP request in this process, one request at a time, no contention.

    Precondition: Django is set up for the ingest benchmark's database, which has one ingest key, and
    Keel's own processes are not running yet.
    """
    from agent_registry.models import ApiKey
    from tracing import otlp, services

    api_key = ApiKey.objects.select_related("workspace").get()
    timings: list[tuple[float, float]] = []
    spans = 0
    profiler = cProfile.Profile()
    for number in range(repeat + 1):
        body = fresh_body(number)  # new trace ids each time: a repeated body would store nothing
        started, cpu_started = time.perf_counter(), time.process_time()
        if number == repeat:
            profiler.enable()
        accepted = services.ingest_otlp_accept(
            api_key=api_key, body=body, content_type=otlp.CONTENT_TYPE_PROTOBUF, content_encoding=""
        )
        if number == repeat:
            profiler.disable()
        elif number > 0:  # the first one pays for imports and caches
            timings.append((time.perf_counter() - started, time.process_time() - cpu_started))
        assert accepted.batch_id is None, "the request was kept as a batch: writing it failed (see the log)"
        spans = accepted.accepted_spans
    wall = sum(w for w, _ in timings) / len(timings)
    cpu = sum(c for _, c in timings) / len(timings)
    report.line(
        f"One process, no contention, {spans} spans per request ({len(timings)} requests): "
        f"`services.ingest_otlp_accept` (the web's work: decode, map, write, commit) {wall * 1000:.0f} ms wall / "
        f"{cpu * 1000:.0f} ms Python CPU per request = **{spans / wall:,.0f} spans/s per thread** "
        f"({wall / spans * 1e6:.0f} µs/span, of which {cpu / spans * 1e6:.0f} µs Python CPU; the rest is "
        "waiting for PostgreSQL). cProfile of one request, cumulative time of the pipeline's stages:"
    )
    report.line()
    report.code(_cumulative(profiler).replace(str(BASE_DIR) + "/", ""))


# Single-column indexes that Django's ForeignKey adds and that a composite index already covers
# (workspace_id leads span_unique_per_trace, trajectory_recent and trajectory_agent_recent), or that
# index a column that is almost always NULL (prompt_version_id) and serves only ON DELETE SET NULL.
REDUNDANT_INDEXES = (
    ("tracing_span", "tracing_span_workspace_id_%"),
    ("tracing_span", "tracing_span_prompt_version_id_%"),
    ("tracing_trajectory", "tracing_trajectory_workspace_id_%"),
    ("tracing_trajectory", "tracing_trajectory_agent_id_%"),
)


def index_experiment(report: Report, fresh_body: Callable[[int], bytes], batches: int = 40) -> None:
    """spans_write (the worker's write half) with the indexes as migrated, without the redundant ones,
    and as migrated again (A-B-A, so drift shows); the indexes are put back before the benchmark goes on.

    Precondition: as batch_profile.
    """
    from django.db import connection, transaction

    from agent_registry.models import ApiKey
    from bench import stack
    from tracing import otlp, services

    api_key = ApiKey.objects.select_related("workspace").get()
    postmaster = stack.postmaster_pid()

    def decoded(offset: int) -> list[list[otlp.Span]]:
        return [
            otlp.decode_and_map(fresh_body(offset + number), otlp.CONTENT_TYPE_PROTOBUF, None)[0]
            for number in range(batches)
        ]

    def measure(label: str, work: list[list[otlp.Span]]) -> list[str]:
        pg_before = stack.cpu_seconds(stack.process_tree(postmaster)) if postmaster else 0.0
        started, cpu_started = time.perf_counter(), time.process_time()
        spans = 0
        for batch in work:
            with transaction.atomic():
                spans += services.spans_write(workspace=api_key.workspace, api_key=api_key, spans=batch)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        pg = (stack.cpu_seconds(stack.process_tree(postmaster)) - pg_before) if postmaster else 0.0
        return [
            label,
            f"{spans / wall:,.0f}",
            f"{wall / spans * 1e6:.0f} µs",
            f"{cpu / spans * 1e6:.0f} µs",
            f"{pg / spans * 1e6:.0f} µs",
        ]

    with connection.cursor() as cursor:
        definitions: list[tuple[str, str]] = []
        for table, pattern in REDUNDANT_INDEXES:
            cursor.execute(
                "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s AND indexname LIKE %s",
                [table, pattern],
            )
            definitions += [(str(name), str(definition)) for name, definition in cursor.fetchall()]
    rows = [measure("indexes as migrated", decoded(10_000))]
    with connection.cursor() as cursor:
        for name, _ in definitions:
            cursor.execute(f'DROP INDEX "{name}"')
    try:
        rows.append(measure(f"without {len(definitions)} redundant indexes", decoded(20_000)))
    finally:
        with connection.cursor() as cursor:
            for _, definition in definitions:
                cursor.execute(definition)
    rows.append(measure("indexes as migrated (again)", decoded(30_000)))
    report.line(
        f"`services.spans_write` alone (decoded and mapped beforehand; {batches} batches of 500 spans each, "
        f"one transaction per batch, one process): the indexes dropped in the middle run are "
        f"{', '.join(name for name, _ in definitions)}."
    )
    report.line()
    report.table(["indexes", "spans/s", "wall per span", "Python CPU per span", "PostgreSQL CPU per span"], rows)
