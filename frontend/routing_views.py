"""Routing pages: the workspace's model targets, an agent's router (configuration, rules, chain, tools) and
its report, routing decisions, the hand-off queue, and the cache review. Viewers read; members change
targets, configurations and tools, take hand-offs and judge cache hits; owners alone set provider keys
and tool secrets."""

from __future__ import annotations

import json
from datetime import datetime, time, timedelta
from typing import Final

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from agent_registry import selectors
from agent_registry.models import Agent, Membership
from frontend.access import HtmxHttpRequest, membership_can_edit, membership_can_manage_keys, workspace_view
from frontend.routing_forms import (
    ROUTABLE_TIERS,
    RULE_KIND_CHOICES,
    AgentToolForm,
    HandoffResolveForm,
    ModelTargetForm,
    RouterConfigForm,
    RowsView,
    chain_rows,
)
from frontend.views import _keel_errors_to_form, _query_string, _render
from routing import cache, exceptions, reports, services
from routing.models import ChainStep, DecisionMethod, HandoffStatus, RouterConfig, TierChoice

# --- Model targets ----------------------------------------------------------------------------------


def _targets_page(
    request: HtmxHttpRequest, membership: Membership, form: ModelTargetForm | None = None, status: int = 200
) -> HttpResponse:
    now = timezone.now()
    targets = list(reports.model_target_list(workspace=membership.workspace))
    return _render(
        request,
        membership,
        "frontend/routing/model_targets.html",
        {
            "rows": [(target, reports.model_target_health(target, now=now)) for target in targets],
            "form": form or ModelTargetForm(can_manage_keys=membership_can_manage_keys(membership)),
        },
        status=status,
    )


@workspace_view()
@require_http_methods(["GET", "POST"])
def model_target_list_view(request: HtmxHttpRequest, membership: Membership) -> HttpResponse:
    if request.method == "GET":
        return _targets_page(request, membership)
    form = ModelTargetForm(request.POST, can_manage_keys=membership_can_manage_keys(membership))
    if form.is_valid():
        try:
            target = services.model_target_create(
                workspace=membership.workspace, created_by=membership.user, **form.target_arguments()
            )
        except (exceptions.ModelTargetInvalid, exceptions.ModelTargetAliasTaken) as error:
            _keel_errors_to_form(form, error, {})
        else:
            messages.success(request, f"Added the model target {target.alias}.")
            return redirect("frontend:model_target_list", workspace_slug=membership.workspace.slug)
    return _targets_page(request, membership, form=form, status=422)


@workspace_view()
@require_http_methods(["GET", "POST"])
def model_target_edit_view(request: HtmxHttpRequest, membership: Membership, alias: str) -> HttpResponse:
    target = reports.model_target_get(workspace=membership.workspace, alias=alias)
    can_manage_keys = membership_can_manage_keys(membership)
    form = ModelTargetForm(
        request.POST if request.method == "POST" else None, target=target, can_manage_keys=can_manage_keys
    )
    if form.is_bound and form.is_valid():
        try:
            services.model_target_update(target=target, updated_by=membership.user, **form.target_arguments())
        except (exceptions.ModelTargetInvalid, exceptions.ModelTargetReadOnly) as error:
            _keel_errors_to_form(form, error, {})
        else:
            messages.success(request, f"Saved the model target {target.alias}.")
            return redirect("frontend:model_target_list", workspace_slug=membership.workspace.slug)
    return _render(
        request,
        membership,
        "frontend/routing/model_target_edit.html",
        {"target": target, "health": reports.model_target_health(target), "form": form},
        status=422 if form.errors else 200,
    )


@workspace_view()
@require_http_methods(["GET", "POST"])
def model_target_delete_view(request: HtmxHttpRequest, membership: Membership, alias: str) -> HttpResponse:
    target = reports.model_target_get(workspace=membership.workspace, alias=alias)
    if request.method == "GET":
        return _render(request, membership, "frontend/routing/model_target_delete.html", {"target": target})
    try:
        services.model_target_delete(target=target, deleted_by=membership.user)
    except (exceptions.ModelTargetInUse, exceptions.ModelTargetReadOnly) as error:
        messages.error(request, f"{target.alias} was not deleted: {error.detail}.")
    else:
        messages.success(request, f"Deleted the model target {target.alias}.")
    return redirect("frontend:model_target_list", workspace_slug=membership.workspace.slug)


