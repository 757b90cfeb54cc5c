"""Counterfactual replay: planning, running against a fake provider, divergences, progress, retries, failures."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone
from litellm.exceptions import AuthenticationError, RateLimitError, Timeout

from agent_registry import services as registry_services
from agent_registry.tests.factories import AgentFactory
from tracing import exceptions, replay, selectors
from tracing.models import Replay, ReplayStatus, Span, Trajectory
from tracing.tests.replay_fakes import (
    ANSWER,
    FAKE_PROVIDER,
    LOOKUP_RESULT,
    RECORDED_MODEL,
    REFUND_RESULT,
    TOOLS,
    call,
    refund_document,
    refund_recorded,
    say,
    trajectory_record,
)

pytestmark = pytest.mark.django_db

SYSTEM_V2_RENDERED = "You are the refund desk of Acme. Refund duplicate charges at once."
USER = {"role": "user", "content": "I was charged twice for trip T1."}


def _replay_state(found: Replay) -> tuple[str, int, int]:
    found.refresh_from_db()
    return (found.status, found.steps_done, found.steps_planned)


def _sources(trajectory: Trajectory) -> list[tuple[str, str | None]]:
    spans = sorted(selectors.trajectory_spans(trajectory=trajectory), key=lambda span: span.start_time_ns)
    return [(span.tool_name or "", span.attributes.get(replay.SOURCE_ATTRIBUTE)) for span in spans if span.tool_name]


def test_a_replay_with_another_prompt_version_is_a_linked_trajectory_served_from_the_recording(recorded, fake_llm):
    fake_llm.script = [
        call("lookup_trip", '{ "trip_id" : "T1" }'),
        call("refund", {"amount": 12.5, "trip_id": "T1"}, call_id="call-b"),  # keys in another order
        say("Refunded 12.50 USD at once."),
    ]
    created = replay.replay_create(original=recorded.trajectory, from_step=3, prompt_version=recorded.version_2)

    finished = replay.replay_execute(replay_id=created.pk)

    assert finished is not None
    assert (finished.status, finished.steps_done, finished.steps_planned) == ("done", 3, 3)
    assert (finished.divergence_step, finished.divergence_tool_name, finished.error) == (None, "", "")
    new = finished.replay_trajectory
    assert new is not None
    assert new.trace_id == finished.trace_id != recorded.trajectory.trace_id
    assert (new.replay_of, new.replay_from_step) == (recorded.trajectory, 3)
    assert (new.agent, new.session_id, new.user_id) == (recorded.trajectory.agent, "session-7", "rider-42")
    assert new.agent is not None
    assert new.agent.slug == "ride-support"
    assert new.tags == ["production", "replay"]
    assert (new.status, new.llm_call_count, new.tool_call_count) == ("ok", 3, 2)
    assert (new.input_tokens, new.output_tokens) == (150, 30)
    assert new.output_preview == "Refunded 12.50 USD at once."
    assert list(new.prompt_versions.all()) == [recorded.version_2]

    view = selectors.trajectory_view(trajectory=new)
    assert [(step.kind, step.role or step.tool_name) for step in view.steps] == [
        ("agent", None),
        ("message", "system"),
        ("message", "user"),
        ("llm_call", None),
        ("tool_call", "lookup_trip"),
        ("llm_call", None),
        ("tool_call", "refund"),
        ("llm_call", None),
    ]
    assert view.steps[1].content == SYSTEM_V2_RENDERED
    assert [(call.name, call.result) for call in view.tool_calls] == [
        ("lookup_trip", LOOKUP_RESULT),
        ("refund", REFUND_RESULT),
    ]
    assert _sources(new) == [("lookup_trip", "recording"), ("refund", "recording")]

    first, second, third = fake_llm.requests
    assert first.model == "support-v1"  # the recorded model, without its provider prefix
    assert first.messages == [{"role": "system", "content": SYSTEM_V2_RENDERED}, USER]
    assert first.tools == TOOLS
    assert first.params["temperature"] == 0.2  # from the prompt version's config
    assert second.messages[2:] == [
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "call-a",
                    "type": "function",
                    "function": {"name": "lookup_trip", "arguments": '{ "trip_id" : "T1" }'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call-a", "content": json.dumps(LOOKUP_RESULT)},
    ]
    assert third.messages[-1] == {"role": "tool", "tool_call_id": "call-b", "content": json.dumps(REFUND_RESULT)}


def test_a_replay_from_a_later_step_sends_the_recorded_history_to_another_model(recorded, fake_llm):
    fake_llm.script = [say("Your duplicate charge is refunded.")]
    created = replay.replay_create(original=recorded.trajectory, from_step=5, model=f"{FAKE_PROVIDER}/bigger")

    finished = replay.replay_execute(replay_id=created.pk)

    assert finished is not None
    assert finished.status == "done"
    (request,) = fake_llm.requests
    assert request.model == "bigger"
    assert request.messages == [
        {"role": "system", "content": "You help riders of Acme."},
        USER,
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "lookup_trip", "arguments": '{"trip_id": "T1"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": json.dumps(LOOKUP_RESULT)},
    ]
    assert finished.replay_trajectory is not None
    assert finished.replay_trajectory.replay_from_step == 5
    assert (finished.steps_done, finished.steps_planned) == (1, 1)


def test_the_diff_of_a_replay_finds_where_it_parts(recorded, fake_llm):
    fake_llm.script = [call("lookup_trip", {"trip_id": "T1"}), say("Which charge should I refund?")]
    finished = replay.replay_execute(
        replay_id=replay.replay_create(original=recorded.trajectory, from_step=3, prompt_version=recorded.version_2).pk
    )
    assert finished is not None

    diff = selectors.replay_diff_get(replay=finished)

    assert (diff.original_start, diff.replay_start) == (3, 3)
    assert [(pair.status, pair.label) for pair in diff.steps] == [
        ("same", "agent refund request"),
        ("changed", "system message"),
        ("same", "user message"),
        ("same", "assistant"),
        ("same", "tool lookup_trip"),
        ("changed", "assistant"),
        ("only_in_original", "tool refund"),
        ("only_in_original", "assistant"),
    ]
    assert diff.first_difference == 5
    assert [(change.field, change.replay) for change in diff.steps[5].changes] == [
        ("content", "Which charge should I refund?"),
        ("tool_calls", []),
    ]
    assert (diff.replayed_totals.original.llm_calls, diff.replayed_totals.replay.llm_calls) == (3, 2)


def test_a_divergent_tool_call_stops_the_replay_with_its_details(recorded, fake_llm):
    fake_llm.script = [call("lookup_trip", {"trip_id": "T2"})]
    created = replay.replay_create(original=recorded.trajectory, from_step=3, prompt_version=recorded.version_2)

    finished = replay.replay_execute(replay_id=created.pk)

    assert finished is not None
    assert (finished.status, finished.steps_done, finished.steps_planned) == ("stopped_divergence", 1, 1)
    assert (finished.divergence_step, finished.divergence_tool_name, finished.divergence_arguments) == (
        3,
        "lookup_trip",
        {"trip_id": "T2"},
    )
    new = finished.replay_trajectory
    assert new is not None
    view = selectors.trajectory_view(trajectory=new)
    assert view.steps[3].kind == "llm_call"
    assert view.steps[3].output_message is not None
    assert view.steps[3].output_message["tool_calls"][0]["function"]["arguments"] == '{"trip_id": "T2"}'
    assert view.tool_calls == ()
    assert len(fake_llm.requests) == 1


def test_a_divergent_tool_call_gets_the_users_stub_and_the_replay_goes_on(recorded, fake_llm):
    fake_llm.script = [call("lookup_trip", {"trip_id": "T2"}), say("Trip T2 is fine.")]
    created = replay.replay_create(
        original=recorded.trajectory, from_step=3, divergence_policy="stub", stub_result={"status": "completed"}
    )

    finished = replay.replay_execute(replay_id=created.pk)

    assert finished is not None
    assert (finished.status, finished.divergence_step, finished.divergence_tool_name) == ("done", 3, "lookup_trip")
    assert finished.divergence_arguments == {"trip_id": "T2"}
    assert finished.replay_trajectory is not None
    assert _sources(finished.replay_trajectory) == [("lookup_trip", "stub")]
    assert fake_llm.requests[1].messages[-1] == {
        "role": "tool",
        "tool_call_id": "call-a",
        "content": '{"status": "completed"}',
    }


def test_without_a_stub_of_its_own_a_divergent_call_gets_the_generic_stub(recorded, fake_llm):
    fake_llm.script = [call("cancel_trip", {"trip_id": "T1"}), say("Cancelled.")]
    created = replay.replay_create(original=recorded.trajectory, from_step=3, divergence_policy="stub")

    finished = replay.replay_execute(replay_id=created.pk)

    assert finished is not None
    assert finished.status == "done"
    assert json.loads(fake_llm.requests[1].messages[-1]["content"]) == replay.GENERIC_STUB
    assert finished.replay_trajectory is not None
    view = selectors.trajectory_view(trajectory=finished.replay_trajectory)
    assert [(call.name, call.result) for call in view.tool_calls] == [("cancel_trip", replay.GENERIC_STUB)]


def test_progress_and_status_are_written_as_the_replay_goes(recorded, fake_llm):
    fake_llm.script = [
        call("lookup_trip", {"trip_id": "T1"}),
        call("refund", {"trip_id": "T1", "amount": 12.5}),
        call("lookup_trip", {"trip_id": "T1"}),  # once more than the original: planned grows with it
        say(ANSWER),
    ]
    created = replay.replay_create(original=recorded.trajectory, from_step=3)
    assert _replay_state(created) == ("pending", 0, 3)
    seen: list[tuple[str, int, int]] = []
    fake_llm.before_reply = lambda: seen.append(_replay_state(created))

    replay.replay_execute(replay_id=created.pk)

    assert seen == [("running", 0, 3), ("running", 1, 3), ("running", 2, 3), ("running", 3, 4)]
    assert _replay_state(created) == ("done", 4, 4)
    created.refresh_from_db()
    assert created.claimed_at is not None
    assert created.finished_at is not None
    assert created.attempts == 1


def test_the_replay_stops_after_max_steps_model_calls(recorded, fake_llm):
    fake_llm.script = [call("lookup_trip", {"trip_id": "T1"}), call("lookup_trip", {"trip_id": "T1"})]
    created = replay.replay_create(original=recorded.trajectory, from_step=3, max_steps=2)

    finished = replay.replay_execute(replay_id=created.pk)

    assert finished is not None
    assert (finished.status, finished.steps_done, finished.steps_planned) == ("done", 2, 2)
    assert len(fake_llm.requests) == 2
    # A call made again with the same arguments is served the same recorded result.
    assert finished.replay_trajectory is not None
    assert _sources(finished.replay_trajectory) == [("lookup_trip", "recording"), ("lookup_trip", "recording")]


def test_running_a_replay_twice_does_nothing_the_second_time(recorded, fake_llm):
    fake_llm.script = [say(ANSWER)]
    created = replay.replay_create(original=recorded.trajectory, from_step=7)
    replay.replay_execute(replay_id=created.pk)
    spans = Span.objects.count()

    assert replay.replay_execute(replay_id=created.pk) is None

    assert len(fake_llm.requests) == 1
    assert Span.objects.count() == spans
    assert _replay_state(created) == ("done", 1, 1)
    assert Trajectory.objects.filter(replay_of=recorded.trajectory).count() == 1


def test_a_replay_claimed_by_a_live_worker_is_skipped_and_an_expired_claim_is_taken_over(recorded, fake_llm):
    created = replay.replay_create(original=recorded.trajectory, from_step=7)
    Replay.objects.filter(pk=created.pk).update(status=ReplayStatus.RUNNING, claimed_at=timezone.now(), attempts=1)

    assert replay.replay_execute(replay_id=created.pk) is None
    assert replay.replay_sweep() == []

    Replay.objects.filter(pk=created.pk).update(claimed_at=timezone.now() - timedelta(seconds=replay.LEASE_SECONDS + 1))
    assert replay.replay_sweep() == [created.pk]
    fake_llm.script = [say(ANSWER)]
    finished = replay.replay_execute(replay_id=created.pk)
    assert finished is not None
    assert (finished.status, finished.attempts) == ("done", 2)


def test_the_sweeper_resends_pending_replays_whose_message_may_be_lost(recorded):
    fresh = replay.replay_create(original=recorded.trajectory, from_step=7)
    stale = replay.replay_create(original=recorded.trajectory, from_step=3)
    Replay.objects.filter(pk=stale.pk).update(created_at=timezone.now() - timedelta(minutes=5))

    assert replay.replay_sweep() == [stale.pk]
    assert _replay_state(fresh) == ("pending", 0, 1)


def test_a_provider_error_fails_the_replay_with_the_error(recorded, fake_llm):
    fake_llm.script = [AuthenticationError("the API key is not valid", llm_provider=FAKE_PROVIDER, model="x")]
    created = replay.replay_create(original=recorded.trajectory, from_step=3)

    finished = replay.replay_execute(replay_id=created.pk)

    assert finished is not None
    assert finished.status == "failed"
    assert "the API key is not valid" in finished.error
    assert finished.finished_at is not None
    assert finished.replay_trajectory is None
    assert not Trajectory.objects.filter(trace_id=finished.trace_id).exists()


def test_a_transient_provider_error_puts_the_replay_back_for_a_retry(recorded, fake_llm):
    fake_llm.script = [RateLimitError("slow down", llm_provider=FAKE_PROVIDER, model="x")]
    created = replay.replay_create(original=recorded.trajectory, from_step=7)

    with pytest.raises(exceptions.ReplayProviderUnavailable, match="slow down"):
        replay.replay_execute(replay_id=created.pk)

    created.refresh_from_db()
    assert (created.status, created.attempts) == ("pending", 1)
    assert "slow down" in created.error
    fake_llm.script = [say(ANSWER)]
    finished = replay.replay_execute(replay_id=created.pk)
    assert finished is not None
    assert (finished.status, finished.attempts, finished.error) == ("done", 2, "")


def test_a_provider_that_stays_unavailable_fails_the_replay_on_the_last_attempt(recorded, fake_llm):
    created = replay.replay_create(original=recorded.trajectory, from_step=7)
    Replay.objects.filter(pk=created.pk).update(attempts=replay.MAX_ATTEMPTS - 1)
    fake_llm.script = [Timeout("no answer in 120 s", model="x", llm_provider=FAKE_PROVIDER)]

    finished = replay.replay_execute(replay_id=created.pk)

    assert finished is not None
    assert (finished.status, finished.attempts) == ("failed", replay.MAX_ATTEMPTS)
    assert "no answer in 120 s" in finished.error


@pytest.mark.parametrize(
    ("from_step", "code", "detail"),
    [
        (8, "replay_step_not_found", "the trajectory has no step 8 (it has steps 0 to 7)"),
        (99, "replay_step_not_found", "the trajectory has no step 99 (it has steps 0 to 7)"),
    ],
)
def test_an_unknown_step_is_refused_and_nothing_is_stored(recorded, from_step, code, detail):
    with pytest.raises(exceptions.ReplayInvalid) as raised:
        replay.replay_create(original=recorded.trajectory, from_step=from_step)

    assert (raised.value.code, raised.value.detail) == (code, detail)
    assert raised.value.extra["errors"] == [{"field": "from_step", "message": detail}]
    assert not Replay.objects.exists()


def test_a_step_after_the_last_model_call_is_refused(workspace):
    document = refund_document(messages=refund_document()["messages"][:4])  # ends with a tool result
    trajectory = trajectory_record(workspace, document)

    with pytest.raises(exceptions.ReplayInvalid, match="no model call at or after step 4"):
        replay.replay_create(original=trajectory, from_step=4)
    assert not Replay.objects.exists()


def test_a_prompt_version_of_another_workspace_is_refused(recorded, other_workspace):
    theirs = registry_services.prompt_create(
        agent=AgentFactory.create(workspace=other_workspace), name="theirs", type="text", template="Secret"
    )

    with pytest.raises(exceptions.ReplayInvalid, match="another workspace"):
        replay.replay_create(original=recorded.trajectory, from_step=3, prompt_version=theirs)
    assert not Replay.objects.exists()


def test_prompt_variables_the_original_did_not_record_are_an_error(workspace):
    recorded = refund_recorded(workspace, metadata={})

    with pytest.raises(exceptions.ReplayInvalid) as raised:
        replay.replay_create(original=recorded.trajectory, from_step=3, prompt_version=recorded.version_2)

    assert raised.value.code == "missing_variables"
    assert raised.value.detail == "prompt ride-support/system v2 needs variables the original did not record: company"


def test_a_chat_prompt_version_replaces_the_system_message_with_its_own(recorded, fake_llm):
    # A prompt keeps its type across versions: the chat prompt is a prompt of its own.
    chat = registry_services.prompt_create(
        agent=recorded.trajectory.agent,
        name="ride-support/chat",
        type="chat",
        template=[
            {"role": "system", "content": "Chat desk of {{company}}."},
            {"type": "placeholder", "name": "history"},
        ],
    )
    fake_llm.script = [say("Done.")]

    replay.replay_execute(
        replay_id=replay.replay_create(original=recorded.trajectory, from_step=7, prompt_version=chat).pk
    )

    assert fake_llm.requests[0].messages[0] == {"role": "system", "content": "Chat desk of Acme."}


def test_a_running_original_cannot_be_replayed_yet(recorded):
    Trajectory.objects.filter(pk=recorded.trajectory.pk).update(status="running")
    recorded.trajectory.refresh_from_db()

    with pytest.raises(exceptions.ReplayConflict):
        replay.replay_create(original=recorded.trajectory, from_step=3)
    assert not Replay.objects.exists()


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"divergence_policy": "ask"}, "divergence"),
        ({"stub_result": {"ok": True}}, "stub_result"),  # a stub under the "stop" policy
        ({"max_steps": 0}, "max_steps"),
        ({"max_steps": replay.MAX_STEPS_LIMIT + 1}, "max_steps"),
    ],
)
def test_invalid_options_are_refused(recorded, changes, field):
    with pytest.raises(exceptions.ReplayInvalid) as raised:
        replay.replay_create(original=recorded.trajectory, from_step=3, **changes)

    assert raised.value.extra["errors"][0]["field"] == field
    assert not Replay.objects.exists()


def test_without_a_recorded_model_one_must_be_named(workspace):
    document = refund_document(model=None)

    with pytest.raises(exceptions.ReplayInvalid, match="recorded no model"):
        replay.replay_create(original=trajectory_record(workspace, document), from_step=3)


def test_the_task_runs_the_replay_when_the_request_commits(
    recorded, fake_llm, settings, django_capture_on_commit_callbacks
):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    fake_llm.script = [say(ANSWER)]

    with django_capture_on_commit_callbacks(execute=True):
        created = replay.replay_create(original=recorded.trajectory, from_step=7, model=RECORDED_MODEL)

    assert _replay_state(created) == ("done", 1, 1)
