"""Alerts on signal rates: rules, their evaluation, and the delivery of what fired.

A rule watches one agent: the share of its trajectories that started in the last `window_minutes`
with a signal (or an error status), fired when above `threshold` (or, with `direction="below"`, under it:
satisfaction dropping) with at least `min_trajectories` in the window, then quiet for `cooldown_minutes`.
A beat task evaluates every enabled rule each minute.

Several beat or worker processes may evaluate at once: a firing is claimed with a conditional UPDATE
of the rule's `last_fired_at` (only where the cooldown has passed), in the transaction that writes the
`Alert`, so a rule fires once per cooldown whoever evaluates it. Windows end on a whole minute, so the
trajectory list filtered by agent, signal and window shows exactly the trajectories behind an alert.

Each alert is on the dashboard at once; email and webhook deliveries are outbox rows (`AlertDelivery`)
written with the alert, sent by a worker and retried with exponential backoff until they succeed or
run out of attempts, the last error kept on the row. A webhook goes only to an address the operator permits
(tracing/outbound.py: public addresses by default), checked when the rule is saved and at each delivery;
a refusal fails the delivery at once, with the reason as its error. Webhooks are POSTs of JSON signed with
HMAC-SHA256 of `"{timestamp}.{body}"` under the rule's secret (stored encrypted):

    X-Keel-Timestamp: 1767225600
    X-Keel-Signature: sha256=<hex digest>
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.mail import send_mail
from django.core.validators import EmailValidator, URLValidator
from django.db import transaction
from django.db.models import Count, F, Q, QuerySet
from django.urls import reverse
from django.utils import timezone

from agent_registry import audit
from agent_registry.models import Agent, ApiKey, AuditAction, User, Workspace
from config import crypto, dispatch
from tracing import exceptions, outbound, signals
from tracing.models import (
    ERROR_STATUS_SIGNAL,
    Alert,
    AlertChannel,
    AlertDelivery,
    AlertDirection,
    AlertRule,
    AlertSeverity,
    DeliveryStatus,
    Trajectory,
    TrajectoryStatus,
)

logger = logging.getLogger("tracing.alerts")

AgentIds = Collection[int] | None

MAX_ATTEMPTS = 8
LEASE = timedelta(minutes=2)
TRACE_IDS_KEPT = 50
WEBHOOK_TIMEOUT_SECONDS = 10
ALERT_SIGNALS: dict[str, str] = {
    ERROR_STATUS_SIGNAL: "Any error status",
    **{name: name.replace("_", " ").capitalize() for name in signals.SIGNAL_NAMES},
}


class DeliveryError(Exception):
    """The channel did not take the alert (SMTP error, network error, a non-2xx answer)."""


class DeliveryRefused(DeliveryError):
    """Keel will not send there (a webhook to a forbidden address): trying again cannot help."""


# --- Rules ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RuleFields:
    name: str
    signal: str
    threshold: float
    direction: str = AlertDirection.ABOVE
    window_minutes: int = 60
    min_trajectories: int = 20
    severity: str = AlertSeverity.WARNING
    cooldown_minutes: int = 60
    enabled: bool = True
    email_to: Sequence[str] = ()
    webhook_url: str = ""


def _rule_problems(fields: RuleFields, has_secret: bool) -> list[dict[str, str]]:
    problems = []
    if not fields.name.strip() or len(fields.name) > 200:
        problems.append({"field": "name", "message": "1 to 200 characters"})
    if fields.signal not in ALERT_SIGNALS:
        problems.append({"field": "signal", "message": f"one of {', '.join(ALERT_SIGNALS)}"})
    if fields.direction not in AlertDirection.values:
        problems.append({"field": "direction", "message": f"one of {', '.join(AlertDirection.values)}"})
    elif fields.direction == AlertDirection.BELOW and not 0 < fields.threshold <= 1:
        problems.append({"field": "threshold", "message": "a share above 0 up to 1, e.g. 0.6: no rate is below 0"})
    elif fields.direction == AlertDirection.ABOVE and not 0 <= fields.threshold < 1:
        problems.append(
            {"field": "threshold", "message": "a share from 0 up to (not including) 1, e.g. 0.02: no rate is above 1"}
        )
    for name, value, low, high in (
        ("window_minutes", fields.window_minutes, 1, 60 * 24 * 31),
        ("min_trajectories", fields.min_trajectories, 1, 1_000_000),
        ("cooldown_minutes", fields.cooldown_minutes, 1, 60 * 24 * 31),
    ):
        if not low <= value <= high:
            problems.append({"field": name, "message": f"a whole number from {low} to {high}"})
    if fields.severity not in AlertSeverity.values:
        problems.append({"field": "severity", "message": f"one of {', '.join(AlertSeverity.values)}"})
    validate_email = EmailValidator()
    for address in fields.email_to:
        try:
            validate_email(address)
        except DjangoValidationError:
            problems.append({"field": "email_to", "message": f"{address!r} is not an email address"})
    if fields.webhook_url:
        try:
            URLValidator(schemes=["http", "https"])(fields.webhook_url)
        except DjangoValidationError:
            problems.append({"field": "webhook_url", "message": "an http(s) URL"})
        else:
            refusal = outbound.OutboundPolicy.from_settings().url_refusal(fields.webhook_url.strip())
            if refusal is not None:
                problems.append({"field": "webhook_url", "message": refusal})
        if not has_secret:
            problems.append({"field": "webhook_secret", "message": "a webhook needs a secret to sign with"})
    return problems


def _raise(problems: list[dict[str, str]]) -> None:
    if problems:
        raise exceptions.AlertRuleInvalid(
            "invalid alert rule: " + "; ".join(f"{p['field']}: {p['message']}" for p in problems), errors=problems
        )


def _apply(rule: AlertRule, fields: RuleFields) -> None:
    rule.name = fields.name.strip()
    rule.signal = fields.signal
    rule.threshold = fields.threshold
    rule.direction = fields.direction
    rule.window_minutes = fields.window_minutes
    rule.min_trajectories = fields.min_trajectories
    rule.severity = fields.severity
    rule.cooldown_minutes = fields.cooldown_minutes
    rule.enabled = fields.enabled
    rule.email_to = sorted({address.strip() for address in fields.email_to if address.strip()})
    rule.webhook_url = fields.webhook_url.strip()


@transaction.atomic
def alert_rule_create(
    *,
    agent: Agent,
    fields: RuleFields,
    webhook_secret: str = "",
    created_by: User | None = None,
    created_via_key: ApiKey | None = None,
) -> AlertRule:
    """Add a rule to an agent. Raises AlertRuleInvalid naming every bad field, having stored nothing."""
    _raise(_rule_problems(fields, has_secret=bool(webhook_secret)))
    rule = AlertRule(workspace_id=agent.workspace_id, agent=agent, created_by=created_by)
    _apply(rule, fields)
    rule.webhook_secret_encrypted = crypto.encrypt(webhook_secret) if fields.webhook_url else ""
    rule.save()
    audit.record(
        workspace=agent.workspace_id,
        action=AuditAction.ALERT_RULE_CREATED,
        user=created_by,
        api_key=created_via_key,
        target=rule,
        target_name=rule.name,
        details={
            "agent": agent.slug,
            "signal": rule.signal,
            "direction": rule.direction,
            "webhook_url": rule.webhook_url,
        },
    )
    return rule


def alert_rule_update(
    *,
    rule: AlertRule,
    fields: RuleFields,
    webhook_secret: str | None = None,
    updated_by: User | None = None,
    updated_via_key: ApiKey | None = None,
) -> AlertRule:
    """Change a rule; `webhook_secret=None` keeps the stored secret. Its firing history stays."""
    has_secret = bool(webhook_secret) or (webhook_secret is None and bool(rule.webhook_secret_encrypted))
    _raise(_rule_problems(fields, has_secret=has_secret))
    with transaction.atomic():
        locked = AlertRule.objects.select_for_update().get(pk=rule.pk)
        _apply(locked, fields)
        if not fields.webhook_url:
            locked.webhook_secret_encrypted = ""
        elif webhook_secret:
            locked.webhook_secret_encrypted = crypto.encrypt(webhook_secret)
        locked.save()
        audit.record(
            workspace=locked.workspace_id,
            action=AuditAction.ALERT_RULE_CHANGED,
            user=updated_by,
            api_key=updated_via_key,
            target=locked,
            target_name=locked.name,
            details={"webhook_url": locked.webhook_url, "webhook_secret_changed": bool(webhook_secret)},
        )
    return locked


@transaction.atomic
def alert_rule_delete(
    *, rule: AlertRule, deleted_by: User | None = None, deleted_via_key: ApiKey | None = None
) -> None:
    audit.record(
        workspace=rule.workspace_id,
        action=AuditAction.ALERT_RULE_DELETED,
        user=deleted_by,
        api_key=deleted_via_key,
        target=rule,
        target_name=rule.name,
    )
    AlertRule.objects.filter(pk=rule.pk).delete()


# --- Evaluation -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Observation:
    window_start: datetime
    window_end: datetime
    trajectory_count: int
    matching_count: int

    @property
    def rate(self) -> float:
        return self.matching_count / self.trajectory_count if self.trajectory_count else 0.0


def _matching(signal: str) -> Q:
    if signal == ERROR_STATUS_SIGNAL:
        return Q(status=TrajectoryStatus.ERROR)
    return Q(signal_names__contains=[signal])


def _window(rule: AlertRule, now: datetime) -> tuple[datetime, datetime]:
    end = now.replace(second=0, microsecond=0)
    return end - timedelta(minutes=rule.window_minutes), end


def _watched(rule: AlertRule, start: datetime, end: datetime) -> QuerySet[Trajectory]:
    return Trajectory.objects.filter(
        workspace_id=rule.workspace_id, agent_id=rule.agent_id, started_at__gte=start, started_at__lt=end
    )


def alert_rule_observe(*, rule: AlertRule, now: datetime | None = None) -> Observation:
    """The rule's window ending at the last whole minute: how many trajectories, how many matching."""
    start, end = _window(rule, now or timezone.now())
    counts = _watched(rule, start, end).aggregate(
        total=Count("pk"), matching=Count("pk", filter=_matching(rule.signal))
    )
    return Observation(start, end, counts["total"], counts["matching"])