# --- An agent's router ------------------------------------------------------------------------------------


def _step_rows(steps: list[ChainStep]) -> list[dict[str, str]]:
    return [
        {
            "name": step.name,
            "prompt_version": str(step.prompt_version_id or ""),
            "instructions": step.instructions,
            "model_target": step.model_target.alias if step.model_target else "",
            "output_schema": json.dumps(step.output_schema, indent=2) if step.output_schema is not None else "",
        }
        for step in steps
    ]


def _router_page(
    request: HtmxHttpRequest,
    membership: Membership,
    agent: Agent,
    *,
    config_form: RouterConfigForm | None = None,
    chain: RowsView | None = None,
    tool_form: AgentToolForm | None = None,
    status: int = 200,
) -> HttpResponse:
    config = reports.router_config_get(agent=agent)
    targets = list(reports.model_target_list(workspace=membership.workspace))
    if chain is None:
        chain = RowsView(rows=_step_rows(list(reports.chain_step_list(agent=agent))))
    return _render(
        request,
        membership,
        "frontend/routing/router.html",
        {
            "agent": agent,
            "tab": "router",
            "config": config,
            "targets": targets,
            "form": config_form or RouterConfigForm(config=config, targets=targets),
            "rule_kinds": RULE_KIND_CHOICES,
            "tiers": ROUTABLE_TIERS,
            "chain": chain,
            "prompt_versions": list(reports.chain_prompt_versions(agent=agent)),
            "tools": list(reports.agent_tool_list(agent=agent)),
            "tool_form": tool_form or AgentToolForm(can_manage_keys=membership_can_manage_keys(membership)),
        },
        status=status,
    )


def _rule_errors(form: RouterConfigForm, error: exceptions.RouterConfigInvalid) -> None:
    """Rule errors go above the rules; the rest on their fields."""
    for item in error.extra.get("errors", []):
        name = str(item.get("field", ""))
        if name.startswith("rules"):
            form.rules.errors.append(str(item.get("message", error.detail)))
        elif name in form.fields:
            form.add_error(name, str(item.get("message", error.detail)))
        elif name == "cache_ttl_seconds":
            form.add_error("cache_ttl_hours", str(item.get("message", error.detail)))
        else:
            form.add_error(None, f"{name}: {item.get('message', error.detail)}")


@workspace_view()
@require_http_methods(["GET", "POST"])
def agent_router_view(request: HtmxHttpRequest, membership: Membership, agent_slug: str) -> HttpResponse:
    agent = selectors.agent_get(workspace=membership.workspace, slug=agent_slug)
    if request.method == "GET":
        return _router_page(request, membership, agent)
    targets = list(reports.model_target_list(workspace=membership.workspace))
    form = RouterConfigForm(request.POST, config=reports.router_config_get(agent=agent), targets=targets)
    if form.is_valid():
        try:
            services.router_config_update(agent=agent, updated_by=membership.user, **form.config_arguments())
        except exceptions.RouterConfigInvalid as error:
            _rule_errors(form, error)
        else:
            messages.success(request, f"Saved the router of {agent.name}.")
            return redirect("frontend:agent_router", workspace_slug=membership.workspace.slug, agent_slug=agent.slug)
    return _router_page(request, membership, agent, config_form=form, status=422)


@workspace_view()
@require_POST
def agent_chain_save_view(request: HtmxHttpRequest, membership: Membership, agent_slug: str) -> HttpResponse:
    agent = selectors.agent_get(workspace=membership.workspace, slug=agent_slug)
    shown, steps, errors = chain_rows(request.POST)
    if not errors:
        try:
            services.chain_steps_set(agent=agent, steps=steps, updated_by=membership.user)
        except exceptions.ChainInvalid as error:
            errors = [f"{item['field']}: {item['message']}" for item in error.extra.get("errors", [])]
        else:
            messages.success(
                request, f"Saved the chain of {agent.name}: {len(steps)} step{'s' if len(steps) != 1 else ''}."
            )
            url = reverse(
                "frontend:agent_router", kwargs={"workspace_slug": membership.workspace.slug, "agent_slug": agent.slug}
            )
            return redirect(f"{url}#chain")
    return _router_page(request, membership, agent, chain=RowsView(rows=shown, errors=errors), status=422)


