"""Drawing review samples: the strategies on real rows, the window, the queue that never draws a
trajectory twice, and the daily draw that runs once however many processes run it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import IntegrityError
from django.utils import timezone

from agent_registry.tests.factories import AgentFactory
from tracing import exceptions, triage
from tracing.models import ReviewItem, ReviewSample, Trajectory, TriageSettings
from tracing.tests.factories import TrajectoryFactory, signal_instance

pytestmark = pytest.mark.django_db

NOW = timezone.now()
DAY = (NOW - timedelta(days=1), NOW)


@pytest.fixture
def agents(workspace):
    return (
        AgentFactory.create(workspace=workspace, slug="ride-support"),
        AgentFactory.create(workspace=workspace, slug="shopping"),
    )


def _traffic(workspace, agent, count, *, signal=None, score=0.0, steps=6, hours_ago=1.0):
    return [
        TrajectoryFactory.create(
            workspace=workspace,
            agent=agent,
            signals=[signal_instance(signal)] if signal else [],
            triage_score=score,
            step_count=steps,
            started_at=NOW - timedelta(hours=hours_ago, minutes=index),
        )
        for index in range(count)
    ]


def _draw(workspace, strategy, budget=10, **options):
    sample = triage.review_sample_create(
        workspace=workspace, strategy=strategy, window_start=DAY[0], window_end=DAY[1], budget=budget, **options
    )
    return sample, list(sample.items.order_by("position").select_related("trajectory"))


def test_signal_sampling_takes_turns_across_signals(workspace, agents):
    ride, _ = agents
    noisy = _traffic(workspace, ride, 20, signal="exhaustion", score=0.8)
    loops = _traffic(workspace, ride, 2, signal="loop", score=0.5)
    _traffic(workspace, ride, 5)

    sample, items = _draw(workspace, "signal", budget=6, agent=ride)

    chosen = {item.trajectory_id for item in items}
    assert len(items) == 6
    assert {t.pk for t in loops} <= chosen
    assert sum(1 for t in noisy if t.pk in chosen) == 4
    assert [item.position for item in items] == [1, 2, 3, 4, 5, 6]
    assert items[0].triage_score == 0.8
    assert items[0].signal_names == ["exhaustion"]
    assert sample.source == "manual"


def test_signal_sampling_follows_the_agents_own_weights(workspace, agents):
    ride, shopping = agents
    limited = [
        TrajectoryFactory.create(
            workspace=workspace,
            agent=ride,
            signals=[signal_instance("exhaustion"), signal_instance("stagnation")],
            triage_score=0.45,
            started_at=NOW - timedelta(hours=1, minutes=index),
        )
        for index in range(10)
    ]
    _traffic(workspace, ride, 10, signal="loop", score=0.36)
    satisfied = _traffic(workspace, shopping, 3, signal="satisfaction", score=0.3)

    _, before = _draw(workspace, "signal", budget=6, agent=ride)
    # Rate limits are noise to this team; a satisfied shopper is worth a look to the other one.
    triage.triage_settings_update(agent=ride, weights={"exhaustion": 0.0})
    triage.triage_settings_update(agent=shopping, weights={"satisfaction": 0.5})
    # What the recompute the save queues does to the scores: exhaustion no longer counts.
    Trajectory.objects.filter(pk__in=[t.pk for t in limited]).update(triage_score=0.24)
    _, after = _draw(workspace, "signal", budget=6, agent=ride, allow_repeats=True)
    _, workspace_wide = _draw(workspace, "signal", budget=12)

    # Exhaustion and stagnation each took a turn for the limited runs; now only stagnation does.
    assert sum(1 for item in before if item.trajectory_id in {t.pk for t in limited}) == 4
    assert sum(1 for item in after if item.trajectory_id in {t.pk for t in limited}) == 3
    assert {t.pk for t in satisfied} <= {item.trajectory_id for item in workspace_wide}


def test_length_sampling_takes_the_longest(workspace, agents):
    ride, _ = agents
    _traffic(workspace, ride, 5, steps=4)
    long = _traffic(workspace, ride, 3, steps=40)

    _, items = _draw(workspace, "length", budget=3, agent=ride)

    assert {item.trajectory_id for item in items} == {t.pk for t in long}


def test_random_sampling_is_reproducible_from_its_seed_and_stays_in_the_window(workspace, agents):
    ride, _ = agents
    inside = _traffic(workspace, ride, 30)
    _traffic(workspace, ride, 10, hours_ago=30)
    TrajectoryFactory.create(workspace=workspace, agent=ride, status="running", started_at=NOW - timedelta(hours=1))

    _, first = _draw(workspace, "random", budget=8, agent=ride, seed="s1", allow_repeats=True)
    _, again = _draw(workspace, "random", budget=8, agent=ride, seed="s1", allow_repeats=True)
    _, other = _draw(workspace, "random", budget=8, agent=ride, seed="s2", allow_repeats=True)

    assert [i.trajectory_id for i in first] == [i.trajectory_id for i in again]
    assert [i.trajectory_id for i in first] != [i.trajectory_id for i in other]
    assert {i.trajectory_id for i in first} <= {t.pk for t in inside}


def test_stratified_by_agent_splits_the_budget_across_agents(workspace, agents):
    ride, shopping = agents
    _traffic(workspace, ride, 30)
    _traffic(workspace, shopping, 3)

    _, items = _draw(workspace, "stratified_agent", budget=8)

    per_agent = {agent.pk: sum(1 for item in items if item.trajectory.agent_id == agent.pk) for agent in agents}
    assert per_agent == {ride.pk: 5, shopping.pk: 3}


def test_stratified_by_score_reaches_every_bucket(workspace, agents):
    ride, _ = agents
    _traffic(workspace, ride, 20)
    _traffic(workspace, ride, 20, signal="stagnation", score=0.1)
    _traffic(workspace, ride, 2, signal="loop", score=0.9)

    _, items = _draw(workspace, "stratified_score", budget=9, agent=ride)

    scores = sorted(item.triage_score for item in items)
    assert scores.count(0.0) == 4 or scores.count(0.0) == 3
    assert scores.count(0.9) == 2
    assert len(items) == 9


def test_a_queue_never_draws_a_trajectory_twice_unless_asked(workspace, agents):
    ride, _ = agents
    _traffic(workspace, ride, 6)

    _, first = _draw(workspace, "random", budget=4, agent=ride)
    _, second = _draw(workspace, "random", budget=4, agent=ride)
    _, other_queue = _draw(workspace, "length", budget=4, agent=ride)
    _, repeated = _draw(workspace, "random", budget=4, agent=ride, allow_repeats=True)

    assert not {i.trajectory_id for i in first} & {i.trajectory_id for i in second}
    assert len(second) == 2
    assert len(other_queue) == 4
    assert len(repeated) == 4


def test_invalid_samples_store_nothing(workspace, other_workspace, agents):
    theirs = AgentFactory.create(workspace=other_workspace, slug="theirs")
    cases: list[tuple[dict[str, Any], str]] = [
        ({"strategy": "vibes"}, "strategy"),
        ({"strategy": "random", "budget": 0}, "budget"),
        ({"strategy": "random", "window_end": DAY[0]}, "window_end"),
        ({"strategy": "stratified_agent", "agent": agents[0]}, "agent"),
        ({"strategy": "random", "agent": theirs}, "agent"),
    ]
    for changes, field in cases:
        arguments: dict[str, Any] = {
            "strategy": "random",
            "window_start": DAY[0],
            "window_end": DAY[1],
            "budget": 5,
            **changes,
        }
        with pytest.raises(exceptions.ReviewSampleInvalid) as caught:
            triage.review_sample_create(workspace=workspace, **arguments)
        assert field in [problem["field"] for problem in caught.value.extra["errors"]]
    assert ReviewSample.objects.count() == 0


def test_the_daily_draw_splits_each_agents_budget_and_runs_once(workspace, agents):
    ride, shopping = agents
    now = datetime(2026, 3, 2, 4, 15, tzinfo=UTC)
    for index in range(12):
        TrajectoryFactory.create(
            workspace=workspace,
            agent=ride,
            started_at=datetime(2026, 3, 1, 10, index, tzinfo=UTC),
            signals=[signal_instance("loop")] if index % 2 else [],
            triage_score=0.6 if index % 2 else 0.0,
        )
    TrajectoryFactory.create(workspace=workspace, agent=ride, started_at=datetime(2026, 3, 2, 1, tzinfo=UTC))
    TriageSettings.objects.create(agent=ride, review_budget_per_day=6, review_strategies=["signal", "random"])
    TriageSettings.objects.create(agent=shopping, review_budget_per_day=0, review_strategies=["random"])

    created = triage.review_samples_daily(now=now)
    again = triage.review_samples_daily(now=now + timedelta(minutes=5))

    assert again == []
    assert sorted((s.strategy, s.budget, s.agent_id, s.source) for s in created) == [
        ("random", 3, ride.pk, "daily"),
        ("signal", 3, ride.pk, "daily"),
    ]
    assert {s.window_start for s in created} == {datetime(2026, 3, 1, tzinfo=UTC)}
    assert ReviewItem.objects.filter(sample__in=created).count() == 6


def test_the_database_refuses_a_second_daily_sample_of_a_queue(workspace, agents):
    ride, _ = agents
    kwargs = {
        "workspace": workspace,
        "agent": ride,
        "strategy": "random",
        "window_start": DAY[0],
        "window_end": DAY[1],
        "budget": 3,
        "source": "daily",
    }
    triage.review_sample_create(**kwargs)

    with pytest.raises(IntegrityError):
        triage.review_sample_create(**kwargs)
