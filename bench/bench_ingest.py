"""Sustained OTLP/protobuf ingest: Keel against Arize Phoenix, on one machine, in the same run.

    python -m bench.bench_ingest [--duration 60] [--rate 20000] [--quick] [--no-phoenix] [--profile]

What runs (all on this machine, which has 2 cores):
- PostgreSQL: the benchmarks' own embedded server (var/bench/pg; never the shared var/pg), a fresh
  database for Keel (`keel_bench_ingest`) and one for Phoenix (`phoenix_bench`).
- Keel: gunicorn (2 workers × 4 threads) and a Celery worker (prefork, 2) as `make run` starts them,
  on a broker directory of the benchmark's own; a workspace and an `ingest` key created with
  agent_registry.services. The web processes store each OTLP request before answering it (at most
  KEEL_INGEST_CONCURRENCY at a time each); the worker only stores a request that failed there.
- Phoenix: `phoenix serve` from its own virtualenv (var/bench/phoenix-venv, see bench/phoenix.py),
  with PHOENIX_SQL_DATABASE_URL on the same server, telemetry and external resources off.
- Load: 2 generator processes × 4 threads (8 keep-alive connections) POST pre-built request bodies
  (bench/workload.py: 50 trajectories × 10 spans = 500 spans, ~0.85 MB, new trace ids each time) to
  `/v1/traces` at an offered rate; a 429/503 is retried after its Retry-After (1 s when absent).

Phases per system:
1. `target`: the issue's target rate (20,000 spans/s offered) for `--duration` seconds. Durable
   spans/s = rows in the span table counted at the start and the end of the steady-state window
   (after `--warmup`), divided by its length. Counted are the rows above the table's highest id when
   the phase began, as the phase goes (`DurableCount`: each count reads only the newest rows, and one
   count of all of them checks it after the drain). Then the backlog (acknowledged − stored), and how
   long it takes to drain.
2. `capacity`, only when the system kept up with the target (its backlog drained): 150 % of the
   target rate (`--capacity-share`) for `--duration`. A system that keeps up stores what is offered,
   so the target phase can show at most the target; this phase shows how far past it the system goes.
3. `sustainable`: 80 % of what the phases before showed the system can store (their highest durable
   rate, or the rate at which the target phase's backlog drained once the load stopped, whichever is
   higher), for half the duration: the time from acknowledgement to queryable at a load the system
   keeps up with.
Time to queryable: 3 trajectories of every acknowledged request (the first, middle and last) are
polled every `--poll` seconds (0.1) until the trajectory has all its 10 spans in the database
(Keel: its `tracing_trajectory` row with span_count ≥ 10 and 10 `tracing_span` rows; Phoenix: its
`traces` row with 10 `spans` rows). Latency = start of the poll that saw it − time the client
received the acknowledgement, so figures are late by up to one poll interval plus the query time.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import math
import multiprocessing
import os
import queue
import shutil
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.synchronize import Event as EventType
from pathlib import Path
from typing import Any

from bench import phoenix, stack
from bench.harness import VAR_DIR, Report, load_average, percentile
from bench.workload import TRAJECTORIES_PER_REQUEST, Template, templates_build

SPANS_PER_TRAJECTORY = 10
TARGET_SPANS_PER_SECOND = 20_000
TARGET_P99_SECONDS = 2.0
SAMPLES_PER_REQUEST = (0, TRAJECTORIES_PER_REQUEST // 2, TRAJECTORIES_PER_REQUEST - 1)
KEEL_DATABASE = "keel_bench_ingest"
PHOENIX_DATABASE = "phoenix_bench"
PROFILE_DIR = VAR_DIR / "profile"

KEEL_QUERYABLE = (
    "SELECT t.trace_id FROM tracing_trajectory t WHERE t.workspace_id = %s AND t.trace_id = ANY(%s) "
    "AND t.span_count >= 10 AND (SELECT count(*) FROM tracing_span s "
    "WHERE s.workspace_id = t.workspace_id AND s.trace_id = t.trace_id) >= 10"
)
PHOENIX_QUERYABLE = (
    "SELECT t.trace_id FROM traces t WHERE t.trace_id = ANY(%s) "
    "AND (SELECT count(*) FROM spans s WHERE s.trace_rowid = t.id) >= 10"
)


@dataclass(frozen=True)
class Options:
    duration: float
    warmup: float
    rate: float
    # The capacity phase offers rate × capacity_share (none when it is 1 or less: _capacity_rate).
    capacity_share: float
    sustainable_share: float
    connections: int
    processes: int
    poll: float
    drain_timeout: float
    templates: int
    phoenix: bool
    profile: bool
    # Settings given to Keel's processes on top of the defaults (e.g. KEEL_INGEST_BACKLOG_SPANS).
    keel_settings: tuple[tuple[str, str], ...] = ()


@dataclass
class Target:
    """A system under load: where to send, how to count what it stored, which processes are its own."""

    name: str
    port: int
    path: str
    headers: dict[str, str]
    database: stack.Database
    # The span table (its ids come from a sequence): what a phase stored is counted there (DurableCount).
    span_table: str
    queryable_sql: str
    queryable_prefix: tuple[Any, ...]
    process_groups: Callable[[], dict[str, list[int]]]
    backlog_sql: str | None = None


# --- Load generation (runs in its own processes) -----------------------------------------------------


def _load_process(
    port: int,
    path: str,
    headers: dict[str, str],
    templates: list[Template],
    spans_per_second: float,
    start_at: float,
    duration: float,
    threads: int,
    samples: queue.Queue[tuple[str, float]],
    results: queue.Queue[dict[str, Any]],
) -> None:
    lock = threading.Lock()
    stats: dict[str, Any] = {
        "new_requests": 0,
        "new_spans": 0,
        "attempts": 0,
        "retries": 0,
        "acked_requests": 0,
        "acked_spans": 0,
        "given_up_spans": 0,
        "errors": 0,
        "status": Counter(),
        "request_seconds": [],
        "acks": [],
    }
    spans_per_request = templates[0].spans
    interval = spans_per_request / spans_per_second if spans_per_second > 0 else 0.0
    end_at = start_at + duration
    slot = [0]

    def next_slot() -> float | None:
        with lock:
            when = start_at + slot[0] * interval
            slot[0] += 1
        return when if when < end_at else None

    def worker(number: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        turn = number
        while True:
            when = next_slot()
            if when is None or time.time() >= end_at:
                break
            delay = when - time.time()
            if delay > 0:
                time.sleep(delay)
            template = templates[turn % len(templates)]
            turn += threads
            body, trace_ids = template.fresh()
            with lock:
                stats["new_requests"] += 1
                stats["new_spans"] += spans_per_request
            reconnected = False
            while True:
                sent = time.time()
                try:
                    connection.request("POST", path, body=body, headers=headers)
                    response = connection.getresponse()
                    response.read()
                    status = response.status
                    retry_after = response.getheader("Retry-After")
                except (OSError, http.client.HTTPException):
                    connection.close()
                    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
                    if not reconnected:
                        # The server closed an idle keep-alive connection (gunicorn after 2 s): as any
                        # HTTP client does, send again at once on a new connection.
                        reconnected = True
                        continue
                    status, retry_after = -1, None
                received = time.time()
                with lock:
                    stats["attempts"] += 1
                    stats["status"][status] += 1
                if 200 <= status < 300:
                    with lock:
                        stats["acked_requests"] += 1
                        stats["acked_spans"] += spans_per_request
                        stats["request_seconds"].append(received - sent)
                        stats["acks"].append(received)
                    for index in SAMPLES_PER_REQUEST:
                        samples.put((trace_ids[index], received))
                    break
                if status in (429, 503) or status == -1:
                    wait = 1.0
                    if retry_after and retry_after.strip().isdigit():
                        wait = float(retry_after.strip())
                    if status == -1:
                        with lock:
                            stats["errors"] += 1
                    if received + wait >= end_at:
                        with lock:
                            stats["given_up_spans"] += spans_per_request
                        break
                    time.sleep(wait)
                    with lock:
                        stats["retries"] += 1
                    continue
                with lock:  # 4xx other than 429: the body is refused for good
                    stats["given_up_spans"] += spans_per_request
                break
        connection.close()

    pool = [threading.Thread(target=worker, args=(number,), daemon=True) for number in range(threads)]
    delay = start_at - time.time()
    if delay > 0:
        time.sleep(delay)
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    stats["status"] = dict(stats["status"])
    results.put(stats)


def _latency_poller(
    conninfo: str,
    sql: str,
    prefix: tuple[Any, ...],
    samples: queue.Queue[tuple[str, float]],
    results: queue.Queue[dict[str, Any]],
    stop: EventType,
    interval: float,
) -> None:
    """Poll the database for sampled trajectories until `stop` is set and nothing is pending (or 10 s)."""
    import psycopg

    pending: dict[str, float] = {}
    latencies: list[float] = []
    query_seconds: list[float] = []
    stop_seen: float | None = None
    # Never prepared: psycopg prepares a query on its 5th run, and the generic plan PostgreSQL then kept,
    # made while the table was nearly empty and never analyzed, read every trajectory of the workspace by
    # its index and compared its trace id with each one polled for, 10 times a second: a fifth of
    # PostgreSQL's CPU in the target phase (perf), charged to the system under test.
    with psycopg.connect(conninfo, autocommit=True, prepare_threshold=None) as connection:
        while True:
            with contextlib.suppress(queue.Empty):
                while True:
                    trace_id, acked = samples.get_nowait()
                    pending[trace_id] = acked
            if stop.is_set():
                stop_seen = stop_seen or time.time()
                if not pending or time.time() - stop_seen > 10:
                    break
            started = time.time()
            if pending:
                rows = connection.execute(sql, [*prefix, list(pending)]).fetchall()
                query_seconds.append(time.time() - started)
                for (trace_id,) in rows:
                    acked = pending.pop(trace_id)
                    latencies.append(max(0.0, started - acked))
            time.sleep(max(0.0, interval - (time.time() - started)))
    results.put({"latencies": latencies, "never_seen": len(pending), "query_seconds": query_seconds})


# --- Phases ------------------------------------------------------------------------------------------


@dataclass
class Phase:
    system: str
    label: str
    offered_rate_target: float
    load_seconds: float
    window_seconds: float = 0.0
    new_spans: int = 0
    acked_spans: int = 0
    acked_in_window: int = 0
    retries: int = 0
    given_up_spans: int = 0
    errors: int = 0
    status: dict[int, int] = field(default_factory=dict)
    durable_window: int = 0
    durable_at_end: int = 0
    backlog_at_end: int = 0
    backlog_batches_note: str = ""
    drain_seconds: float | None = None
    drained: bool = False
    # Spans stored per second while draining: the worker's rate with no requests to answer.
    drain_rate: float = math.nan
    latencies: list[float] = field(default_factory=list)
    never_seen: int = 0
    poll_query_ms_p50: float = math.nan
    request_seconds: list[float] = field(default_factory=list)
    cpu: dict[str, float] = field(default_factory=dict)
    timeline: list[tuple[float, int]] = field(default_factory=list)
    # After the drain: the phase's stored spans as DurableCount counted them, and one count of all its rows.
    count_check: tuple[int, int] = (0, 0)
    load: str = ""
    note: str = ""

    @property
    def offered(self) -> float:
        return self.new_spans / self.load_seconds

    @property
    def acked(self) -> float:
        return self.acked_spans / self.load_seconds

    @property
    def durable(self) -> float:
        return self.durable_window / self.window_seconds if self.window_seconds else math.nan


def _number(target: Target, sql: str, params: Sequence[Any] = ()) -> int:
    """The one number `sql` answers in the target's database (0 for none, as max() of an empty table)."""
    import psycopg

    with psycopg.connect(target.database.conninfo(), autocommit=True) as connection:
        row = connection.execute(sql, params).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def _high_water(target: Target) -> int:
    return _number(target, f"SELECT max(id) FROM {target.span_table}")