@workspace_view()
@require_POST
def agent_tool_create_view(request: HtmxHttpRequest, membership: Membership, agent_slug: str) -> HttpResponse:
    agent = selectors.agent_get(workspace=membership.workspace, slug=agent_slug)
    form = AgentToolForm(request.POST, can_manage_keys=membership_can_manage_keys(membership))
    if form.is_valid():
        try:
            tool = services.agent_tool_create(agent=agent, created_by=membership.user, **form.tool_arguments())
        except (exceptions.AgentToolInvalid, exceptions.AgentToolNameTaken) as error:
            _keel_errors_to_form(form, error, {})
        else:
            messages.success(request, f"Added the tool {tool.name}.")
            url = reverse(
                "frontend:agent_router", kwargs={"workspace_slug": membership.workspace.slug, "agent_slug": agent.slug}
            )
            return redirect(f"{url}#tools")
    return _router_page(request, membership, agent, tool_form=form, status=422)


@workspace_view()
@require_http_methods(["GET", "POST"])
def agent_tool_edit_view(
    request: HtmxHttpRequest, membership: Membership, agent_slug: str, tool_name: str
) -> HttpResponse:
    agent = selectors.agent_get(workspace=membership.workspace, slug=agent_slug)
    tool = reports.agent_tool_get(agent=agent, name=tool_name)
    form = AgentToolForm(
        request.POST if request.method == "POST" else None,
        tool=tool,
        can_manage_keys=membership_can_manage_keys(membership),
    )
    if form.is_bound and form.is_valid():
        try:
            services.agent_tool_update(tool=tool, updated_by=membership.user, **form.tool_arguments())
        except (exceptions.AgentToolInvalid, exceptions.AgentToolNameTaken) as error:
            _keel_errors_to_form(form, error, {})
        else:
            messages.success(request, f"Saved the tool {form.cleaned_data['name']}.")
            url = reverse(
                "frontend:agent_router", kwargs={"workspace_slug": membership.workspace.slug, "agent_slug": agent.slug}
            )
            return redirect(f"{url}#tools")
    return _render(
        request,
        membership,
        "frontend/routing/tool_edit.html",
        {"agent": agent, "tab": "router", "tool": tool, "form": form},
        status=422 if form.errors else 200,
    )


@workspace_view()
@require_POST
def agent_tool_delete_view(
    request: HtmxHttpRequest, membership: Membership, agent_slug: str, tool_name: str
) -> HttpResponse:
    agent = selectors.agent_get(workspace=membership.workspace, slug=agent_slug)
    tool = reports.agent_tool_get(agent=agent, name=tool_name)
    services.agent_tool_delete(tool=tool, deleted_by=membership.user)
    messages.success(request, f"Removed the tool {tool_name}.")
    url = reverse(
        "frontend:agent_router", kwargs={"workspace_slug": membership.workspace.slug, "agent_slug": agent.slug}
    )
    return redirect(f"{url}#tools")


# --- The router report ------------------------------------------------------------------------------------

REPORT_PERIODS: Final[dict[str, tuple[str, int]]] = {
    "7d": ("Last 7 days", 7),
    "30d": ("Last 30 days", 30),
    "90d": ("Last 90 days", 90),
}


