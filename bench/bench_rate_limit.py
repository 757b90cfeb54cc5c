"""Rate limiting's cost per request (issue 9): the shared PostgreSQL bucket against the per-process one.

    python -m bench --only rate_limit        # appended to bench/RESULTS.md
    python -m bench.bench_rate_limit [--quick]   # prints only

On the benchmarks' own embedded PostgreSQL (var/bench/pg), database `keel_bench_rate_limit`, migrated
fresh. Measured in this process, wall time per call, after a warm-up:
- `ratelimit._db_take`: the UPSERT that refills, takes and answers, on one key (the steady state of a
  busy key: an UPDATE of a hot row), and round-robin over 1,000 keys; autocommit, as a request runs it;
- `ProcessBuckets.take`, the in-memory bucket the hot scopes (ingest, gateway) use;
- for scale, `apikey_authenticate`, the query every keyed request already pays;
- contention: 8 threads, each with its own connection, taking from one key's bucket (they queue on the
  row's lock) and from 8 keys, for a few seconds: takes per second and p50/p95;
- a whole request, `GET /v1/models` through the Django test client (URLconf, middleware, auth, JSON),
  with limits off, with the gateway scope in process memory, and with it in PostgreSQL, interleaved
  request by request so that the shared machine's load falls on the three alike.
The gateway's overhead target is p50 <= 5 ms; the brief's threshold for a shared bucket on a hot path is
0.3 ms per request.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable
from typing import Any

from bench import stack
from bench.harness import VAR_DIR, Report, load_average, percentile

DATABASE = "keel_bench_rate_limit"
THRESHOLD_MS = 0.3
THREADS = 8


def _row(label: str, samples: list[float]) -> list[str]:
    return [
        label,
        f"{len(samples):,}",
        f"{percentile(samples, 0.5) * 1000:.0f} µs",
        f"{percentile(samples, 0.95) * 1000:.0f} µs",
        f"{percentile(samples, 0.99) * 1000:.0f} µs",
    ]


def _contended(keys: list[str], seconds: float) -> tuple[float, list[float]]:
    """THREADS threads taking from `keys` (thread i uses keys[i % len(keys)]) for `seconds`."""
    from django.db import connection

    from agent_registry import ratelimit

    limit = ratelimit.Limit(rate=1e9, burst=1e9)
    samples: list[list[float]] = [[] for _ in range(THREADS)]
    start = threading.Barrier(THREADS + 1)
    deadline = [0.0]

    def work(index: int) -> None:
        key = keys[index % len(keys)]
        start.wait()
        try:
            while time.perf_counter() < deadline[0]:
                began = time.perf_counter()
                ratelimit._db_take(key, limit, time.time())
                samples[index].append((time.perf_counter() - began) * 1000)
        finally:
            connection.close()

    threads = [threading.Thread(target=work, args=(index,)) for index in range(THREADS)]
    for thread in threads:
        thread.start()
    deadline[0] = time.perf_counter() + seconds
    start.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    flat = [value for per_thread in samples for value in per_thread]
    return len(flat) / elapsed, flat


def run(report: Report, *, quick: bool = False) -> None:
    count = 500 if quick else 5_000
    seconds = 1.0 if quick else 5.0
    database = stack.database_fresh(DATABASE)
    environment = stack.keel_environment(database, VAR_DIR / "broker-rate-limit")
    report.line(f"Load average before: {load_average()}")
    report.line()
    try:
        stack.keel_migrate(environment)
        stack.django_setup(environment)
        from django.conf import settings
        from django.test import Client

        from agent_registry import ratelimit, services
        from agent_registry.models import User

        owner = User.objects.create_user(username="bench")
        workspace = services.workspace_create(slug="bench", name="Benchmark", owner=owner)
        _, raw_key = services.apikey_create(workspace=workspace, name="bench", scopes=["gateway"])
        limit = ratelimit.Limit(rate=1e9, burst=1e9)  # never refuses: every call does the whole UPSERT
        keys = [f"bench:{index}" for index in range(1_000)]
        buckets = ratelimit.ProcessBuckets()

        calls: dict[str, Callable[[int], Any]] = {
            "one_key": lambda i: ratelimit._db_take("bench:hot", limit, time.time()),
            "many_keys": lambda i: ratelimit._db_take(keys[i % len(keys)], limit, time.time()),
            "in_memory": lambda i: buckets.take("bench:hot", limit, time.time()),
            "authenticate": lambda i: services.apikey_authenticate(raw_key=raw_key),
        }
        # Interleaved, so that a burst of load on the shared machine falls on every variant alike.
        for index in range(len(keys)):
            for call in calls.values():
                call(index)
        timings: dict[str, list[float]] = {name: [] for name in calls}
        for index in range(count):
            for name, call in calls.items():
                started = time.perf_counter()
                call(index)
                timings[name].append((time.perf_counter() - started) * 1000)
        one_key, many_keys, in_memory, authenticate = (timings[name] for name in calls)
        report.line(f"One call at a time, in this process ({count:,} calls of each, interleaved, after a warm-up):")
        report.line()
        report.table(
            ["what", "calls", "p50", "p95", "p99"],
            [
                _row("PostgreSQL bucket, one key (UPDATE of a hot row)", one_key),
                _row("PostgreSQL bucket, 1,000 keys round-robin", many_keys),
                _row("process bucket (in memory)", in_memory),
                _row("for scale: apikey_authenticate (one SELECT)", authenticate),
            ],
        )

        one_rate, one_samples = _contended(["bench:contended"], seconds)
        spread_rate, spread_samples = _contended([f"bench:spread:{index}" for index in range(THREADS)], seconds)
        report.line(f"{THREADS} threads, each with its own connection, for {seconds:.0f} s:")
        report.line()
        report.table(
            ["buckets", "takes/s", "p50", "p95"],
            [
                [
                    "one key (all on one row)",
                    f"{one_rate:,.0f}",
                    f"{percentile(one_samples, 0.5) * 1000:.0f} µs",
                    f"{percentile(one_samples, 0.95) * 1000:.0f} µs",
                ],
                [
                    f"{THREADS} keys",
                    f"{spread_rate:,.0f}",
                    f"{percentile(spread_samples, 0.5) * 1000:.0f} µs",
                    f"{percentile(spread_samples, 0.95) * 1000:.0f} µs",
                ],
            ],
        )

        client = Client(headers={"Authorization": f"Bearer {raw_key}"}, SERVER_NAME="127.0.0.1")
        generous = {**settings.KEEL_RATE_LIMITS, "gateway": (1_000_000_000, 1_000_000_000)}
        variants: list[tuple[str, bool, list[str]]] = [
            ("limits off", False, []),
            ("gateway bucket in process memory (the default)", True, ["gateway"]),
            ("gateway bucket in PostgreSQL", True, []),
        ]
        requests: dict[str, list[float]] = {label: [] for label, _, _ in variants}

        def request_with(enabled: bool, process_scopes: list[str]) -> float:
            settings.KEEL_RATE_LIMIT_ENABLED = enabled
            settings.KEEL_RATE_LIMITS = generous
            settings.KEEL_RATE_LIMIT_PROCESS_SCOPES = process_scopes
            started = time.perf_counter()
            response = client.get("/v1/models")
            elapsed = (time.perf_counter() - started) * 1000
            if response.status_code != 200:
                raise RuntimeError(f"GET /v1/models answered {response.status_code}")
            return elapsed

        for _ in range(50):
            for _, enabled, process_scopes in variants:
                request_with(enabled, process_scopes)
        for _ in range(count // 5):
            for label, enabled, process_scopes in variants:
                requests[label].append(request_with(enabled, process_scopes))
        rows = [_row(label, samples) for label, samples in requests.items()]
        medians = {label: percentile(samples, 0.5) for label, samples in requests.items()}
        report.line(
            f"A whole request, `GET /v1/models` through the Django test client ({count // 5:,} of each, interleaved):"
        )
        report.line()
        report.table(["rate limiting", "requests", "p50", "p95", "p99"], rows)

        db_cost = percentile(one_key, 0.5)
        request_cost = medians["gateway bucket in PostgreSQL"] - medians["limits off"]
        process_cost = medians["gateway bucket in process memory (the default)"] - medians["limits off"]
        verdict = "above" if db_cost > THRESHOLD_MS else "within"
        report.line(
            f"The PostgreSQL bucket costs {db_cost * 1000:.0f} µs per call at p50 ({verdict} the "
            f"{THRESHOLD_MS * 1000:.0f} µs allowed a hot path), {request_cost * 1000:+.0f} µs on a whole "
            f"request's p50; the process bucket {percentile(in_memory, 0.5) * 1000:.1f} µs per call, "
            f"{process_cost * 1000:+.0f} µs on a request (noise at this size). Load average after: {load_average()}."
        )
        report.line()
    finally:
        from django.db import connections

        connections.close_all()
        stack.server_stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer calls and shorter contention runs")
    arguments = parser.parse_args()
    run(Report("Rate limiting"), quick=arguments.quick)


if __name__ == "__main__":
    main()