# One statement, so one snapshot: the rows above `low`, those above `floor`, those of them up to `band`, the
# highest id, and the snapshot's bounds (every transaction id below xmin has ended; none from xmax on had
# begun).
_DURABLE_SQL = (
    "SELECT count(*), count(*) FILTER (WHERE id > %(floor)s), "
    "count(*) FILTER (WHERE id > %(floor)s AND id <= %(band)s), coalesce(max(id), %(floor)s), "
    "txid_snapshot_xmin(txid_current_snapshot()), txid_snapshot_xmax(txid_current_snapshot()) "
    "FROM {table} WHERE id > %(low)s"
)


class DurableCount:
    """The spans a phase stored: the rows above the span table's highest id when it began (`mark`; ids come
    from the table's sequence, so every span stored after the mark is above it, and a transaction still open
    at the mark holds ids below it, for spans sent before the phase).

    Each count used to read every row above the mark, every 5 s of the window: 0.79 s, with two parallel
    workers, for 700,000 of Keel's 2.4 KB span rows, and 19 % of PostgreSQL's busy time in a one-minute
    run, charged to the system under test with the pages its scans read and wrote (bench/RESULTS.md,
    2026-11-30). Now a count reads only the rows above `floor`, and adds `settled`, the rows from the mark
    to the floor, which were counted once and can no longer change.

    The floor moves up to the previous count's highest id once every transaction that held a transaction
    id at the previous count has ended (this count's xmin is at or past that count's xmax). Each id up to
    that highest was taken before the previous count, by a writer that already held its transaction id: the
    trajectory or trace row each system writes first in the transaction, before its spans. Such a
    transaction has now committed or rolled back, so no row of those ids can appear any more.
    `verified` counts every row above the mark in the same snapshot as the floor's count, as the old count
    did, and says whether the two agree: a row that appeared below the floor after all would be missing
    from every count since, and from the last."""

    def __init__(self, conninfo: str, table: str, mark: int) -> None:
        self.conninfo = conninfo
        self.sql = _DURABLE_SQL.format(table=table)
        self.mark = mark
        self.floor = mark
        self.settled = 0
        self._previous: tuple[int, int] | None = None  # (highest id, xmax) of the previous count

    def _read(self, low: int) -> tuple[int, int]:
        import psycopg

        band, xmax_before = self._previous if self._previous is not None else (self.floor, 0)
        with psycopg.connect(self.conninfo, autocommit=True) as connection:
            # By the primary key: on a table without statistics yet, the planner takes `id > x` for a third of
            # the rows, and read the whole table with two parallel workers to count the newest rows.
            connection.execute("SET enable_seqscan = off")
            connection.execute("SET max_parallel_workers_per_gather = 0")
            row = connection.execute(self.sql, {"low": low, "floor": self.floor, "band": band}).fetchone()
        assert row is not None
        everything, above_floor, in_band, highest, xmin, xmax = (int(value) for value in row)
        count = self.settled + above_floor
        if self._previous is not None and xmin >= xmax_before:
            self.settled += in_band
            self.floor = band
        self._previous = (highest, xmax)
        return count, everything

    def __call__(self) -> int:
        """How many spans the phase has stored so far."""
        return self._read(self.floor)[0]

    def verified(self) -> tuple[int, int]:
        """This count and one of every row above the mark, in one snapshot."""
        return self._read(self.mark)