def alert_rule_fires(rule: AlertRule, observation: Observation) -> bool:
    if observation.trajectory_count < rule.min_trajectories:
        return False
    if rule.direction == AlertDirection.BELOW:
        return observation.rate < rule.threshold
    return observation.rate > rule.threshold


def _behind(rule: AlertRule) -> Q:
    """The trajectories behind a firing: those with the signal when its rate rose, those without it when
    it dropped (the conversations that did not end satisfied)."""
    matching = _matching(rule.signal)
    return ~matching if rule.direction == AlertDirection.BELOW else matching


def _fire(rule: AlertRule, observation: Observation, now: datetime) -> Alert | None:
    """Claim the firing (only one evaluator wins it) and write the alert with its deliveries."""
    from tracing import tasks  # tasks import this module; import it here, as STYLE.md says

    with transaction.atomic():
        quiet_since = now - timedelta(minutes=rule.cooldown_minutes)
        claimed = (
            AlertRule.objects.filter(pk=rule.pk, enabled=True)
            .filter(Q(last_fired_at__isnull=True) | Q(last_fired_at__lte=quiet_since))
            .update(last_fired_at=now)
        )
        if not claimed:
            return None
        trace_ids = list(
            _watched(rule, observation.window_start, observation.window_end)
            .filter(_behind(rule))
            .order_by("-started_at", "-pk")
            .values_list("trace_id", flat=True)[:TRACE_IDS_KEPT]
        )
        alert = Alert.objects.create(
            workspace_id=rule.workspace_id,
            rule=rule,
            agent_id=rule.agent_id,
            signal=rule.signal,
            severity=rule.severity,
            threshold=rule.threshold,
            direction=rule.direction,
            fired_at=now,
            window_start=observation.window_start,
            window_end=observation.window_end,
            observed_rate=observation.rate,
            matching_count=observation.matching_count,
            trajectory_count=observation.trajectory_count,
            trace_ids=trace_ids,
        )
        deliveries = [
            AlertDelivery(alert=alert, channel=AlertChannel.DASHBOARD, status=DeliveryStatus.DONE, sent_at=now)
        ]
        if rule.email_to:
            deliveries.append(AlertDelivery(alert=alert, channel=AlertChannel.EMAIL))
        if rule.webhook_url:
            deliveries.append(AlertDelivery(alert=alert, channel=AlertChannel.WEBHOOK))
        AlertDelivery.objects.bulk_create(deliveries)
        outbound = [delivery.pk for delivery in deliveries if delivery.status == DeliveryStatus.PENDING]

        for delivery_id in outbound:
            dispatch.task_send_on_commit(tasks.alert_delivery_deliver, delivery_id)
    logger.info(
        "tracing.alert_fired",
        extra={
            "rule_id": rule.pk,
            "alert_id": alert.pk,
            "rate": observation.rate,
            "count": observation.trajectory_count,
        },
    )
    return alert


