"""The tool result shape history behind `silent_tool_api_change`: counted at ingest, per agent, and
read back as the detector's history without the judged trajectory's own results."""

from __future__ import annotations

import io
import json
import uuid
from typing import Any

import pytest
from django.core.management import call_command

from agent_registry import services as registry_services
from agent_registry.models import Agent
from tracing import services, signals
from tracing.models import ToolResultShape, Trajectory

pytestmark = pytest.mark.django_db

TRIP = {"trip_id": "T1", "status": "completed", "fare": {"amount": 12.5, "currency": "EUR"}}
# The same tool after its provider changed the API: the fare is a string, the status is gone.
TRIP_CHANGED = {"trip_id": "T1", "state": "completed", "fare": "12.50 EUR"}


def _call(number: int, result: Any, tool: str = "lookup_trip") -> list[dict[str, Any]]:
    call_id = f"c{number}"
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": tool, "arguments": '{"trip_id": "T1"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": json.dumps(result)},
    ]


def _document(*results: Any, agent: str = "ride-support", tool: str = "lookup_trip", **extra: Any) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Where is my receipt for trip T1?"}]
    for number, result in enumerate(results):
        messages.extend(_call(number, result, tool))
    messages.append({"role": "assistant", "content": "Your trip T1 receipt is on its way to your email."})
    return {"trace_id": uuid.uuid4().hex, "agent": agent, "messages": messages, **extra}


def _ingest(workspace, *documents: dict[str, Any]) -> None:
    """Accept the documents as one batch and process it, as the API and the worker do."""
    api_key, _ = registry_services.apikey_create(workspace=workspace, name="agent", scopes=["ingest"])
    accepted, _ = services.ingest_trajectories_accept(api_key=api_key, payload=list(documents))
    assert accepted.batch_id is not None
    services.span_batch_process(batch_id=accepted.batch_id)


def _signals(workspace, document: dict[str, Any]) -> list[dict[str, Any]]:
    trajectory = Trajectory.objects.get(workspace=workspace, trace_id=document["trace_id"])
    return [instance for instance in trajectory.signals if instance["signal"] == "silent_tool_api_change"]


def _history(workspace, agent: str = "ride-support") -> list[tuple[str, dict[str, str], int]]:
    return list(
        ToolResultShape.objects.filter(agent__workspace=workspace, agent__slug=agent)
        .order_by("-count", "shape_key")
        .values_list("tool_name", "shape", "count")
    )


def _consistent_history(workspace, agent: str = "ride-support", times: int = 5) -> None:
    _ingest(workspace, *(_document(TRIP, agent=agent) for _ in range(times)))


def test_a_result_that_changes_shape_after_consistent_ones_fires(workspace):
    _consistent_history(workspace)
    changed = _document(TRIP_CHANGED)
    consistent = _document(TRIP)

    _ingest(workspace, changed, consistent)

    (instance,) = _signals(workspace, changed)
    assert (instance["kind"], instance["category"], instance["steps"]) == (
        "result_shape_changed",
        "failure_mode",
        [3],
    )
    assert instance["snippets"] == [
        "missing fare.amount, fare.currency, status; type changed for fare; new state",
    ]
    assert _signals(workspace, consistent) == []
    assert _history(workspace) == [
        ("lookup_trip", signals.tool_result_shape(TRIP), 6),
        ("lookup_trip", signals.tool_result_shape(TRIP_CHANGED), 1),
    ]


def test_a_tool_seen_for_the_first_time_is_not_judged(workspace):
    first = _document(TRIP_CHANGED, tool="find_receipt")
    _consistent_history(workspace)

    _ingest(workspace, first)

    assert _signals(workspace, first) == []
    assert [row for row in _history(workspace) if row[0] == "find_receipt"] == [
        ("find_receipt", signals.tool_result_shape(TRIP_CHANGED), 1)
    ]


def test_a_shape_seen_fewer_times_than_the_minimum_is_not_history(workspace):
    _consistent_history(workspace, times=services.TOOL_SHAPE_HISTORY_MIN_COUNT - 1)
    changed = _document(TRIP_CHANGED)

    _ingest(workspace, changed)

    assert _signals(workspace, changed) == []


def test_a_shape_becomes_history_once_seen_often_enough(workspace):
    """After a real API change the new shape is the norm after MIN_COUNT results: the signal marks the
    trajectories around the change, not every one after it."""
    _consistent_history(workspace)
    _ingest(workspace, *(_document(TRIP_CHANGED) for _ in range(services.TOOL_SHAPE_HISTORY_MIN_COUNT)))
    after = _document(TRIP_CHANGED)
    old_shape_again = _document(TRIP)

    _ingest(workspace, after, old_shape_again)

    assert _signals(workspace, after) == []
    assert _signals(workspace, old_shape_again) == []


