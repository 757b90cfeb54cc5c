"""Reviewers' decisions and what they add up to: informativeness per strategy, overall and per agent."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from agent_registry.tests.factories import AgentFactory, UserFactory
from tracing import exceptions, triage
from tracing.models import ReviewItem
from tracing.tests.factories import TrajectoryFactory, signal_instance

pytestmark = pytest.mark.django_db

NOW = timezone.now()


@pytest.fixture
def reviewer():
    return UserFactory.create(username="rita")


def _sample(workspace, agent, strategy, count):
    for index in range(count):
        TrajectoryFactory.create(
            workspace=workspace,
            agent=agent,
            signals=[signal_instance("loop")],
            triage_score=0.5,
            started_at=NOW - timedelta(minutes=5 + index),
        )
    return triage.review_sample_create(
        workspace=workspace,
        agent=agent,
        strategy=strategy,
        window_start=NOW - timedelta(hours=1),
        window_end=NOW,
        budget=count,
        allow_repeats=True,
    )


def _decide(sample, decisions, reviewer):
    for item, informative in zip(triage.review_item_list(sample=sample), decisions, strict=False):
        if informative is None:
            triage.review_item_decide(item=item, status="skipped", reviewer=reviewer)
        else:
            triage.review_item_decide(item=item, status="reviewed", informative=informative, reviewer=reviewer)


def test_a_decision_is_recorded_and_can_be_changed(workspace, reviewer):
    agent = AgentFactory.create(workspace=workspace)
    sample = _sample(workspace, agent, "signal", 2)
    item = triage.review_item_get(sample=sample, position=1)

    triage.review_item_decide(
        item=item, status="reviewed", informative=True, failure_mode="loop", note=" looped ", reviewer=reviewer
    )
    triage.review_item_decide(item=item, status="skipped", informative=True, failure_mode="loop", reviewer=reviewer)

    item.refresh_from_db()
    assert (item.status, item.informative, item.failure_mode, item.reviewer) == ("skipped", None, "", reviewer)
    assert item.reviewed_at is not None
    assert triage.review_item_next(sample=sample) == triage.review_item_get(sample=sample, position=2)
    assert triage.review_item_next(sample=sample, after=2) == triage.review_item_get(sample=sample, position=2)


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"status": "pending"}, "status"),
        ({"status": "reviewed"}, "informative"),
        ({"status": "reviewed", "informative": True, "failure_mode": "vibes"}, "failure_mode"),
        ({"status": "reviewed", "informative": True, "note": "x" * 10_001}, "note"),
    ],
)
def test_an_invalid_decision_changes_nothing(workspace, reviewer, arguments, field):
    sample = _sample(workspace, AgentFactory.create(workspace=workspace), "random", 1)
    item = triage.review_item_get(sample=sample, position=1)

    with pytest.raises(exceptions.ReviewDecisionInvalid) as caught:
        triage.review_item_decide(item=item, reviewer=reviewer, **arguments)

    assert [p["field"] for p in caught.value.extra["errors"]] == [field]
    assert ReviewItem.objects.get(pk=item.pk).status == "pending"


def test_informativeness_per_strategy_overall_and_per_agent(workspace, other_workspace, reviewer):
    ride, shop = AgentFactory.create(workspace=workspace, slug="ride"), AgentFactory.create(workspace=workspace)
    _decide(_sample(workspace, ride, "signal", 5), [True, True, True, False, None], reviewer)
    _decide(_sample(workspace, shop, "signal", 2), [True, False], reviewer)
    _decide(_sample(workspace, ride, "random", 4), [True, False, False, False], reviewer)
    _decide(_sample(other_workspace, AgentFactory.create(workspace=other_workspace), "random", 3), [True] * 3, reviewer)

    report = triage.review_informativeness(workspace=workspace)

    assert [(row.strategy, row.reviewed, row.informative) for row in report.overall] == [
        ("signal", 6, 4),
        ("random", 4, 1),
    ]
    per_agent = {
        entry.agent.slug if entry.agent else None: [(r.strategy, r.reviewed, r.informative) for r in entry.rows]
        for entry in report.by_agent
    }
    assert per_agent == {"ride": [("signal", 4, 3), ("random", 4, 1)], shop.slug: [("signal", 2, 1)]}
    assert report.comparison.lift == pytest.approx((4 / 6) / (1 / 4))
    assert report.comparison.verdict == "undecided"
    assert triage.review_informativeness(workspace=workspace, agent_ids=[shop.pk]).overall[0].reviewed == 2
    assert triage.review_informativeness(workspace=workspace, agent=ride).overall[0].reviewed == 4


def test_signal_rates_per_bucket_and_prompt_version_in_one_query(workspace, django_assert_max_num_queries):
    from agent_registry.tests.factories import prompt_with_versions

    agent = AgentFactory.create(workspace=workspace)
    prompt = prompt_with_versions(agent=agent, name="system", templates=["v1", "v2"])
    v1, v2 = prompt.versions.order_by("version")
    hour = NOW.replace(minute=30, second=0, microsecond=0) - timedelta(hours=3)
    for index in range(4):
        trajectory = TrajectoryFactory.create(
            workspace=workspace,
            agent=agent,
            started_at=hour + timedelta(minutes=index),
            signals=[signal_instance("misalignment")] if index == 0 else [],
        )
        trajectory.prompt_versions.add(v1)
    for index in range(2):
        trajectory = TrajectoryFactory.create(
            workspace=workspace,
            agent=agent,
            started_at=hour + timedelta(hours=1, minutes=index),
            signals=[signal_instance("misalignment"), signal_instance("loop")],
        )
        trajectory.prompt_versions.add(v2)
    TrajectoryFactory.create(workspace=workspace, agent=agent, started_at=hour)

    with django_assert_max_num_queries(2):
        rates = triage.signal_rate_series(agent=agent, since=NOW - timedelta(hours=6), until=NOW, bucket="hour")

    assert rates.signals == ["misalignment", "loop"]
    by_label = {series.label: series for series in rates.series}
    assert set(by_label) == {"system v1", "system v2", triage.NO_PROMPT_VERSION}
    first = rates.buckets.index(hour.replace(minute=0))
    assert by_label["system v1"].totals[first] == 4
    assert by_label["system v1"].rates("misalignment")[first] == 0.25
    assert by_label["system v2"].rates("misalignment")[first + 1] == 1.0
    assert by_label["system v2"].rates("misalignment")[first] is None
    assert by_label[triage.NO_PROMPT_VERSION].rates("misalignment")[first] == 0.0
