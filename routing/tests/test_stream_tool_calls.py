"""Tool calls streamed as deltas through a target alias, put together as the openai client does, and recorded."""

from __future__ import annotations

import pytest

from routing.tests.fakes import call
from routing.tests.test_gateway import _events, _stored
from tracing.models import Span

pytestmark = pytest.mark.django_db

TOOLS = [{"type": "function", "function": {"name": "lookup_trip", "parameters": {"type": "object"}}}]


def test_streamed_tool_call_deltas_add_up_to_the_call_and_the_call_is_recorded(gateway):
    gateway.fake.script("fast", call("lookup_trip", {"trip_id": "T1"}))

    response = gateway.post(
        {"model": "fast", "messages": [{"role": "user", "content": "my trip"}], "tools": TOOLS, "stream": True}
    )

    events = _events(response)
    assert events[-1] == "[DONE]"
    deltas = [event["choices"][0]["delta"] for event in events[:-1] if event["choices"]]
    pieces = [piece for delta in deltas for piece in delta.get("tool_calls") or ()]
    assert {piece["index"] for piece in pieces} == {0}
    assert [piece["id"] for piece in pieces if piece.get("id")] == ["call-1"]
    assert "".join(piece["function"].get("arguments") or "" for piece in pieces) == '{"trip_id": "T1"}'
    assert [e["choices"][0]["finish_reason"] for e in events[:-1] if e["choices"][0].get("finish_reason")] == [
        "tool_calls"
    ]
    _stored(gateway, response["X-Keel-Trace-Id"])
    generation = Span.objects.get(trace_id=response["X-Keel-Trace-Id"], span_type="generation")
    assert '"lookup_trip"' in generation.data
    assert "trip_id" in generation.data
