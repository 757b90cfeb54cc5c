"""The HTTP gateway with its record written after the answer (KEEL_GATEWAY_RECORD_BEHIND, on outside
tests): the answer does not wait, and the write-behind thread stores the decision, the spans, the cache
entry; a database that goes away delays the record, and a full queue makes the request write its own.

Transactional tests: the thread has its own database connection, which sees only committed rows."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from django.db import OperationalError
from litellm.exceptions import ServiceUnavailableError

from config import write_behind
from routing.models import CacheEntry, RoutingDecision
from routing.tests.conftest import Gateway
from routing.tests.fakes import FAKE_PROVIDER
from tracing import services as tracing_services
from tracing.models import IngestBatch, Span, Trajectory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def writer(settings, monkeypatch) -> Iterator[write_behind.WriteBehind]:
    settings.KEEL_GATEWAY_RECORD_BEHIND = True
    fresh = write_behind.WriteBehind(size=10, exit_seconds=5, pauses=(0.01,))
    monkeypatch.setattr(write_behind, "writer", fresh)
    yield fresh
    assert fresh.drain(10) == 0  # nothing may outlive the test's tables


def _gate(writer: write_behind.WriteBehind) -> threading.Event:
    """Hold the thread until the returned event is set; returns once the thread is holding."""
    taken, gate = threading.Event(), threading.Event()
    writer.submit(taken.set, gate.wait)
    assert taken.wait(5)
    return gate


def test_the_answer_leaves_before_the_record_and_the_thread_then_stores_it(gateway: Gateway, writer):
    gateway.config.cache_enabled = True
    gateway.config.save()
    gate = _gate(writer)

    response = gateway.ask("Where is my receipt for trip T9?")

    assert response.status_code == 200
    trace_id = response["X-Keel-Trace-Id"]
    assert not RoutingDecision.objects.exists()  # answered; the record waits behind the gate
    assert not Trajectory.objects.exists()
    assert writer.waiting() == 2

    gate.set()
    assert writer.drain(10) == 0
    decision = RoutingDecision.objects.get()
    assert (decision.trace_id, decision.tier, decision.status) == (trace_id, "single_call", "ok")
    assert CacheEntry.objects.get().trace_id == trace_id  # the step after the record ran too
    trajectory = Trajectory.objects.get(trace_id=trace_id)  # stored with the decision, no worker involved
    assert (trajectory.status, trajectory.llm_call_count) == ("ok", 1)
    assert not IngestBatch.objects.exists()
    # The next identical request is answered from the entry the thread stored.
    assert gateway.ask("Where is my receipt for trip T9?").json()["keel"]["cache_hit"] is True


def test_a_failed_request_is_recorded_behind_its_error_answer(gateway: Gateway, writer):
    outage = ServiceUnavailableError("overloaded", llm_provider=FAKE_PROVIDER, model="fast")
    gateway.fake.script("fast", outage, outage)

    response = gateway.ask("Where is my receipt?")

    assert response.status_code == 502
    assert writer.drain(10) == 0
    decision = RoutingDecision.objects.get()
    assert decision.status == "error"
    assert Trajectory.objects.get(trace_id=decision.trace_id).status == "error"


def test_a_record_the_database_refuses_is_stored_once_when_it_is_back(gateway: Gateway, writer, monkeypatch):
    accept = tracing_services.ingest_spans_accept
    refusals = [OperationalError("the database system is starting up")] * 3

    def flaky(**kwargs):
        if refusals:
            raise refusals.pop()
        return accept(**kwargs)

    monkeypatch.setattr(tracing_services, "ingest_spans_accept", flaky)

    response = gateway.ask("Where is my receipt?")

    assert response.status_code == 200
    assert writer.drain(10) == 0
    assert writer.retries == 3
    # The decision and the spans share a transaction: three rolled back, one stored.
    trace_id = response["X-Keel-Trace-Id"]
    assert RoutingDecision.objects.get().trace_id == trace_id
    assert Trajectory.objects.get().trace_id == trace_id
    spans = Span.objects.filter(trace_id=trace_id)
    assert spans.count() == len(set(spans.values_list("span_id", flat=True))) > 1


def test_spans_that_fail_to_assemble_are_kept_as_a_batch_for_the_worker(gateway: Gateway, writer, monkeypatch):
    write = tracing_services.spans_write

    def broken(**kwargs):
        raise ValueError("a bug in assembly")

    monkeypatch.setattr(tracing_services, "spans_write", broken)

    response = gateway.ask("Where is my receipt?")

    assert response.status_code == 200
    assert writer.drain(10) == 0
    trace_id = response["X-Keel-Trace-Id"]
    assert RoutingDecision.objects.get().trace_id == trace_id  # the decision is not lost with the spans
    assert not Trajectory.objects.exists()
    batch = IngestBatch.objects.get(source="spans", status="pending")
    monkeypatch.setattr(tracing_services, "spans_write", write)  # the bug fixed, the batch is replayed
    tracing_services.span_batch_process(batch_id=batch.pk)
    assert Trajectory.objects.get(trace_id=trace_id).llm_call_count == 1


def test_when_the_queue_is_full_the_request_writes_its_own_record(gateway: Gateway, monkeypatch, settings):
    settings.KEEL_GATEWAY_RECORD_BEHIND = True
    small = write_behind.WriteBehind(size=1, exit_seconds=5, pauses=(0.01,))
    monkeypatch.setattr(write_behind, "writer", small)
    gate = _gate(small)
    small.submit(lambda: None)  # the queue is full

    response = gateway.ask("Where is my receipt?")

    assert response.status_code == 200
    assert RoutingDecision.objects.get().trace_id == response["X-Keel-Trace-Id"]  # stored before the answer
    gate.set()
    assert small.drain(10) == 0
