"""An agent's triage settings: validation and merging over the defaults (pure), the service that saves
them and queues a recompute, and the detectors reading them through signal_config_for_agent."""

from __future__ import annotations

import pytest

from agent_registry import services as registry_services
from agent_registry.tests.factories import AgentFactory, requirements_answers
from tracing import exceptions, services, signals, tasks, triage, triage_config
from tracing.models import Trajectory, TriageSettings
from tracing.services import signal_config_for_agent
from tracing.tests.agent_traces import refund_conversation
from tracing.tests.factories import TrajectoryFactory


def test_phrase_lists_extend_or_replace_the_english_defaults():
    built = triage_config.phrase_lists_build(
        {
            "quit": {"mode": "extend", "phrases": ["ich gebe auf", " forget it "]},
            "gratitude": {"mode": "replace", "phrases": ["danke"]},
            "stopwords": {"mode": "extend", "phrases": ["und"]},
        },
        signals.ENGLISH_PHRASES,
    )

    assert built.quit == (*signals.ENGLISH_PHRASES.quit, "ich gebe auf")
    assert built.gratitude == ("danke",)
    assert "und" in built.stopwords
    assert signals.ENGLISH_PHRASES.stopwords < built.stopwords
    assert built.correction == signals.ENGLISH_PHRASES.correction


def test_a_config_carries_weights_thresholds_limits_language_and_handoff_tools():
    base = signals.SignalConfig(max_steps=8, time_budget_seconds=30)

    config = triage_config.signal_config_build(
        base,
        language="de",
        phrases={"de": {"quit": {"mode": "replace", "phrases": ["ich gebe auf"]}}},
        weights={"loop": 0.9, "satisfaction": -0.5},
        thresholds={"loop_repeats": 4, "goal_drift_max_overlap": 0.2},
        limits={"token_budget": 50_000, "context_window_tokens": None},
        handoff_tools=["page_oncall"],
    )

    assert config.phrase_lists.quit == ("ich gebe auf",)
    assert config.phrases["en"] is signals.ENGLISH_PHRASES
    assert config.weight("loop") == 0.9
    assert config.weight("failure") == signals.DEFAULT_WEIGHTS["failure"]
    assert (config.thresholds.loop_repeats, config.thresholds.goal_drift_max_overlap) == (4, 0.2)
    assert (config.token_budget, config.context_window_tokens) == (50_000, None)
    assert (config.max_steps, config.time_budget_seconds) == (8, 30)
    assert "page_oncall" in config.handoff_tools
    assert config.handoff_tools >= signals.DEFAULT_HANDOFF_TOOLS


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"language": ""}, "language"),
        ({"phrases": {"en": {"nonsense": {"mode": "extend", "phrases": ["x"]}}}}, "phrases.en.nonsense"),
        ({"phrases": {"en": {"quit": {"mode": "append", "phrases": ["x"]}}}}, "phrases.en.quit"),
        ({"phrases": {"en": {"quit": {"mode": "extend", "phrases": ["  "]}}}}, "phrases.en.quit"),
        ({"weights": {"loop": 3}}, "weights.loop"),
        ({"weights": {"vibes": 0.5}}, "weights.vibes"),
        ({"thresholds": {"loop_repeats": 2.5}}, "thresholds.loop_repeats"),
        ({"thresholds": {"max_text_chars": 10}}, "thresholds.max_text_chars"),
        ({"limits": {"token_budget": 0}}, "limits.token_budget"),
        ({"handoff_tools": [""]}, "handoff_tools"),
    ],
)
def test_invalid_settings_name_the_field(changes, field):
    arguments = {"language": "en", "phrases": {}, "weights": {}, "thresholds": {}, "limits": {}, "handoff_tools": []}

    problems = triage_config.settings_problems(**{**arguments, **changes})

    assert [problem["field"] for problem in problems] == [field]


