"""The alerts API: rules (CRUD), alerts and acknowledging; scoped to the key's workspace and agents."""

from __future__ import annotations

import pytest
from django.test import Client

from agent_registry.tests.factories import AgentFactory
from tracing.models import Alert, AlertRule
from tracing.tests.factories import AlertFactory, AlertRuleFactory

pytestmark = pytest.mark.django_db

RULE = {
    "agent": "ride-support",
    "name": "Loop rate",
    "signal": "loop",
    "threshold": 0.02,
    "window_minutes": 60,
    "min_trajectories": 20,
    "severity": "page",
    "cooldown_minutes": 30,
    "email_to": ["oncall@example.com"],
    "webhook_url": "https://hooks.example.com/keel",
    "webhook_secret": "whsec",
}


@pytest.fixture
def agents(workspace, other_workspace):
    return (
        AgentFactory.create(workspace=workspace, slug="ride-support"),
        AgentFactory.create(workspace=other_workspace, slug="ride-support"),
    )


def _state():
    return (
        list(AlertRule.objects.order_by("pk").values_list("pk", "name", "threshold", "webhook_url")),
        list(Alert.objects.order_by("pk").values_list("pk", "acknowledged_at")),
    )


def test_rule_crud(workspace, agents, api_client_for):
    client = api_client_for(workspace)

    created = client.post("/api/v1/alert-rules", RULE, content_type="application/json")
    assert created.status_code == 201, created.content
    rule = created.json()
    assert (rule["has_webhook_secret"], rule["severity"], rule["email_to"]) == (True, "page", ["oncall@example.com"])
    assert "webhook_secret" not in rule
    update = {key: value for key, value in RULE.items() if key not in ("agent", "webhook_secret")}
    updated = client.put(
        f"/api/v1/alert-rules/{rule['id']}", {**update, "threshold": 0.05}, content_type="application/json"
    )
    assert updated.status_code == 200
    assert (updated.json()["threshold"], updated.json()["has_webhook_secret"]) == (0.05, True)
    assert [item["id"] for item in client.get("/api/v1/alert-rules", {"agent": "ride-support"}).json()] == [rule["id"]]
    assert client.delete(f"/api/v1/alert-rules/{rule['id']}").status_code == 204
    assert client.get(f"/api/v1/alert-rules/{rule['id']}").status_code == 404


def test_an_invalid_rule_is_a_422(workspace, agents, api_client_for):
    response = api_client_for(workspace).post(
        "/api/v1/alert-rules", {**RULE, "signal": "vibes", "webhook_secret": None}, content_type="application/json"
    )

    assert response.status_code == 422
    assert {error["field"] for error in response.json()["errors"]} == {"signal", "webhook_secret"}
    assert AlertRule.objects.count() == 0


def test_list_and_acknowledge_alerts(workspace, agents, api_client_for):
    alert = AlertFactory.create(rule=AlertRuleFactory.create(agent=agents[0]))
    AlertFactory.create(rule=AlertRuleFactory.create(agent=agents[1]))
    client = api_client_for(workspace)

    listed = client.get("/api/v1/alerts", {"unacknowledged": True}).json()
    acknowledged = client.post(f"/api/v1/alerts/{alert.pk}/acknowledge")

    assert [item["id"] for item in listed] == [alert.pk]
    assert listed[0]["trajectories_query"]["signal"] == "loop"
    assert acknowledged.status_code == 200
    assert acknowledged.json()["acknowledged_at"] is not None
    assert client.get("/api/v1/alerts", {"unacknowledged": True}).json() == []
    assert len(client.get("/api/v1/alerts").json()) == 1