def alert_rule_evaluate(*, rule: AlertRule, now: datetime | None = None) -> Alert | None:
    """Evaluate one rule; the alert it fired, or None (below threshold, too few trajectories, cooling down,
    or fired by another evaluator)."""
    now = now or timezone.now()
    observation = alert_rule_observe(rule=rule, now=now)
    AlertRule.objects.filter(pk=rule.pk).update(last_evaluated_at=now)
    if not alert_rule_fires(rule, observation):
        return None
    if rule.last_fired_at is not None and rule.last_fired_at > now - timedelta(minutes=rule.cooldown_minutes):
        return None  # cooling down (the claim would refuse it too; this saves the transaction)
    return _fire(rule, observation, now)


def alert_rules_evaluate(*, now: datetime | None = None) -> list[Alert]:
    """Evaluate every enabled rule (the beat task, each minute); returns the alerts that fired."""
    now = now or timezone.now()
    fired = []
    for rule in AlertRule.objects.filter(enabled=True).order_by("pk"):
        alert = alert_rule_evaluate(rule=rule, now=now)
        if alert is not None:
            fired.append(alert)
    return fired


def alert_acknowledge(*, alert: Alert, user: User | None = None, api_key: ApiKey | None = None) -> Alert:
    """Mark an alert as seen; acknowledging again keeps the first acknowledgement."""
    Alert.objects.filter(pk=alert.pk, acknowledged_at__isnull=True).update(
        acknowledged_at=timezone.now(), acknowledged_by=user, acknowledged_via_key=api_key
    )
    alert.refresh_from_db()
    return alert


