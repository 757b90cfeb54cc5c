"""The gateway under 100 concurrent clients against the stub model server (issue 9 §1): no error of
Keel's, every answered request's trace stored, memory bounded. Invariants only; the overhead figures are
bench/bench_load.py's."""

from __future__ import annotations

import pytest

from bench import load
from bench.harness import Report
from tests.celery.processes import PROCESS_TESTS
from tests.load.conftest import FULL, RSS_LIMIT_BYTES

OPTIONS = (
    load.GatewayOptions(seconds=60)
    if FULL
    else load.GatewayOptions(seconds=6, warmup_seconds=0.5, warmup_clients=4, drain_timeout=120)
)


@pytest.mark.django_db(transaction=True)
@PROCESS_TESTS
def test_gateway_under_100_clients_answers_without_errors_of_its_own(keel):
    with load.stub_running(keel.environment) as stub_port:
        world = load.gateway_world_create(stub_port)
        result = load.gateway_load(keel, world, stub_port, OPTIONS)
    load.gateway_report(Report("gateway under 100 clients"), result)  # printed: pytest shows it on a failure

    assert result.answered()
    assert result.errors("keel") == {}
    assert result.errors("stub") == {}
    # A client sends a request again when its connection fails (as the `openai` client does); seen once in
    # 451 requests (CI, 2026-11-28, cause not found). More than one request in a hundred would be Keel's fault.
    assert sum(result.retried().values()) <= len(result.calls) // 100, result.retried()
    assert len(result.overheads()) == len(result.answered())
    assert result.drained
    assert result.traces_missing == 0
    assert result.memory.peak("web", largest=True) < RSS_LIMIT_BYTES
    assert result.memory.peak("worker", largest=True) < RSS_LIMIT_BYTES