def _backlog_note(target: Target) -> str:
    if not target.backlog_sql:
        return ""
    import psycopg

    with psycopg.connect(target.database.conninfo(), autocommit=True) as connection:
        row = connection.execute(target.backlog_sql).fetchone()
    return f"{row[0]} batches / {row[1] or 0} spans unfinished" if row else ""


def _cpu_snapshot(groups: dict[str, list[int]]) -> dict[str, float]:
    return {name: stack.cpu_seconds(pids) for name, pids in groups.items()}


def _profile_start(target: Target, seconds: float) -> list[subprocess.Popen[bytes]]:
    """py-spy on Keel's web and worker process trees (raw collapsed stacks, 100 Hz, on-CPU only)."""
    py_spy = shutil.which("py-spy", path=str(stack.BIN)) or shutil.which("py-spy")
    if py_spy is None:
        print("py-spy is not installed (.venv/bin/pip install py-spy); no profile", flush=True)
        return []
    PROFILE_DIR.mkdir(parents=True, exist_ok=True)
    groups = target.process_groups()
    started = []
    for name in ("web", "worker"):
        output = PROFILE_DIR / f"keel-{name}.txt"
        started.append(
            subprocess.Popen(
                [
                    py_spy,
                    "record",
                    "--pid",
                    str(groups[name][0]),
                    "--subprocesses",
                    "--format",
                    "raw",
                    "--rate",
                    "100",
                    "--duration",
                    str(max(1, int(seconds))),
                    "--nonblocking",
                    "--output",
                    str(output),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    return started


def phase_run(
    target: Target,
    label: str,
    rate: float,
    duration: float,
    options: Options,
    templates: list[Template],
    profile: bool = False,
) -> Phase:
    context = multiprocessing.get_context("spawn")
    samples: multiprocessing.Queue[tuple[str, float]] = context.Queue()
    load_results: multiprocessing.Queue[dict[str, Any]] = context.Queue()
    poll_results: multiprocessing.Queue[dict[str, Any]] = context.Queue()
    stop = context.Event()
    poller = context.Process(
        target=_latency_poller,
        args=(
            target.database.conninfo(),
            target.queryable_sql,
            target.queryable_prefix,
            samples,
            poll_results,
            stop,
            options.poll,
        ),
        daemon=True,
    )
    poller.start()
    start_at = time.time() + 4.0
    generators = []
    for number in range(options.processes):
        mine = templates[number :: options.processes] or templates
        generator = context.Process(
            target=_load_process,
            args=(
                target.port,
                target.path,
                target.headers,
                mine,
                rate / options.processes,
                start_at,
                duration,
                max(1, options.connections // options.processes),
                samples,
                load_results,
            ),
            daemon=True,
        )
        generator.start()
        generators.append(generator)

    phase = Phase(system=target.name, label=label, offered_rate_target=rate, load_seconds=duration)
    # taken before this phase's first request (its load starts at start_at)
    stored_count = DurableCount(target.database.conninfo(), target.span_table, _high_water(target))
    baseline = stored_count()  # 0 unless a write of the phase before landed since
    warmup = min(options.warmup, duration / 3)
    window_start, end_at = start_at + warmup, start_at + duration
    groups: dict[str, list[int]] = {}
    cpu_before: dict[str, float] = {}
    durable_start = 0
    profilers: list[subprocess.Popen[bytes]] = []
    while time.time() < window_start:
        time.sleep(0.05)
    groups = target.process_groups()
    groups["load generator"] = [pid for generator in generators if (pid := generator.pid) is not None]
    groups["latency poller"] = [poller.pid] if poller.pid is not None else []
    cpu_before = _cpu_snapshot(groups)
    window_started = time.time()
    durable_start = stored_count()
    phase.timeline.append((window_started - start_at, durable_start))
    if profile:
        profilers = _profile_start(target, end_at - time.time() - 1)
    while time.time() < end_at - 0.5:
        # Every 5 s: each count reads the rows stored since the one before last (DurableCount).
        time.sleep(min(5.0, max(0.0, end_at - 0.5 - time.time())))
        if time.time() < end_at - 0.5:
            phase.timeline.append((time.time() - start_at, stored_count()))
    while time.time() < end_at:
        time.sleep(0.01)
    window_ended = time.time()
    durable_end = stored_count()
    cpu_after = _cpu_snapshot(groups)
    phase.window_seconds = window_ended - window_started
    phase.durable_window = durable_end - durable_start
    phase.timeline.append((window_ended - start_at, durable_end))
    phase.cpu = {name: cpu_after[name] - cpu_before[name] for name in groups}
    phase.load = load_average()
    for profiler in profilers:
        with contextlib.suppress(subprocess.TimeoutExpired):
            profiler.wait(timeout=30)

    acks: list[float] = []
    for _ in generators:
        result = load_results.get(timeout=300)
        phase.new_spans += result["new_spans"]
        phase.acked_spans += result["acked_spans"]
        phase.retries += result["retries"]
        phase.given_up_spans += result["given_up_spans"]
        phase.errors += result["errors"]
        phase.request_seconds += result["request_seconds"]
        acks += result["acks"]
        for status, count in result["status"].items():
            phase.status[int(status)] = phase.status.get(int(status), 0) + count
    for generator in generators:
        generator.join(timeout=30)
    spans_per_request = templates[0].spans
    phase.acked_in_window = spans_per_request * sum(1 for ack in acks if window_started <= ack <= window_ended)

    phase.durable_at_end = stored_count()
    phase.backlog_at_end = max(0, phase.acked_spans - (phase.durable_at_end - baseline))
    phase.backlog_batches_note = _backlog_note(target)
    drain_started = time.time()
    stored = last_count = phase.durable_at_end - baseline
    last_progress = drain_started
    while True:
        stored = stored_count() - baseline
        if stored >= phase.acked_spans:
            phase.drained = True
            break
        now = time.time()
        if stored > last_count:
            last_progress, last_count = now, stored
        if now - drain_started > options.drain_timeout or now - last_progress > 120:
            break
        time.sleep(1.0)
    phase.drain_seconds = time.time() - drain_started
    if phase.drain_seconds > 5:
        phase.drain_rate = (stored - (phase.durable_at_end - baseline)) / phase.drain_seconds
    phase.count_check = stored_count.verified()
    stop.set()
    polled = poll_results.get(timeout=120)
    poller.join(timeout=30)
    phase.latencies = polled["latencies"]
    phase.never_seen = polled["never_seen"]
    phase.poll_query_ms_p50 = percentile(polled["query_seconds"], 0.5) * 1000
    return phase


def _capacity_rate(options: Options) -> float | None:
    """The capacity phase's offered rate; None when there is none (a share of 1 or less, or no target rate)."""
    if options.rate <= 0 or options.capacity_share <= 1:
        return None
    return options.rate * options.capacity_share


def phases_run(
    start: Callable[[], contextlib.AbstractContextManager[Target]], options: Options, templates: list[Template]
) -> list[Phase]:
    """The target phase; the capacity phase if the system kept up with the target; then the sustainable
    one. When the last phase's backlog did not drain, the system is started again on a fresh database
    first (Phoenix's queue is in memory: it loses it)."""
    with start() as target:
        print(f"[{target.name}] target: {options.rate:,.0f} spans/s offered for {options.duration:.0f} s", flush=True)
        phases = [phase_run(target, "target", options.rate, options.duration, options, templates, options.profile)]
        _phase_print(phases[0])
        rate = _capacity_rate(options)
        if phases[0].drained and rate is not None:
            print(f"[{target.name}] capacity: {rate:,.0f} spans/s offered for {options.duration:.0f} s", flush=True)
            phases.append(phase_run(target, "capacity", rate, options.duration, options, templates))
            _phase_print(phases[-1])
        # What the system stores with the web busy (durable) or idle (drain rate), whichever is higher.
        capacity = max(phase.durable for phase in phases)
        if not math.isnan(phases[0].drain_rate):
            capacity = max(capacity, phases[0].drain_rate)
        sustainable = max(capacity * options.sustainable_share, 50.0)
        duration = max(10.0, options.duration / 2)
        kept_up = phases[-1].drained
        if kept_up:
            print(f"[{target.name}] sustainable: {sustainable:,.0f} spans/s offered", flush=True)
            phases.append(phase_run(target, "sustainable", sustainable, duration, options, templates))
    if not kept_up:
        with start() as target:
            print(f"[{target.name}] sustainable (restarted): {sustainable:,.0f} spans/s offered", flush=True)
            phases.append(phase_run(target, "sustainable", sustainable, duration, options, templates))
            phases[-1].note = f"restarted on a fresh database: the {phases[-2].label} phase's backlog had not drained"
    _phase_print(phases[-1])
    return phases


def _phase_print(phase: Phase) -> None:
    print(
        f"[{phase.system}/{phase.label}] offered {phase.offered:,.0f}/s acked {phase.acked:,.0f}/s "
        f"durable {phase.durable:,.0f}/s backlog {phase.backlog_at_end:,} drain {phase.drain_seconds or 0:.1f}s "
        f"p50 {percentile(phase.latencies, 0.5):.2f}s p99 {percentile(phase.latencies, 0.99):.2f}s "
        f"status {phase.status} load {phase.load}",
        flush=True,
    )


# --- Systems -----------------------------------------------------------------------------------------


def _keel_prepare(environment: dict[str, str]) -> tuple[str, int]:
    """Migrate the fresh database, create a user, a workspace and an ingest key; returns (key, workspace id)."""
    stack.keel_migrate(environment)
    stack.django_setup(environment)
    from django.db import connections

    from agent_registry import services
    from agent_registry.models import Scope, User

    owner = User.objects.create_user(username="bench-owner", password=None)
    workspace = services.workspace_create(slug="bench", name="Benchmark", owner=owner)
    _, raw_key = services.apikey_create(workspace=workspace, name="bench ingest", scopes=[Scope.INGEST, Scope.READ])
    workspace_id = workspace.pk
    connections.close_all()
    return raw_key, workspace_id


def keel_target(database: stack.Database, port: int, key: str, workspace_id: int, processes: stack.Processes) -> Target:
    def groups() -> dict[str, list[int]]:
        postmaster = stack.postmaster_pid()
        return {
            "web": stack.process_tree(processes.pid("web")),
            "worker": stack.process_tree(processes.pid("worker")),
            "postgres": stack.process_tree(postmaster) if postmaster else [],
        }

    return Target(
        name="Keel",
        port=port,
        path="/v1/traces",
        headers={"Content-Type": "application/x-protobuf", "Authorization": f"Bearer {key}"},
        database=database,
        span_table="tracing_span",
        queryable_sql=KEEL_QUERYABLE,
        queryable_prefix=(workspace_id,),
        process_groups=groups,
        backlog_sql=(
            "SELECT count(*), sum(span_count) FROM tracing_ingestbatch WHERE status IN ('pending', 'processing')"
        ),
    )


def phoenix_target(database: stack.Database, port: int, processes: stack.Processes) -> Target:
    def groups() -> dict[str, list[int]]:
        postmaster = stack.postmaster_pid()
        return {
            "phoenix": stack.process_tree(processes.pid("phoenix")),
            "postgres": stack.process_tree(postmaster) if postmaster else [],
        }

    return Target(
        name="Phoenix",
        port=port,
        path="/v1/traces",
        headers={"Content-Type": "application/x-protobuf"},
        database=database,
        span_table="spans",
        queryable_sql=PHOENIX_QUERYABLE,
        queryable_prefix=(),
        process_groups=groups,
    )


def keel_run(options: Options, templates: list[Template], profile_report: Report | None = None) -> list[Phase]:
    starts = [0]

    @contextlib.contextmanager
    def start() -> Iterator[Target]:
        database = stack.database_fresh(KEEL_DATABASE)
        environment = stack.keel_environment(database, VAR_DIR / "broker-ingest")
        environment.update(dict(options.keel_settings))
        key, workspace_id = _keel_prepare(environment)
        if profile_report is not None and starts[0] == 0:
            _profile_in_process(profile_report, templates)
        starts[0] += 1
        port = stack.free_port()
        with stack.keel_running(environment, port, tag="ingest") as processes:
            yield keel_target(database, port, key, workspace_id, processes)

    return phases_run(start, options, templates)


def _profile_in_process(profile_report: Report, templates: list[Template]) -> None:
    from django.db import connections

    from bench import profile

    def fresh_body(number: int) -> bytes:
        return templates[number % len(templates)].fresh()[0]

    profile.batch_profile(profile_report, fresh_body)
    profile.index_experiment(profile_report, fresh_body)
    connections.close_all()


def phoenix_run(options: Options, templates: list[Template]) -> list[Phase]:
    @contextlib.contextmanager
    def start() -> Iterator[Target]:
        database = stack.database_fresh(PHOENIX_DATABASE)
        port = stack.free_port()
        with phoenix.running(database, port) as processes:
            yield phoenix_target(database, port, processes)

    return phases_run(start, options, templates)


# --- Report ------------------------------------------------------------------------------------------


def _seconds(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:.2f} s"


def _rate(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:,.0f}"


def _ratio(keel: float, peer: float) -> str:
    if math.isnan(keel) or math.isnan(peer) or peer <= 0:
        return "—"
    return f"{keel / peer:,.1f}×"


def _drain_text(phase: Phase) -> str:
    if phase.drain_seconds is None:
        return "—"
    if phase.drained:
        return f"{phase.drain_seconds:.0f} s"
    stored = phase.drain_rate * phase.drain_seconds if not math.isnan(phase.drain_rate) else 0.0
    left = phase.backlog_at_end - stored
    estimate = f" (≈ {left / phase.drain_rate:,.0f} s more at that rate)" if phase.drain_rate > 0 else ""
    return f"not drained after {phase.drain_seconds:.0f} s{estimate}"


def _status_text(status: dict[int, int]) -> str:
    names = {-1: "conn. error"}
    return ", ".join(f"{names.get(code, code)}: {count}" for code, count in sorted(status.items()))


def _phases_of(phases: Sequence[Phase], system: str, labels: Collection[str]) -> list[Phase]:
    return [phase for phase in phases if phase.system == system and phase.label in labels]


def _most_durable(phases: Sequence[Phase], system: str) -> Phase | None:
    """The phase under load (target or capacity) in which `system` stored the most spans per second."""
    return max(_phases_of(phases, system, ("target", "capacity")), key=lambda phase: phase.durable, default=None)


def _verdict(phases: Sequence[Phase]) -> str:
    """Keel's figures against the issue's targets: its highest durable rate under load, and its worst ack→queryable
    p99 at a load it keeps up with (the target's and the sustainable one)."""
    most = _most_durable(phases, "Keel")
    kept_up = _phases_of(phases, "Keel", ("target", "sustainable"))
    if most is None or not kept_up:
        return ""
    p99, worst = max((percentile(phase.latencies, 0.99), phase.label) for phase in kept_up)
    durable_verdict = "meets" if most.durable >= TARGET_SPANS_PER_SECOND else "**below**"
    p99_verdict = "meets" if p99 <= TARGET_P99_SECONDS else "**above**"
    return (
        f"Against the issue's targets: Keel stored **{_rate(most.durable)} durable spans/s** at the most (its "
        f"{most.label} phase, {_rate(most.offered)} offered): {durable_verdict} ≥ {TARGET_SPANS_PER_SECOND:,}. "
        f"Its ack→queryable p99 was at worst **{_seconds(p99)}** ({worst} phase): {p99_verdict} "
        f"≤ {TARGET_P99_SECONDS:.0f} s."
    )


def _most_row(phases: Sequence[Phase]) -> list[str]:
    keel, peer = _most_durable(phases, "Keel"), _most_durable(phases, "Phoenix")
    keel_rate = keel.durable if keel else math.nan
    peer_rate = peer.durable if peer else math.nan
    return [
        "durable spans/s at the most (the capacity phase; the target phase for a system that did not keep up)",
        _rate(keel_rate) + (f" ({keel.label})" if keel else ""),
        _rate(peer_rate) + (f" ({peer.label})" if peer else ""),
        _ratio(keel_rate, peer_rate),
    ]


def report_phases(report: Report, phases: Sequence[Phase], options: Options) -> None:
    report.table(
        [
            "system / phase",
            "offered spans/s",
            "acked spans/s",
            "**durable spans/s**",
            "ack→queryable p50",
            "p99",
            "samples (not seen)",
            "responses",
            "backlog at end",
            "drain",
            "spans/s stored while draining",
            "load (1/5/15 min)",
        ],
        [
            [
                f"{phase.system} / {phase.label}" + (f" ({phase.note})" if phase.note else ""),
                _rate(phase.offered),
                _rate(phase.acked),
                f"**{_rate(phase.durable)}**",
                _seconds(percentile(phase.latencies, 0.5)),
                _seconds(percentile(phase.latencies, 0.99)),
                f"{len(phase.latencies)} ({phase.never_seen})",
                _status_text(phase.status),
                f"{phase.backlog_at_end:,} spans"
                + (f" ({phase.backlog_batches_note})" if phase.backlog_batches_note else ""),
                _drain_text(phase),
                _rate(phase.drain_rate),
                phase.load,
            ]
            for phase in phases
        ],
    )
    by_key = {(phase.system, phase.label): phase for phase in phases}
    keel_target_phase, phoenix_target_phase = by_key.get(("Keel", "target")), by_key.get(("Phoenix", "target"))
    if keel_target_phase and phoenix_target_phase:
        keel_sustainable = by_key.get(("Keel", "sustainable"))
        phoenix_sustainable = by_key.get(("Phoenix", "sustainable"))
        rows = [
            [
                "durable spans/s at the target's offered load",
                _rate(keel_target_phase.durable),
                _rate(phoenix_target_phase.durable),
                _ratio(keel_target_phase.durable, phoenix_target_phase.durable),
            ],
            _most_row(phases),
            [
                "spans/s stored while draining the backlog (no requests coming in)",
                _rate(keel_target_phase.drain_rate),
                _rate(phoenix_target_phase.drain_rate),
                _ratio(keel_target_phase.drain_rate, phoenix_target_phase.drain_rate),
            ],
            [
                "acknowledged spans/s at the target's offered load",
                _rate(keel_target_phase.acked),
                _rate(phoenix_target_phase.acked),
                _ratio(keel_target_phase.acked, phoenix_target_phase.acked),
            ],
        ]
        if keel_sustainable and phoenix_sustainable:
            for share, name in ((0.5, "p50"), (0.99, "p99")):
                keel_value = percentile(keel_sustainable.latencies, share)
                peer_value = percentile(phoenix_sustainable.latencies, share)
                rows.append(
                    [
                        f"ack→queryable {name}, sustainable phase (lower is better)",
                        _seconds(keel_value),
                        _seconds(peer_value),
                        _ratio(peer_value, keel_value) + " faster" if keel_value > 0 else "—",
                    ]
                )
        report.table(["Keel / Phoenix", "Keel", "Phoenix", "ratio"], rows)
    cpu_rows = []
    for phase in phases:
        durable = max(1, phase.durable_window)
        total = sum(phase.cpu.values())
        parts = ", ".join(
            f"{name} {seconds / phase.window_seconds * 100:.0f} % ({seconds / durable * 1e6:,.0f} µs/span)"
            for name, seconds in phase.cpu.items()
        )
        cpu_rows.append(
            [
                f"{phase.system} / {phase.label}",
                f"{total / phase.window_seconds * 100:.0f} % of one core",
                f"{total / durable * 1e6:,.0f} µs",
                parts,
            ]
        )
    report.line(
        "CPU in the steady-state window, from /proc (user + system, whole process trees; 200 % = both cores). "
        "µs/span = CPU time / spans stored in the window."
    )
    report.line()
    report.table(["system / phase", "CPU used", "CPU per stored span", "by process"], cpu_rows)
    report.line(
        "Request time (client side, acknowledged requests): "
        + "; ".join(
            f"{phase.system}/{phase.label} p50 {percentile(phase.request_seconds, 0.5) * 1000:,.0f} ms, "
            f"p99 {percentile(phase.request_seconds, 0.99) * 1000:,.0f} ms"
            for phase in phases
            if phase.request_seconds
        )
        + ". Poll query p50: "
        + "; ".join(f"{phase.system}/{phase.label} {phase.poll_query_ms_p50:.0f} ms" for phase in phases)
        + "."
    )
    report.line()
    report.line(
        "Stored rows over time (seconds since load start: rows): "
        + " · ".join(
            f"{phase.system}/{phase.label}: "
            + ", ".join(
                f"{offset:.0f}s {count - phase.timeline[0][1]:,}"
                for offset, count in phase.timeline[:: max(1, len(phase.timeline) // 8)]
            )
            for phase in phases
        )
    )
    report.line()
    verdict = _verdict(phases)
    if verdict:
        report.line(verdict)
        report.line()
    report.line(
        "Durable counts checked after each phase (rows counted as the phase went against one count of all the "
        "phase's rows, in one snapshot): "
        + " · ".join(
            f"{phase.system}/{phase.label} {phase.count_check[0]:,} = {phase.count_check[1]:,}"
            if phase.count_check[0] == phase.count_check[1]
            else f"**{phase.system}/{phase.label} {phase.count_check[0]:,} ≠ {phase.count_check[1]:,}: its "
            "durable figures are not to be trusted**"
            for phase in phases
        )
    )
    report.line()


def run(report: Report, *, quick: bool = False, options: Options | None = None) -> None:
    options = options or options_default(quick)
    capacity_rate = _capacity_rate(options)
    capacity = (
        f"for a system that kept up with it, a capacity phase at {capacity_rate:,.0f} spans/s offered for as long; "
        if capacity_rate is not None
        else ""
    )
    report.line(
        f"Offered load: OTLP/protobuf, {TRAJECTORIES_PER_REQUEST} trajectories × {SPANS_PER_TRAJECTORY} spans "
        f"per request (~0.85 MB), {options.processes} generator processes × "
        f"{options.connections // options.processes} keep-alive connections; target phase "
        f"{options.rate:,.0f} spans/s offered for {options.duration:.0f} s (steady-state window after "
        f"{options.warmup:.0f} s); {capacity}a sustainable phase at "
        f"{options.sustainable_share:.0%} of the highest durable rate before it (or the target phase's drain rate, if "
        f"higher), for {max(10.0, options.duration / 2):.0f} s. Time to queryable: "
        f"{len(SAMPLES_PER_REQUEST)} trajectories per acknowledged request, polled every "
        f"{options.poll * 1000:.0f} ms (resolution: one poll interval + the poll query). "
        f"Issue target: ≥ {TARGET_SPANS_PER_SECOND:,} durable spans/s and p99 ≤ {TARGET_P99_SECONDS:.0f} s."
    )
    report.line()
    if options.keel_settings:
        report.line(
            "Keel's settings changed for this run: " + ", ".join(f"`{k}={v}`" for k, v in options.keel_settings) + "."
        )
        report.line()
    report.line(f"Load average before: {load_average()}")
    report.line()
    started = time.time()
    templates = templates_build(options.templates)
    print(f"built {len(templates)} request bodies in {time.time() - started:.1f} s", flush=True)
    phases: list[Phase] = []
    profile_report = Report("profile") if options.profile else None
    try:
        phases += keel_run(options, templates, profile_report)
        if options.phoenix:
            phases += phoenix_run(options, templates)
    finally:
        stack.server_stop()
    report_phases(report, phases, options)
    if options.phoenix:
        report.line(phoenix.describe())
        report.line()
    if options.profile:
        from bench import profile

        profile.report_profile(report, phases[0], PROFILE_DIR)
        if profile_report is not None:
            report.parts += profile_report.parts


def options_default(quick: bool) -> Options:
    return Options(
        duration=15 if quick else 60,
        warmup=3 if quick else 10,
        rate=TARGET_SPANS_PER_SECOND,
        capacity_share=1.5,
        sustainable_share=0.8,
        connections=8,
        processes=2,
        poll=0.1,
        drain_timeout=60 if quick else 600,
        templates=8 if quick else 16,
        phoenix=True,
        # `python -m bench --profile` asks for it through the environment.
        profile=os.environ.get("BENCH_PROFILE") == "1",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a short run for smoke-testing")
    parser.add_argument("--duration", type=float, help="seconds of load in the target phase (60)")
    parser.add_argument("--rate", type=float, help="offered spans/s in the target phase (20000; 0 = as fast as acked)")
    parser.add_argument(
        "--capacity-share", type=float, help="the capacity phase's offered rate as a multiple of --rate (1.5; 0: none)"
    )
    parser.add_argument("--warmup", type=float, help="seconds before the steady-state window opens (10)")
    parser.add_argument("--connections", type=int, help="keep-alive connections in all (8)")
    parser.add_argument("--drain-timeout", type=float, help="longest wait for the backlog to drain (600 s)")
    parser.add_argument("--poll", type=float, help="seconds between queryability polls (0.1)")
    parser.add_argument("--no-phoenix", action="store_true", help="Keel only")
    parser.add_argument(
        "--keel-setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting for Keel's processes, e.g. KEEL_INGEST_BACKLOG_SPANS=20000 (repeatable)",
    )
    parser.add_argument("--profile", action="store_true", help="py-spy Keel's web and worker in the target phase")
    parser.add_argument("--output", type=Path, help="also write the markdown section here")
    arguments = parser.parse_args()
    options = options_default(arguments.quick)
    overrides = {
        "duration": arguments.duration,
        "rate": arguments.rate,
        "capacity_share": arguments.capacity_share,
        "warmup": arguments.warmup,
        "connections": arguments.connections,
        "drain_timeout": arguments.drain_timeout,
        "poll": arguments.poll,
    }
    values = {**options.__dict__, **{key: value for key, value in overrides.items() if value is not None}}
    values["phoenix"] = not arguments.no_phoenix
    values["profile"] = arguments.profile or options.profile
    values["keel_settings"] = tuple(tuple(item.split("=", 1)) for item in arguments.keel_setting)
    options = Options(**values)
    report = Report("Ingest: sustained OTLP/protobuf, Keel and Arize Phoenix")
    run(report, quick=arguments.quick, options=options)
    if arguments.output:
        arguments.output.write_text(report.markdown())


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
