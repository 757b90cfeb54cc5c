"""Guardrails pages: an agent's policy (shown as it runs, edited as its JSON document), the workspace's
violations and their daily rates per check, the approval queue with each request's trajectory and audit
trail, and budgets with what they have spent. Viewers read; members change policies and budgets and decide
approval requests."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from decimal import Decimal
from typing import Any, Final

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import redirect
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from agent_registry import selectors
from agent_registry.models import Agent, Membership
from frontend.access import HtmxHttpRequest, workspace_view
from frontend.guardrails_forms import ApprovalDecisionForm, BudgetForm, GuardrailPolicyForm
from frontend.views import _keel_errors_to_form, _render
from guardrails import budgets, exceptions, services
from guardrails import selectors as guardrail_selectors
from guardrails.models import (
    ActionChoice,
    ApprovalRequest,
    ApprovalStatus,
    BudgetScope,
    LayerChoice,
)
from guardrails.policy import TEXT_CHECKS
from tracing import selectors as tracing_selectors
from tracing.exceptions import TrajectoryNotFound

# --- An agent's policy --------------------------------------------------------------------------------


def _policy_page(
    request: HtmxHttpRequest,
    membership: Membership,
    agent: Agent,
    *,
    form: GuardrailPolicyForm | None = None,
    policy_errors: list[dict[str, str]] | None = None,
    status: int = 200,
) -> HttpResponse:
    effective = services.guardrail_policy_get(agent=agent)
    tools = effective.tools()
    return _render(
        request,
        membership,
        "frontend/guardrails/policy.html",
        {
            "agent": agent,
            "tab": "guardrails",
            "effective": effective,
            "tools": tools,
            "allowed_tools": sorted(tools.allow_list),
            "approval_tools": sorted(tools.approval_always),
            "form": form or GuardrailPolicyForm(document=effective.document),
            "policy_errors": policy_errors or [],
        },
        status=status,
    )


@workspace_view()
@require_http_methods(["GET", "POST"])
def agent_guardrails_view(request: HtmxHttpRequest, membership: Membership, agent_slug: str) -> HttpResponse:
    agent = selectors.agent_get(workspace=membership.workspace, slug=agent_slug)
    if request.method == "GET":
        return _policy_page(request, membership, agent)
    form = GuardrailPolicyForm(request.POST)
    policy_errors: list[dict[str, str]] = []
    if form.is_valid():
        try:
            services.guardrail_policy_update(
                agent=agent,
                document=form.cleaned_data["document"],
                rotate_canary=form.cleaned_data["rotate_canary"],
                user=membership.user,
            )
        except exceptions.GuardrailPolicyInvalid as error:
            policy_errors = list(error.extra.get("errors") or [{"field": "document", "message": error.detail}])
        else:
            rotated = " and rotated its canary" if form.cleaned_data["rotate_canary"] else ""
            messages.success(request, f"Saved the guardrail policy of {agent.name}{rotated}.")
            return redirect(
                "frontend:agent_guardrails", workspace_slug=membership.workspace.slug, agent_slug=agent.slug
            )
    return _policy_page(request, membership, agent, form=form, policy_errors=policy_errors, status=422)


# --- Violations ---------------------------------------------------------------------------------------

RATE_DAYS: Final = 14
VIOLATIONS_SHOWN: Final = 200
# The sparkline of a check: one bar per day, BAR_STEP apart, at most CHART_HEIGHT tall.
BAR_STEP: Final = 8
CHART_HEIGHT: Final = 24


@dataclass(frozen=True)
class CheckRate:
    """One check's violations per day, with the bars of its sparkline: (x, y, height) in pixels."""

    check: str
    counts: list[int]
    total: int
    bars: list[tuple[int, float, float]]


def _check_rates(rows: list[dict[str, Any]], days: list[Any]) -> list[CheckRate]:
    by_check: dict[str, dict[Any, int]] = {}
    for row in rows:
        by_check.setdefault(str(row["check"]), {})[row["day"]] = int(row["count"])
    peak = max((count for counts in by_check.values() for count in counts.values()), default=0)
    rates = []
    for check in sorted(by_check):
        counts = [by_check[check].get(day, 0) for day in days]
        rates.append(
            CheckRate(
                check=check,
                counts=counts,
                total=sum(counts),
                bars=[
                    (index * BAR_STEP, CHART_HEIGHT - height, height)
                    for index, height in enumerate(
                        round(count / peak * CHART_HEIGHT, 1) if peak else 0.0 for count in counts
                    )
                ],
            )
        )
    return rates


