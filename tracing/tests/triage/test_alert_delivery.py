"""Alert deliveries against a local HTTP server and Django's in-memory mail: the signature a receiver
checks, retries with backoff on failure, failing for good after the last attempt."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import timedelta

import pytest
from django.utils import timezone

from agent_registry.tests.factories import AgentFactory
from tracing import alerts
from tracing.models import AlertDelivery
from tracing.tests.factories import TrajectoryFactory, signal_instance

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _private_receivers_permitted(settings):
    """Every receiver here listens on 127.0.0.1, which Keel refuses unless the operator permits it
    (test_webhook_addresses.py tests the refusal)."""
    settings.KEEL_OUTBOUND_ALLOW_PRIVATE = True


def _fired(workspace, **fields):
    agent = AgentFactory.create(workspace=workspace, slug="ride-support", name="Ride support")
    now = timezone.now()
    for index in range(10):
        TrajectoryFactory.create(
            workspace=workspace,
            agent=agent,
            signals=[signal_instance("loop")] if index < 4 else [],
            started_at=now - timedelta(minutes=5, seconds=index),
        )
    rule = alerts.alert_rule_create(
        agent=agent,
        fields=alerts.RuleFields(name="Loop rate", signal="loop", threshold=0.1, min_trajectories=5, **fields),
        webhook_secret="whsec-test" if fields.get("webhook_url") else "",
    )
    alert = alerts.alert_rule_evaluate(rule=rule, now=now)
    assert alert is not None
    return alert


def _due(delivery: AlertDelivery) -> None:
    """Make a scheduled retry due now (instead of waiting out the backoff)."""
    AlertDelivery.objects.filter(pk=delivery.pk).update(next_attempt_at=timezone.now() - timedelta(seconds=1))


def test_a_webhook_is_json_signed_with_hmac_sha256(workspace, receiver):
    alert = _fired(workspace, webhook_url=receiver.url)
    delivery = alert.deliveries.get(channel="webhook")

    assert alerts.alert_delivery_deliver(delivery_id=delivery.pk) is True

    (request,) = receiver.requests
    headers = {key.lower(): value for key, value in request["headers"].items()}
    body = request["body"]
    assert isinstance(body, bytes)
    expected = hmac.new(b"whsec-test", headers["x-keel-timestamp"].encode() + b"." + body, hashlib.sha256).hexdigest()
    assert headers["x-keel-signature"] == f"sha256={expected}"
    assert headers["content-type"] == "application/json"
    assert headers["x-keel-event"] == "alert"
    payload = json.loads(body)
    assert payload["type"] == "keel.alert"
    assert payload["alert"]["id"] == alert.pk
    assert payload["alert"]["observed_rate"] == 0.4
    assert payload["alert"]["trace_ids"] == alert.trace_ids
    assert "signal=loop" in payload["alert"]["trajectories_url"]
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.last_error) == ("done", 1, "")


def test_a_failed_webhook_is_retried_with_backoff_until_it_succeeds(workspace, receiver):
    alert = _fired(workspace, webhook_url=receiver.url)
    delivery = alert.deliveries.get(channel="webhook")
    receiver.statuses = [500, 503]

    assert alerts.alert_delivery_deliver(delivery_id=delivery.pk) is False
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts) == ("pending", 1)
    assert delivery.last_error.startswith("HTTP 500")
    assert delivery.next_attempt_at > timezone.now() + timedelta(seconds=20)
    assert alerts.alert_delivery_due() == []
    assert alerts.alert_delivery_deliver(delivery_id=delivery.pk) is False  # not due yet: not even tried

    _due(delivery)
    assert alerts.alert_delivery_due() == [delivery.pk]
    assert alerts.alert_delivery_deliver(delivery_id=delivery.pk) is False
    delivery.refresh_from_db()
    assert (delivery.attempts, delivery.last_error[:8]) == (2, "HTTP 503")

    _due(delivery)
    assert alerts.alert_delivery_deliver(delivery_id=delivery.pk) is True
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.last_error) == ("done", 3, "")
    assert len(receiver.requests) == 3


def test_the_backoff_doubles_up_to_an_hour():
    assert [alerts.retry_delay(n).total_seconds() for n in (1, 2, 3, 4, 10)] == [30, 60, 120, 240, 3600]


def test_a_webhook_that_keeps_failing_ends_failed_with_its_error(workspace):
    alert = _fired(workspace, webhook_url="http://127.0.0.1:9/nothing-listens-here")
    delivery = alert.deliveries.get(channel="webhook")

    for _ in range(alerts.MAX_ATTEMPTS):
        _due(delivery)
        assert alerts.alert_delivery_deliver(delivery_id=delivery.pk) is False

    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts) == ("failed", alerts.MAX_ATTEMPTS)
    assert "ConnectError" in delivery.last_error
    assert alerts.alert_delivery_due() == []


def test_an_email_goes_through_djangos_email_backend(workspace, mailoutbox):
    alert = _fired(workspace, email_to=["oncall@example.com", "lead@example.com"])
    delivery = alert.deliveries.get(channel="email")

    assert alerts.alert_delivery_deliver(delivery_id=delivery.pk) is True

    (message,) = mailoutbox
    assert sorted(message.to) == ["lead@example.com", "oncall@example.com"]
    assert message.subject == "[Keel Warning] Ride support: Loop at 40.0% (above threshold 10.0%)"
    assert "4 of 10 trajectories" in message.body
    assert "signal=loop" in message.body
    delivery.refresh_from_db()
    assert delivery.status == "done"


def test_a_delivery_is_sent_once_however_often_its_task_runs(workspace, mailoutbox):
    alert = _fired(workspace, email_to=["oncall@example.com"])
    delivery = alert.deliveries.get(channel="email")

    results = [alerts.alert_delivery_deliver(delivery_id=delivery.pk) for _ in range(3)]

    assert results == [True, False, False]
    assert len(mailoutbox) == 1
