"""Reads of routing for the API and the dashboard: model targets and their health, an agent's router
configuration, chain and tools, routing decisions, hand-offs, and the router report that measures the
router against its shadow runs. Every read is scoped to a workspace (or an agent already scoped to one);
`agent_ids` narrows it further to what an API key limited to some agents may see.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from django.db.models import Count, FloatField, Q, QuerySet, Sum
from django.db.models.fields.json import KT
from django.db.models.functions import Cast
from django.urls import reverse
from django.utils import timezone
from pydantic import ValidationError

from agent_registry import selectors as registry_selectors
from agent_registry.models import Agent, PromptVersion, Workspace
from agent_registry.selectors import AgentIds
from routing import evaluation, exceptions, selectors
from routing.models import (
    AgentTool,
    CacheHit,
    ChainStep,
    DecisionMethod,
    Handoff,
    HandoffStatus,
    ModelTarget,
    OutcomeStatus,
    RouterConfig,
    RoutingDecision,
    ShadowRun,
    ShadowStatus,
    TierChoice,
)

# --- Model targets ----------------------------------------------------------------------------------


def model_target_list(*, workspace: Workspace) -> QuerySet[ModelTarget]:
    return ModelTarget.objects.filter(workspace=workspace).order_by("alias")


def model_target_get(*, workspace: Workspace, alias: str) -> ModelTarget:
    target = ModelTarget.objects.filter(workspace=workspace, alias=alias).first()
    if target is None:
        raise exceptions.ModelTargetNotFound(f"there is no model target {alias!r} in this workspace")
    return target


@dataclass(frozen=True)
class TargetHealth:
    """How a target is doing, as the gateway last saw it: `state` is ok, failing (failures in a row, not yet
    resting), cooling_down (resting until `cooldown_until`; its fallbacks serve) or disabled."""

    state: str
    label: str
    consecutive_failures: int
    cooldown_until: datetime | None
    last_error: str


def model_target_health(target: ModelTarget, *, now: datetime | None = None) -> TargetHealth:
    now = now or timezone.now()
    if not target.enabled:
        state, label = "disabled", "Disabled"
    elif target.cooldown_until is not None and target.cooldown_until > now:
        state, label = "cooling_down", "Cooling down"
    elif target.consecutive_failures:
        state, label = "failing", "Failing"
    else:
        state, label = "ok", "Healthy"
    return TargetHealth(
        state=state,
        label=label,
        consecutive_failures=target.consecutive_failures,
        cooldown_until=target.cooldown_until if state == "cooling_down" else None,
        last_error=target.last_error,
    )


# --- An agent's router --------------------------------------------------------------------------------


def router_config_get(*, agent: Agent) -> RouterConfig:
    """The agent's router configuration; an agent never configured gets the defaults (unsaved)."""
    return selectors.router_config_find(agent=agent) or RouterConfig(agent=agent)


def chain_step_list(*, agent: Agent) -> QuerySet[ChainStep]:
    return (
        ChainStep.objects.filter(agent=agent)
        .select_related("prompt_version__prompt", "model_target")
        .order_by("position")
    )


def chain_prompt_versions(*, agent: Agent, limit: int = 200) -> QuerySet[PromptVersion]:
    """The versions of the agent's prompts a chain step may use, newest first within each prompt."""
    return (
        PromptVersion.objects.filter(prompt__agent=agent)
        .select_related("prompt")
        .order_by("prompt__name", "-version")[:limit]
    )


def agent_tool_list(*, agent: Agent) -> QuerySet[AgentTool]:
    return AgentTool.objects.filter(agent=agent).order_by("name")


def agent_tool_get(*, agent: Agent, name: str) -> AgentTool:
    tool = AgentTool.objects.filter(agent=agent, name=name).first()
    if tool is None:
        raise exceptions.AgentToolNotFound(f"agent {agent.slug!r} has no tool {name!r}")
    return tool


# --- Routing decisions ----------------------------------------------------------------------------------

DECISION_PAGE_MAX: Final = 200


@dataclass(frozen=True)
class DecisionPage:
    decisions: list[RoutingDecision]
    next_cursor: str | None


