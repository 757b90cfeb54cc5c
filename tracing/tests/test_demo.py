"""The demo's trajectories: recorded with the OpenTelemetry SDK, ingested through Keel's own path, varied
enough to show every page, and seeded once however often `demo_seed` runs."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest
from django.utils import timezone

from agent_registry import demo as registry_demo
from agent_registry import selectors as registry_selectors
from agent_registry import services as registry_services
from agent_registry.models import ApiKey, PromptVersion
from tracing import demo, replay, selectors
from tracing.models import IngestBatch, Replay, Score, Span, Trajectory

pytestmark = pytest.mark.django_db


def _recorded(workspace=None):
    """The trajectories this module seeds as recordings (the gateway's demo traffic is routing's, tagged
    `gateway`; the replays re-run one of them)."""
    trajectories = Trajectory.objects.exclude(tags__contains=["gateway"]).filter(replay_of__isnull=True)
    return trajectories if workspace is None else trajectories.filter(workspace=workspace)


def _counts() -> dict[str, int]:
    return {
        "trajectories": Trajectory.objects.count(),
        "spans": Span.objects.count(),
        "scores": Score.objects.count(),
        "batches": IngestBatch.objects.count(),
        "keys": ApiKey.objects.count(),
        "replays": Replay.objects.count(),
    }


def test_seeding_twice_adds_nothing(demo_workspace):
    first = _counts()

    registry_demo.demo_seed()
    added = demo.demo_traces_seed(demo_workspace)

    assert _counts() == first
    assert added == 0
    assert demo.demo_replays_seed(demo_workspace) == 0
    assert _recorded().count() == len(demo.week_plan()) + sum(
        1
        for session in demo.week_plan()
        if session.scenario == "misunderstood" or dict(session.options).get("follow_up")
    )


def test_seeding_again_after_someone_published_a_prompt_version_with_a_new_variable(demo_workspace):
    prompt = registry_selectors.prompt_get(workspace=demo_workspace, name="shopping-assistant/system")
    latest = prompt.versions.order_by("-version").first()
    assert latest is not None
    template = "Hi {{customer_name}}"
    registry_services.prompt_version_create(
        prompt=prompt, template=template if latest.type == "text" else [{"role": "system", "content": template}]
    )
    first = _counts()

    added = demo.demo_traces_seed(demo_workspace)

    assert added == 0
    assert _counts() == first


def test_the_trajectories_come_through_ingest_with_the_demo_key(demo_workspace):
    key = ApiKey.objects.get(workspace=demo_workspace, name=demo.DEMO_KEY_NAME)
    trajectories = _recorded(demo_workspace).select_related("agent")

    assert key.scopes == ["ingest"]
    # Stored in the request: no OTLP batch was left for a worker.
    assert not IngestBatch.objects.filter(workspace=demo_workspace, source="otlp").exists()
    assert (
        Span.objects.filter(workspace=demo_workspace, trajectory__in=trajectories).count()
        == sum(t.span_count for t in trajectories)
        > 0
    )
    assert Counter(t.agent.slug for t in trajectories if t.agent is not None) == {
        "ride-support": 33,
        "shopping-assistant": 30,
    }
    assert 55 <= trajectories.count() <= 70


def test_the_week_is_spread_over_seven_days_with_recent_traffic(demo_workspace):
    now = timezone.now()
    started = sorted(Trajectory.objects.filter(workspace=demo_workspace).values_list("started_at", flat=True))

    assert started[0] >= now - timedelta(days=7, minutes=5)
    assert started[-1] <= now
    assert sum(1 for moment in started if moment >= now - timedelta(hours=24)) >= 10
    assert sum(1 for moment in started if moment < now - timedelta(days=3)) >= 10


def _tool_calls(trajectory: Trajectory) -> list[tuple[str, str | None]]:
    view = selectors.trajectory_view(trajectory=trajectory)
    return [(call.name, call.error) for call in view.tool_calls if call.source == "span"]


def test_the_expected_variety_is_there(demo_workspace):
    trajectories = _recorded(demo_workspace)

    # Successful refunds.
    refunds = [t for t in trajectories.filter(tags__contains=["double-charge"]) if t.status == "ok"]
    assert len(refunds) == 12
    assert all(("issue_refund", None) in _tool_calls(t) for t in refunds)
    # A tool timeout that failed the run, with the error text.
    (timeout, *_) = trajectories.filter(tags__contains=["tool-error"])
    assert timeout.status == "error"
    assert ("lookup_payment", "TimeoutError: payments-service did not answer within 10 s") in _tool_calls(timeout)
    # A safety complaint escalated to a human at once.
    safety = trajectories.filter(tags__contains=["safety"])
    assert safety.count() == 2
    assert all(_tool_calls(t) == [("escalate_to_human", None)] for t in safety)
    # A rider who had to rephrase: two turns of one session, the first corrected by a reviewer.
    rephrased = trajectories.filter(tags__contains=["rephrased"]).order_by("trace_id").first()
    assert rephrased is not None
    first_turn = trajectories.filter(session_id=rephrased.session_id).order_by("started_at").first()
    assert first_turn is not None
    assert first_turn != rephrased
    assert first_turn.scores.filter(data_type="correction").exists()
    said = [m["content"] for m in selectors.trajectory_view(trajectory=rephrased).conversation if m["role"] == "user"]
    assert said[-1] == "No, I don't want a refund!! I LEFT MY PHONE in the car. How do I get it back?"
    # A looping tool call: the same search five times.
    loop = trajectories.get(tags__contains=["loop"])
    searches = [c for c in selectors.trajectory_view(trajectory=loop).tool_calls if c.source == "span"]
    assert len(searches) == 5
    assert len({str(c.arguments) for c in searches}) == 1
    # A long run, with a sub-agent inside the tool call that asks it (its answer is the call's result).
    long = trajectories.order_by("-step_count").first()
    assert long is not None
    assert long.step_count >= 40
    steps = selectors.trajectory_view(trajectory=long).steps
    (sub_agent,) = [step for step in steps if step.kind == "agent" and step.depth > 0]
    asked = next(step for step in steps if step.span_id == sub_agent.parent_span_id)
    assert (sub_agent.depth, asked.kind, asked.name) == (2, "tool_call", "execute_tool ask_agent")
    # Shopping queries answered from catalog searches.
    shopping = trajectories.filter(agent__slug="shopping-assistant")
    assert all(any(name == "search_catalog" for name, _ in _tool_calls(t)) for t in shopping)
    # Sessions of several turns.
    turns = Counter(trajectories.values_list("session_id", flat=True))
    assert sum(1 for count in turns.values() if count >= 2) >= 10


def test_trajectories_link_to_the_demo_prompt_versions(demo_workspace):
    linked = {
        (version.prompt.name, version.version)
        for version in PromptVersion.objects.filter(trajectories__workspace=demo_workspace).select_related("prompt")
    }

    assert linked == {
        ("shopping-assistant/system", 1),
        ("shopping-assistant/system", 2),
        ("ride-support/system", 1),
        ("ride-support/system", 2),
    }


def test_reviewers_left_scores_of_every_kind(demo_workspace):
    # The evals demo's online rule adds evaluator scores afterwards; these are the reviewers'.
    scores = Score.objects.filter(workspace=demo_workspace).exclude(source="evaluator").select_related("created_by")

    assert {score.data_type for score in scores} == {"numeric", "boolean", "categorical", "correction"}
    assert {score.source for score in scores} == {"human"}
    assert {score.created_by.username for score in scores if score.created_by} == {registry_demo.DEMO_USERNAME}
    (step_score,) = [score for score in scores if score.span_id]
    assert step_score.name == "redundant_call"
    assert Span.objects.filter(trajectory=step_score.trajectory, span_id=step_score.span_id, tool_name="search_catalog")


def test_the_recording_is_reproducible():
    first, second = demo.week_plan(), demo.week_plan()

    assert first == second
    assert demo.trace_hex("ride-support/01/1") == demo.trace_hex("ride-support/01/1")
    assert demo.Dice("seed").randint(0, 10**9) == demo.Dice("seed").randint(0, 10**9)


def test_the_refund_policy_sub_agent_runs_on_a_model_nothing_prices(demo_workspace):
    """The long refund turn hands the policy question to a self-hosted model: its two calls show as unpriced,
    beside the priced gpt-4o calls, not as free ones."""
    (trajectory,) = _recorded(demo_workspace).filter(unpriced_call_count__gt=0)

    assert (trajectory.unpriced_call_count, trajectory.unpriced_models) == (2, [demo.POLICY_MODEL])
    assert trajectory.cost_usd is not None
    assert trajectory.cost_usd > 0
    assert "multi-trip" in trajectory.tags
    policy_calls = Span.objects.filter(workspace=demo_workspace, trace_id=trajectory.trace_id, model=demo.POLICY_MODEL)
    assert list(policy_calls.values_list("cost_usd", flat=True)) == [None, None]


def test_the_demo_replays_a_refund_conversation_as_a_worker_would(demo_workspace):
    replays = list(Replay.objects.filter(workspace=demo_workspace).select_related("prompt_version").order_by("pk"))

    assert [(r.status, r.divergence_policy) for r in replays] == [
        ("done", "stop"),
        ("stopped_divergence", "stop"),
        ("done", "stub"),
        ("done", "stop"),
    ]
    answered, stopped, stubbed, _ = replays
    assert {r.original_id for r in (answered, stopped, stubbed)} == {answered.original_id}
    assert (answered.model, answered.prompt_version.version if answered.prompt_version else None) == (
        demo.REPLAY_MODEL,
        1,
    )
    assert answered.replay_trajectory is not None
    assert answered.replay_trajectory.replay_of_id == answered.original_id
    assert (stopped.divergence_tool_name, stubbed.divergence_tool_name) == ("issue_refund", "issue_refund")
    assert stubbed.replay_trajectory is not None
    served = {
        (span.tool_name, span.attributes.get(replay.SOURCE_ATTRIBUTE))
        for span in selectors.trajectory_spans(trajectory=stubbed.replay_trajectory)
        if span.tool_name
    }
    assert ("issue_refund", "stub") in served


def test_the_demo_replays_the_policy_sub_agent_and_the_ride_agent_goes_on_offline_on_its_own_model(demo_workspace):
    """From the refund-policy sub-agent's answer on the strong model: the ride agent reads the new answer where
    the recorded one was and goes on, on the model it recorded (gpt-4o, the demo's target of that name serves
    it on the fake provider), and its final answer changes."""
    sub_agent_replay = Replay.objects.filter(workspace=demo_workspace).select_related("original").order_by("pk")[3]
    original = sub_agent_replay.original

    assert demo.SUB_AGENT_TAG_PICKED in original.tags
    assert (sub_agent_replay.status, sub_agent_replay.error, sub_agent_replay.model) == ("done", "", demo.REPLAY_MODEL)
    replayed_from = selectors.trajectory_view(trajectory=original).steps[sub_agent_replay.from_step]
    assert (replayed_from.kind, replayed_from.model) == ("llm_call", demo.POLICY_MODEL)
    new = sub_agent_replay.replay_trajectory
    assert new is not None
    spans = sorted(selectors.trajectory_spans(trajectory=new), key=lambda span: span.start_time_ns)
    assert [span.request_model for span in spans if span.span_type == "generation"] == [
        "keel-demo/strong",
        f"keel-demo/{demo.RIDE.model}",
    ]
    verdict, answer = [span.output[0]["content"] for span in spans if span.span_type == "generation"]
    assert verdict.startswith("Eligible only where the charge is confirmed as an error")
    # The ride agent's resumed call carried the new answer as the result of the call that asked the sub-agent.
    resumed = [span for span in spans if span.span_type == "generation"][1].input
    assert resumed[-1]["role"] == "tool"
    assert resumed[-1]["content"] == verdict
    assert answer == f"I had your request checked by a specialist: {verdict}"
    assert new.output_preview == answer
    assert original.output_preview is not None
    assert original.output_preview.startswith("I checked your six rides since Monday.")

    diff = selectors.replay_diff_get(replay=sub_agent_replay)
    assert diff.first_difference is not None
    sub_agent_answer = diff.steps[diff.first_difference]
    assert (sub_agent_answer.label, sub_agent_answer.status) == ("assistant", "changed")
    # With the stricter answer the agent refunds nothing: its answer stands where it made the first refund,
    # and the rest of the original, up to its final answer, is the original's only.
    parent_answer = [pair for pair in diff.steps if pair.replayed and pair.replay_index is not None][-1]
    content = next(change for change in parent_answer.changes if change.field == "content")
    assert (parent_answer.status, content.original, content.replay) == ("changed", None, answer)
    assert (diff.steps[-1].status, diff.steps[-1].label) == ("only_in_original", "assistant")