# --- Delivery -------------------------------------------------------------------------------------------


def alert_trajectories_query(alert: Alert) -> dict[str, str]:
    """The trajectory list's query for the trajectories behind an alert: its agent's list, filtered by
    the signal (or the error status) and the alert's window (whole minutes, as the list reads them).
    A rate that dropped is about the trajectories *without* the signal, which the list cannot filter
    for: the query is then the whole window, the trajectories the rate was taken over."""
    query = {
        "period": "custom",
        "started_after": alert.window_start.strftime("%Y-%m-%dT%H:%M"),
        "started_before": alert.window_end.strftime("%Y-%m-%dT%H:%M"),
    }
    if alert.direction == AlertDirection.BELOW:
        return query
    if alert.signal == ERROR_STATUS_SIGNAL:
        query["status"] = "error"
    else:
        query["signal"] = alert.signal
    return query


def alert_trajectories_path(alert: Alert) -> str:
    path = reverse("frontend:agent_trajectory_list", args=[alert.agent.workspace.slug, alert.agent.slug])
    return f"{path}?{urlencode(alert_trajectories_query(alert))}"


def alert_payload(alert: Alert) -> dict[str, Any]:
    """What a webhook receives (and what the email says)."""
    base = settings.KEEL_PUBLIC_URL.rstrip("/")
    workspace = alert.agent.workspace.slug
    return {
        "type": "keel.alert",
        "alert": {
            "id": alert.pk,
            "rule": {"id": alert.rule_id, "name": alert.rule.name},
            "workspace": workspace,
            "agent": alert.agent.slug,
            "signal": alert.signal,
            "severity": alert.severity,
            "threshold": alert.threshold,
            "direction": alert.direction,
            "observed_rate": round(alert.observed_rate, 6),
            "matching_count": alert.matching_count,
            "trajectory_count": alert.trajectory_count,
            "window_start": alert.window_start.isoformat(),
            "window_end": alert.window_end.isoformat(),
            "fired_at": alert.fired_at.isoformat(),
            "trace_ids": list(alert.trace_ids),
            "url": f"{base}{reverse('frontend:alert_list', args=[workspace])}#alert-{alert.pk}",
            "trajectories_url": f"{base}{alert_trajectories_path(alert)}",
        },
    }