def _cursor_encode(decision: RoutingDecision) -> str:
    raw = json.dumps([decision.created_at.isoformat(), decision.pk]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _cursor_decode(cursor: str) -> tuple[datetime, int]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        moment, pk = json.loads(raw)
        parsed = datetime.fromisoformat(moment)
        if not isinstance(pk, int) or parsed.tzinfo is None:
            raise ValueError("bad cursor")
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        errors = [{"field": "cursor", "message": "not a cursor this list gave out"}]
        raise exceptions.RoutingDecisionListInvalid("invalid cursor", errors=errors) from None
    return parsed, pk


def routing_decision_list(
    *,
    workspace: Workspace,
    agent_ids: AgentIds = None,
    agent: Agent | None = None,
    tier: str | None = None,
    method: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    cursor: str | None = None,
    limit: int = 50,
) -> DecisionPage:
    """Decisions newest first, `limit` at a time; `next_cursor` reads on from the last one (keyset, so a
    page stays correct while new decisions arrive)."""
    errors = []
    if tier and tier not in TierChoice.values:
        errors.append({"field": "tier", "message": f"one of {', '.join(TierChoice.values)}"})
    if method and method not in DecisionMethod.values:
        errors.append({"field": "method", "message": f"one of {', '.join(DecisionMethod.values)}"})
    if errors:
        raise exceptions.RoutingDecisionListInvalid("invalid filter", errors=errors)
    decisions = RoutingDecision.objects.filter(workspace=workspace).select_related("agent").defer("embedding")
    if agent_ids is not None:
        decisions = decisions.filter(agent_id__in=agent_ids)
    if agent is not None:
        decisions = decisions.filter(agent=agent)
    if tier:
        decisions = decisions.filter(tier=tier)
    if method:
        decisions = decisions.filter(method=method)
    if since is not None:
        decisions = decisions.filter(created_at__gte=since)
    if until is not None:
        decisions = decisions.filter(created_at__lt=until)
    if cursor:
        moment, pk = _cursor_decode(cursor)
        decisions = decisions.filter(Q(created_at__lt=moment) | Q(created_at=moment, pk__lt=pk))
    limit = max(1, min(limit, DECISION_PAGE_MAX))
    page = list(decisions.order_by("-created_at", "-pk")[: limit + 1])
    more = len(page) > limit
    page = page[:limit]
    return DecisionPage(decisions=page, next_cursor=_cursor_encode(page[-1]) if more and page else None)


def routing_decision_get(*, workspace: Workspace, decision_id: int, agent_ids: AgentIds = None) -> RoutingDecision:
    decisions = RoutingDecision.objects.filter(workspace=workspace, pk=decision_id)
    if agent_ids is not None:
        decisions = decisions.filter(agent_id__in=agent_ids)
    decision = decisions.select_related("agent").prefetch_related("shadows").defer("embedding").first()
    if decision is None:
        raise exceptions.RoutingDecisionNotFound(f"there is no routing decision {decision_id} in this workspace")
    return decision


def trajectory_path(*, workspace: Workspace, trace_id: str) -> str:
    """Where the dashboard shows the trajectory a decision (or shadow run) belongs to."""
    return reverse("frontend:trajectory_detail", args=[workspace.slug, trace_id])


# --- Hand-offs ------------------------------------------------------------------------------------------


def handoff_list(
    *, workspace: Workspace, agent_ids: AgentIds = None, status: str | None = None, limit: int = 100
) -> list[Handoff]:
    """The queue: open first (oldest first, they have waited longest), then claimed, then the latest resolved."""
    handoffs = Handoff.objects.filter(workspace=workspace).select_related("agent", "assigned_to")
    if agent_ids is not None:
        handoffs = handoffs.filter(agent_id__in=agent_ids)
    if status:
        if status not in HandoffStatus.values:
            errors = [{"field": "status", "message": f"one of {', '.join(HandoffStatus.values)}"}]
            raise exceptions.HandoffInvalid("invalid status", errors=errors)
        handoffs = handoffs.filter(status=status)
    waiting = list(handoffs.exclude(status=HandoffStatus.RESOLVED).order_by("-status", "created_at", "pk")[:limit])
    # "open" sorts after "claimed": reverse the status order so open ones lead.
    waiting.sort(key=lambda handoff: (handoff.status != HandoffStatus.OPEN, handoff.created_at, handoff.pk))
    resolved = list(handoffs.filter(status=HandoffStatus.RESOLVED).order_by("-resolved_at", "-pk")[:limit])
    return (waiting + resolved)[:limit]


def handoff_get(*, workspace: Workspace, handoff_id: int, agent_ids: AgentIds = None) -> Handoff:
    handoffs = Handoff.objects.filter(workspace=workspace, pk=handoff_id)
    if agent_ids is not None:
        handoffs = handoffs.filter(agent_id__in=agent_ids)
    handoff = handoffs.select_related("agent", "assigned_to", "decision").first()
    if handoff is None:
        raise exceptions.HandoffNotFound(f"there is no hand-off {handoff_id} in this workspace")
    return handoff


def handoff_open_count(*, workspace: Workspace) -> int:
    return Handoff.objects.filter(workspace=workspace, status=HandoffStatus.OPEN).count()


# --- Cache hits -----------------------------------------------------------------------------------------


def cache_hit_get(*, workspace: Workspace, hit_id: int) -> CacheHit:
    hit = (
        CacheHit.objects.filter(workspace=workspace, pk=hit_id).select_related("entry", "agent", "reviewed_by").first()
    )
    if hit is None:
        raise exceptions.CacheHitNotFound(f"there is no cache hit {hit_id} in this workspace")
    return hit


# --- The router report -----------------------------------------------------------------------------------

# The tiers a report lists when the agent has no requirements yet, cheapest first.
REPORT_TIERS: Final[tuple[str, ...]] = (TierChoice.SINGLE_CALL, TierChoice.CHAIN, TierChoice.AGENTIC, TierChoice.HUMAN)


def report_tiers(*, agent: Agent) -> tuple[str, ...]:
    """The agent's enabled tiers, cheapest first (the requirements keep them in that order)."""
    if agent.current_requirements_id is None:
        return REPORT_TIERS
    try:
        parsed = registry_selectors.requirements_of(agent=agent)
    except ValidationError:
        return REPORT_TIERS
    if parsed is None:
        return REPORT_TIERS
    return tuple(str(tier) for tier in parsed.routing.enabled_tiers)


def router_outcomes(*, agent: Agent, since: datetime, until: datetime) -> list[tuple[datetime, evaluation.Outcome]]:
    """Every finished decision of the agent in [since, until) with its finished shadow runs, as the
    evaluation's outcomes, each with when it was decided (in the current time zone, so days are local)."""
    decisions = (
        RoutingDecision.objects.filter(agent=agent, created_at__gte=since, created_at__lt=until)
        .exclude(status=OutcomeStatus.PENDING)
        .only("pk", "tier", "quality", "cost_usd", "latency_ms", "created_at")
        .order_by("created_at", "pk")
    )
    shadows: dict[int, dict[str, evaluation.ShadowOutcome]] = {}
    judged: dict[int, float] = {}
    shadow_rows = (
        ShadowRun.objects.filter(
            decision__agent=agent,
            decision__created_at__gte=since,
            decision__created_at__lt=until,
            status=ShadowStatus.DONE,
        )
        .only("decision_id", "tier", "quality", "primary_quality", "cost_usd", "latency_ms")
        .order_by("pk")
    )
    for shadow in shadow_rows:
        if shadow.primary_quality is not None:
            # The judge scored the chosen answer beside this shadow's: the comparison uses that score.
            judged.setdefault(shadow.decision_id, shadow.primary_quality)
        shadows.setdefault(shadow.decision_id, {})[shadow.tier] = evaluation.ShadowOutcome(
            quality=shadow.quality,
            cost_usd=float(shadow.cost_usd) if shadow.cost_usd is not None else None,
            latency_ms=shadow.latency_ms,
        )
    return [
        (
            timezone.localtime(decision.created_at),
            evaluation.Outcome(
                tier=decision.tier,
                quality=decision.quality,
                cost_usd=float(decision.cost_usd) if decision.cost_usd is not None else None,
                latency_ms=decision.latency_ms,
                shadow=shadows.get(decision.pk, {}),
                judged_quality=judged.get(decision.pk),
            ),
        )
        for decision in decisions
    ]


@dataclass(frozen=True)
class SpeculationSummary:
    """The agent's speculative single calls (routing/speculation.py) in a period: how many started, how many
    answers the router's choice of the single call took, and what the unused ones cost."""

    started: int
    taken: int
    unused_cost_usd: float | None

    @property
    def unused(self) -> int:
        return self.started - self.taken

    def as_json(self) -> dict[str, object]:
        return {
            "started": self.started,
            "taken": self.taken,
            "unused": self.unused,
            "unused_cost_usd": self.unused_cost_usd,
        }


def speculation_summary(*, agent: Agent, since: datetime, until: datetime) -> SpeculationSummary:
    totals = RoutingDecision.objects.filter(
        agent=agent, created_at__gte=since, created_at__lt=until, features__has_key="speculative"
    ).aggregate(
        started=Count("pk"),
        taken=Count("pk", filter=Q(features__speculative=True)),
        unused_cost=Sum(Cast(KT("features__speculative_cost_usd"), FloatField())),
    )
    return SpeculationSummary(started=totals["started"], taken=totals["taken"], unused_cost_usd=totals["unused_cost"])


@dataclass(frozen=True)
class RouterReportView:
    since: datetime
    until: datetime
    tiers: tuple[str, ...]
    report: evaluation.RouterReport
    daily: list[evaluation.Bucket]
    speculation: SpeculationSummary


def router_report(*, agent: Agent, since: datetime, until: datetime) -> RouterReportView:
    """The router of `agent` measured over [since, until): `routing.evaluation.router_report` over its
    finished decisions and their shadow runs, and the same per day."""
    tiers = report_tiers(agent=agent)
    outcomes = router_outcomes(agent=agent, since=since, until=until)
    return RouterReportView(
        since=since,
        until=until,
        tiers=tiers,
        report=evaluation.router_report([outcome for _, outcome in outcomes], tiers),
        daily=evaluation.bucketed(outcomes),
        speculation=speculation_summary(agent=agent, since=since, until=until),
    )
