"""Alerts' REST API: alert rules per agent (CRUD), the alerts that fired, and acknowledging them."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from django.http import HttpRequest
from ninja import Field, Query, Router, Schema, Status

from agent_registry import selectors as registry_selectors
from agent_registry.auth import key_auth, request_agent_ids, request_api_key, request_workspace
from agent_registry.models import Scope
from agent_registry.schemas import error_responses
from tracing import alerts
from tracing.models import Alert, AlertRule

router = Router(tags=["alerts"])

READ = key_auth(Scope.READ)
WRITE = key_auth(Scope.WRITE)
ERRORS = error_responses()


class AlertRuleIn(Schema):
    name: str = Field(min_length=1, max_length=200)
    signal: str = Field(description="a triage signal (loop, failure, ...) or error_status: any error status")
    threshold: float = Field(
        ge=0,
        le=1,
        description="a share: fire when the rate is above it, e.g. 0.02 (from 0 up to, not including, 1), or with "
        "direction below, under it, e.g. 0.6 (above 0 up to 1)",
    )
    direction: Literal["above", "below"] = Field(
        "above", description="above: fire when the rate rises past the threshold; below: when it drops under it"
    )
    window_minutes: int = Field(60, ge=1)
    min_trajectories: int = Field(20, ge=1, description="fewer trajectories in the window never fire")
    severity: Literal["info", "warning", "page"] = "warning"
    cooldown_minutes: int = Field(60, ge=1)
    enabled: bool = True
    email_to: list[str] = Field(default_factory=list)
    webhook_url: str = Field("", max_length=500)
    webhook_secret: str | None = Field(
        None, max_length=500, description="signs each webhook (HMAC-SHA256); write-only; null keeps the stored one"
    )


class AlertRuleCreateIn(AlertRuleIn):
    agent: str = Field(description="the agent's slug")


class AlertRuleOut(Schema):
    id: int
    agent: str
    name: str
    signal: str
    threshold: float
    direction: str
    window_minutes: int
    min_trajectories: int
    severity: str
    cooldown_minutes: int
    enabled: bool
    email_to: list[str]
    webhook_url: str
    has_webhook_secret: bool
    last_fired_at: datetime | None
    last_evaluated_at: datetime | None


class DeliveryOut(Schema):
    channel: str
    status: str
    attempts: int
    last_error: str
    sent_at: datetime | None
    next_attempt_at: datetime | None


class AlertOut(Schema):
    id: int
    rule_id: int
    rule: str
    agent: str
    signal: str
    severity: str
    threshold: float
    direction: str
    observed_rate: float
    matching_count: int
    trajectory_count: int
    window_start: datetime
    window_end: datetime
    fired_at: datetime
    trace_ids: list[str]
    trajectories_query: dict[str, str] = Field(description="the dashboard's trajectory list filter for this alert")
    acknowledged_at: datetime | None
    deliveries: list[DeliveryOut]


class AlertListQuery(Schema):
    agent: str | None = None
    unacknowledged: bool = False
    limit: int = Field(100, ge=1, le=500)


def _fields(payload: AlertRuleIn) -> alerts.RuleFields:
    return alerts.RuleFields(
        name=payload.name,
        signal=payload.signal,
        threshold=payload.threshold,
        direction=payload.direction,
        window_minutes=payload.window_minutes,
        min_trajectories=payload.min_trajectories,
        severity=payload.severity,
        cooldown_minutes=payload.cooldown_minutes,
        enabled=payload.enabled,
        email_to=payload.email_to,
        webhook_url=payload.webhook_url,
    )


def _rule_out(rule: AlertRule) -> dict[str, Any]:
    return {
        "id": rule.pk,
        "agent": rule.agent.slug,
        "name": rule.name,
        "signal": rule.signal,
        "threshold": rule.threshold,
        "direction": rule.direction,
        "window_minutes": rule.window_minutes,
        "min_trajectories": rule.min_trajectories,
        "severity": rule.severity,
        "cooldown_minutes": rule.cooldown_minutes,
        "enabled": rule.enabled,
        "email_to": rule.email_to,
        "webhook_url": rule.webhook_url,
        "has_webhook_secret": bool(rule.webhook_secret_encrypted),
        "last_fired_at": rule.last_fired_at,
        "last_evaluated_at": rule.last_evaluated_at,
    }


def _alert_out(alert: Alert) -> dict[str, Any]:
    return {
        "id": alert.pk,
        "rule_id": alert.rule_id,
        "rule": alert.rule.name,
        "agent": alert.agent.slug,
        "signal": alert.signal,
        "severity": alert.severity,
        "threshold": alert.threshold,
        "direction": alert.direction,
        "observed_rate": alert.observed_rate,
        "matching_count": alert.matching_count,
        "trajectory_count": alert.trajectory_count,
        "window_start": alert.window_start,
        "window_end": alert.window_end,
        "fired_at": alert.fired_at,
        "trace_ids": alert.trace_ids,
        "trajectories_query": alerts.alert_trajectories_query(alert),
        "acknowledged_at": alert.acknowledged_at,
        "deliveries": [
            {
                "channel": delivery.channel,
                "status": delivery.status,
                "attempts": delivery.attempts,
                "last_error": delivery.last_error,
                "sent_at": delivery.sent_at,
                "next_attempt_at": delivery.next_attempt_at if delivery.status == "pending" else None,
            }
            for delivery in sorted(alert.deliveries.all(), key=lambda delivery: delivery.channel)
        ],
    }


@router.get("/alert-rules", auth=READ, response={200: list[AlertRuleOut], **ERRORS})
def alert_rule_list_api(request: HttpRequest, agent: str | None = None) -> Any:
    workspace = request_workspace(request)
    agent_ids = request_agent_ids(request)
    found = registry_selectors.agent_get(workspace=workspace, slug=agent, agent_ids=agent_ids) if agent else None
    return [_rule_out(rule) for rule in alerts.alert_rule_list(workspace=workspace, agent=found, agent_ids=agent_ids)]


@router.post("/alert-rules", auth=WRITE, response={201: AlertRuleOut, **ERRORS})
def alert_rule_create_api(request: HttpRequest, payload: AlertRuleCreateIn) -> Any:
    """Add an alert rule to an agent: e.g. loop rate above 2% over the last hour, at least 20 trajectories, or
    satisfaction rate below 60% (`direction: below`). A webhook must go to an address the operator permits
    (public ones by default); otherwise 422 naming `webhook_url`."""
    agent = registry_selectors.agent_get(
        workspace=request_workspace(request), slug=payload.agent, agent_ids=request_agent_ids(request)
    )
    rule = alerts.alert_rule_create(
        agent=agent,
        fields=_fields(payload),
        webhook_secret=payload.webhook_secret or "",
        created_via_key=request_api_key(request),
    )
    return Status(201, _rule_out(rule))


@router.get("/alert-rules/{rule_id}", auth=READ, response={200: AlertRuleOut, **ERRORS})
def alert_rule_get_api(request: HttpRequest, rule_id: int) -> Any:
    rule = alerts.alert_rule_get(
        workspace=request_workspace(request), rule_id=rule_id, agent_ids=request_agent_ids(request)
    )
    return _rule_out(rule)


@router.put("/alert-rules/{rule_id}", auth=WRITE, response={200: AlertRuleOut, **ERRORS})
def alert_rule_update_api(request: HttpRequest, rule_id: int, payload: AlertRuleIn) -> Any:
    rule = alerts.alert_rule_get(
        workspace=request_workspace(request), rule_id=rule_id, agent_ids=request_agent_ids(request)
    )
    updated = alerts.alert_rule_update(
        rule=rule,
        fields=_fields(payload),
        webhook_secret=payload.webhook_secret,
        updated_via_key=request_api_key(request),
    )
    updated.agent = rule.agent
    return _rule_out(updated)


@router.delete("/alert-rules/{rule_id}", auth=WRITE, response={204: None, **ERRORS})
def alert_rule_delete_api(request: HttpRequest, rule_id: int) -> Any:
    """Delete a rule and the alerts it fired."""
    rule = alerts.alert_rule_get(
        workspace=request_workspace(request), rule_id=rule_id, agent_ids=request_agent_ids(request)
    )
    alerts.alert_rule_delete(rule=rule, deleted_via_key=request_api_key(request))
    return Status(204, None)


@router.get("/alerts", auth=READ, response={200: list[AlertOut], **ERRORS})
def alert_list_api(request: HttpRequest, query: Query[AlertListQuery]) -> Any:
    """Alerts, newest first, with the trajectories behind each and the delivery status per channel."""
    workspace = request_workspace(request)
    agent_ids = request_agent_ids(request)
    agent = (
        registry_selectors.agent_get(workspace=workspace, slug=query.agent, agent_ids=agent_ids)
        if query.agent
        else None
    )
    found = alerts.alert_list(
        workspace=workspace, agent_ids=agent_ids, agent=agent, unacknowledged=query.unacknowledged, limit=query.limit
    )
    return [_alert_out(alert) for alert in found]


@router.get("/alerts/{alert_id}", auth=READ, response={200: AlertOut, **ERRORS})
def alert_get_api(request: HttpRequest, alert_id: int) -> Any:
    alert = alerts.alert_get(
        workspace=request_workspace(request), alert_id=alert_id, agent_ids=request_agent_ids(request)
    )
    return _alert_out(alert)


@router.post("/alerts/{alert_id}/acknowledge", auth=WRITE, response={200: AlertOut, **ERRORS})
def alert_acknowledge_api(request: HttpRequest, alert_id: int) -> Any:
    alert = alerts.alert_get(
        workspace=request_workspace(request), alert_id=alert_id, agent_ids=request_agent_ids(request)
    )
    alerts.alert_acknowledge(alert=alert, api_key=request_api_key(request))
    return _alert_out(alerts.alert_get(workspace=alert.workspace, alert_id=alert.pk))
