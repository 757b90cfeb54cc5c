"""Issue 9 §1, load: ingest at twice Keel's measured sustained capacity for two minutes, and the gateway
under 100 concurrent clients for a minute (the full versions of tests/load; how both work: bench/load.py).

    python -m bench.bench_load [--quick] [--only ingest|gateway] [--capacity SPANS_PER_SECOND]

Database `keel_bench_load` (fresh each run, migrated) on the benchmarks' embedded PostgreSQL; Keel's web
and worker as bench/stack.py starts them (gunicorn 2 × 4 threads, a Celery worker of concurrency 2 on
the filesystem broker, DEBUG off); the stub model server (bench/stub_model_server.py, 20 ms) for the
gateway. Every figure comes with the invariants the load tests assert: acknowledged spans stored exactly
once, refusals with Retry-After, no gateway error of Keel's, every answered request's trace stored.
`--quick` runs the CI sizes (ingest 2× for 12 s, gateway for 6 s): a smoke test, not figures.
"""

from __future__ import annotations

import argparse
import sys

from bench import load, stack
from bench.harness import VAR_DIR, Report, Stopwatch, load_average

DATABASE = "keel_bench_load"


def _verdicts(report: Report, checks: list[tuple[str, bool]]) -> None:
    report.line("Invariants: " + "; ".join(f"{name} **{'held' if held else 'FAILED'}**" for name, held in checks) + ".")
    report.line()


def _ingest(report: Report, keel: load.Keel, quick: bool, capacity: float | None) -> bool:
    options = (
        load.IngestOptions(seconds=12, capacity_seconds=4, templates=2, capacity=capacity)
        if quick
        else load.IngestOptions(seconds=120, capacity_seconds=20, capacity=capacity)
    )
    report.line(f"#### Ingest at {options.factor:g} × sustained capacity (load average before: {load_average()})")
    report.line()
    result = load.ingest_load(keel, load.ingest_world_create(), options)
    load.ingest_report(report, result)
    checks = [
        ("every acknowledged span stored exactly once", (result.lost, result.duplicates) == (0, 0)),
        ("nothing stored that was not acknowledged", result.unexpected == 0),
        ("every refusal a 429/503 with Retry-After", not result.unexpected_statuses()),
        ("Retry-After on every refusal", result.refusals_without_retry_after() == 0),
        ("backlog drained, no failed batch", result.drained and result.failed_batches == 0),
        ("dashboard answered 200 throughout", set(result.dashboard.statuses()) == {200}),
    ]
    _verdicts(report, checks)
    return all(held for _, held in checks)


def _gateway(report: Report, keel: load.Keel, quick: bool) -> bool:
    options = (
        load.GatewayOptions(seconds=6, warmup_seconds=0.5, warmup_clients=4)
        if quick
        else load.GatewayOptions(seconds=60)
    )
    report.line(f"#### Gateway, {options.clients} concurrent clients (load average before: {load_average()})")
    report.line()
    with load.stub_running(keel.environment, options.stub_latency_ms) as stub_port:
        result = load.gateway_load(keel, load.gateway_world_create(stub_port), stub_port, options)
    load.gateway_report(report, result)
    checks = [
        ("no error of Keel's", not result.errors("keel")),
        ("every answered request's trace stored", result.drained and result.traces_missing == 0),
    ]
    _verdicts(report, checks)
    return all(held for _, held in checks)


def run(report: Report, *, quick: bool, only: str | None = None, capacity: float | None = None) -> None:
    held = measure(report, quick=quick, only=only, capacity=capacity)
    if not held:
        report.line("**An invariant failed**: see above.")


def measure(report: Report, *, quick: bool, only: str | None = None, capacity: float | None = None) -> bool:
    """Run the loads and add their figures to the report; returns whether every invariant held."""
    clock = Stopwatch()
    database = stack.database_fresh(DATABASE)
    environment = stack.keel_environment(database, VAR_DIR / "broker-load")
    stack.keel_migrate(environment)
    stack.django_setup(environment)
    held = True
    try:
        port = stack.free_port()
        with stack.keel_running(environment, port, tag="load") as processes:
            keel = load.Keel(port, processes, environment)
            if only in (None, "ingest"):
                held &= _ingest(report, keel, quick, capacity)
            if only in (None, "gateway"):
                held &= _gateway(report, keel, quick)
            keel.stop()
    finally:
        stack.server_stop()
    report.line(
        "The load generators (sender threads, the dashboard session, the gateway's client threads) run in the "
        "benchmark's process on the same 2 cores as Keel and PostgreSQL, so every figure includes their share; "
        "so does whatever else ran on the machine (the load averages above). "
        f"_Whole benchmark: {clock.seconds():.0f} s._"
    )
    return held


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the CI sizes: a smoke test, not figures")
    parser.add_argument("--only", choices=("ingest", "gateway"))
    parser.add_argument("--capacity", type=float, help="sustained ingest capacity in spans/s (measured when absent)")
    arguments = parser.parse_args()
    held = measure(Report("bench_load"), quick=arguments.quick, only=arguments.only, capacity=arguments.capacity)
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main())