def webhook_signature(secret: str, timestamp: str, body: bytes) -> str:
    """`sha256=` and the hex HMAC-SHA256 of `"{timestamp}.{body}"`: what a receiver recomputes and
    compares (with a constant-time comparison), after checking the timestamp is recent."""
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def _send_webhook(delivery: AlertDelivery) -> None:
    import httpx

    rule = delivery.alert.rule
    if not rule.webhook_url:
        raise DeliveryError("the rule has no webhook any more")
    body = json.dumps(alert_payload(delivery.alert), separators=(",", ":")).encode()
    timestamp = str(int(time.time()))
    headers = {
        "Content-Type": "application/json",
        "User-Agent": f"Keel/{settings.KEEL_VERSION}",
        "X-Keel-Event": "alert",
        "X-Keel-Delivery": str(delivery.pk),
        "X-Keel-Timestamp": timestamp,
        "X-Keel-Signature": webhook_signature(crypto.decrypt(rule.webhook_secret_encrypted), timestamp, body),
    }
    # Redirects are not followed: the receiver is the URL the rule names (a moved receiver is a rule to
    # edit), and a redirect cannot lead the worker anywhere else.
    try:
        with outbound.checked_client(timeout=WEBHOOK_TIMEOUT_SECONDS, follow_redirects=False) as client:
            answer = client.post(rule.webhook_url, content=body, headers=headers)
    except outbound.HostUnresolved as error:
        raise DeliveryError(str(error)[:500]) from error
    except outbound.AddressRefused as error:
        raise DeliveryRefused(f"refused: {str(error)[:500]}") from error
    except httpx.HTTPError as error:
        raise DeliveryError(f"{type(error).__name__}: {str(error)[:300]}") from error
    if answer.is_redirect:
        location = answer.headers.get("location", "")[:300]
        raise DeliveryError(f"HTTP {answer.status_code}: redirects to {location!r}, which Keel does not follow")
    if not answer.is_success:
        raise DeliveryError(f"HTTP {answer.status_code}: {answer.text[:300]}")


def _send_email(delivery: AlertDelivery) -> None:
    alert = delivery.alert
    recipients = list(alert.rule.email_to)
    if not recipients:
        raise DeliveryError("the rule has no email recipients any more")
    payload = alert_payload(alert)["alert"]
    what = ALERT_SIGNALS.get(alert.signal, alert.signal)
    side = alert.get_direction_display().lower()
    subject = (
        f"[Keel {alert.get_severity_display()}] {alert.agent.name}: {what} at {alert.observed_rate:.1%}"
        f" ({side} threshold {alert.threshold:.1%})"
    )
    body = (
        f"{alert.rule.name}\n\n"
        f"{alert.matching_count} of {alert.trajectory_count} trajectories of {alert.agent.name} "
        f"({alert.observed_rate:.1%}) from {alert.window_start:%Y-%m-%d %H:%M} to {alert.window_end:%H:%M} UTC "
        f"match {what.lower()}; the rule fires {side} {alert.threshold:.1%}.\n\n"
        f"The trajectories: {payload['trajectories_url']}\nThe alert: {payload['url']}\n"
    )
    try:
        send_mail(subject, body, settings.DEFAULT_FROM_EMAIL, recipients)
    except (OSError, ValueError) as error:  # smtplib's errors are OSErrors; a bad header is a ValueError
        raise DeliveryError(f"{type(error).__name__}: {str(error)[:300]}") from error


def _claim(delivery_id: int) -> AlertDelivery | None:
    now = timezone.now()
    claimed = AlertDelivery.objects.filter(
        Q(status=DeliveryStatus.PENDING, next_attempt_at__lte=now)
        | Q(status=DeliveryStatus.SENDING, claimed_at__lt=now - LEASE),
        pk=delivery_id,
    ).update(status=DeliveryStatus.SENDING, claimed_at=now, attempts=F("attempts") + 1)
    if not claimed:
        return None
    return AlertDelivery.objects.select_related("alert__rule", "alert__agent__workspace").get(pk=delivery_id)


