"""Budgets against unbounded consumption: per workspace, agent, API key and end user, per day and month,
in money and tokens.

Before a model call the caller reserves the call's estimated maximum (`budget_reserve`) against every
budget that matches the request; after it, `budget_settle` turns the reservation into what was spent and
releases the rest. (The gateway does not call these yet: wiring them into its request path is the next
step of the guardrails work.) A reservation locks the matching usage rows (`SELECT ... FOR UPDATE`, in id order so
two requests never wait on each other crosswise) and checks `spent + reserved + estimate <= limit` under
that lock, so concurrent requests cannot overshoot together (the race litellm's proxy has). Over a limit
the request is refused with `BudgetExceeded` (429, `budget_exceeded`): budgets fail closed. A soft limit
raises one `BudgetAlert` per budget and period; so does the first refusal.

Writes live here like a service module: the budget ledger is one unit.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F, Q, QuerySet
from django.db.models.functions import Greatest
from django.utils import timezone

from agent_registry import audit
from agent_registry.models import Agent, ApiKey, AuditAction, User, Workspace
from config.compiled_query import CompiledQuery
from config.config_cache import NotifiedCache
from guardrails import exceptions
from guardrails.models import (
    Budget,
    BudgetAlert,
    BudgetAlertKind,
    BudgetPeriod,
    BudgetReservation,
    BudgetScope,
    BudgetUsage,
)
from tracing import pricing

logger = logging.getLogger("guardrails.budgets")

# When a request names no max_tokens, the reservation assumes this many output tokens.
DEFAULT_MAX_OUTPUT_TOKENS = 4096
# Reservations not settled within this are taken as spent in full by the sweep (the request died).
RESERVATION_LEASE = timedelta(minutes=15)


@dataclass(frozen=True, slots=True)
class Reservation:
    """What `budget_settle` needs; `id` is None when no budget matched (nothing was held)."""

    id: int | None
    usage_ids: tuple[int, ...]
    estimated_usd: Decimal
    estimated_tokens: int


# --- Estimating -------------------------------------------------------------------------------


def prompt_tokens_estimate(messages: Sequence[Mapping[str, Any]]) -> int:
    """An upper-leaning count of a chat request's input tokens: about one per three characters, plus the
    per-message overhead. Close enough to reserve; the settlement uses the provider's count."""
    total = 0
    for message in messages:
        content = message.get("content")
        text = content if isinstance(content, str) else str(content or "")
        total += len(text) // 3 + 4
        if message.get("tool_calls"):
            total += len(str(message["tool_calls"])) // 3
    return total + 3


def request_cost_estimate(
    *,
    model: str,
    messages: Sequence[Mapping[str, Any]],
    max_tokens: int | None = None,
    prices: Mapping[str, pricing.ModelPrice] | None = None,
) -> tuple[Decimal, int]:
    """(the most a call can cost in USD, the most tokens it can use): its input and `max_tokens` of output
    at the model's price (`prices` are the workspace's overrides). A model without a known price costs 0
    here, so only token budgets hold it back."""
    input_tokens = prompt_tokens_estimate(messages)
    output_tokens = max_tokens or DEFAULT_MAX_OUTPUT_TOKENS
    cost = pricing.generation_cost(model, input_tokens, output_tokens, None, prices)
    return cost or Decimal(0), input_tokens + output_tokens


# --- Periods and matching ---------------------------------------------------------------------


def period_start(period: str, now: datetime | None = None) -> date:
    today = (now or timezone.now()).date()
    return today.replace(day=1) if period == BudgetPeriod.MONTH else today


