"""Replays as a user makes them: a replay of a replay, a failed tool call served again, a model target."""

from __future__ import annotations

import json
from typing import Any

import pytest
from litellm.exceptions import APIConnectionError, AuthenticationError, InternalServerError
from opentelemetry.trace import Status, StatusCode

from agent_registry import services as registry_services
from agent_registry.tests.factories import AgentFactory
from config import crypto
from routing.tests.factories import ModelTargetFactory
from tracing import exceptions, replay, selectors, services
from tracing.models import Replay, Trajectory
from tracing.tests.replay_fakes import (
    ANSWER,
    FAKE_PROVIDER,
    call,
    refund_recorded,
    say,
)

pytestmark = pytest.mark.django_db


def _run(original: Trajectory, **options: Any) -> Replay:
    finished = replay.replay_execute(replay_id=replay.replay_create(original=original, **options).pk)
    assert finished is not None
    return finished


# --- A replay of a replay -----------------------------------------------------------------------------


def test_a_replay_of_a_replay_renders_a_prompt_version_with_the_variables_the_first_run_recorded(recorded, fake_llm):
    fake_llm.script = [
        call("lookup_trip", {"trip_id": "T1"}),
        call("refund", {"trip_id": "T1", "amount": 12.5}, call_id="call-b"),
        say(ANSWER),
    ]
    first = _run(recorded.trajectory, from_step=3, prompt_version=recorded.version_2)
    assert first.status == "done"
    assert first.replay_trajectory is not None
    fake_llm.script = [say("Refunded.")]

    # Back to v1 ("You help riders of {{company}}.") from the replay's last model call.
    second = _run(first.replay_trajectory, from_step=7, prompt_version=recorded.version_1)

    assert (second.status, second.error) == ("done", "")
    assert fake_llm.requests[-1].messages[0] == {"role": "system", "content": "You help riders of Acme."}
    assert second.replay_trajectory is not None
    assert second.replay_trajectory.replay_of == first.replay_trajectory


# --- A tool call that failed --------------------------------------------------------------------------


def _parts_messages(*messages: dict[str, Any]) -> str:
    return json.dumps(list(messages))


def _failed_lookup_recorded(otel, workspace, *, told_the_model: bool = True, answered_by: str = "") -> Trajectory:
    """An OpenTelemetry-instrumented turn whose lookup_trip raised: its span holds the error and no result;
    the agent told the model "Error: the trip service is down" (when `told_the_model`). The model calls
    ask for fake-replay/support-v1; `answered_by` is the model the provider says answered."""
    answered = {"gen_ai.response.model": answered_by} if answered_by else {}
    AgentFactory.create(workspace=workspace, slug="ride-support")
    tracer = otel.tracer()
    question = {"role": "user", "parts": [{"type": "text", "content": "Where is trip T1?"}]}
    asks = {
        "role": "assistant",
        "parts": [{"type": "tool_call", "id": "call-1", "name": "lookup_trip", "arguments": {"trip_id": "T1"}}],
    }
    told = {
        "role": "tool",
        "parts": [{"type": "tool_call_response", "id": "call-1", "response": "Error: the trip service is down"}],
    }
    with tracer.start_as_current_span(
        "invoke_agent ride-support",
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "ride-support"},
    ) as root:
        with tracer.start_as_current_span(
            "chat",
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": f"{FAKE_PROVIDER}/support-v1",
                "gen_ai.input.messages": _parts_messages(question),
                "gen_ai.output.messages": _parts_messages(asks),
                **answered,
            },
        ):
            pass
        with tracer.start_as_current_span(
            "execute_tool lookup_trip",
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "lookup_trip",
                "gen_ai.tool.call.id": "call-1",
                "gen_ai.tool.call.arguments": '{"trip_id": "T1"}',
            },
        ) as tool:
            tool.set_status(Status(StatusCode.ERROR, "ConnectionError: the trip service is down"))
        with tracer.start_as_current_span(
            "chat",
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": f"{FAKE_PROVIDER}/support-v1",
                "gen_ai.input.messages": _parts_messages(question, asks, *([told] if told_the_model else [])),
                "gen_ai.output.messages": _parts_messages(
                    {"role": "assistant", "parts": [{"type": "text", "content": "Sorry, try again later."}]}
                ),
                **answered,
            },
        ):
            pass
    api_key, _ = registry_services.apikey_create(workspace=workspace, name="otel", scopes=["ingest"])
    accepted = services.ingest_otlp_accept(
        api_key=api_key, body=otel.protobuf(), content_type="application/x-protobuf", content_encoding=""
    )
    if accepted.batch_id is not None:  # a small request is stored at once, a larger one by a worker
        services.span_batch_process(batch_id=accepted.batch_id)
    return Trajectory.objects.get(workspace=workspace, trace_id=format(root.get_span_context().trace_id, "032x"))


