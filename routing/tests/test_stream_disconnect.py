"""A client that closes a streamed answer midway: the request is recorded as cut short, the part that went
out is neither cached nor learned from as a success, and the provider's stream is closed with it."""

from __future__ import annotations

import pytest

from routing.models import CacheEntry, RoutingDecision
from routing.tests.conftest import Gateway
from routing.tests.fakes import say
from routing.tests.test_gateway import _stored, _stream_live
from tracing.models import Span

# Closing a response ends its request, which closes the database connection: outside a test transaction.
pytestmark = pytest.mark.django_db(transaction=True)


def _leave_after(gateway: Gateway, chunks: int) -> str:
    response = gateway.ask("Tell me about my trip", stream=True)
    events = response.streaming_content
    for _ in range(chunks):
        next(events)
    response.close()  # what the server does when the client's connection is gone
    return str(response["X-Keel-Trace-Id"])


def test_a_client_that_leaves_midway_is_recorded_as_disconnected_and_the_part_is_not_cached(gateway):
    _stream_live(gateway.agent)
    gateway.config.cache_enabled = True
    gateway.config.save()
    gateway.fake.script("fast", say(" ".join(f"word{number}" for number in range(40))))

    trace_id = _leave_after(gateway, chunks=2)

    decision = RoutingDecision.objects.get(trace_id=trace_id)
    assert decision.status == "error"
    assert not CacheEntry.objects.exists()
    assert gateway.fake.streams_abandoned == 1
    trajectory = _stored(gateway, trace_id)
    assert trajectory.status == "error"
    root = Span.objects.get(trace_id=trace_id, parent_span_id="")
    assert root.status_message == "the client closed the stream before the answer was complete"


def test_a_client_that_leaves_after_the_finish_chunk_is_recorded_as_served(gateway):
    _stream_live(gateway.agent)
    gateway.config.cache_enabled = True
    gateway.config.save()
    gateway.fake.script("fast", say("All done"))

    # Role+first word, second word, the finish reason, and [DONE].
    trace_id = _leave_after(gateway, chunks=4)

    assert RoutingDecision.objects.get(trace_id=trace_id).status == "ok"
    assert CacheEntry.objects.count() == 1
    assert gateway.fake.streams_abandoned == 0
