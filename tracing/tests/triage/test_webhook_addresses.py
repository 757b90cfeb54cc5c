"""Alert webhooks go only to addresses the operator permits (tracing/outbound.py): refused when the rule is
saved (422 naming webhook_url, nothing stored) and again at delivery, where the host is resolved once,
every address checked, and the connection made to the checked address. Names resolve through the fake
resolver (`fake_dns`), never real DNS."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings
from django.utils import timezone

from agent_registry.tests.factories import AgentFactory
from tracing import alerts, exceptions, outbound
from tracing.models import AlertRule
from tracing.tests import fake_dns as resolver
from tracing.tests.factories import TrajectoryFactory, signal_instance

pytestmark = pytest.mark.django_db

PUBLIC = "93.184.215.14"
REFUSED_URLS = [
    "http://127.0.0.1:8000/hook",
    "http://10.0.0.5/hook",
    "http://172.16.4.4/hook",
    "http://192.168.1.10/hook",
    "http://169.254.169.254/latest/meta-data/",
    "http://0.0.0.0:8000/hook",
    "http://localhost:9000/hook",
    "http://api.localhost/hook",
    "http://[::1]:8000/hook",
    "http://[fd12:3456::1]/hook",
    "http://[fe80::1]/hook",
    "http://[::ffff:127.0.0.1]/hook",
    "http://[64:ff9b::a00:5]/hook",
    "http://100.64.0.1/hook",
    "http://internal.example.com/hook",  # resolves to 10.1.2.3
    "http://mixed.example.com/hook",  # one public and one loopback answer
    "http://metadata.example.com/hook",  # resolves to the metadata address
]


@pytest.fixture
def agent(workspace):
    return AgentFactory.create(workspace=workspace, slug="ride-support", name="Ride support")


@pytest.fixture
def names(fake_dns):
    fake_dns.update(
        {
            "hooks.example.com": [PUBLIC],
            "internal.example.com": ["10.1.2.3"],
            "mixed.example.com": [PUBLIC, "127.0.0.1"],
            "metadata.example.com": ["169.254.169.254"],
        }
    )
    return fake_dns


def _rule_body(url: str) -> dict[str, object]:
    return {
        "agent": "ride-support",
        "name": "Loop rate",
        "signal": "loop",
        "threshold": 0.1,
        "webhook_url": url,
        "webhook_secret": "whsec",
    }


@pytest.mark.parametrize("url", REFUSED_URLS)
def test_a_webhook_to_an_internal_address_is_a_422_naming_the_field(workspace, agent, names, api_client_for, url):
    response = api_client_for(workspace).post("/api/v1/alert-rules", _rule_body(url), content_type="application/json")

    assert response.status_code == 422, response.content
    body = response.json()
    assert body["code"] == "alert_rule_invalid"
    assert [error["field"] for error in body["errors"]] == ["webhook_url"]
    # A metadata address is never permitted by KEEL_OUTBOUND_ALLOW_PRIVATE, and its refusal says so.
    assert "Keel sends only to public addresses" in body["errors"][0]["message"] or (
        "a cloud metadata address: Keel never sends to one" in body["errors"][0]["message"]
    )
    assert AlertRule.objects.count() == 0


def test_an_update_to_an_internal_address_is_refused_and_changes_nothing(workspace, agent, names, api_client_for):
    client = api_client_for(workspace)
    rule = client.post(
        "/api/v1/alert-rules", _rule_body("https://hooks.example.com/k"), content_type="application/json"
    )
    assert rule.status_code == 201, rule.content
    update = {key: value for key, value in _rule_body("http://internal.example.com/k").items() if key != "agent"}

    response = client.put(f"/api/v1/alert-rules/{rule.json()['id']}", update, content_type="application/json")

    assert response.status_code == 422
    assert response.json()["errors"][0]["message"].startswith("internal.example.com resolves to 10.1.2.3, which is")
    assert AlertRule.objects.get().webhook_url == "https://hooks.example.com/k"


def test_public_and_not_yet_resolvable_hosts_are_accepted(workspace, agent, names, api_client_for):
    client = api_client_for(workspace)
    for url in ("https://hooks.example.com/k", f"http://{PUBLIC}/k", "https://not-yet.example.org/k"):
        body = {**_rule_body(url), "name": url}
        assert client.post("/api/v1/alert-rules", body, content_type="application/json").status_code == 201

    assert AlertRule.objects.count() == 3


def test_the_operator_can_permit_private_addresses_but_not_the_metadata_service(agent, names, settings):
    settings.KEEL_OUTBOUND_ALLOW_PRIVATE = True
    fields = alerts.RuleFields(name="Loops", signal="loop", threshold=0.1, webhook_url="http://10.0.0.5/hook")
    assert alerts.alert_rule_create(agent=agent, fields=fields, webhook_secret="s").webhook_url == fields.webhook_url

    for url in ("http://169.254.169.254/latest/", "http://metadata.example.com/"):
        with pytest.raises(exceptions.AlertRuleInvalid) as caught:
            alerts.alert_rule_create(
                agent=agent, fields=alerts.RuleFields(name="Meta", signal="loop", threshold=0.1, webhook_url=url)
            )
        assert "a cloud metadata address" in caught.value.extra["errors"][0]["message"]


def test_the_allow_list_permits_named_hosts_and_networks_only(names, settings):
    settings.KEEL_OUTBOUND_ALLOWED_HOSTS = ["internal.example.com", "192.168.0.0/16"]
    policy = outbound.OutboundPolicy.from_settings()

    assert policy.url_refusal("http://internal.example.com/") is None
    assert policy.url_refusal("http://192.168.1.10/") is None
    assert policy.url_refusal("http://10.0.0.5/") == (
        "10.0.0.5 is private: Keel sends only to public addresses unless the operator permits others "
        "(KEEL_OUTBOUND_ALLOW_PRIVATE, KEEL_OUTBOUND_ALLOWED_HOSTS)"
    )
    with pytest.raises(ValueError, match="not a host name"):
        outbound.parse_allowed(["http://x/"])


@pytest.mark.parametrize("host", ["127.1", "0x7f.0.0.1", "2130706433", "017700000001", "LOCALHOST."])
def test_other_spellings_of_loopback_are_refused_without_asking_a_resolver(host, fake_dns):
    refusal = outbound.OutboundPolicy.from_settings().url_refusal(f"http://{host}/")

    assert refusal is not None
    assert "is loopback" in refusal
    assert resolver.ASKED == []


def _fired(agent, url: str):
    now = timezone.now()
    for index in range(10):
        TrajectoryFactory.create(
            workspace=agent.workspace,
            agent=agent,
            signals=[signal_instance("loop")] if index < 4 else [],
            started_at=now - timedelta(minutes=5, seconds=index),
        )
    rule = alerts.alert_rule_create(
        agent=agent,
        fields=alerts.RuleFields(name="Loop rate", signal="loop", threshold=0.1, min_trajectories=5, webhook_url=url),
        webhook_secret="whsec",
    )
    alert = alerts.alert_rule_evaluate(rule=rule, now=now)
    assert alert is not None
    return alert.deliveries.get(channel="webhook")


@pytest.mark.parametrize("answers", [["127.0.0.1"], [PUBLIC, "127.0.0.1"]])
def test_a_name_that_resolves_to_an_internal_address_at_delivery_is_refused_and_recorded(
    agent, names, receiver, answers
):
    # Public when saved; by the time the alert fires, the name points at Keel's own host (DNS rebinding).
    names["rebind.example.com"] = [PUBLIC]
    delivery = _fired(agent, f"http://rebind.example.com:{receiver.port}/hook")
    names["rebind.example.com"] = answers

    assert alerts.alert_delivery_deliver(delivery_id=delivery.pk) is False

    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts) == ("failed", 1)  # retrying cannot help
    assert delivery.last_error == (
        "refused: rebind.example.com resolves to 127.0.0.1, which is loopback: Keel sends only to public "
        "addresses unless the operator permits others (KEEL_OUTBOUND_ALLOW_PRIVATE, KEEL_OUTBOUND_ALLOWED_HOSTS)"
    )
    assert receiver.requests == []
    assert alerts.alert_delivery_due() == []


def test_a_delivery_connects_to_the_address_it_checked(agent, names, receiver, settings):
    # hooks.internal is permitted by name; the system resolver has never heard of it, so the request
    # reaching the receiver shows the connection went to the address the check resolved, not a new lookup.
    settings.KEEL_OUTBOUND_ALLOWED_HOSTS = ["hooks.internal"]
    names["hooks.internal"] = ["127.0.0.1"]
    delivery = _fired(agent, f"http://hooks.internal:{receiver.port}/hook")
    resolver.ASKED.clear()

    assert alerts.alert_delivery_deliver(delivery_id=delivery.pk) is True

    assert [(request["path"], request["host"]) for request in receiver.requests] == [
        ("/hook", f"hooks.internal:{receiver.port}")
    ]
    assert resolver.ASKED == ["hooks.internal"]


def test_a_redirect_is_not_followed_and_its_target_is_recorded(agent, names, receiver, settings):
    settings.KEEL_OUTBOUND_ALLOWED_HOSTS = ["hooks.internal"]
    names["hooks.internal"] = ["127.0.0.1"]
    receiver.statuses = [307]
    receiver.location = "http://169.254.169.254/latest/meta-data/"
    delivery = _fired(agent, f"http://hooks.internal:{receiver.port}/hook")

    assert alerts.alert_delivery_deliver(delivery_id=delivery.pk) is False

    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts) == ("pending", 1)
    assert delivery.last_error == (
        "HTTP 307: redirects to 'http://169.254.169.254/latest/meta-data/', which Keel does not follow"
    )
    assert len(receiver.requests) == 1


def test_a_private_address_saved_while_permitted_is_refused_once_the_permission_goes(agent, names, settings):
    settings.KEEL_OUTBOUND_ALLOW_PRIVATE = True
    delivery = _fired(agent, "http://10.0.0.5:9/hook")
    settings.KEEL_OUTBOUND_ALLOW_PRIVATE = False

    assert alerts.alert_delivery_deliver(delivery_id=delivery.pk) is False

    delivery.refresh_from_db()
    assert delivery.status == "failed"
    assert delivery.last_error.startswith("refused: 10.0.0.5 is private:")


def test_a_name_that_does_not_resolve_at_delivery_is_retried(agent, names):
    delivery = _fired(agent, "https://gone.example.com/hook")

    assert alerts.alert_delivery_deliver(delivery_id=delivery.pk) is False

    delivery.refresh_from_db()
    assert delivery.status == "pending"
    assert delivery.last_error.startswith("gone.example.com does not resolve")


def test_a_malformed_outbound_setting_is_reported_when_keel_starts() -> None:
    with (
        override_settings(KEEL_OUTBOUND_ALLOWED_HOSTS=["langfuse.internal", "10.2.0.0/99"]),
        pytest.raises(SystemCheckError, match=r"keel\.E001\) KEEL_OUTBOUND_ALLOWED_HOSTS: '10\.2\.0\.0/99'"),
    ):
        call_command("check", stdout=io.StringIO())
    with (
        override_settings(KEEL_OUTBOUND_RESOLVER="tracing.outbound.no_such_resolver"),
        pytest.raises(SystemCheckError, match=r"keel\.E002"),
    ):
        call_command("check", stdout=io.StringIO())
    call_command("check", stdout=io.StringIO())  # the settings as they are pass
