"""Request and response shapes of the guardrails API."""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal
from typing import Any, Literal

from ninja import Field, Schema

from guardrails.policy import ArgumentConstraint, PolicyDocument


class CheckIn(Schema):
    agent: str = Field(min_length=1, max_length=64, description="the agent's slug")
    layer: str = Field(description="input | system | output | tool")
    content: str | dict[str, Any] | list[Any] = Field(description="text, or JSON (checked as its text)")
    context: dict[str, Any] = Field(
        default_factory=dict,
        description="optional: system_prompt, canary (or prompt_name and prompt_version), json_schema, allowed_topics",
    )
    source: str = Field("user", max_length=32, description="user | document | tool_result | agent | model")
    trace_id: str = Field("", max_length=64, description="the trajectory this content belongs to, if any")


class ViolationBriefOut(Schema):
    check: str
    score: float
    evidence: str


class CheckOut(Schema):
    verdict: Literal["allow", "flag", "redact", "block", "require_approval"]
    content: str | dict[str, Any] | list[Any]
    violations: list[ViolationBriefOut]
    latency_ms: float


class ToolCallIn(Schema):
    agent: str = Field(min_length=1, max_length=64)
    tool: str = Field(min_length=1, max_length=200)
    arguments: dict[str, Any] = Field(default_factory=dict)
    conversation_id: str = Field("", max_length=200, description="approvals and rate limits are per conversation")
    trace_id: str = Field("", max_length=64)


class ToolCallOut(Schema):
    allowed: bool
    reason: str
    pending_approval_id: int | None


class PolicyIn(PolicyDocument):
    rotate_canary: bool = False


class MandatoryOut(Schema):
    check: str
    layer: str
    why: str


class ToolBoundaryOut(Schema):
    allow_list: list[str]
    approval_always: list[str]
    constraints: list[ArgumentConstraint]


class PolicyOut(Schema):
    agent: str
    saved: bool = Field(description="false: the default the requirements derive, until a policy is saved")
    updated_at: datetime | None
    policy: PolicyDocument
    mandatory: list[MandatoryOut]
    tool_boundary: ToolBoundaryOut


class ViolationOut(Schema):
    id: int
    agent: str
    layer: str
    check: str
    action: str
    score: float
    evidence: str
    source: str
    failure: str
    trace_id: str
    created_at: datetime


class ViolationQuery(Schema):
    agent: str | None = None
    check: str | None = None
    layer: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    limit: int = Field(100, ge=1, le=1000)


class ApprovalEventOut(Schema):
    kind: str
    actor: str | None
    note: str
    trace_id: str
    created_at: datetime


class ApprovalOut(Schema):
    id: int
    agent: str
    tool: str
    arguments: Any
    reason: str
    status: str
    trace_id: str
    conversation_id: str
    decided_by: str | None
    decided_at: datetime | None
    decision_note: str
    used_at: datetime | None
    expires_at: datetime
    created_at: datetime


class ApprovalDetailOut(ApprovalOut):
    events: list[ApprovalEventOut]


class ApprovalQuery(Schema):
    status: Literal["pending", "approved", "rejected", "expired", "used"] | None = None
    agent: str | None = None
    limit: int = Field(100, ge=1, le=1000)


class DecideIn(Schema):
    approved: bool
    note: str = Field("", max_length=2000, description="why; kept in the audit trail")


class BudgetIn(Schema):
    scope: Literal["workspace", "agent", "api_key", "end_user"]
    period: Literal["day", "month"]
    agent: str | None = Field(None, description="the agent's slug, for scope agent")
    api_key_id: int | None = Field(None, description="the key's id, for scope api_key")
    end_user: str | None = Field(None, max_length=200, description="the request's `user`, for scope end_user")
    limit_usd: Decimal | None = Field(None, ge=0, max_digits=14, decimal_places=6)
    limit_tokens: int | None = Field(None, ge=0)
    soft_limit_share: float | None = Field(None, gt=0, le=1, description="alert once this share is spent")


class BudgetOut(Schema):
    id: int
    scope: str
    agent: str | None
    api_key_id: int | None
    end_user: str | None
    period: str
    limit_usd: Decimal | None
    limit_tokens: int | None
    soft_limit_share: float | None
    created_at: datetime


class BudgetStatusOut(Schema):
    budget: BudgetOut
    period_start: date
    spent_usd: Decimal
    reserved_usd: Decimal
    spent_tokens: int
    reserved_tokens: int
    remaining_usd: Decimal | None
    remaining_tokens: int | None
    soft_limit_reached: bool
    exhausted: bool