def retry_delay(attempts: int) -> timedelta:
    """After the n-th failed attempt: 30 s, 1 min, 2 min, ... at most an hour."""
    return timedelta(seconds=min(3600, 30 * 2 ** max(attempts - 1, 0)))


def alert_delivery_deliver(*, delivery_id: int) -> bool:
    """Send one delivery; returns whether the channel took it. A failure schedules a retry with
    exponential backoff (`retry_delay`) and keeps the error; after MAX_ATTEMPTS the row is failed."""
    delivery = _claim(delivery_id)
    if delivery is None:
        return False
    now = timezone.now()
    try:
        if delivery.channel == AlertChannel.WEBHOOK:
            _send_webhook(delivery)
        elif delivery.channel == AlertChannel.EMAIL:
            _send_email(delivery)
    except (DeliveryError, crypto.DecryptionFailed) as error:
        message = str(error)
        failed = delivery.attempts >= MAX_ATTEMPTS or isinstance(error, DeliveryRefused)
        AlertDelivery.objects.filter(pk=delivery.pk).update(
            status=DeliveryStatus.FAILED if failed else DeliveryStatus.PENDING,
            next_attempt_at=now + retry_delay(delivery.attempts),
            last_error=message,
        )
        logger.warning("tracing.alert_delivery_failed", extra={"delivery_id": delivery.pk, "error": message})
        return False
    AlertDelivery.objects.filter(pk=delivery.pk).update(status=DeliveryStatus.DONE, sent_at=now, last_error="")
    return True


def alert_delivery_due() -> list[int]:
    """Deliveries to send now: retries whose time has come, and rows a dead worker left half-sent."""
    now = timezone.now()
    return list(
        AlertDelivery.objects.filter(
            Q(status=DeliveryStatus.PENDING, next_attempt_at__lte=now)
            | Q(status=DeliveryStatus.SENDING, claimed_at__lt=now - LEASE)
        )
        .order_by("next_attempt_at")
        .values_list("pk", flat=True)[:500]
    )


# --- Reads ----------------------------------------------------------------------------------------------


def alert_rule_list(
    *, workspace: Workspace, agent: Agent | None = None, agent_ids: AgentIds = None
) -> QuerySet[AlertRule]:
    found = AlertRule.objects.filter(workspace=workspace).select_related("agent")
    if agent is not None:
        found = found.filter(agent=agent)
    if agent_ids is not None:
        found = found.filter(agent_id__in=agent_ids)
    return found.order_by("agent__name", "name", "pk")


def alert_rule_get(*, workspace: Workspace, rule_id: int, agent_ids: AgentIds = None) -> AlertRule:
    found = alert_rule_list(workspace=workspace, agent_ids=agent_ids).filter(pk=rule_id).first()
    if found is None:
        raise exceptions.AlertRuleNotFound(f"no alert rule {rule_id}")
    return found


def alert_list(
    *,
    workspace: Workspace,
    agent_ids: AgentIds = None,
    agent: Agent | None = None,
    unacknowledged: bool = False,
    limit: int = 100,
) -> list[Alert]:
    """Alerts, newest first, with their rule, agent and deliveries."""
    found = Alert.objects.filter(workspace=workspace)
    if agent_ids is not None:
        found = found.filter(agent_id__in=agent_ids)
    if agent is not None:
        found = found.filter(agent=agent)
    if unacknowledged:
        found = found.filter(acknowledged_at__isnull=True)
    return list(
        found.select_related("rule", "agent__workspace", "acknowledged_by")
        .prefetch_related("deliveries")
        .order_by("-fired_at", "-pk")[:limit]
    )


def alert_get(*, workspace: Workspace, alert_id: int, agent_ids: AgentIds = None) -> Alert:
    query = Alert.objects.filter(workspace=workspace, pk=alert_id)
    if agent_ids is not None:
        query = query.filter(agent_id__in=agent_ids)
    alert = query.select_related("rule", "agent__workspace", "acknowledged_by").prefetch_related("deliveries").first()
    if alert is None:
        raise exceptions.AlertNotFound(f"no alert {alert_id}")
    return alert


def alert_unacknowledged_count(*, workspace: Workspace) -> int:
    return Alert.objects.filter(workspace=workspace, acknowledged_at__isnull=True).count()