@workspace_view()
@require_GET
def guardrail_violation_list_view(request: HtmxHttpRequest, membership: Membership) -> HttpResponse:
    workspace = membership.workspace
    agents = list(selectors.agent_list(workspace=workspace))
    agent = next((candidate for candidate in agents if candidate.slug == request.GET.get("agent")), None)
    layer = request.GET.get("layer") if request.GET.get("layer") in LayerChoice.values else None
    action = request.GET.get("action") if request.GET.get("action") in ActionChoice.values else None
    check = (request.GET.get("check") or "").strip()[:100] or None
    violations = guardrail_selectors.violation_list(
        workspace=workspace, agent_id=agent.pk if agent else None, layer=layer, action=action, check=check
    )
    # Whole UTC days, today included, as violation_daily_counts buckets them.
    today = timezone.now().astimezone(UTC).date()
    days = [today - timedelta(days=offset) for offset in range(RATE_DAYS - 1, -1, -1)]
    since = datetime.combine(days[0], time.min, tzinfo=UTC)
    rates = _check_rates(
        guardrail_selectors.violation_daily_counts(
            workspace=workspace, agent_id=agent.pk if agent else None, since=since
        ),
        days,
    )
    return _render(
        request,
        membership,
        "frontend/guardrails/violations.html",
        {
            "violations": list(violations[:VIOLATIONS_SHOWN]),
            "shown_limit": VIOLATIONS_SHOWN,
            "agents": agents,
            "agent": agent,
            "layer": layer or "",
            "action": action or "",
            "check": check or "",
            "layer_choices": LayerChoice.choices,
            "action_choices": ActionChoice.choices,
            "check_choices": TEXT_CHECKS,
            "filtered": bool(agent or layer or action or check),
            "days": days,
            "rates": rates,
            "rate_days": RATE_DAYS,
            "chart_width": RATE_DAYS * BAR_STEP,
            "chart_height": CHART_HEIGHT,
        },
    )


# --- Approvals ----------------------------------------------------------------------------------------

DECIDED_SHOWN: Final = 50


@workspace_view()
@require_GET
def guardrail_approval_list_view(request: HtmxHttpRequest, membership: Membership) -> HttpResponse:
    workspace = membership.workspace
    # Pending first, oldest first: they expire, and the oldest has the least time left.
    pending = list(guardrail_selectors.approval_list(workspace=workspace, status=ApprovalStatus.PENDING))[::-1]
    decided = [
        approval
        for approval in guardrail_selectors.approval_list(workspace=workspace)[: DECIDED_SHOWN + len(pending)]
        if approval.status != ApprovalStatus.PENDING
    ][:DECIDED_SHOWN]
    return _render(
        request,
        membership,
        "frontend/guardrails/approvals.html",
        {"pending": pending, "decided": decided, "now": timezone.now()},
    )


def _approval_page(
    request: HtmxHttpRequest,
    membership: Membership,
    approval: ApprovalRequest,
    *,
    form: ApprovalDecisionForm | None = None,
    status: int = 200,
) -> HttpResponse:
    trajectory = view = None
    if approval.trace_id:
        try:
            trajectory = tracing_selectors.trajectory_get(workspace=membership.workspace, trace_id=approval.trace_id)
        except TrajectoryNotFound:
            trajectory = None
        else:
            view = tracing_selectors.trajectory_view(trajectory=trajectory)
    now = timezone.now()
    return _render(
        request,
        membership,
        "frontend/guardrails/approval.html",
        {
            "approval": approval,
            "events": list(approval.events.select_related("actor_user", "actor_key").order_by("created_at", "pk")),
            "trajectory": trajectory,
            "view": view,
            "decidable": approval.status == ApprovalStatus.PENDING and approval.expires_at > now,
            "form": form or ApprovalDecisionForm(),
        },
        status=status,
    )


@workspace_view()
@require_GET
def guardrail_approval_detail_view(request: HtmxHttpRequest, membership: Membership, approval_id: int) -> HttpResponse:
    approval = guardrail_selectors.approval_get(workspace=membership.workspace, approval_id=approval_id)
    return _approval_page(request, membership, approval)


