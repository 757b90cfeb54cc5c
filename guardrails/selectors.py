"""Reads of the guardrails, each scoped to a workspace (and, for keys limited to some agents, to those
agents): violations and their rates, the approval queue, budgets and their status."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db.models import Count, QuerySet
from django.db.models.functions import TruncDay
from django.utils import timezone

from agent_registry.models import Workspace
from guardrails import exceptions
from guardrails.budgets import period_start
from guardrails.models import ApprovalRequest, ApprovalStatus, Budget, BudgetAlert, BudgetUsage, GuardrailViolation

AgentIds = Collection[int] | None


def violation_list(
    *,
    workspace: Workspace,
    agent_ids: AgentIds = None,
    agent_id: int | None = None,
    check: str | None = None,
    layer: str | None = None,
    action: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> QuerySet[GuardrailViolation]:
    violations = GuardrailViolation.objects.filter(workspace=workspace).select_related("agent")
    if agent_ids is not None:
        violations = violations.filter(agent_id__in=agent_ids)
    if agent_id is not None:
        violations = violations.filter(agent_id=agent_id)
    if check:
        violations = violations.filter(check_name=check)
    if layer:
        violations = violations.filter(layer=layer)
    if action:
        violations = violations.filter(action=action)
    if since is not None:
        violations = violations.filter(created_at__gte=since)
    if until is not None:
        violations = violations.filter(created_at__lt=until)
    return violations.order_by("-created_at", "-pk")


def violation_daily_counts(
    *, workspace: Workspace, agent_ids: AgentIds = None, agent_id: int | None = None, since: datetime
) -> list[dict[str, object]]:
    """Violations per day and check since `since` (UTC days), for rates over time."""
    rows = (
        violation_list(workspace=workspace, agent_ids=agent_ids, agent_id=agent_id, since=since)
        .order_by()
        .annotate(day=TruncDay("created_at"))
        .values("day", "check_name")
        .annotate(count=Count("pk"))
        .order_by("day", "check_name")
    )
    return [{"day": row["day"].date(), "check": row["check_name"], "count": row["count"]} for row in rows]


def approval_pending_count(*, workspace: Workspace) -> int:
    """Requests waiting for a person (and not yet past their time)."""
    return ApprovalRequest.objects.filter(
        workspace=workspace, status=ApprovalStatus.PENDING, expires_at__gt=timezone.now()
    ).count()


def approval_list(
    *,
    workspace: Workspace,
    agent_ids: AgentIds = None,
    status: str | None = None,
    agent_id: int | None = None,
) -> QuerySet[ApprovalRequest]:
    approvals = ApprovalRequest.objects.filter(workspace=workspace).select_related(
        "agent", "decided_by", "decided_by_key"
    )
    if agent_ids is not None:
        approvals = approvals.filter(agent_id__in=agent_ids)
    if agent_id is not None:
        approvals = approvals.filter(agent_id=agent_id)
    if status:
        approvals = approvals.filter(status=status)
    return approvals.order_by("-created_at", "-pk")


def approval_get(*, workspace: Workspace, approval_id: int, agent_ids: AgentIds = None) -> ApprovalRequest:
    found = approval_list(workspace=workspace, agent_ids=agent_ids).filter(pk=approval_id).first()
    if found is None:
        raise exceptions.ApprovalNotFound(f"no approval request {approval_id} in this workspace")
    return found


def budget_list(*, workspace: Workspace) -> QuerySet[Budget]:
    return Budget.objects.filter(workspace=workspace).order_by("scope", "scope_value", "period")


def budget_get(*, workspace: Workspace, budget_id: int) -> Budget:
    found = budget_list(workspace=workspace).filter(pk=budget_id).first()
    if found is None:
        raise exceptions.BudgetNotFound(f"no budget {budget_id} in this workspace")
    return found


@dataclass(frozen=True)
class BudgetStatus:
    budget: Budget
    period_start: object
    spent_usd: Decimal
    reserved_usd: Decimal
    spent_tokens: int
    reserved_tokens: int
    soft_limit_reached: bool
    exhausted: bool


def budget_status_list(*, workspace: Workspace, now: datetime | None = None) -> list[BudgetStatus]:
    """Each budget of the workspace in its current period: spent, held by open reservations, and whether
    its soft limit was reached or a request was refused."""
    now = now or timezone.now()
    budgets = list(budget_list(workspace=workspace))
    starts = {budget.pk: period_start(budget.period, now) for budget in budgets}
    usages = {
        (usage.budget_id, usage.period_start): usage
        for usage in BudgetUsage.objects.filter(budget__in=budgets, period_start__in=set(starts.values()))
    }
    alerts = set(
        BudgetAlert.objects.filter(budget__in=budgets, period_start__in=set(starts.values())).values_list(
            "budget_id", "period_start", "kind"
        )
    )
    statuses = []
    for budget in budgets:
        start = starts[budget.pk]
        usage = usages.get((budget.pk, start))
        statuses.append(
            BudgetStatus(
                budget=budget,
                period_start=start,
                spent_usd=usage.spent_usd if usage else Decimal(0),
                reserved_usd=usage.reserved_usd if usage else Decimal(0),
                spent_tokens=usage.spent_tokens if usage else 0,
                reserved_tokens=usage.reserved_tokens if usage else 0,
                soft_limit_reached=(budget.pk, start, "soft_limit") in alerts,
                exhausted=(budget.pk, start, "exceeded") in alerts,
            )
        )
    return statuses