@pytest.mark.parametrize(
    ("told_the_model", "served"),
    [(True, "Error: the trip service is down"), (False, "ConnectionError: the trip service is down")],
)
def test_a_recorded_tool_call_that_failed_is_served_as_the_agent_told_the_model_or_as_its_error(
    otel, workspace, fake_llm, told_the_model, served
):
    original = _failed_lookup_recorded(otel, workspace, told_the_model=told_the_model)
    view = selectors.trajectory_view(trajectory=original)
    (failed,) = view.tool_calls
    assert (failed.status, failed.result) == ("error", None)
    fake_llm.script = [call("lookup_trip", {"trip_id": "T1"}), say("Sorry, try again later.")]

    finished = _run(original, from_step=0)

    assert finished.status == "done"
    assert fake_llm.requests[1].messages[-1] == {"role": "tool", "tool_call_id": "call-a", "content": served}


def test_a_replay_with_the_recorded_model_asks_for_the_model_the_agent_asked_for(otel, workspace, fake_llm):
    # Providers name the answering model by a dated snapshot, without the prefix that routes the call.
    original = _failed_lookup_recorded(otel, workspace, answered_by="support-v1-2025-06-01")
    fake_llm.script = [say("Sorry, try again later.")]

    finished = _run(original, from_step=4)

    assert (finished.status, finished.error) == ("done", "")
    assert [request.model for request in fake_llm.requests] == ["support-v1"]


# --- Another model: a model target of the workspace ---------------------------------------------------


def test_a_replay_with_a_model_target_calls_its_model_on_its_server_with_its_key(
    recorded, fake_llm, workspace, other_workspace
):
    ModelTargetFactory.create(
        workspace=other_workspace, alias="support-fast", model=f"{FAKE_PROVIDER}/theirs", api_base="http://theirs:1"
    )
    ModelTargetFactory.create(
        workspace=workspace,
        alias="support-fast",
        model=f"{FAKE_PROVIDER}/small",
        api_base="http://127.0.0.1:9/v1",
        api_key_encrypted=crypto.encrypt("sk-target"),
    )
    fake_llm.script = [say("Refunded.")]

    finished = _run(recorded.trajectory, from_step=7, model="support-fast")

    assert (finished.status, finished.error) == ("done", "")
    assert [request.model for request in fake_llm.requests] == ["small"]
    assert fake_llm.servers == [("http://127.0.0.1:9/v1", "sk-target")]
    assert finished.replay_trajectory is not None
    spans = selectors.trajectory_spans(trajectory=finished.replay_trajectory)
    assert [span.request_model for span in spans if span.span_type == "generation"] == [f"{FAKE_PROVIDER}/small"]


def test_a_model_targets_key_quoted_back_by_its_server_stays_out_of_the_replays_error(recorded, fake_llm):
    ModelTargetFactory.create(
        workspace=recorded.trajectory.workspace,
        alias="support-fast",
        model=f"{FAKE_PROVIDER}/small",
        api_key_encrypted=crypto.encrypt("sk-target-0123456789"),
    )
    fake_llm.script = [
        AuthenticationError("key sk-target-0123456789 is revoked", llm_provider=FAKE_PROVIDER, model="small")
    ]

    finished = _run(recorded.trajectory, from_step=7, model="support-fast")

    assert finished.status == "failed"
    assert "key [redacted] is revoked" in finished.error
    assert "sk-target-0123456789" not in finished.error