def test_a_trajectory_repeating_a_changed_shape_is_not_its_own_history(workspace):
    """Six changed results of one trajectory, in two batches, are counted: they are still not history
    for that trajectory, at ingest or on a recompute."""
    _consistent_history(workspace)
    document = _document(*[TRIP_CHANGED] * services.TOOL_SHAPE_HISTORY_MIN_COUNT)
    _ingest(workspace, document)
    assert len(_signals(workspace, document)) == 1

    longer = {**document, "messages": document["messages"][:-1]}
    for number in range(services.TOOL_SHAPE_HISTORY_MIN_COUNT, 6):
        longer["messages"].extend(_call(number, TRIP_CHANGED))
    longer["messages"].append(document["messages"][-1])
    _ingest(workspace, longer)

    assert (signals.tool_result_shape(TRIP_CHANGED), 6) in [(shape, count) for _, shape, count in _history(workspace)]
    assert len(_signals(workspace, longer)) == 1
    call_command("signals_recompute", "--workspace", workspace.slug, "--sync", stdout=io.StringIO())
    assert len(_signals(workspace, longer)) == 1


def test_consistent_results_do_not_fire_and_are_counted_once(workspace):
    _consistent_history(workspace)
    consistent = _document(TRIP, TRIP)

    _ingest(workspace, consistent)
    _ingest(workspace, consistent)  # posted again: no new spans, nothing counted again

    assert _signals(workspace, consistent) == []
    assert _history(workspace) == [("lookup_trip", signals.tool_result_shape(TRIP), 7)]


def test_error_results_are_not_counted_nor_judged(workspace):
    _consistent_history(workspace)
    failing = _document({"error": "trip not found", "code": 404})

    _ingest(workspace, failing)

    assert _signals(workspace, failing) == []
    assert "failure" in Trajectory.objects.get(trace_id=failing["trace_id"]).signal_names
    assert _history(workspace) == [("lookup_trip", signals.tool_result_shape(TRIP), 5)]


def test_agents_and_workspaces_do_not_share_history(workspace, other_workspace):
    _consistent_history(workspace)
    other_agent = _document(TRIP_CHANGED, agent="billing-bot")
    other_workspace_same_slug = _document(TRIP_CHANGED)

    _ingest(workspace, other_agent)
    _ingest(other_workspace, other_workspace_same_slug)

    assert _signals(workspace, other_agent) == []
    assert _signals(other_workspace, other_workspace_same_slug) == []
    assert _history(other_workspace) == [("lookup_trip", signals.tool_result_shape(TRIP_CHANGED), 1)]
    assert _history(workspace) == [("lookup_trip", signals.tool_result_shape(TRIP), 5)]
    assert Agent.objects.filter(slug="ride-support").count() == 2


def test_a_tool_keeps_a_bounded_number_of_shapes(workspace, monkeypatch):
    """A tool whose keys are data would add a row per call; past the cap only known shapes grow."""
    monkeypatch.setattr(services, "TOOL_SHAPE_HISTORY_MAX_SHAPES", 2)
    _ingest(workspace, _document({"a": 1}, {"a": 1}, {"a": 1}, {"b": 1}, {"b": 1}, {"c": 1}))
    assert [(shape, count) for _, shape, count in _history(workspace)] == [({"a": "number"}, 3), ({"b": "number"}, 2)]

    _ingest(workspace, _document({"a": 1}, {"d": 1}))

    assert [(shape, count) for _, shape, count in _history(workspace)] == [({"a": "number"}, 4), ({"b": "number"}, 2)]


def test_the_agents_signal_config_carries_its_history(workspace):
    _consistent_history(workspace)
    _ingest(workspace, _document(TRIP_CHANGED))
    agent = Agent.objects.get(workspace=workspace, slug="ride-support")

    config = services.signal_config_for_agent(agent.pk)

    assert config.tool_result_shapes == {"lookup_trip": [signals.tool_result_shape(TRIP)]}


def test_a_failing_detector_is_recorded_and_the_others_still_run(workspace, monkeypatch):
    def broken(analysis: Any) -> list[signals.SignalInstance]:
        raise ValueError("boom")

    monkeypatch.setattr(
        signals,
        "DETECTORS",
        tuple((name, broken if name == "goal_drift" else detector) for name, detector in signals.DETECTORS),
    )
    failing = _document({"error": "trip not found", "code": 404})

    _ingest(workspace, failing)

    trajectory = Trajectory.objects.get(trace_id=failing["trace_id"])
    assert trajectory.signal_errors == [{"detector": "goal_drift", "message": "ValueError: boom"}]
    assert "failure" in trajectory.signal_names
    assert trajectory.triage_score > 0


def test_the_limits_are_documented():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[3] / "docs" / "triage.md").read_text()
    assert f"at least **{services.TOOL_SHAPE_HISTORY_MIN_COUNT}** times" in doc
    assert f"at most **{services.TOOL_SHAPE_HISTORY_MAX_SHAPES}** distinct shapes" in doc
