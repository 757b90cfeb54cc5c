"""Guardrail policies, the violations they record, approvals at the action boundary, tool-call counters
and budgets.

A policy's rules are one validated document (`guardrails/policy.py` owns its shape and the defaults the
requirements derive); the database keeps it with its canary secret, encrypted. Violations are
append-only and indexed for rates over time. Approvals and budget usage are claimed with conditional
UPDATEs (or row locks), so concurrent requests cannot use one approval twice or overshoot a budget.
"""

from __future__ import annotations

from typing import ClassVar

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from agent_registry.models import Agent, ApiKey, User, Workspace

EVIDENCE_MAX_CHARS = 500


class GuardrailPolicy(models.Model):
    """An agent's guardrail policy: which checks run on which layer and what a hit does, model-based
    checks, PII handling, topics, tool constraints, rate limits and approvals (`document`, validated by
    `policy.PolicyDocument`). Without a row the agent runs the default its requirements derive."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    agent = models.OneToOneField(Agent, on_delete=models.CASCADE, related_name="guardrail_policy")
    document = models.JSONField(default=dict)
    canary_secret_encrypted = models.TextField(blank=True)
    updated_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    updated_via_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"guardrail policy of agent {self.agent_id}"


class LayerChoice(models.TextChoices):
    INPUT = "input", "Input"
    SYSTEM = "system", "System prompt"
    OUTPUT = "output", "Output"
    TOOL = "tool", "Tool"


class ActionChoice(models.TextChoices):
    ALLOW = "allow", "Allow"
    FLAG = "flag", "Flag"
    REDACT = "redact", "Redact"
    BLOCK = "block", "Block"
    REQUIRE_APPROVAL = "require_approval", "Require approval"


class FailureMode(models.TextChoices):
    """What a check that could not run did: nothing (it ran), or failed open or closed per the policy."""

    NONE = "", "Ran"
    FAILED_OPEN = "failed_open", "Failed open"
    FAILED_CLOSED = "failed_closed", "Failed closed"


class GuardrailViolation(models.Model):
    """One triggered check (or one model-based check that failed, open or closed) on one piece of content."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="guardrail_violations")
    layer = models.CharField(max_length=8, choices=LayerChoice.choices)
    check_name = models.CharField(max_length=100)
    action = models.CharField(max_length=16, choices=ActionChoice.choices)
    score = models.FloatField(default=0.0)
    evidence = models.CharField(max_length=EVIDENCE_MAX_CHARS, blank=True)
    source = models.CharField(max_length=32, blank=True)
    failure = models.CharField(max_length=16, choices=FailureMode.choices, blank=True, default=FailureMode.NONE)
    trace_id = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        indexes: ClassVar = [
            models.Index(fields=["workspace", "-created_at"], name="violation_recent"),
            models.Index(fields=["agent", "check_name", "created_at"], name="violation_rate"),
            models.Index(fields=["workspace", "trace_id"], name="violation_trace", condition=~Q(trace_id="")),
        ]
        constraints: ClassVar = [
            models.CheckConstraint(condition=Q(layer__in=LayerChoice.values), name="violation_layer_valid"),
            models.CheckConstraint(condition=Q(action__in=ActionChoice.values), name="violation_action_valid"),
            models.CheckConstraint(condition=Q(failure__in=FailureMode.values), name="violation_failure_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.check_name} on {self.layer}: {self.action}"


class ApprovalStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Rejected"
    EXPIRED = "expired", "Expired"
    USED = "used", "Used"


class ApprovalRequest(models.Model):
    """A gated tool call waiting for (or holding) a person's decision. The same call, in the same
    conversation with the same canonical arguments (`arguments_hash`), runs once after approval."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="approval_requests")
    trace_id = models.CharField(max_length=64, blank=True)
    conversation_id = models.CharField(max_length=200)
    tool = models.CharField(max_length=200)
    arguments = models.JSONField(default=dict)
    arguments_hash = models.CharField(max_length=64)
    reason = models.TextField()
    status = models.CharField(max_length=16, choices=ApprovalStatus.choices, default=ApprovalStatus.PENDING)
    decided_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    decided_by_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_note = models.TextField(blank=True)
    used_at = models.DateTimeField(null=True, blank=True)
    used_trace_id = models.CharField(max_length=64, blank=True)
    expires_at = models.DateTimeField()
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        indexes: ClassVar = [
            models.Index(fields=["workspace", "status", "-created_at"], name="approval_queue"),
            models.Index(fields=["agent", "conversation_id", "tool", "arguments_hash"], name="approval_call"),
        ]
        constraints: ClassVar = [
            models.CheckConstraint(condition=Q(status__in=ApprovalStatus.values), name="approval_status_valid"),
            # A decision names its time; a pending request has none.
            models.CheckConstraint(
                condition=Q(status=ApprovalStatus.PENDING, decided_at__isnull=True)
                | Q(status=ApprovalStatus.EXPIRED)
                | Q(
                    status__in=[ApprovalStatus.APPROVED, ApprovalStatus.REJECTED, ApprovalStatus.USED],
                    decided_at__isnull=False,
                ),
                name="approval_decided_at_consistent",
            ),
            models.CheckConstraint(
                condition=Q(status=ApprovalStatus.USED, used_at__isnull=False) | ~Q(status=ApprovalStatus.USED),
                name="approval_used_at_consistent",
            ),
            # One open request per call: a repeated attempt finds it instead of queueing a duplicate.
            models.UniqueConstraint(
                fields=["agent", "conversation_id", "tool", "arguments_hash"],
                condition=Q(status__in=[ApprovalStatus.PENDING, ApprovalStatus.APPROVED]),
                name="approval_open_unique",
            ),
        ]

    def __str__(self) -> str:
        return f"approval {self.pk}: {self.tool} ({self.status})"


class ApprovalEventKind(models.TextChoices):
    REQUESTED = "requested", "Requested"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Rejected"
    USED = "used", "Used"
    EXPIRED = "expired", "Expired"
    REFUSED = "refused", "Refused (already rejected)"


class ApprovalEvent(models.Model):
    """The audit trail of an approval: who (a person, a key, or Keel itself), when, and why."""

    approval = models.ForeignKey(ApprovalRequest, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=16, choices=ApprovalEventKind.choices)
    actor_user = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    actor_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    note = models.TextField(blank=True)
    trace_id = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        indexes: ClassVar = [models.Index(fields=["approval", "created_at"], name="approvalevent_history")]
        constraints: ClassVar = [
            models.CheckConstraint(condition=Q(kind__in=ApprovalEventKind.values), name="approvalevent_kind_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} on approval {self.approval_id}"


class CounterWindow(models.TextChoices):
    CONVERSATION = "conversation", "Per conversation"
    DAY = "day", "Per day"


class ToolCallCounter(models.Model):
    """Tool calls let through, per agent, tool and window (a conversation id or a UTC date); claimed with a
    conditional UPDATE so that concurrent calls cannot pass a rate limit together."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="+")
    tool = models.CharField(max_length=200)
    window = models.CharField(max_length=16, choices=CounterWindow.choices)
    window_key = models.CharField(max_length=200)
    count = models.PositiveIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["agent", "tool", "window", "window_key"], name="toolcallcounter_unique"),
            models.CheckConstraint(condition=Q(window__in=CounterWindow.values), name="toolcallcounter_window_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.tool} {self.window} {self.window_key}: {self.count}"


class BudgetScope(models.TextChoices):
    WORKSPACE = "workspace", "Workspace"
    AGENT = "agent", "Agent"
    API_KEY = "api_key", "API key"
    END_USER = "end_user", "End user"


class BudgetPeriod(models.TextChoices):
    DAY = "day", "Day"
    MONTH = "month", "Month"


class Budget(models.Model):
    """A spending limit for one scope and period, in money, tokens or both. `scope_value` is empty for the
    workspace, the agent's or key's id, or the end user's identifier (the request's `user`)."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    scope = models.CharField(max_length=16, choices=BudgetScope.choices)
    scope_value = models.CharField(max_length=200, blank=True)
    period = models.CharField(max_length=8, choices=BudgetPeriod.choices)
    limit_usd = models.DecimalField(max_digits=14, decimal_places=6, null=True, blank=True)
    limit_tokens = models.BigIntegerField(null=True, blank=True)
    soft_limit_share = models.FloatField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["workspace", "scope", "scope_value", "period"], name="budget_unique"),
            models.CheckConstraint(condition=Q(scope__in=BudgetScope.values), name="budget_scope_valid"),
            models.CheckConstraint(condition=Q(period__in=BudgetPeriod.values), name="budget_period_valid"),
            models.CheckConstraint(
                condition=Q(limit_usd__isnull=False) | Q(limit_tokens__isnull=False), name="budget_has_limit"
            ),
            models.CheckConstraint(
                condition=(Q(limit_usd__isnull=True) | Q(limit_usd__gte=0))
                & (Q(limit_tokens__isnull=True) | Q(limit_tokens__gte=0)),
                name="budget_limits_non_negative",
            ),
            models.CheckConstraint(
                condition=Q(soft_limit_share__isnull=True) | Q(soft_limit_share__gt=0, soft_limit_share__lte=1),
                name="budget_soft_limit_share_range",
            ),
            models.CheckConstraint(
                condition=Q(scope=BudgetScope.WORKSPACE, scope_value="")
                | (~Q(scope=BudgetScope.WORKSPACE) & ~Q(scope_value="")),
                name="budget_scope_value_consistent",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.scope} {self.scope_value or '*'} per {self.period}"


class BudgetUsage(models.Model):
    """What one budget has spent and holds reserved in one period (starting `period_start`, UTC)."""

    budget = models.ForeignKey(Budget, on_delete=models.CASCADE, related_name="usages")
    period_start = models.DateField()
    spent_usd = models.DecimalField(max_digits=16, decimal_places=8, default=0)
    reserved_usd = models.DecimalField(max_digits=16, decimal_places=8, default=0)
    spent_tokens = models.BigIntegerField(default=0)
    reserved_tokens = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["budget", "period_start"], name="budgetusage_period_unique"),
            models.CheckConstraint(
                condition=Q(reserved_usd__gte=0, reserved_tokens__gte=0), name="budgetusage_reserved_non_negative"
            ),
        ]

    def __str__(self) -> str:
        return f"budget {self.budget_id} from {self.period_start}"


class BudgetReservation(models.Model):
    """The estimated maximum held against each matching budget's usage for one request, until it is settled
    (or released by the sweep when the request never came back)."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    usage_ids = ArrayField(models.BigIntegerField(), default=list, blank=True)
    estimated_usd = models.DecimalField(max_digits=16, decimal_places=8)
    estimated_tokens = models.BigIntegerField()
    actual_usd = models.DecimalField(max_digits=16, decimal_places=8, null=True, blank=True)
    actual_tokens = models.BigIntegerField(null=True, blank=True)
    settled_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        indexes: ClassVar = [
            models.Index(fields=["created_at"], name="reservation_open", condition=Q(settled_at__isnull=True)),
        ]
        constraints: ClassVar = [
            models.CheckConstraint(
                condition=Q(estimated_usd__gte=0, estimated_tokens__gte=0), name="reservation_non_negative"
            ),
        ]

    def __str__(self) -> str:
        return f"reservation {self.pk}"


class BudgetAlertKind(models.TextChoices):
    SOFT_LIMIT = "soft_limit", "Soft limit reached"
    EXCEEDED = "exceeded", "Limit reached: requests refused"


class BudgetAlert(models.Model):
    """Raised once per budget, period and kind."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    budget = models.ForeignKey(Budget, on_delete=models.CASCADE, related_name="alerts")
    period_start = models.DateField()
    kind = models.CharField(max_length=16, choices=BudgetAlertKind.choices)
    detail = models.TextField(blank=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["budget", "period_start", "kind"], name="budgetalert_once_per_period"),
            models.CheckConstraint(condition=Q(kind__in=BudgetAlertKind.values), name="budgetalert_kind_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} on budget {self.budget_id}"