@pytest.mark.django_db
def test_saving_settings_stores_them_and_queues_a_recompute_of_the_agents_trajectories(
    workspace, django_capture_on_commit_callbacks, monkeypatch
):
    agent = AgentFactory.create(workspace=workspace, slug="ride-support")
    other = AgentFactory.create(workspace=workspace, slug="other")
    mine = [TrajectoryFactory.create(workspace=workspace, agent=agent) for _ in range(3)]
    TrajectoryFactory.create(workspace=workspace, agent=other)
    queued: list[object] = []
    monkeypatch.setattr(tasks.agent_signals_recompute, "delay", queued.append)
    chunks: list[list[int]] = []
    monkeypatch.setattr(tasks.trajectory_signals_recompute, "delay", chunks.append)

    with django_capture_on_commit_callbacks(execute=True):
        saved = triage.triage_settings_update(
            agent=agent, weights={"loop": 0.9}, review_budget_per_day=5, review_strategies=["signal"]
        )

    assert saved.recomputing == 3
    assert queued == [agent.pk]
    assert triage.agent_signals_recompute_enqueue(agent_id=agent.pk, chunk_size=2) == 2
    assert sorted(pk for chunk in chunks for pk in chunk) == sorted(t.pk for t in mine)
    stored = TriageSettings.objects.get(agent=agent)
    assert (stored.weights, stored.review_budget_per_day, stored.review_strategies) == ({"loop": 0.9}, 5, ["signal"])


@pytest.mark.django_db
def test_changing_only_the_review_budget_recomputes_nothing(workspace, django_capture_on_commit_callbacks, monkeypatch):
    agent = AgentFactory.create(workspace=workspace)
    TrajectoryFactory.create(workspace=workspace, agent=agent)
    queued: list[object] = []
    monkeypatch.setattr(tasks.agent_signals_recompute, "delay", queued.append)

    with django_capture_on_commit_callbacks(execute=True):
        first = triage.triage_settings_update(agent=agent, review_budget_per_day=3, review_strategies=["random"])
        second = triage.triage_settings_update(agent=agent, review_budget_per_day=7, review_strategies=["random"])

    assert (first.recomputing, second.recomputing, queued) == (0, 0, [])


@pytest.mark.django_db
def test_invalid_settings_change_nothing(workspace):
    agent = AgentFactory.create(workspace=workspace)
    triage.triage_settings_update(agent=agent, weights={"loop": 0.7})

    with pytest.raises(exceptions.TriageSettingsInvalid) as caught:
        triage.triage_settings_update(
            agent=agent, weights={"loop": 7}, review_budget_per_day=3, review_strategies=["stratified_agent"]
        )

    assert {p["field"] for p in caught.value.extra["errors"]} == {"weights.loop", "review_strategies"}
    assert TriageSettings.objects.get(agent=agent).weights == {"loop": 0.7}


@pytest.mark.django_db
def test_signal_config_for_agent_keeps_the_requirements_limits_and_adds_the_settings(workspace):
    agent = AgentFactory.create(workspace=workspace)
    registry_services.requirements_version_create(agent=agent, answers=requirements_answers())
    before = signal_config_for_agent(agent.pk)
    triage.triage_settings_update(agent=agent, weights={"goal_drift": 0.1}, limits={"token_budget": 1000})

    after = signal_config_for_agent(agent.pk)

    assert (after.max_steps, after.time_budget_seconds) == (before.max_steps, before.time_budget_seconds)
    assert after.weight("goal_drift") == 0.1
    assert after.token_budget == 1000
    assert signal_config_for_agent(AgentFactory.create(workspace=workspace).pk) is signals.DEFAULT_CONFIG


@pytest.mark.django_db
def test_an_agents_own_phrase_makes_a_signal_fire_after_the_recompute(otel, workspace):
    agent = AgentFactory.create(workspace=workspace, slug="ride-support")
    # The opening request: an agent's phrase for asking for a person reads it (giving up is read only
    # after the agent has answered).
    trace_id = refund_conversation(otel.tracer(), question="Das ist ein Witz, ich will einen Menschen")
    api_key, _ = registry_services.apikey_create(workspace=workspace, name="k", scopes=["ingest"], agents=[agent])
    services.ingest_otlp_accept(
        api_key=api_key, body=otel.protobuf(), content_type="application/x-protobuf", content_encoding=""
    )
    trajectory = Trajectory.objects.get(trace_id=trace_id)
    assert "disengagement" not in trajectory.signal_names

    triage.triage_settings_update(
        agent=agent,
        language="de",
        phrases={"de": {"human_request": {"mode": "extend", "phrases": ["ich will einen menschen"]}}},
    )
    services.trajectory_signals_recompute(trajectory_ids=[trajectory.pk])

    trajectory.refresh_from_db()
    assert "disengagement" in trajectory.signal_names
    (request_signal,) = [i for i in trajectory.signals if i["signal"] == "disengagement"]
    assert request_signal["kind"] == "human_request"
