"""Beat schedules of triage (written by migration 0008), and the demo workspace's triage: settings, a
review queue per strategy with decisions, alert rules and the alerts they fired; seeded once."""

from __future__ import annotations

import pytest
from django_celery_beat.models import PeriodicTask

from agent_registry import demo as registry_demo
from tracing import demo, sampling, triage
from tracing.models import Alert, AlertRule, ReviewItem, ReviewSample, TriageSettings

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def media(tmp_path, settings):
    """The seed writes files (the trainer bridge's exports, base model and adapter): each test keeps its own."""
    settings.MEDIA_ROOT = tmp_path / "media"


def test_migrations_schedule_alert_evaluation_delivery_and_the_daily_draw():
    schedules = {
        task.task: (task.interval.every, task.interval.period) if task.interval else (task.crontab.hour, "cron")
        for task in PeriodicTask.objects.select_related("interval", "crontab").filter(enabled=True)
    }

    assert schedules["tracing.alert_rules_evaluate"] == (60, "seconds")
    assert schedules["tracing.alert_delivery_sweep"] == (30, "seconds")
    assert schedules["tracing.review_samples_daily"] == ("4", "cron")


def _counts():
    return {
        model.__name__: model.objects.count() for model in (TriageSettings, ReviewSample, ReviewItem, AlertRule, Alert)
    }


def test_the_demo_shows_every_part_of_triage_and_seeds_once(demo_workspace):
    first = _counts()

    registry_demo.demo_seed()

    assert _counts() == first
    settings = TriageSettings.objects.get(agent__workspace=demo_workspace, agent__slug="ride-support")
    assert settings.review_strategies == ["signal", "random"]
    assert settings.phrases["en"]["negative"]["mode"] == "extend"
    samples = ReviewSample.objects.filter(workspace=demo_workspace)
    assert sorted(samples.values_list("strategy", flat=True)) == sorted(sampling.STRATEGIES)
    for sample in samples:
        reviewed = sample.items.filter(status="reviewed")
        assert reviewed.count() == min(demo.DEMO_REVIEWED_PER_SAMPLE, sample.items.count())
        for item in reviewed:
            problems = set(item.signal_names) & sampling.PROBLEM_SIGNALS - {"exhaustion"}
            if problems or item.trajectory.status == "error":
                assert item.informative, item.signal_names
    report = triage.review_informativeness(workspace=demo_workspace)
    assert report.comparison.signal.share is not None
    assert report.comparison.random.share is not None
    assert report.comparison.signal.share > report.comparison.random.share
    assert {rule.name for rule in AlertRule.objects.filter(workspace=demo_workspace)} == {
        name for _, name, *_ in demo.DEMO_RULES
    }
    fired = Alert.objects.filter(workspace=demo_workspace)
    assert {alert.signal for alert in fired} >= {"error_status"}
    for alert in fired:
        assert alert.observed_rate > alert.threshold
        assert alert.trajectory_count >= alert.rule.min_trajectories
        assert len(alert.trace_ids) == alert.matching_count
