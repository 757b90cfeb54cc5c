"""Ingest at twice Keel's measured sustained capacity (issue 9 §1): every acknowledged span is stored
exactly once, every refusal is a 429/503 with Retry-After, the processes' memory stays bounded, and the
dashboard answers throughout. Invariants only; the speed figures are bench/bench_load.py's."""

from __future__ import annotations

import pytest

from bench import load
from bench.harness import Report
from tests.celery.processes import PROCESS_TESTS
from tests.load.conftest import FULL, RSS_LIMIT_BYTES

OPTIONS = (
    load.IngestOptions(seconds=120, capacity_seconds=20, drain_timeout=600)
    if FULL
    else load.IngestOptions(seconds=12, capacity_seconds=4, templates=2, drain_timeout=120)
)


@pytest.mark.django_db(transaction=True)
@PROCESS_TESTS
def test_ingest_at_twice_capacity_stores_each_acknowledged_span_once(keel):
    world = load.ingest_world_create()

    result = load.ingest_load(keel, world, OPTIONS)
    load.ingest_report(Report("ingest at twice capacity"), result)  # printed: pytest shows it on a failure

    assert result.drained, f"{result.unfinished_batches} batches were still unfinished"
    assert result.failed_batches == 0
    assert result.acknowledged_spans() > 0
    assert (result.lost, result.duplicates, result.unexpected) == (0, 0, 0)
    assert result.stored_pairs == result.acknowledged_spans()
    assert result.unexpected_statuses() == {}
    assert result.refusals_without_retry_after() == 0
    assert sum(batch.rejected_spans for batch in result.batches) == 0
    assert set(result.outcomes()) <= {"acknowledged", "refused"}
    assert result.memory.samples
    assert result.memory.peak("web", largest=True) < RSS_LIMIT_BYTES
    assert result.memory.peak("worker", largest=True) < RSS_LIMIT_BYTES
    assert result.dashboard.errors == []
    assert set(result.dashboard.statuses()) == {200}
    assert {time.page for time in result.dashboard.times} == set(load.PAGES)