@workspace_view()
@require_POST
def guardrail_approval_decide_view(request: HtmxHttpRequest, membership: Membership, approval_id: int) -> HttpResponse:
    approval = guardrail_selectors.approval_get(workspace=membership.workspace, approval_id=approval_id)
    form = ApprovalDecisionForm(request.POST)
    if not form.is_valid():
        return _approval_page(request, membership, approval, form=form, status=422)
    approved = form.cleaned_data["decision"] == "approve"
    try:
        services.approval_decide(
            approval=approval, approved=approved, note=form.cleaned_data["note"], user=membership.user
        )
    except exceptions.ApprovalAlreadyDecided as error:
        messages.error(request, f"Not decided: {error.detail}.")
    else:
        messages.success(request, f"{'Approved' if approved else 'Rejected'} the call of {approval.tool}.")
    return redirect(
        "frontend:guardrail_approval_detail", workspace_slug=membership.workspace.slug, approval_id=approval.pk
    )


# --- Budgets ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BudgetRow:
    status: guardrail_selectors.BudgetStatus
    scope_label: str
    used_share: float | None  # the larger of money and tokens spent against its limit

    @property
    def bar_percent(self) -> float:
        return min(100.0, (self.used_share or 0.0) * 100)


def _share(spent: Decimal | int, limit: Decimal | int | None) -> float | None:
    if limit is None:
        return None
    if not limit:
        return 1.0 if spent else 0.0
    return float(spent) / float(limit)


def _budgets_page(
    request: HtmxHttpRequest, membership: Membership, *, form: BudgetForm | None = None, status: int = 200
) -> HttpResponse:
    workspace = membership.workspace
    agents = list(selectors.agent_list(workspace=workspace))
    api_keys = list(selectors.apikey_list(workspace=workspace))
    names = {
        BudgetScope.AGENT: {str(agent.pk): agent.name for agent in agents},
        BudgetScope.API_KEY: {str(key.pk): key.name for key in api_keys},
    }
    rows = []
    for item in guardrail_selectors.budget_status_list(workspace=workspace):
        budget = item.budget
        if budget.scope == BudgetScope.WORKSPACE:
            label = "The workspace"
        else:
            label = names.get(BudgetScope(budget.scope), {}).get(budget.scope_value, budget.scope_value)
        shares = [
            share
            for share in (
                _share(item.spent_usd, budget.limit_usd),
                _share(item.spent_tokens, budget.limit_tokens),
            )
            if share is not None
        ]
        rows.append(BudgetRow(status=item, scope_label=label, used_share=max(shares) if shares else None))
    return _render(
        request,
        membership,
        "frontend/guardrails/budgets.html",
        {"rows": rows, "form": form or BudgetForm(agents=agents, api_keys=api_keys)},
        status=status,
    )


@workspace_view()
@require_http_methods(["GET", "POST"])
def guardrail_budget_list_view(request: HtmxHttpRequest, membership: Membership) -> HttpResponse:
    if request.method == "GET":
        return _budgets_page(request, membership)
    workspace = membership.workspace
    form = BudgetForm(
        request.POST,
        agents=list(selectors.agent_list(workspace=workspace)),
        api_keys=list(selectors.apikey_list(workspace=workspace)),
    )
    if form.is_valid():
        try:
            budgets.budget_create(workspace=workspace, created_by=membership.user, **form.budget_arguments())
        except (exceptions.BudgetInvalid, exceptions.BudgetExists) as error:
            _keel_errors_to_form(form, error, {})
        else:
            messages.success(request, "Added the budget.")
            return redirect("frontend:guardrail_budget_list", workspace_slug=workspace.slug)
    return _budgets_page(request, membership, form=form, status=422)


@workspace_view()
@require_POST
def guardrail_budget_delete_view(request: HtmxHttpRequest, membership: Membership, budget_id: int) -> HttpResponse:
    budget = guardrail_selectors.budget_get(workspace=membership.workspace, budget_id=budget_id)
    budgets.budget_delete(budget=budget, deleted_by=membership.user)
    messages.success(
        request, f"Deleted the {budget.get_period_display().lower()} budget of {budget.get_scope_display().lower()}."
    )
    return redirect("frontend:guardrail_budget_list", workspace_slug=membership.workspace.slug)