def seconds_to_next_period(period: str, now: datetime | None = None) -> int:
    """Seconds until the budget's next period starts (UTC midnight, or the first of next month)."""
    now = now or timezone.now()
    start = period_start(period, now)
    if period == BudgetPeriod.MONTH:
        following = date(start.year + start.month // 12, start.month % 12 + 1, 1)
    else:
        following = start + timedelta(days=1)
    boundary = datetime(following.year, following.month, following.day, tzinfo=UTC)
    return max(1, int((boundary - now).total_seconds()))


def _scope_values(*, agent_id: int | None, api_key_id: int | None, end_user: str) -> dict[str, str]:
    """The request's scopes a budget may name (`scope_value`), by `_matching`'s argument."""
    values = {
        "agent": None if agent_id is None else str(agent_id),
        "api_key": None if api_key_id is None else str(api_key_id),
        "end_user": end_user[:200] or None,
    }
    return {name: value for name, value in values.items() if value is not None}


def _matching(
    *, workspace_id: int, agent: str | None = None, api_key: str | None = None, end_user: str | None = None
) -> QuerySet[Budget]:
    scopes = Q(scope=BudgetScope.WORKSPACE)
    if agent is not None:
        scopes |= Q(scope=BudgetScope.AGENT, scope_value=agent)
    if api_key is not None:
        scopes |= Q(scope=BudgetScope.API_KEY, scope_value=api_key)
    if end_user is not None:
        scopes |= Q(scope=BudgetScope.END_USER, scope_value=end_user)
    return Budget.objects.filter(scopes, workspace_id=workspace_id)


# _matching compiled once per shape (which scopes the request has): every model call of the gateway reads
# it (config/compiled_query.py).
_MATCHING_SENTINELS: dict[str, object] = {
    "workspace_id": -7_000_002,
    "agent": "keel-sentinel:agent",
    "api_key": "keel-sentinel:api-key",
    "end_user": "keel-sentinel:end-user",
}
_matching_compiled: dict[frozenset[str], CompiledQuery[Budget]] = {}


def budgets_matching(*, workspace_id: int, agent_id: int | None, api_key_id: int | None, end_user: str) -> list[Budget]:
    """The budgets a request with these scopes counts against: the workspace's, and those of its agent,
    key and end user."""
    values: dict[str, object] = {
        "workspace_id": workspace_id,
        **_scope_values(agent_id=agent_id, api_key_id=api_key_id, end_user=end_user),
    }
    shape = frozenset(values)
    query = _matching_compiled.get(shape)
    if query is None:
        query = CompiledQuery(Budget, _matching, **{name: _MATCHING_SENTINELS[name] for name in shape})
        _matching_compiled[shape] = query
    # Kept per process until a budget changes (config/config_cache.py); the instances are shared: read only.
    return list(_budgets.get(tuple(sorted(values.items())), functools.partial(query.rows, **values)))


_budgets: NotifiedCache[tuple[tuple[str, object], ...], list[Budget]] = NotifiedCache(size=4096)


def _usage_ids(budgets: Sequence[Budget], now: datetime) -> list[int]:
    ids = []
    for budget in budgets:
        usage, _ = BudgetUsage.objects.get_or_create(budget=budget, period_start=period_start(budget.period, now))
        ids.append(usage.pk)
    return ids


def _describe(budget: Budget) -> str:
    target = {BudgetScope.WORKSPACE: "the workspace"}.get(
        BudgetScope(budget.scope), f"{budget.get_scope_display().lower()} {budget.scope_value}"
    )
    return f"the {budget.period}ly budget of {target}".replace("dayly", "daily")


def _alert(budget: Budget, start: date, kind: BudgetAlertKind, detail: str) -> None:
    _, created = BudgetAlert.objects.get_or_create(
        budget=budget,
        period_start=start,
        kind=kind,
        defaults={"workspace_id": budget.workspace_id, "detail": detail},
    )
    if created:
        logger.warning("guardrails.budget_alert", extra={"budget_id": budget.pk, "kind": kind, "detail": detail})


# --- Reserving and settling -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Refusal:
    budget: Budget
    period_start: date
    detail: str


def _reserve(
    budgets: Sequence[Budget], workspace_id: int, estimated_usd: Decimal, estimated_tokens: int
) -> Reservation | _Refusal:
    now = timezone.now()
    with transaction.atomic():
        ids = _usage_ids(budgets, now)
        usages = list(
            BudgetUsage.objects.select_for_update().filter(pk__in=ids).select_related("budget").order_by("pk")
        )
        for usage in usages:
            budget = usage.budget
            if budget.limit_usd is not None and usage.spent_usd + usage.reserved_usd + estimated_usd > budget.limit_usd:
                left = max(Decimal(0), budget.limit_usd - usage.spent_usd - usage.reserved_usd)
                return _Refusal(
                    budget,
                    usage.period_start,
                    f"{_describe(budget)} is spent: ${left:.4f} of ${budget.limit_usd:.4f} left, "
                    f"this request may cost up to ${estimated_usd:.4f}",
                )
            if (
                budget.limit_tokens is not None
                and usage.spent_tokens + usage.reserved_tokens + estimated_tokens > budget.limit_tokens
            ):
                left_tokens = max(0, budget.limit_tokens - usage.spent_tokens - usage.reserved_tokens)
                return _Refusal(
                    budget,
                    usage.period_start,
                    f"{_describe(budget)} is spent: {left_tokens} of {budget.limit_tokens} tokens left, "
                    f"this request may use up to {estimated_tokens}",
                )
        BudgetUsage.objects.filter(pk__in=ids).update(
            reserved_usd=F("reserved_usd") + estimated_usd, reserved_tokens=F("reserved_tokens") + estimated_tokens
        )
        reservation = BudgetReservation.objects.create(
            workspace_id=workspace_id,
            usage_ids=ids,
            estimated_usd=estimated_usd,
            estimated_tokens=estimated_tokens,
        )
    return Reservation(reservation.pk, tuple(ids), estimated_usd, estimated_tokens)


def budget_reserve(
    *,
    workspace_id: int,
    agent_id: int | None = None,
    api_key_id: int | None = None,
    end_user: str = "",
    estimated_usd: Decimal,
    estimated_tokens: int,
) -> Reservation:
    """Hold the request's estimated maximum against every matching budget, or refuse it: raises
    BudgetExceeded naming the first budget it would take past its limit, holding nothing. Settle the
    reservation after the call, whether the call succeeded or not."""
    if estimated_usd < 0 or estimated_tokens < 0:
        raise exceptions.BudgetInvalid("an estimate cannot be negative")
    budgets = budgets_matching(workspace_id=workspace_id, agent_id=agent_id, api_key_id=api_key_id, end_user=end_user)
    if not budgets:
        return Reservation(None, (), estimated_usd, estimated_tokens)
    outcome = _reserve(budgets, workspace_id, estimated_usd, estimated_tokens)
    if isinstance(outcome, _Refusal):
        _alert(outcome.budget, outcome.period_start, BudgetAlertKind.EXCEEDED, outcome.detail)
        raise exceptions.BudgetExceeded(
            outcome.detail,
            retry_after=seconds_to_next_period(outcome.budget.period),
            budget={
                "id": outcome.budget.pk,
                "scope": outcome.budget.scope,
                "scope_value": outcome.budget.scope_value,
                "period": outcome.budget.period,
            },
        )
    return outcome


def budget_settle(*, reservation: Reservation, actual_usd: Decimal | None, actual_tokens: int | None) -> None:
    """Count what the call spent and release the rest of its reservation. Idempotent: a reservation settles
    once. Unknown actuals (a provider that reports no usage) are taken as the estimate."""
    if reservation.id is None:
        return
    spent_usd = reservation.estimated_usd if actual_usd is None else max(Decimal(0), actual_usd)
    spent_tokens = reservation.estimated_tokens if actual_tokens is None else max(0, actual_tokens)
    with transaction.atomic():
        claimed = BudgetReservation.objects.filter(pk=reservation.id, settled_at__isnull=True).update(
            settled_at=timezone.now(), actual_usd=spent_usd, actual_tokens=spent_tokens
        )
        if not claimed:
            return
        usages = list(
            BudgetUsage.objects.select_for_update()
            .filter(pk__in=reservation.usage_ids)
            .select_related("budget")
            .order_by("pk")
        )
        BudgetUsage.objects.filter(pk__in=reservation.usage_ids).update(
            reserved_usd=Greatest(F("reserved_usd") - reservation.estimated_usd, Decimal(0)),
            reserved_tokens=Greatest(F("reserved_tokens") - reservation.estimated_tokens, 0),
            spent_usd=F("spent_usd") + spent_usd,
            spent_tokens=F("spent_tokens") + spent_tokens,
        )
    for usage in usages:
        budget = usage.budget
        if budget.soft_limit_share is None:
            continue
        share = Decimal(str(budget.soft_limit_share))
        usd_reached = budget.limit_usd is not None and usage.spent_usd + spent_usd >= budget.limit_usd * share
        tokens_reached = (
            budget.limit_tokens is not None and usage.spent_tokens + spent_tokens >= budget.limit_tokens * share
        )
        if usd_reached or tokens_reached:
            _alert(
                budget,
                usage.period_start,
                BudgetAlertKind.SOFT_LIMIT,
                f"{_describe(budget)} has reached {budget.soft_limit_share:.0%} of its limit",
            )


def budget_reservations_release_stale(*, lease: timedelta = RESERVATION_LEASE) -> int:
    """Settle reservations older than the lease as spent in full: their request died before settling, and
    what it spent is unknown, so the budget keeps the estimate (failing closed). Returns how many."""
    count = 0
    stale = BudgetReservation.objects.filter(settled_at__isnull=True, created_at__lt=timezone.now() - lease)
    for row in stale.iterator():
        budget_settle(
            reservation=Reservation(row.pk, tuple(row.usage_ids), row.estimated_usd, row.estimated_tokens),
            actual_usd=None,
            actual_tokens=None,
        )
        count += 1
    return count


# --- Managing budgets -------------------------------------------------------------------------


def budget_create(
    *,
    workspace: Workspace,
    scope: str,
    period: str,
    agent: Agent | None = None,
    api_key: ApiKey | None = None,
    end_user: str = "",
    limit_usd: Decimal | None = None,
    limit_tokens: int | None = None,
    soft_limit_share: float | None = None,
    created_by: User | None = None,
    created_via_key: ApiKey | None = None,
) -> Budget:
    """A budget for one scope and period; the agent or key must belong to the workspace (the caller found
    it there). One budget per scope, value and period: a second is refused with 409."""
    values = {
        BudgetScope.WORKSPACE: "",
        BudgetScope.AGENT: str(agent.pk) if agent is not None else "",
        BudgetScope.API_KEY: str(api_key.pk) if api_key is not None else "",
        BudgetScope.END_USER: end_user.strip(),
    }
    if scope not in BudgetScope.values:
        raise exceptions.BudgetInvalid(f"unknown scope {scope!r}; the scopes are {', '.join(BudgetScope.values)}")
    scope_value = values[BudgetScope(scope)]
    if scope != BudgetScope.WORKSPACE and not scope_value:
        raise exceptions.BudgetInvalid(f"a budget of scope {scope!r} needs its {scope.replace('_', ' ')}")
    for holder in (agent, api_key):
        if holder is not None and holder.workspace_id != workspace.pk:
            raise exceptions.BudgetInvalid("the budget's agent or key belongs to another workspace")
    budget = Budget(
        workspace=workspace,
        scope=scope,
        scope_value=scope_value,
        period=period,
        limit_usd=limit_usd,
        limit_tokens=limit_tokens,
        soft_limit_share=soft_limit_share,
    )
    budget.full_clean(validate_unique=False, validate_constraints=False)
    if limit_usd is None and limit_tokens is None:
        raise exceptions.BudgetInvalid("a budget needs limit_usd, limit_tokens or both")
    try:
        with transaction.atomic():
            budget.save()
            audit.record(
                workspace=workspace,
                action=AuditAction.BUDGET_CREATED,
                user=created_by,
                api_key=created_via_key,
                target=budget,
                details={
                    "scope": scope,
                    "period": period,
                    "limit_usd": str(limit_usd) if limit_usd is not None else None,
                    "limit_tokens": limit_tokens,
                },
            )
    except IntegrityError:
        raise exceptions.BudgetExists(
            f"there is already a {period} budget for this {scope.replace('_', ' ')}; delete it first"
        ) from None
    budget.refresh_from_db()  # the limits as stored (scale of the column), as every later read shows them
    return budget


@transaction.atomic
def budget_delete(*, budget: Budget, deleted_by: User | None = None, deleted_via_key: ApiKey | None = None) -> None:
    audit.record(
        workspace=budget.workspace_id,
        action=AuditAction.BUDGET_DELETED,
        user=deleted_by,
        api_key=deleted_via_key,
        target=budget,
    )
    budget.delete()
