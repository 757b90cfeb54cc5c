"""A trajectory as OTLP/JSON with its signals as events on the root span; Keel's own OTLP parser reads it back."""

from __future__ import annotations

import json

import pytest

from agent_registry import services as registry_services
from agent_registry.tests.factories import AgentFactory
from tracing import otlp, selectors, services
from tracing.models import Trajectory
from tracing.otlp_export import any_value, trajectory_otlp_json
from tracing.tests.agent_traces import refund_conversation

pytestmark = pytest.mark.django_db


def test_values_take_otlp_jsons_shapes():
    assert any_value(3) == {"intValue": "3"}
    assert any_value(True) == {"boolValue": True}
    assert any_value(0.5) == {"doubleValue": 0.5}
    assert any_value(["a", 1]) == {"arrayValue": {"values": [{"stringValue": "a"}, {"intValue": "1"}]}}
    assert any_value({"k": "v"}) == {"kvlistValue": {"values": [{"key": "k", "value": {"stringValue": "v"}}]}}


def test_the_export_carries_every_span_and_the_signals_on_the_root(otel, workspace, api_client_for):
    agent = AgentFactory.create(workspace=workspace, slug="ride-support")
    trace_id = refund_conversation(otel.tracer(), tool_fails=True)
    api_key, _ = registry_services.apikey_create(workspace=workspace, name="k", scopes=["ingest"], agents=[agent])
    services.ingest_otlp_accept(
        api_key=api_key, body=otel.protobuf(), content_type="application/x-protobuf", content_encoding=""
    )
    trajectory = Trajectory.objects.get(trace_id=trace_id)
    assert trajectory.signals

    response = api_client_for(workspace, scopes=["read"]).get(f"/api/v1/trajectories/{trace_id}/otlp")

    assert response.status_code == 200
    spans, request = otlp.decode_and_map(json.dumps(response.json()).encode(), otlp.CONTENT_TYPE_JSON, None)
    assert request.rejected_spans == 0
    stored = selectors.trajectory_spans(trajectory=trajectory)
    assert sorted(span.span_id for span in spans) == sorted(span.span_id for span in stored)
    (root,) = [span for span in spans if span.parent_span_id is None]
    events = [event for event in root.events if event.name.startswith("signal.")]
    assert [event.name for event in events] == [f"signal.{instance['signal']}" for instance in trajectory.signals]
    first = events[0].attributes
    instance = trajectory.signals[0]
    assert (first["signal.kind"], first["signal.level"], first["signal.why"]) == (
        instance["kind"],
        instance["level"],
        instance["why"],
    )
    assert list(first["signal.steps"]) == instance["steps"]
    assert root.attributes["signals.triage_score"] == trajectory.triage_score
    assert list(root.attributes["signals.names"]) == trajectory.signal_names


def test_a_trajectory_without_spans_exports_nothing():
    assert trajectory_otlp_json([], [], signals=[], signal_names=[], triage_score=0.0) == {"resourceSpans": []}
