"""Alert rules: the rate over a window, the minimum count, the cooldown, evaluators racing each other,
and the deliveries each firing writes."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from agent_registry.tests.factories import AgentFactory
from config import crypto
from tracing import alerts, exceptions, tasks
from tracing.models import Alert, AlertDelivery, AlertRule, Trajectory
from tracing.tests.factories import AlertRuleFactory, TrajectoryFactory, signal_instance

NOW = timezone.now().replace(second=30, microsecond=0)


def _traffic(workspace, agent, total, looping, *, minutes_ago=10, status="ok"):
    for index in range(total):
        TrajectoryFactory.create(
            workspace=workspace,
            agent=agent,
            status=status if index < looping else "ok",
            signals=[signal_instance("loop")] if index < looping else [],
            started_at=NOW - timedelta(minutes=minutes_ago, seconds=index),
        )


@pytest.fixture
def agent(workspace):
    return AgentFactory.create(workspace=workspace, slug="ride-support")


@pytest.mark.django_db
def test_a_rule_fires_above_its_threshold_with_the_trajectories_behind_it(workspace, agent):
    _traffic(workspace, agent, total=40, looping=2)
    _traffic(workspace, agent, total=5, looping=5, minutes_ago=90)  # before the window
    rule = AlertRuleFactory.create(agent=agent, threshold=0.02, min_trajectories=20)

    alert = alerts.alert_rule_evaluate(rule=rule, now=NOW)

    assert alert is not None
    assert (alert.matching_count, alert.trajectory_count, alert.observed_rate) == (2, 40, 0.05)
    assert alert.window_end == NOW.replace(second=0)
    assert alert.window_start == alert.window_end - timedelta(minutes=60)
    assert len(alert.trace_ids) == 2
    assert list(alert.deliveries.values_list("channel", "status")) == [("dashboard", "done")]
    rule.refresh_from_db()
    assert rule.last_fired_at == NOW


@pytest.mark.django_db
def test_too_few_trajectories_never_fire_however_bad_the_rate(workspace, agent):
    _traffic(workspace, agent, total=3, looping=3)
    rule = AlertRuleFactory.create(agent=agent, threshold=0.02, min_trajectories=20)

    assert alerts.alert_rule_evaluate(rule=rule, now=NOW) is None
    assert alerts.alert_rule_observe(rule=rule, now=NOW).rate == 1.0
    assert Alert.objects.count() == 0


@pytest.mark.django_db
def test_a_rate_at_the_threshold_does_not_fire(workspace, agent):
    _traffic(workspace, agent, total=50, looping=1)
    rule = AlertRuleFactory.create(agent=agent, threshold=0.02, min_trajectories=20)

    assert alerts.alert_rule_evaluate(rule=rule, now=NOW) is None


@pytest.mark.django_db
def test_the_error_status_rule_counts_failed_runs(workspace, agent):
    _traffic(workspace, agent, total=10, looping=3, status="error")
    rule = AlertRuleFactory.create(agent=agent, signal="error_status", threshold=0.2, min_trajectories=10)

    alert = alerts.alert_rule_evaluate(rule=rule, now=NOW)

    assert alert is not None
    assert alert.matching_count == 3
    assert alerts.alert_trajectories_query(alert)["status"] == "error"


@pytest.mark.django_db
def test_the_cooldown_holds_a_rule_quiet_then_lets_it_fire_again(workspace, agent):
    _traffic(workspace, agent, total=20, looping=10)
    rule = AlertRuleFactory.create(agent=agent, threshold=0.1, min_trajectories=5, cooldown_minutes=30)

    first = alerts.alert_rule_evaluate(rule=rule, now=NOW)
    rule.refresh_from_db()
    during = alerts.alert_rule_evaluate(rule=rule, now=NOW + timedelta(minutes=29))
    rule.refresh_from_db()
    after = alerts.alert_rule_evaluate(rule=rule, now=NOW + timedelta(minutes=31))

    assert first is not None
    assert during is None
    assert after is not None
    assert Alert.objects.count() == 2


@pytest.mark.django_db
def test_a_stale_copy_of_a_rule_cannot_fire_inside_the_cooldown(workspace, agent):
    """An evaluator that read the rule before another fired it: the conditional UPDATE refuses it."""
    _traffic(workspace, agent, total=20, looping=10)
    rule = AlertRuleFactory.create(agent=agent, threshold=0.1, min_trajectories=5)
    stale = AlertRule.objects.get(pk=rule.pk)

    assert alerts.alert_rule_evaluate(rule=rule, now=NOW) is not None
    assert alerts.alert_rule_evaluate(rule=stale, now=NOW + timedelta(seconds=20)) is None
    assert Alert.objects.count() == 1


@pytest.mark.django_db
def test_disabled_rules_are_not_evaluated(workspace, agent):
    _traffic(workspace, agent, total=20, looping=10)
    AlertRuleFactory.create(agent=agent, threshold=0.1, min_trajectories=5, enabled=False)
    enabled = AlertRuleFactory.create(agent=agent, name="Enabled", threshold=0.1, min_trajectories=5)

    fired = alerts.alert_rules_evaluate(now=NOW)

    assert [alert.rule_id for alert in fired] == [enabled.pk]


@pytest.mark.django_db(transaction=True)
def test_concurrent_evaluators_fire_a_rule_once(workspace, agent):
    _traffic(workspace, agent, total=20, looping=10)
    AlertRuleFactory.create(agent=agent, threshold=0.1, min_trajectories=5)
    start = threading.Barrier(4)
    fired: list[int] = []
    errors: list[BaseException] = []

    def evaluate(offset: int) -> None:
        try:
            start.wait()
            fired.extend(alert.pk for alert in alerts.alert_rules_evaluate(now=NOW + timedelta(seconds=offset)))
        except BaseException as error:
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=evaluate, args=(offset,)) for offset in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert len(fired) == 1
    assert Alert.objects.count() == 1


@pytest.mark.django_db
def test_email_and_webhook_deliveries_are_queued_after_the_commit(
    workspace, agent, django_capture_on_commit_callbacks, monkeypatch, fake_dns
):
    fake_dns["hooks.example.com"] = ["93.184.215.14"]
    _traffic(workspace, agent, total=20, looping=10)
    rule = alerts.alert_rule_create(
        agent=agent,
        fields=alerts.RuleFields(
            name="Loops",
            signal="loop",
            threshold=0.1,
            min_trajectories=5,
            email_to=["oncall@example.com"],
            webhook_url="https://hooks.example.com/hook",
        ),
        webhook_secret="s3cret",
    )
    sent: list[int] = []
    monkeypatch.setattr(tasks.alert_delivery_deliver, "delay", sent.append)

    with django_capture_on_commit_callbacks(execute=True):
        alert = alerts.alert_rule_evaluate(rule=rule, now=NOW)

    assert alert is not None
    pending = AlertDelivery.objects.filter(alert=alert, status="pending")
    assert sorted(pending.values_list("channel", flat=True)) == ["email", "webhook"]
    assert sorted(sent) == sorted(pending.values_list("pk", flat=True))


@pytest.mark.django_db
def test_rule_validation_names_every_bad_field_and_stores_nothing(agent):
    with pytest.raises(exceptions.AlertRuleInvalid) as caught:
        alerts.alert_rule_create(
            agent=agent,
            fields=alerts.RuleFields(
                name="",
                signal="vibes",
                threshold=1.5,
                window_minutes=0,
                severity="panic",
                email_to=["not an address"],
                webhook_url="ftp://example.com",
            ),
        )

    assert {p["field"] for p in caught.value.extra["errors"]} == {
        "name",
        "signal",
        "threshold",
        "window_minutes",
        "severity",
        "email_to",
        "webhook_url",
        "webhook_secret",
    }
    assert AlertRule.objects.count() == 0


@pytest.mark.django_db
def test_the_webhook_secret_is_stored_encrypted_and_kept_on_update(agent):
    fields = alerts.RuleFields(name="Loops", signal="loop", threshold=0.1, webhook_url="https://hooks.example.com/k")
    rule = alerts.alert_rule_create(agent=agent, fields=fields, webhook_secret="s3cret")

    assert "s3cret" not in rule.webhook_secret_encrypted
    assert crypto.decrypt(rule.webhook_secret_encrypted) == "s3cret"
    kept = alerts.alert_rule_update(rule=rule, fields=fields, webhook_secret=None)
    assert crypto.decrypt(kept.webhook_secret_encrypted) == "s3cret"
    dropped = alerts.alert_rule_update(
        rule=kept, fields=alerts.RuleFields(name="Loops", signal="loop", threshold=0.1), webhook_secret=None
    )
    assert (dropped.webhook_url, dropped.webhook_secret_encrypted) == ("", "")


@pytest.mark.django_db
def test_acknowledging_keeps_the_first_acknowledgement(workspace, agent):
    from agent_registry.tests.factories import UserFactory
    from tracing.tests.factories import AlertFactory

    alert = AlertFactory.create(rule=AlertRuleFactory.create(agent=agent))
    first, second = UserFactory.create(username="first"), UserFactory.create(username="second")

    alerts.alert_acknowledge(alert=alert, user=first)
    acknowledged_at = alert.acknowledged_at
    alerts.alert_acknowledge(alert=alert, user=second)

    assert alert.acknowledged_by == first
    assert alert.acknowledged_at == acknowledged_at
    assert alerts.alert_unacknowledged_count(workspace=workspace) == 0


def _satisfied(workspace, agent, total, satisfied):
    for index in range(total):
        TrajectoryFactory.create(
            workspace=workspace,
            agent=agent,
            signals=[signal_instance("satisfaction")] if index < satisfied else [],
            started_at=NOW - timedelta(minutes=10, seconds=index),
        )


@pytest.mark.django_db
def test_a_below_rule_fires_when_satisfaction_drops_with_the_unsatisfied_trajectories_behind_it(
    workspace, agent, mailoutbox
):
    _satisfied(workspace, agent, total=20, satisfied=5)
    below = AlertRuleFactory.create(agent=agent, signal="satisfaction", direction="below", threshold=0.5)
    above = AlertRuleFactory.create(agent=agent, name="Above", signal="satisfaction", threshold=0.5)

    alert = alerts.alert_rule_evaluate(rule=below, now=NOW)

    assert alerts.alert_rule_evaluate(rule=above, now=NOW) is None
    assert alert is not None
    assert (alert.direction, alert.matching_count, alert.trajectory_count, alert.observed_rate) == (
        "below",
        5,
        20,
        0.25,
    )
    unsatisfied = set(
        Trajectory.objects.filter(agent=agent)
        .exclude(signal_names__contains=["satisfaction"])
        .values_list("trace_id", flat=True)
    )
    assert len(alert.trace_ids) == 15
    assert set(alert.trace_ids) == unsatisfied
    # The list cannot filter for "without a signal": the link is the whole window the rate was taken over.
    assert "signal" not in alerts.alert_trajectories_query(alert)
    assert alerts.alert_payload(alert)["alert"]["direction"] == "below"


@pytest.mark.django_db
@pytest.mark.parametrize(("satisfied", "fires"), [(9, True), (10, False), (12, False)])
def test_a_below_rule_fires_only_strictly_under_its_threshold(workspace, agent, satisfied, fires):
    _satisfied(workspace, agent, total=20, satisfied=satisfied)
    rule = AlertRuleFactory.create(agent=agent, signal="satisfaction", direction="below", threshold=0.5)

    assert (alerts.alert_rule_evaluate(rule=rule, now=NOW) is not None) is fires


@pytest.mark.django_db
def test_a_below_rule_never_fires_on_too_few_trajectories(workspace, agent):
    _satisfied(workspace, agent, total=3, satisfied=0)
    rule = AlertRuleFactory.create(agent=agent, signal="satisfaction", direction="below", threshold=0.5)

    assert alerts.alert_rule_evaluate(rule=rule, now=NOW) is None


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("direction", "threshold", "field"),
    [
        ("below", 0.0, "threshold"),
        ("above", 1.0, "threshold"),
        ("below", 1.2, "threshold"),
        ("sideways", 0.5, "direction"),
    ],
)
def test_a_threshold_that_cannot_be_crossed_is_refused(agent, direction, threshold, field):
    with pytest.raises(exceptions.AlertRuleInvalid) as caught:
        alerts.alert_rule_create(
            agent=agent,
            fields=alerts.RuleFields(name="Sat", signal="satisfaction", threshold=threshold, direction=direction),
        )

    assert [problem["field"] for problem in caught.value.extra["errors"]] == [field]
    assert AlertRule.objects.count() == 0


@pytest.mark.django_db
def test_a_below_rule_may_watch_for_anything_short_of_everyone_satisfied(agent):
    rule = alerts.alert_rule_create(
        agent=agent, fields=alerts.RuleFields(name="Sat", signal="satisfaction", threshold=1.0, direction="below")
    )

    assert (rule.direction, rule.threshold) == ("below", 1.0)
    assert str(rule) == "Sat (satisfaction < 100.0% over 60 min)"


@pytest.mark.django_db
def test_the_database_refuses_a_threshold_on_the_wrong_side(agent):
    from django.db import IntegrityError, transaction

    with pytest.raises(IntegrityError), transaction.atomic():
        AlertRuleFactory.create(agent=agent, direction="below", threshold=0.0)