@workspace_view()
@require_GET
def agent_router_report_view(request: HtmxHttpRequest, membership: Membership, agent_slug: str) -> HttpResponse:
    agent = selectors.agent_get(workspace=membership.workspace, slug=agent_slug)
    period = request.GET.get("period") or "7d"
    if period not in REPORT_PERIODS:
        period = "7d"
    label, days = REPORT_PERIODS[period]
    until = timezone.now()
    view = reports.router_report(agent=agent, since=until - timedelta(days=days), until=until)
    tiers = [stats.tier for stats in view.report.tiers]
    # Every day of the period on the axis, days without a finished decision as gaps, so one busy day
    # does not stretch the time axis over years.
    by_day = {bucket.start.date(): bucket for bucket in view.daily}
    first, last = timezone.localdate(view.since), timezone.localdate(view.until)
    days_shown = [first + timedelta(days=offset) for offset in range((last - first).days + 1)]
    moments = [timezone.make_aware(datetime.combine(day, time.min)) for day in days_shown]
    buckets = [by_day.get(day) for day in days_shown]
    chart_data = {
        "x": [int(moment.timestamp()) for moment in moments],
        "tiers": [
            {
                "label": TierChoice(tier).label if tier in TierChoice.values else tier,
                "shares": [bucket.share(tier) if bucket else None for bucket in buckets],
            }
            for tier in tiers
        ],
        "quality": [bucket.mean_quality if bucket else None for bucket in buckets],
        "cost": [bucket.mean_cost_usd if bucket else None for bucket in buckets],
        "totals": [bucket.total if bucket else 0 for bucket in buckets],
    }
    return _render(
        request,
        membership,
        "frontend/routing/report.html",
        {
            "agent": agent,
            "tab": "router",
            "period": period,
            "periods": [(key, value[0]) for key, value in REPORT_PERIODS.items()],
            "period_label": label,
            "view": view,
            "report": view.report,
            "chart_data": chart_data,
            "daily_rows": [(bucket, [bucket.share(tier) for tier in tiers]) for bucket in view.daily],
            "decisions_url": reverse(
                "frontend:routing_decision_list", kwargs={"workspace_slug": membership.workspace.slug}
            )
            + f"?agent={agent.slug}",
        },
    )


# --- Routing decisions ----------------------------------------------------------------------------------

DECISION_PERIODS: Final[dict[str, tuple[str, timedelta | None]]] = {
    "24h": ("Last 24 hours", timedelta(hours=24)),
    "7d": ("Last 7 days", timedelta(days=7)),
    "30d": ("Last 30 days", timedelta(days=30)),
    "all": ("All time", None),
}


@workspace_view()
@require_GET
def routing_decision_list_view(request: HtmxHttpRequest, membership: Membership) -> HttpResponse:
    workspace = membership.workspace
    agents = list(selectors.agent_list(workspace=workspace))
    agent = next((candidate for candidate in agents if candidate.slug == request.GET.get("agent")), None)
    tier = request.GET.get("tier") if request.GET.get("tier") in TierChoice.values else None
    method = request.GET.get("method") if request.GET.get("method") in DecisionMethod.values else None
    period = request.GET.get("period") or "7d"
    if period not in DECISION_PERIODS:
        period = "7d"
    span = DECISION_PERIODS[period][1]
    since = timezone.now() - span if span is not None else None
    try:
        page = reports.routing_decision_list(
            workspace=workspace,
            agent=agent,
            tier=tier,
            method=method,
            since=since,
            cursor=request.GET.get("cursor") or None,
        )
    except exceptions.RoutingDecisionListInvalid:
        messages.info(request, "That page of decisions is gone: showing the newest.")
        page = reports.routing_decision_list(workspace=workspace, agent=agent, tier=tier, method=method, since=since)
    return _render(
        request,
        membership,
        "frontend/routing/decisions.html",
        {
            "page": page,
            "agents": agents,
            "agent": agent,
            "tier": tier or "",
            "method": method or "",
            "period": period,
            "periods": [(key, value[0]) for key, value in DECISION_PERIODS.items()],
            "tier_choices": TierChoice.choices,
            "method_choices": DecisionMethod.choices,
            "filtered": bool(agent or tier or method or period != "7d"),
            "next_query": _query_string(request.GET, cursor=page.next_cursor) if page.next_cursor else None,
            "first_query": _query_string(request.GET, cursor=None) if request.GET.get("cursor") else None,
        },
    )


@workspace_view()
@require_GET
def routing_decision_detail_view(request: HtmxHttpRequest, membership: Membership, decision_id: int) -> HttpResponse:
    decision = reports.routing_decision_get(workspace=membership.workspace, decision_id=decision_id)
    estimate_rows = [
        {"tier": tier, "chosen": tier == decision.tier, **values}
        for tier, values in decision.estimates.items()
        if isinstance(values, dict)
    ]
    return _render(
        request,
        membership,
        "frontend/routing/decision.html",
        {
            "decision": decision,
            "estimate_rows": estimate_rows,
            "features": sorted(decision.features.items()),
            "shadows": list(decision.shadows.all()),
            "handoff": getattr(decision, "handoff", None),
        },
    )


