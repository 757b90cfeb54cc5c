"""The six forcing questions as structured data, the feasibility check, and the configuration they derive.

Pure module: no Django. Services validate answers with `Requirements.model_validate`, run
`feasibility_check` on every save, and read `derived_configuration` wherever another app needs a
budget, a tier, an approval rule or an eval schedule, so the answers configure Keel from one place.

The vocabulary and the rules come from "Requirements and Problem Framing" (shared/seeds): the error
surface, the I/O gap, the four walls, the three Pareto axes, the evaluation commitment and the routing
policy. Where a rule uses a number the post gives (cost multipliers per tier, steps a tier can close,
the latency classes), the number is a named constant below.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence
from decimal import Decimal
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

# --- Vocabulary -------------------------------------------------------------------------------


class DecisionAuthority(StrEnum):
    ADVISORY = "advisory"
    BOUNDED_AUTONOMY = "bounded_autonomy"
    FULL_AUTONOMY = "full_autonomy"


class ErrorDirection(StrEnum):
    FALSE_POSITIVE = "false_positive"
    FALSE_NEGATIVE = "false_negative"
    SYMMETRIC = "symmetric"


class Recoverability(StrEnum):
    INSTANT = "instant"
    MINUTES = "minutes"
    HOURS = "hours"
    DAYS = "days"
    IRREVERSIBLE = "irreversible"


class ActionMode(StrEnum):
    EXECUTE = "execute"
    RECOMMEND = "recommend"


class Stakes(StrEnum):
    LOW = "low"
    MODERATE = "moderate"
    HIGH = "high"


class AtomicOperation(StrEnum):
    GENERATION = "generation"
    CLASSIFICATION = "classification"
    EXTRACTION = "extraction"
    TRANSFORMATION = "transformation"
    DECISION_ACTION = "decision_action"


class LatencyClass(StrEnum):
    INLINE = "inline"
    CONVERSATIONAL = "conversational"
    ASYNCHRONOUS = "asynchronous"


class PiiHandling(StrEnum):
    NO_PII = "no_pii"
    REDACT_BEFORE_MODEL = "redact_before_model"
    PSEUDONYMIZE = "pseudonymize"
    ALLOWED = "allowed"


class GovernanceLevel(StrEnum):
    OUTPUT_MONITORING = "output_monitoring"
    POLICY_COMPLIANCE_AUDITING = "policy_compliance_auditing"
    FULL_AUDIT_TRAIL = "full_audit_trail"


class ParetoAxis(StrEnum):
    QUALITY_SPEED = "quality_speed"
    AUTONOMY_CONTROL = "autonomy_control"
    GENERALITY_RELIABILITY = "generality_reliability"


class MetricKind(StrEnum):
    OUTPUT = "output"
    TRAJECTORY = "trajectory"


class Comparator(StrEnum):
    AT_LEAST = ">="
    AT_MOST = "<="


class RoutingMode(StrEnum):
    SINGLE_LEVEL = "single_level"
    ADAPTIVE = "adaptive"


class Tier(StrEnum):
    SINGLE_CALL = "single_call"
    CHAIN = "chain"
    AGENTIC = "agentic"
    HUMAN = "human"


class RoutingSignal(StrEnum):
    RULES = "rules"
    CLASSIFIER = "classifier"
    LEARNED_DIFFICULTY = "learned_difficulty"
    CONFIDENCE = "confidence"


class EscalationTrigger(StrEnum):
    KEYWORDS = "keywords"  # any of the listed terms appears in the request
    INTENT = "intent"  # the router's intent label equals the value
    AMOUNT_OVER = "amount_over"  # a money amount in the request exceeds the value
    LOW_CONFIDENCE = "low_confidence"  # the tier's confidence falls below the value
    SIGNAL = "signal"  # a triage signal (e.g. misalignment) fires on the conversation


# Ordered from cheapest to dearest; escalation moves right.
TIER_ORDER = (Tier.SINGLE_CALL, Tier.CHAIN, Tier.AGENTIC, Tier.HUMAN)

# The post's back-of-envelope: cost relative to one call (single 1x, chain 3-5x, agentic 10-100x).
TIER_COST_MULTIPLIER_RANGE: dict[Tier, tuple[int, int]] = {
    Tier.SINGLE_CALL: (1, 1),
    Tier.CHAIN: (3, 5),
    Tier.AGENTIC: (10, 100),
}
# Information-acquisition steps a tier can close: one or two for a single call, three to five with
# dependencies for a chain, unpredictable counts for an agentic loop (or a human).
TIER_MAX_STEPS: dict[Tier, int | None] = {
    Tier.SINGLE_CALL: 2,
    Tier.CHAIN: 5,
    Tier.AGENTIC: None,
    Tier.HUMAN: None,
}
# Upper bounds of the latency classes, in milliseconds.
LATENCY_CLASS_BOUND_MS: dict[LatencyClass, int | None] = {
    LatencyClass.INLINE: 2_000,
    LatencyClass.CONVERSATIONAL: 30_000,
    LatencyClass.ASYNCHRONOUS: None,
}
# Governance that each authority level needs (Wall 4).
GOVERNANCE_REQUIRED: dict[DecisionAuthority, GovernanceLevel] = {
    DecisionAuthority.ADVISORY: GovernanceLevel.OUTPUT_MONITORING,
    DecisionAuthority.BOUNDED_AUTONOMY: GovernanceLevel.POLICY_COMPLIANCE_AUDITING,
    DecisionAuthority.FULL_AUTONOMY: GovernanceLevel.FULL_AUDIT_TRAIL,
}
GOVERNANCE_RANK = {level: rank for rank, level in enumerate(GovernanceLevel)}

ACTION_NAME = r"^[a-z][a-z0-9_]{0,63}$"
Text = Annotated[str, Field(max_length=4000)]
ShortText = Annotated[str, Field(max_length=300)]
Money = Annotated[Decimal, Field(ge=0, max_digits=12, decimal_places=4)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", use_enum_values=False, str_strip_whitespace=True)


# --- 1. Error surface -------------------------------------------------------------------------


class ErrorCostAsymmetry(Strict):
    worse_direction: ErrorDirection
    description: Text = ""
    ratio: float = Field(default=1.0, ge=1.0, le=1_000_000, description="cost of the worse error / the other")


class Action(Strict):
    name: Annotated[str, Field(pattern=ACTION_NAME)]
    description: ShortText = ""
    mode: ActionMode
    stakes: Stakes
    # Whether the action changes the world (a refund, a write); reads such as a lookup do not, and
    # an advisory agent may run them on its own.
    side_effects: bool = False
    requires_approval: bool = False
    # Executes on its own up to this amount; above it, a human approves (e.g. refunds under $20).
    autonomy_limit_usd: Money | None = None


class ErrorSurface(Strict):
    decision_authority: DecisionAuthority
    error_cost: ErrorCostAsymmetry
    recoverability: Recoverability
    actions: list[Action] = Field(default_factory=list, max_length=100)
    notes: Text = ""

    @model_validator(mode="after")
    def _action_names_unique(self) -> ErrorSurface:
        names = [action.name for action in self.actions]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"action names must be unique; repeated: {', '.join(duplicates)}")
        return self


# --- 2. I/O gap -------------------------------------------------------------------------------


class IOGap(Strict):
    steps_median: int = Field(ge=0, le=1000)
    steps_p95: int = Field(ge=0, le=1000)
    steps_predictable: bool = True
    output_verifiable_from_input: bool
    atomic_operations: list[AtomicOperation] = Field(min_length=1)
    notes: Text = ""

    # A field validator, not a model one, so the error names io_gap.steps_p95; steps_median is
    # declared (and validated) first, so it is in info.data unless it was itself invalid.
    @field_validator("steps_p95")
    @classmethod
    def _p95_not_below_median(cls, steps_p95: int, info: ValidationInfo) -> int:
        median = info.data.get("steps_median")
        if median is not None and steps_p95 < median:
            raise ValueError("steps_p95 must be at least steps_median")
        return steps_p95


# --- 3. Constraint feasibility ----------------------------------------------------------------


class Latency(Strict):
    latency_class: LatencyClass
    hard_ceiling_ms: int = Field(gt=0, le=7 * 24 * 3600 * 1000)
    notes: Text = ""


class Cost(Strict):
    per_request_ceiling_usd: Money
    per_resolution_ceiling_usd: Money | None = None
    comparison_point: ShortText = ""
    comparison_cost_usd: Money | None = None
    # What one model call of this agent costs; the tier estimates multiply it.
    single_call_cost_usd: Money | None = None
    expected_daily_requests: int | None = Field(default=None, ge=0)


class Privacy(Strict):
    may_see: Text = ""
    may_infer: Text = ""
    may_store: Text = ""
    may_transmit: Text = ""
    pii_handling: PiiHandling


class Constraints(Strict):
    latency: Latency
    cost: Cost
    privacy: Privacy
    governance: GovernanceLevel


# --- 4. Pareto position -----------------------------------------------------------------------


class ParetoPosition(Strict):
    # 0 = entirely the first pole, 100 = entirely the second.
    quality_vs_speed: int = Field(ge=0, le=100)
    autonomy_vs_control: int = Field(ge=0, le=100)
    generality_vs_reliability: int = Field(ge=0, le=100)
    primary_axis: ParetoAxis
    rationale: Text = ""


# --- 5. Evaluation commitment -----------------------------------------------------------------


class Metric(Strict):
    name: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,63}$")]
    description: ShortText = ""
    # NaN and infinity are no targets, and PostgreSQL's JSON cannot hold them.
    target: float = Field(allow_inf_nan=False)
    comparator: Comparator = Comparator.AT_LEAST


class EvaluationCommitment(Strict):
    output_metrics: list[Metric] = Field(default_factory=list, max_length=50)
    trajectory_metrics: list[Metric] = Field(default_factory=list, max_length=50)
    notes: Text = ""

    @model_validator(mode="after")
    def _metric_names_unique(self) -> EvaluationCommitment:
        names = [metric.name for metric in [*self.output_metrics, *self.trajectory_metrics]]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"metric names must be unique; repeated: {', '.join(duplicates)}")
        return self


# --- 6. Routing policy ------------------------------------------------------------------------


class EscalationRule(Strict):
    trigger: EscalationTrigger
    value: ShortText
    to_tier: Tier
    reason: ShortText = ""

    @model_validator(mode="after")
    def _value_fits_trigger(self) -> EscalationRule:
        if self.trigger in (EscalationTrigger.AMOUNT_OVER, EscalationTrigger.LOW_CONFIDENCE):
            try:
                finite = math.isfinite(float(self.value))
            except ValueError:
                finite = False
            if not finite:
                raise ValueError(f"value must be a number for trigger {self.trigger.value}")
        if not self.value:
            raise ValueError("value must not be empty")
        return self


class RoutingPolicy(Strict):
    mode: RoutingMode
    enabled_tiers: list[Tier] = Field(min_length=1)
    default_tier: Tier
    signal: RoutingSignal = RoutingSignal.RULES
    escalation_rules: list[EscalationRule] = Field(default_factory=list, max_length=100)
    notes: Text = ""

    @model_validator(mode="after")
    def _tiers_consistent(self) -> RoutingPolicy:
        if len(set(self.enabled_tiers)) != len(self.enabled_tiers):
            raise ValueError("enabled_tiers must not repeat a tier")
        if self.default_tier not in self.enabled_tiers:
            raise ValueError("default_tier must be one of enabled_tiers")
        for rule in self.escalation_rules:
            if rule.to_tier not in self.enabled_tiers:
                raise ValueError(f"escalation to {rule.to_tier.value}, which is not an enabled tier")
        # Keep the tiers in escalation order so diffs and derived budgets are stable.
        self.enabled_tiers = [tier for tier in TIER_ORDER if tier in self.enabled_tiers]
        return self


# --- The whole -------------------------------------------------------------------------------


class Requirements(Strict):
    error_surface: ErrorSurface
    io_gap: IOGap
    constraints: Constraints
    pareto: ParetoPosition
    evaluation: EvaluationCommitment
    routing: RoutingPolicy

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = self.model_dump(mode="json")
        return data


QUESTIONS: tuple[tuple[str, str, str], ...] = (
    (
        "error_surface",
        "Error surface",
        "Where is uncertainty allowed to accumulate? Map the decision authority boundary: what does the "
        "agent recommend and what does it execute, and what happens when it is wrong at each boundary?",
    ),
    (
        "io_gap",
        "I/O gap",
        "How many information-acquisition steps bridge the input to the required output, for the median "
        "case and the 95th percentile? If the number is unpredictable, the agent needs a loop.",
    ),
    (
        "constraints",
        "Constraint feasibility",
        "Which of the four walls (latency, cost, privacy, governance) eliminates which framing? A single "
        "constraint often kills a design direction before any trade-off is considered.",
    ),
    (
        "pareto",
        "Pareto position",
        "Given the business model, where does the agent sit on each trade-off axis, and which axis matters "
        "most? Optimise along it and satisfice the others.",
    ),
    (
        "evaluation",
        "Evaluation commitment",
        "What will the team actually measure? Agentic framings need trajectory metrics, not only output "
        "metrics. Choose a framing you can evaluate, not just one you can build.",
    ),
    (
        "routing",
        "Routing policy",
        "One complexity level, or adaptive routing across levels? Which signal drives the routing, and "
        "when does a case escalate?",
    ),
)


# --- Feasibility ------------------------------------------------------------------------------


class Severity(StrEnum):
    ERROR = "error"  # a contradiction: the answers cannot all hold
    WARNING = "warning"  # legal but risky; the framework advises against it
    INFO = "info"


class Finding(BaseModel):
    model_config = ConfigDict(frozen=True)

    code: str
    severity: Severity
    message: str
    fields: tuple[str, ...]


def _closable_steps(tiers: Sequence[Tier]) -> int | None:
    """Most information-acquisition steps the enabled tiers can close (None: unbounded)."""
    limits = [TIER_MAX_STEPS[tier] for tier in tiers]
    if any(limit is None for limit in limits):
        return None
    return max(limit for limit in limits if limit is not None)


def _tier_cost_floor(requirements: Requirements, tier: Tier) -> Decimal | None:
    base = requirements.constraints.cost.single_call_cost_usd
    if base is None or tier not in TIER_COST_MULTIPLIER_RANGE:
        return None
    return base * TIER_COST_MULTIPLIER_RANGE[tier][0]


def _executing_actions(requirements: Requirements) -> list[Action]:
    """Actions the agent carries out on its own that change something: the authority it holds."""
    return [
        action
        for action in requirements.error_surface.actions
        if action.mode is ActionMode.EXECUTE and action.side_effects
    ]


def _feasibility_findings(requirements: Requirements) -> Iterator[Finding]:
    surface = requirements.error_surface
    gap = requirements.io_gap
    latency = requirements.constraints.latency
    cost = requirements.constraints.cost
    routing = requirements.routing
    tiers = routing.enabled_tiers
    automated_tiers = [tier for tier in tiers if tier is not Tier.HUMAN]

    if latency.latency_class is LatencyClass.INLINE and Tier.AGENTIC in tiers:
        yield Finding(
            code="inline_latency_with_agentic_tier",
            severity=Severity.ERROR,
            message="An inline latency wall (under 2 s) leaves no room for an agentic loop: every extra "
            "model call is felt by a user who is blocked mid-task. Disable the agentic tier or relax the "
            "latency class.",
            fields=("constraints.latency.latency_class", "routing.enabled_tiers"),
        )

    bound = LATENCY_CLASS_BOUND_MS[latency.latency_class]
    if bound is not None and latency.hard_ceiling_ms > bound * 10:
        yield Finding(
            code="latency_ceiling_outside_class",
            severity=Severity.WARNING,
            message=f"The hard ceiling of {latency.hard_ceiling_ms} ms is far above the "
            f"{latency.latency_class.value} class ({bound} ms): either the class or the ceiling is wrong.",
            fields=("constraints.latency.hard_ceiling_ms", "constraints.latency.latency_class"),
        )

    for tier in automated_tiers:
        floor = _tier_cost_floor(requirements, tier)
        if floor is not None and floor > cost.per_request_ceiling_usd:
            low, high = TIER_COST_MULTIPLIER_RANGE[tier]
            yield Finding(
                code="cost_ceiling_below_tier_estimate",
                severity=Severity.ERROR,
                message=f"The {tier.value} tier costs at least {low}x a single call (estimate ${floor}; "
                f"{low}-{high}x), above the per-request ceiling of ${cost.per_request_ceiling_usd}.",
                fields=("constraints.cost.per_request_ceiling_usd", "routing.enabled_tiers"),
            )

    if (
        cost.per_resolution_ceiling_usd is not None
        and cost.comparison_cost_usd is not None
        and cost.per_resolution_ceiling_usd > cost.comparison_cost_usd
    ):
        yield Finding(
            code="resolution_costs_more_than_comparison",
            severity=Severity.WARNING,
            message=f"A resolution may cost up to ${cost.per_resolution_ceiling_usd}, more than the "
            f"comparison point ({cost.comparison_point or 'the alternative'}, ${cost.comparison_cost_usd}).",
            fields=("constraints.cost.per_resolution_ceiling_usd", "constraints.cost.comparison_cost_usd"),
        )

    executing = _executing_actions(requirements)
    if (
        surface.decision_authority is not DecisionAuthority.ADVISORY
        and executing
        and not requirements.evaluation.trajectory_metrics
    ):
        yield Finding(
            code="autonomous_actions_without_trajectory_audit",
            severity=Severity.ERROR,
            message="The agent executes actions on its own, but the evaluation commitment has no "
            "trajectory metric: nobody would see whether it followed policy on each action. Commit "
            "to trajectory metrics such as policy compliance and escalation accuracy.",
            fields=("error_surface.actions", "evaluation.trajectory_metrics"),
        )
    if surface.decision_authority is DecisionAuthority.ADVISORY and executing:
        yield Finding(
            code="advisory_agent_executes_actions",
            severity=Severity.ERROR,
            message=f"An advisory agent only recommends, yet {', '.join(a.name for a in executing)} "
            "executes. Make those actions recommendations or widen the decision authority.",
            fields=("error_surface.decision_authority", "error_surface.actions"),
        )

    required = GOVERNANCE_REQUIRED[surface.decision_authority]
    governance = requirements.constraints.governance
    if GOVERNANCE_RANK[governance] < GOVERNANCE_RANK[required]:
        yield Finding(
            code="governance_below_authority",
            severity=Severity.WARNING,
            message=f"{surface.decision_authority.value.replace('_', ' ').capitalize()} needs "
            f"{required.value.replace('_', ' ')}; the governance level is only "
            f"{governance.value.replace('_', ' ')}.",
            fields=("constraints.governance", "error_surface.decision_authority"),
        )

    for action in surface.actions:
        if action.stakes is Stakes.HIGH and action.mode is ActionMode.EXECUTE and not action.requires_approval:
            yield Finding(
                code="high_stakes_action_without_approval",
                severity=Severity.ERROR,
                message=f"{action.name} is high-stakes and executes without human approval. Require "
                "approval, or make it a recommendation: autonomy in reasoning, control at the action boundary.",
                fields=(f"error_surface.actions.{action.name}",),
            )

    if (
        surface.recoverability is Recoverability.IRREVERSIBLE
        and surface.decision_authority is DecisionAuthority.FULL_AUTONOMY
    ):
        yield Finding(
            code="irreversible_full_autonomy",
            severity=Severity.WARNING,
            message="Irreversible mistakes under full autonomy: the governance of a trading system, with "
            "real-time anomaly detection and adversarial testing, is the minimum.",
            fields=("error_surface.recoverability", "error_surface.decision_authority"),
        )

    closable = _closable_steps(automated_tiers) if automated_tiers else 0
    if not gap.steps_predictable and closable is not None:
        if Tier.HUMAN in tiers:
            yield Finding(
                code="unpredictable_gap_goes_to_humans",
                severity=Severity.INFO,
                message="The number of steps cannot be predicted and no agentic tier is enabled: every "
                "such case will escalate to a human.",
                fields=("io_gap.steps_predictable", "routing.enabled_tiers"),
            )
        else:
            yield Finding(
                code="unpredictable_gap_without_agentic_tier",
                severity=Severity.ERROR,
                message="The number of information-acquisition steps cannot be predicted, which needs an "
                "agentic loop (or a human), but neither tier is enabled.",
                fields=("io_gap.steps_predictable", "routing.enabled_tiers"),
            )
    elif closable is not None and gap.steps_p95 > closable:
        severity = Severity.INFO if Tier.HUMAN in tiers else Severity.ERROR
        tail = (
            "those cases will escalate to a human."
            if Tier.HUMAN in tiers
            else "enable a deeper tier or narrow the scope."
        )
        yield Finding(
            code="io_gap_exceeds_tiers",
            severity=severity,
            message=f"The 95th-percentile case needs {gap.steps_p95} information-acquisition steps; the "
            f"enabled tiers close at most {closable}: {tail}",
            fields=("io_gap.steps_p95", "routing.enabled_tiers"),
        )

    if routing.mode is RoutingMode.SINGLE_LEVEL and len(automated_tiers) > 1:
        yield Finding(
            code="single_level_with_several_tiers",
            severity=Severity.WARNING,
            message="Routing is single-level but several automated tiers are enabled; only the default "
            "tier will ever run. Switch to adaptive routing or disable the others.",
            fields=("routing.mode", "routing.enabled_tiers"),
        )
    if routing.mode is RoutingMode.ADAPTIVE and len(tiers) < 2:
        yield Finding(
            code="adaptive_with_one_tier",
            severity=Severity.WARNING,
            message="Adaptive routing needs at least two tiers to choose between.",
            fields=("routing.mode", "routing.enabled_tiers"),
        )
    if routing.mode is RoutingMode.ADAPTIVE and not routing.escalation_rules and routing.signal is RoutingSignal.RULES:
        yield Finding(
            code="adaptive_rules_without_rules",
            severity=Severity.WARNING,
            message="Routing is adaptive and driven by rules, but no escalation rule is defined: every "
            "request would stay on the default tier.",
            fields=("routing.escalation_rules",),
        )

    if (
        requirements.constraints.privacy.pii_handling is PiiHandling.ALLOWED
        and surface.decision_authority is DecisionAuthority.FULL_AUTONOMY
    ):
        yield Finding(
            code="raw_pii_under_full_autonomy",
            severity=Severity.WARNING,
            message="The model sees raw PII and acts on its own: push PII resolution into deterministic "
            "pre-processing so that tool calls cannot leak it.",
            fields=("constraints.privacy.pii_handling", "error_surface.decision_authority"),
        )


def feasibility_check(requirements: Requirements) -> list[Finding]:
    """Contradictions and risks in a set of answers, errors first."""
    order = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}
    return sorted(_feasibility_findings(requirements), key=lambda finding: order[finding.severity])


# --- Derived configuration --------------------------------------------------------------------


class Derived(BaseModel):
    """One configured value and the answers it came from."""

    value: Any
    sources: tuple[str, ...]
    explanation: str


class TierBudget(BaseModel):
    tier: Tier
    time_budget_ms: int | None
    cost_budget_usd: Decimal | None
    max_steps: int | None


class DerivedConfiguration(BaseModel):
    allowed_tiers: Derived
    tier_budgets: Derived
    budgets: Derived
    approval_rules: Derived
    tool_allow_list: Derived
    mandatory_guardrails: Derived
    eval_suites: Derived
    router: Derived
    trajectory_sampling_rate: Derived


def _tier_time_budget(requirements: Requirements, tier: Tier) -> int | None:
    latency = requirements.constraints.latency
    if tier is Tier.HUMAN:
        return None
    bound = LATENCY_CLASS_BOUND_MS[latency.latency_class]
    return min(latency.hard_ceiling_ms, bound) if bound is not None else latency.hard_ceiling_ms


def _agentic_step_limit(requirements: Requirements) -> int:
    # Twice the p95 step count, so a hard case can finish, capped where a loop is surely stuck.
    return max(4, min(50, requirements.io_gap.steps_p95 * 2))


def derived_configuration(requirements: Requirements) -> DerivedConfiguration:
    """What the answers configure elsewhere; each value names the fields it was derived from."""
    errors = {f.code for f in feasibility_check(requirements) if f.severity is Severity.ERROR}
    cost = requirements.constraints.cost
    surface = requirements.error_surface
    evaluation = requirements.evaluation

    allowed = [
        tier
        for tier in requirements.routing.enabled_tiers
        if not (tier is Tier.AGENTIC and "inline_latency_with_agentic_tier" in errors)
    ]
    budgets_per_tier = []
    for tier in allowed:
        low_high = TIER_COST_MULTIPLIER_RANGE.get(tier)
        cost_budget = None
        if tier is not Tier.HUMAN:
            cost_budget = cost.per_request_ceiling_usd
            if cost.single_call_cost_usd is not None and low_high is not None:
                cost_budget = min(cost_budget, cost.single_call_cost_usd * low_high[1])
        budgets_per_tier.append(
            TierBudget(
                tier=tier,
                time_budget_ms=_tier_time_budget(requirements, tier),
                cost_budget_usd=cost_budget,
                max_steps=_agentic_step_limit(requirements) if tier is Tier.AGENTIC else TIER_MAX_STEPS.get(tier),
            ).model_dump(mode="json")
        )

    daily = None
    if cost.expected_daily_requests is not None:
        daily = cost.per_request_ceiling_usd * cost.expected_daily_requests

    approval_rules = []
    for action in surface.actions:
        if action.mode is not ActionMode.EXECUTE or not action.side_effects:
            continue
        if action.requires_approval or action.stakes is Stakes.HIGH:
            approval_rules.append({"action": action.name, "approval": "always"})
        elif action.autonomy_limit_usd is not None:
            approval_rules.append(
                {
                    "action": action.name,
                    "approval": "above_amount",
                    "amount_usd": str(action.autonomy_limit_usd),
                }
            )
        else:
            approval_rules.append({"action": action.name, "approval": "never"})

    guardrails: list[dict[str, str]] = [
        {
            "check": "system_prompt_leakage",
            "layer": "output",
            "why": "every agent has a system prompt to protect",
        },
    ]
    if surface.actions:
        guardrails.append(
            {
                "check": "prompt_injection",
                "layer": "input",
                "why": "the agent has tools an injection could steer",
            }
        )
        guardrails.append(
            {"check": "indirect_injection", "layer": "tool", "why": "tool results enter the model's context"}
        )
        guardrails.append({"check": "action_boundary", "layer": "tool", "why": "only the listed actions may be called"})
    pii = requirements.constraints.privacy.pii_handling
    if pii in (PiiHandling.REDACT_BEFORE_MODEL, PiiHandling.PSEUDONYMIZE):
        guardrails.append({"check": "pii", "layer": "input", "why": f"privacy says {pii.value.replace('_', ' ')}"})
    if pii is not PiiHandling.ALLOWED:
        guardrails.append({"check": "pii", "layer": "output", "why": "PII must not reach the user or tools"})
    if surface.decision_authority is not DecisionAuthority.ADVISORY:
        guardrails.append({"check": "budget", "layer": "request", "why": "autonomous spending needs a hard cap"})

    suites = []
    if evaluation.output_metrics:
        suites.append(
            {
                "name": "output-quality",
                "schedule": "nightly",
                "metrics": [metric.name for metric in evaluation.output_metrics],
                "kind": "offline",
            }
        )
    if evaluation.trajectory_metrics:
        suites.append(
            {
                "name": "trajectory-audit",
                "schedule": "online",
                "metrics": [metric.name for metric in evaluation.trajectory_metrics],
                "kind": "online",
            }
        )
    if Tier.HUMAN in allowed or len(allowed) > 1:
        suites.append(
            {
                "name": "router-accuracy",
                "schedule": "weekly",
                "metrics": ["routing_accuracy"],
                "kind": "offline",
            }
        )

    sampling = {
        GovernanceLevel.OUTPUT_MONITORING: 0.05,
        GovernanceLevel.POLICY_COMPLIANCE_AUDITING: 0.25,
        GovernanceLevel.FULL_AUDIT_TRAIL: 1.0,
    }[requirements.constraints.governance]

    routing = requirements.routing
    router_value = {
        "mode": routing.mode.value,
        "tiers": [tier.value for tier in allowed],
        # The latency wall can rule out every enabled tier (only agentic, inline): then there is no default.
        "default_tier": routing.default_tier.value
        if routing.default_tier in allowed
        else (allowed[0].value if allowed else None),
        "signal": routing.signal.value,
        "escalation_rules": [rule.model_dump(mode="json") for rule in routing.escalation_rules],
    }

    return DerivedConfiguration(
        allowed_tiers=Derived(
            value=[tier.value for tier in allowed],
            sources=("routing.enabled_tiers", "constraints.latency.latency_class"),
            explanation="The enabled tiers, less any that the latency wall rules out.",
        ),
        tier_budgets=Derived(
            value=budgets_per_tier,
            sources=(
                "constraints.latency.hard_ceiling_ms",
                "constraints.cost.per_request_ceiling_usd",
                "constraints.cost.single_call_cost_usd",
                "io_gap.steps_p95",
            ),
            explanation="Each tier's time budget is the hard ceiling (capped by the latency class); its "
            "cost budget is the per-request ceiling (capped by the tier's top multiplier of a single call); "
            "the agentic step limit is twice the p95 step count, between 4 and 50.",
        ),
        budgets=Derived(
            value={
                "per_request_usd": str(cost.per_request_ceiling_usd),
                "per_resolution_usd": None
                if cost.per_resolution_ceiling_usd is None
                else str(cost.per_resolution_ceiling_usd),
                "per_day_usd": None if daily is None else str(daily),
            },
            sources=(
                "constraints.cost.per_request_ceiling_usd",
                "constraints.cost.per_resolution_ceiling_usd",
                "constraints.cost.expected_daily_requests",
            ),
            explanation="The cost wall, per request and per resolution; the daily budget is the per-request "
            "ceiling times the expected daily requests.",
        ),
        approval_rules=Derived(
            value=approval_rules,
            sources=("error_surface.actions",),
            explanation="Actions with side effects that are high-stakes or marked for approval always wait "
            "for a human; those with an autonomy limit wait above it; reads never wait.",
        ),
        tool_allow_list=Derived(
            value=[action.name for action in surface.actions],
            sources=("error_surface.actions",),
            explanation="Only the actions on the error surface may be called; anything else is blocked.",
        ),
        mandatory_guardrails=Derived(
            value=guardrails,
            sources=(
                "error_surface.actions",
                "constraints.privacy.pii_handling",
                "error_surface.decision_authority",
            ),
            explanation="Checks the agent may not switch off, given its tools, privacy and authority.",
        ),
        eval_suites=Derived(
            value=suites,
            sources=("evaluation.output_metrics", "evaluation.trajectory_metrics", "routing.enabled_tiers"),
            explanation="Output metrics run nightly against a dataset; trajectory metrics score sampled live "
            "trajectories; a router with a choice to make is evaluated weekly.",
        ),
        router=Derived(
            value=router_value,
            sources=("routing.mode", "routing.signal", "routing.escalation_rules", "routing.default_tier"),
            explanation="The router's tiers, default, signal and escalation rules.",
        ),
        trajectory_sampling_rate=Derived(
            value=sampling,
            sources=("constraints.governance",),
            explanation="Share of live trajectories kept for audit: 5% for output monitoring, 25% for policy "
            "compliance auditing, all of them for a full audit trail.",
        ),
    )


# --- Diff -------------------------------------------------------------------------------------

ChangeKind = Literal["added", "removed", "changed"]


class Change(BaseModel):
    path: str
    kind: ChangeKind
    before: Any = None
    after: Any = None


_KEYED_LISTS = {"actions": "name", "output_metrics": "name", "trajectory_metrics": "name"}


def _flatten(value: Any, path: str = "") -> dict[str, Any]:
    """Flatten nested answers into dotted paths; named lists (actions, metrics) key on their name."""
    if isinstance(value, dict):
        flat: dict[str, Any] = {}
        for key, item in value.items():
            flat.update(_flatten(item, f"{path}.{key}" if path else key))
        return flat
    leaf = path.rsplit(".", 1)[-1]
    if isinstance(value, list) and leaf in _KEYED_LISTS and all(isinstance(item, dict) for item in value):
        key = _KEYED_LISTS[leaf]
        flat = {}
        for item in value:
            flat.update(_flatten(item, f"{path}.{item.get(key)}"))
        return flat
    return {path: value}


def requirements_diff(before: dict[str, Any], after: dict[str, Any]) -> list[Change]:
    """Field-level differences between two answer documents, in path order."""
    old, new = _flatten(before), _flatten(after)
    changes = []
    for path in sorted(old.keys() | new.keys(), key=_path_sort_key):
        if path not in new:
            changes.append(Change(path=path, kind="removed", before=old[path]))
        elif path not in old:
            changes.append(Change(path=path, kind="added", after=new[path]))
        elif old[path] != new[path]:
            changes.append(Change(path=path, kind="changed", before=old[path], after=new[path]))
    return changes


def _path_sort_key(path: str) -> tuple[int, str]:
    section = path.split(".", 1)[0]
    order = [key for key, _, _ in QUESTIONS]
    return (order.index(section) if section in order else len(order), path)


_WORD = re.compile(r"_")


def field_label(path: str) -> str:
    """A readable label for a dotted path: `constraints.latency.hard_ceiling_ms` → `Latency › hard ceiling ms`."""
    parts = path.split(".")
    titles = {key: title for key, title, _ in QUESTIONS}
    head = titles.get(parts[0], parts[0])
    return " › ".join([head, *(_WORD.sub(" ", part) for part in parts[1:])])
