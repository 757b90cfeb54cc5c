"""Alerts in the dashboard: the alerts that fired (with links to the trajectories behind each), acknowledging
them, and each agent's alert rules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from agent_registry import selectors
from agent_registry.models import Agent, Membership
from frontend.access import HtmxHttpRequest, workspace_view
from frontend.triage_forms import AlertRuleForm
from frontend.views import _render
from tracing import alerts, exceptions
from tracing.models import Alert, AlertRule


@dataclass(frozen=True)
class AlertView:
    alert: Alert
    trajectories_url: str
    what: str


def _alert_views(found: list[Alert]) -> list[AlertView]:
    return [
        AlertView(alert, alerts.alert_trajectories_path(alert), alerts.ALERT_SIGNALS.get(alert.signal, alert.signal))
        for alert in found
    ]


@workspace_view()
@require_GET
def alert_list_view(request: HtmxHttpRequest, membership: Membership) -> HttpResponse:
    unacknowledged = request.GET.get("show") == "open"
    found = alerts.alert_list(workspace=membership.workspace, unacknowledged=unacknowledged, limit=200)
    return _render(
        request,
        membership,
        "frontend/alerts/list.html",
        {
            "alerts": _alert_views(found),
            "unacknowledged_only": unacknowledged,
            "rules": list(alerts.alert_rule_list(workspace=membership.workspace)),
        },
    )


@workspace_view()
@require_POST
def alert_acknowledge_view(request: HtmxHttpRequest, membership: Membership, alert_id: int) -> HttpResponse:
    alert = alerts.alert_get(workspace=membership.workspace, alert_id=alert_id)
    alerts.alert_acknowledge(alert=alert, user=membership.user)
    messages.success(request, f"Acknowledged the alert on {alert.agent.name}.")
    return redirect("frontend:alert_list", workspace_slug=membership.workspace.slug)


def _rules_page(
    request: HtmxHttpRequest, membership: Membership, agent: Agent, form: AlertRuleForm, status: int = 200
) -> HttpResponse:
    rules = list(alerts.alert_rule_list(workspace=membership.workspace, agent=agent))
    observations = {rule.pk: alerts.alert_rule_observe(rule=rule) for rule in rules}
    return _render(
        request,
        membership,
        "frontend/alerts/rules.html",
        {
            "agent": agent,
            "tab": "alerts",
            "rules": [(rule, observations[rule.pk]) for rule in rules],
            "form": form,
            "recent": _alert_views(alerts.alert_list(workspace=membership.workspace, agent=agent, limit=10)),
        },
        status=status,
    )


def _save(form: AlertRuleForm, call: Any) -> AlertRule | None:
    try:
        result: AlertRule = call()
    except exceptions.AlertRuleInvalid as error:
        form.add_service_errors(error.extra.get("errors", []))
        return None
    return result


@workspace_view()
@require_http_methods(["GET", "POST"])
def agent_alert_rules_view(request: HtmxHttpRequest, membership: Membership, agent_slug: str) -> HttpResponse:
    """An agent's alert rules with what each sees now, and a form to add one."""
    agent = selectors.agent_get(workspace=membership.workspace, slug=agent_slug)
    form = AlertRuleForm(request.POST if request.method == "POST" else None)
    if form.is_bound and form.is_valid():
        rule = _save(
            form,
            lambda: alerts.alert_rule_create(
                agent=agent,
                fields=form.rule_fields(),
                webhook_secret=form.cleaned_data.get("webhook_secret") or "",
                created_by=membership.user,
            ),
        )
        if rule is not None:
            messages.success(request, f"Added the alert rule {rule.name}.")
            return redirect(
                "frontend:agent_alert_rules", workspace_slug=membership.workspace.slug, agent_slug=agent.slug
            )
    return _rules_page(request, membership, agent, form, status=422 if form.errors else 200)


@workspace_view()
@require_http_methods(["GET", "POST"])
def agent_alert_rule_edit_view(
    request: HtmxHttpRequest, membership: Membership, agent_slug: str, rule_id: int
) -> HttpResponse:
    agent = selectors.agent_get(workspace=membership.workspace, slug=agent_slug)
    rule = alerts.alert_rule_get(workspace=membership.workspace, rule_id=rule_id, agent_ids=[agent.pk])
    form = AlertRuleForm.for_rule(rule, request.POST if request.method == "POST" else None)
    if form.is_bound and form.is_valid():
        updated = _save(
            form,
            lambda: alerts.alert_rule_update(
                rule=rule,
                fields=form.rule_fields(),
                webhook_secret=form.cleaned_data.get("webhook_secret") or None,
                updated_by=membership.user,
            ),
        )
        if updated is not None:
            messages.success(request, f"Saved the alert rule {updated.name}.")
            return redirect(
                "frontend:agent_alert_rules", workspace_slug=membership.workspace.slug, agent_slug=agent.slug
            )
    return _render(
        request,
        membership,
        "frontend/alerts/rule_edit.html",
        {"agent": agent, "tab": "alerts", "rule": rule, "form": form},
        status=422 if form.errors else 200,
    )


@workspace_view()
@require_POST
def agent_alert_rule_delete_view(
    request: HtmxHttpRequest, membership: Membership, agent_slug: str, rule_id: int
) -> HttpResponse:
    agent = selectors.agent_get(workspace=membership.workspace, slug=agent_slug)
    rule = alerts.alert_rule_get(workspace=membership.workspace, rule_id=rule_id, agent_ids=[agent.pk])
    alerts.alert_rule_delete(rule=rule, deleted_by=membership.user)
    messages.success(request, f"Deleted the alert rule {rule.name} and its alerts.")
    return redirect("frontend:agent_alert_rules", workspace_slug=membership.workspace.slug, agent_slug=agent.slug)