# --- Hand-offs ------------------------------------------------------------------------------------------


@workspace_view()
@require_GET
def handoff_list_view(request: HtmxHttpRequest, membership: Membership) -> HttpResponse:
    status = request.GET.get("status") if request.GET.get("status") in HandoffStatus.values else None
    handoffs = reports.handoff_list(workspace=membership.workspace, status=status)
    return _render(
        request,
        membership,
        "frontend/routing/handoffs.html",
        {
            "handoffs": handoffs,
            "status": status or "",
            "status_choices": HandoffStatus.choices,
            "resolve_form": HandoffResolveForm(),
        },
    )


def _back_to_handoffs(membership: Membership) -> HttpResponse:
    return redirect("frontend:handoff_list", workspace_slug=membership.workspace.slug)


@workspace_view()
@require_POST
def handoff_claim_view(request: HtmxHttpRequest, membership: Membership, handoff_id: int) -> HttpResponse:
    handoff = reports.handoff_get(workspace=membership.workspace, handoff_id=handoff_id)
    try:
        services.handoff_claim(handoff=handoff, user=membership.user)
    except exceptions.HandoffConflict as error:
        messages.error(request, f"Not claimed: {error.detail}.")
    else:
        messages.success(
            request, f"You took the hand-off of {handoff.agent.name} ({handoff.conversation_id or handoff.trace_id})."
        )
    return _back_to_handoffs(membership)


@workspace_view()
@require_POST
def handoff_resolve_view(request: HtmxHttpRequest, membership: Membership, handoff_id: int) -> HttpResponse:
    handoff = reports.handoff_get(workspace=membership.workspace, handoff_id=handoff_id)
    form = HandoffResolveForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Not resolved: say what was done.")
        return _back_to_handoffs(membership)
    try:
        services.handoff_resolve(handoff=handoff, user=membership.user, resolution=form.cleaned_data["resolution"])
    except (exceptions.HandoffConflict, exceptions.HandoffInvalid) as error:
        messages.error(request, f"Not resolved: {error.detail}.")
    else:
        messages.success(request, f"Resolved the hand-off of {handoff.agent.name}.")
    return _back_to_handoffs(membership)


# --- The cache review -----------------------------------------------------------------------------------


@workspace_view()
@require_GET
def cache_review_view(request: HtmxHttpRequest, membership: Membership) -> HttpResponse:
    workspace = membership.workspace
    agents = list(selectors.agent_list(workspace=workspace))
    agent = next((candidate for candidate in agents if candidate.slug == request.GET.get("agent")), None)
    only_unreviewed = request.GET.get("show") == "unreviewed"
    hits = cache.cache_hits_for_review(workspace=workspace, agent=agent, only_unreviewed=only_unreviewed)
    config = RouterConfig.objects.filter(agent=agent).first() if agent is not None else None
    return _render(
        request,
        membership,
        "frontend/routing/cache_review.html",
        {
            "agents": agents,
            "agent": agent,
            "only_unreviewed": only_unreviewed,
            "hits": hits,
            "thresholds": cache.cache_threshold_report(agent=agent) if agent is not None else None,
            "current_threshold": config.cache_threshold if config is not None else None,
            "cache_enabled": config.cache_enabled if config is not None else False,
        },
    )


@workspace_view()
@require_POST
def cache_hit_review_view(request: HtmxHttpRequest, membership: Membership, hit_id: int) -> HttpResponse:
    hit = reports.cache_hit_get(workspace=membership.workspace, hit_id=hit_id)
    verdict = request.POST.get("verdict")
    if verdict not in ("false_hit", "correct"):
        return HttpResponse("verdict must be false_hit or correct", status=400)
    hit = cache.cache_hit_review(hit=hit, false_hit=verdict == "false_hit", reviewed_by=membership.user)
    if request.htmx:
        return _render(
            request,
            membership,
            "frontend/routing/_cache_hit.html",
            {"hit": hit, "can_edit": membership_can_edit(membership)},
        )
    messages.success(request, "Marked the hit a false hit." if hit.false_hit else "Marked the hit correct.")
    url = reverse("frontend:cache_review", kwargs={"workspace_slug": membership.workspace.slug})
    return redirect(f"{url}#hit-{hit.pk}")