def test_without_a_key_401_and_with_a_read_key_403(workspace, agents, api_client_for):
    alert = AlertFactory.create(rule=AlertRuleFactory.create(agent=agents[0]))
    before = _state()

    assert Client().get("/api/v1/alerts").status_code == 401
    assert Client().post("/api/v1/alert-rules", RULE, content_type="application/json").status_code == 401
    reader = api_client_for(workspace, scopes=["read"])
    assert reader.post("/api/v1/alert-rules", RULE, content_type="application/json").status_code == 403
    assert reader.post(f"/api/v1/alerts/{alert.pk}/acknowledge").status_code == 403
    assert reader.delete(f"/api/v1/alert-rules/{alert.rule_id}").status_code == 403
    assert _state() == before


def test_another_workspaces_rules_and_alerts_are_not_found(workspace, agents, api_client_for):
    theirs = AlertFactory.create(rule=AlertRuleFactory.create(agent=agents[1]))
    client = api_client_for(workspace)
    before = _state()

    assert client.get(f"/api/v1/alert-rules/{theirs.rule_id}").status_code == 404
    assert client.delete(f"/api/v1/alert-rules/{theirs.rule_id}").status_code == 404
    assert client.get(f"/api/v1/alerts/{theirs.pk}").status_code == 404
    assert client.post(f"/api/v1/alerts/{theirs.pk}/acknowledge").status_code == 404
    assert client.get("/api/v1/alerts").json() == []
    assert _state() == before


def test_a_key_limited_to_another_agent_does_not_see_the_rules(workspace, agents, api_client_for):
    rule = AlertRuleFactory.create(agent=agents[0])
    other = AgentFactory.create(workspace=workspace, slug="shopping")
    limited = api_client_for(workspace, agents=[other])
    before = _state()

    assert limited.get("/api/v1/alert-rules").json() == []
    assert limited.get(f"/api/v1/alert-rules/{rule.pk}").status_code == 404
    assert limited.post("/api/v1/alert-rules", RULE, content_type="application/json").status_code == 404
    assert _state() == before


def test_a_rule_takes_a_direction_and_defaults_to_above(workspace, agents, api_client_for):
    client = api_client_for(workspace)
    body = {key: value for key, value in RULE.items() if key not in ("webhook_url", "webhook_secret")}

    default = client.post("/api/v1/alert-rules", body, content_type="application/json")
    below = client.post(
        "/api/v1/alert-rules",
        {**body, "name": "Satisfaction", "signal": "satisfaction", "direction": "below", "threshold": 0.6},
        content_type="application/json",
    )

    assert (default.status_code, default.json()["direction"]) == (201, "above")
    assert (below.status_code, below.json()["direction"], below.json()["threshold"]) == (201, "below", 0.6)
    assert client.get(f"/api/v1/alert-rules/{below.json()['id']}").json()["direction"] == "below"
    alert = AlertFactory.create(rule=AlertRule.objects.get(pk=below.json()["id"]), direction="below")
    assert client.get(f"/api/v1/alerts/{alert.pk}").json()["direction"] == "below"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"direction": "below", "threshold": 0}, "threshold"),
        ({"direction": "above", "threshold": 1}, "threshold"),
        ({"threshold": 1}, "threshold"),
    ],
)
def test_a_threshold_that_cannot_be_crossed_is_a_422(workspace, agents, api_client_for, change, field):
    response = api_client_for(workspace).post(
        "/api/v1/alert-rules", {**RULE, "webhook_url": "", **change}, content_type="application/json"
    )

    assert response.status_code == 422, response.content
    assert response.json()["code"] == "alert_rule_invalid"
    assert [error["field"] for error in response.json()["errors"]] == [field]
    assert AlertRule.objects.count() == 0


@pytest.mark.parametrize("change", [{"direction": "sideways"}, {"threshold": 1.5}, {"threshold": -0.1}])
def test_a_direction_or_threshold_out_of_range_is_refused_by_the_schema(workspace, agents, api_client_for, change):
    response = api_client_for(workspace).post(
        "/api/v1/alert-rules", {**RULE, **change}, content_type="application/json"
    )

    assert response.status_code == 422
    assert set(response.json()) >= {"detail", "code"}
    assert AlertRule.objects.count() == 0