def test_a_recorded_model_served_by_a_model_target_is_called_through_it(workspace, fake_llm):
    recorded = refund_recorded(workspace)
    ModelTargetFactory.create(
        workspace=workspace, alias="support", model=f"{FAKE_PROVIDER}/support-v1", api_base="http://127.0.0.1:9/v1"
    )
    fake_llm.script = [say("Refunded.")]

    finished = _run(recorded.trajectory, from_step=7)

    assert finished.status == "done"
    assert fake_llm.servers == [("http://127.0.0.1:9/v1", None)]


def test_a_model_that_names_no_target_goes_to_litellm_as_it_is(recorded, fake_llm):
    ModelTargetFactory.create(
        workspace=recorded.trajectory.workspace, alias="paused", model=f"{FAKE_PROVIDER}/x", enabled=False
    )
    fake_llm.script = [say("Refunded.")]

    finished = _run(recorded.trajectory, from_step=7, model=f"{FAKE_PROVIDER}/bigger")

    assert finished.status == "done"
    assert [request.model for request in fake_llm.requests] == ["bigger"]
    assert fake_llm.servers == [(None, None)]


# --- A provider that is down ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        InternalServerError("upstream answered 500", llm_provider=FAKE_PROVIDER, model="x"),
        APIConnectionError("Connection refused", llm_provider=FAKE_PROVIDER, model="x"),
    ],
    ids=["server-error", "connection-refused"],
)
def test_a_server_error_or_a_refused_connection_puts_the_replay_back_for_a_retry(recorded, fake_llm, error):
    fake_llm.script = [error]
    created = replay.replay_create(original=recorded.trajectory, from_step=7)

    with pytest.raises(exceptions.ReplayProviderUnavailable):
        replay.replay_execute(replay_id=created.pk)

    created.refresh_from_db()
    assert (created.status, created.attempts, created.finished_at) == ("pending", 1, None)
    assert created.error.startswith("retrying: ")
    fake_llm.script = [say(ANSWER)]
    finished = replay.replay_execute(replay_id=created.pk)
    assert finished is not None
    assert (finished.status, finished.attempts) == ("done", 2)


# --- The API: wrong types ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"from_step": True}, "from_step"),
        ({"from_step": "3"}, "from_step"),
        ({"from_step": 3.0}, "from_step"),
        ({"from_step": 3, "max_steps": "5"}, "max_steps"),
        (
            {"from_step": 3, "prompt_version": {"name": "ride-support/system", "version": True}},
            "prompt_version.version",
        ),
    ],
)
def test_a_number_of_the_wrong_type_is_422_and_nothing_is_stored(recorded, workspace, api_client_for, body, field):
    response = api_client_for(workspace).post(
        f"/api/v1/trajectories/{recorded.trajectory.trace_id}/replays", body, content_type="application/json"
    )

    assert response.status_code == 422
    assert response.json()["code"] == "validation_error"
    assert [error["field"] for error in response.json()["errors"]] == [field]
    assert not Replay.objects.exists()


def test_a_recording_without_tool_definitions_offers_the_tools_it_shows_being_called(workspace, fake_llm):
    # Sending the tools is opt-in in the GenAI conventions; without them the model could call none.
    recorded = refund_recorded(workspace, tools=[])
    fake_llm.script = [call("lookup_trip", {"trip_id": "T1"}), say("Found it.")]
    created = replay.replay_create(original=recorded.trajectory, from_step=3)

    finished = replay.replay_execute(replay_id=created.pk)

    assert finished is not None
    assert finished.status == "done"
    offered = {tool["function"]["name"]: tool["function"]["parameters"] for tool in fake_llm.requests[0].tools}
    assert offered == {
        "lookup_trip": {"type": "object", "properties": {"trip_id": {"type": "string"}}},
        "refund": {"type": "object", "properties": {"trip_id": {"type": "string"}, "amount": {"type": "number"}}},
    }
