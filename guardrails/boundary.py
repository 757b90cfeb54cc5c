"""The action boundary: `tool_call_authorize` is the checker the guardrails app installs into
`routing.hooks`, so every tool call the gateway would run or hand back passes it; agents that do not use
the gateway call it through `POST /api/v1/guardrails/tool-calls`.

A call is, in order: refused when its tool is not on the agent's allow-list or breaks a blocking argument
constraint; gated when it needs a person (an `always` rule, an approval tool, or a broken autonomy limit
such as `issue_refund.amount <= 20`); then counted against its rate limits. A gated call creates one
`ApprovalRequest` and is refused with `pending_approval_id`; once a person approves, the same call (same
conversation, tool and canonical arguments) is let through exactly once: the approval is claimed with a
conditional UPDATE, so two concurrent attempts cannot both use it. A rejected call stays refused in that
conversation. Every refusal is a `GuardrailViolation` (layer `tool`, check `action_boundary`), every step
of an approval an `ApprovalEvent`.

This module writes (approval requests, their use, counters) like a service module: the boundary's
decision and its records belong together in one transaction.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from agent_registry.models import Agent
from guardrails import policy, services
from guardrails.models import (
    EVIDENCE_MAX_CHARS,
    ApprovalEvent,
    ApprovalEventKind,
    ApprovalRequest,
    ApprovalStatus,
    CounterWindow,
    FailureMode,
    GuardrailViolation,
    ToolCallCounter,
)
from routing.hooks import ToolCall, ToolCallVerdict

logger = logging.getLogger("guardrails.boundary")

CHECK_NAME = "action_boundary"
ALLOW = ToolCallVerdict(allowed=True)


class _RateLimitReached(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def conversation_key(call: ToolCall) -> str:
    """What an approval and a per-conversation limit are keyed on: the conversation, or else the trace
    (a call outside any conversation can only be resumed within its own trace)."""
    return call.conversation_id or f"trace:{call.trace_id}"


def _violation(agent: Agent, call: ToolCall, action: str, reason: str, failure: FailureMode = FailureMode.NONE) -> None:
    GuardrailViolation.objects.create(
        workspace_id=agent.workspace_id,
        agent=agent,
        layer="tool",
        check_name=CHECK_NAME,
        action=action,
        score=1.0,
        evidence=f"{call.name}: {reason}"[:EVIDENCE_MAX_CHARS],
        source="tool_call",
        failure=failure,
        trace_id=call.trace_id[:64],
    )


def _refuse(agent: Agent, call: ToolCall, reason: str, failure: FailureMode = FailureMode.NONE) -> ToolCallVerdict:
    _violation(agent, call, "block", reason, failure)
    logger.info("guardrails.tool_call_refused", extra={"agent_id": agent.pk, "tool": call.name, "reason": reason})
    return ToolCallVerdict(allowed=False, reason=reason)


def _count(agent: Agent, call: ToolCall, tools: policy.ToolPolicy) -> None:
    """Take one from each rate limit of the tool; raises _RateLimitReached (the caller's transaction rolls
    back what was taken) when one is spent."""
    today = timezone.now().date().isoformat()
    for limit in tools.limits_for(call.name):
        for window, key, maximum in (
            (CounterWindow.CONVERSATION, conversation_key(call), limit.per_conversation),
            (CounterWindow.DAY, today, limit.per_day),
        ):
            if maximum is None:
                continue
            counter, _ = ToolCallCounter.objects.get_or_create(
                agent=agent,
                tool=limit.tool,
                window=window,
                window_key=key[:200],
                defaults={"workspace_id": agent.workspace_id},
            )
            # Conditional UPDATE: concurrent calls serialise on the row, and only those under the limit pass.
            taken = ToolCallCounter.objects.filter(pk=counter.pk, count__lt=maximum).update(count=F("count") + 1)
            if not taken:
                scope = "conversation" if window == CounterWindow.CONVERSATION else "day"
                what = "tool calls" if limit.tool == "*" else f"{call.name} calls"
                raise _RateLimitReached(f"rate limit reached: at most {maximum} {what} per {scope}")


def _allow_counted(agent: Agent, call: ToolCall, tools: policy.ToolPolicy) -> ToolCallVerdict:
    try:
        with transaction.atomic():
            _count(agent, call, tools)
    except _RateLimitReached as limit:
        return _refuse(agent, call, limit.reason)
    return ALLOW


def _use_approval(agent: Agent, call: ToolCall, tools: policy.ToolPolicy, approval_id: int) -> bool:
    """Claim an approved request for this call and count it; False when another attempt claimed it first."""
    now = timezone.now()
    with transaction.atomic():
        used = ApprovalRequest.objects.filter(
            pk=approval_id, status=ApprovalStatus.APPROVED, expires_at__gt=now
        ).update(status=ApprovalStatus.USED, used_at=now, used_trace_id=call.trace_id[:64])
        if not used:
            return False
        _count(agent, call, tools)
        ApprovalEvent.objects.create(
            approval_id=approval_id, kind=ApprovalEventKind.USED, note="the approved call ran", trace_id=call.trace_id
        )
    logger.info("guardrails.approval_used", extra={"approval_id": approval_id, "tool": call.name})
    return True


def _pending(approval: ApprovalRequest) -> ToolCallVerdict:
    return ToolCallVerdict(
        allowed=False,
        reason=f"waiting for a person's approval (request {approval.pk}): {approval.reason}",
        pending_approval_id=approval.pk,
    )


def _request_approval(
    agent: Agent, call: ToolCall, tools: policy.ToolPolicy, reason: str, failure: FailureMode = FailureMode.NONE
) -> ToolCallVerdict:
    if call.rehearsal:  # an eval run asks nobody: the call is held, as it would be while a person decides
        return ToolCallVerdict(allowed=False, reason=f"{reason} (held: an eval run asks no one for approval)")
    key = conversation_key(call)[:200]
    digest = policy.arguments_hash(call.arguments)
    same_call = ApprovalRequest.objects.filter(agent=agent, conversation_id=key, tool=call.name, arguments_hash=digest)
    now = timezone.now()
    # Requests past their time make way for a new one (the open-request constraint counts them until then).
    for stale in same_call.filter(
        status__in=[ApprovalStatus.PENDING, ApprovalStatus.APPROVED], expires_at__lte=now
    ).only("pk"):
        services.approval_expire(approval=stale)

    approved = same_call.filter(status=ApprovalStatus.APPROVED).order_by("created_at").first()
    if approved is not None:
        try:
            if _use_approval(agent, call, tools, approved.pk):
                return ALLOW
        except _RateLimitReached as limit:
            return _refuse(agent, call, limit.reason)
    rejected = same_call.filter(status=ApprovalStatus.REJECTED).order_by("-decided_at").first()
    if rejected is not None:
        note = f": {rejected.decision_note}" if rejected.decision_note else ""
        ApprovalEvent.objects.create(
            approval=rejected, kind=ApprovalEventKind.REFUSED, note="attempted again", trace_id=call.trace_id
        )
        return _refuse(agent, call, f"a person rejected this call (request {rejected.pk}){note}")
    pending = same_call.filter(status=ApprovalStatus.PENDING).first()
    if pending is not None:
        return _pending(pending)
    try:
        with transaction.atomic():
            approval = ApprovalRequest.objects.create(
                workspace_id=agent.workspace_id,
                agent=agent,
                trace_id=call.trace_id[:64],
                conversation_id=key,
                tool=call.name,
                arguments=call.arguments,
                arguments_hash=digest,
                reason=reason,
                expires_at=now + timedelta(hours=tools.approval_ttl_hours),
            )
            ApprovalEvent.objects.create(
                approval=approval, kind=ApprovalEventKind.REQUESTED, note=reason, trace_id=call.trace_id
            )
            _violation(agent, call, "require_approval", reason, failure)
    except IntegrityError:
        # A concurrent attempt of the same call opened the request first: wait on that one.
        existing = same_call.filter(status__in=[ApprovalStatus.PENDING, ApprovalStatus.APPROVED]).first()
        if existing is None:
            raise
        return _pending(existing)
    logger.info("guardrails.approval_requested", extra={"approval_id": approval.pk, "tool": call.name})
    return _pending(approval)


def tool_call_authorize(call: ToolCall) -> ToolCallVerdict:
    """The action-boundary checker (routing.hooks.Checker). Fails closed: an agent it cannot find calls nothing."""
    agent = Agent.objects.filter(pk=call.agent_id, workspace_id=call.workspace_id).first()
    if agent is None:
        return ToolCallVerdict(allowed=False, reason="unknown agent: no tool may be called")
    tools = services.guardrail_policy_get(agent=agent).tools()
    assessment = tools.assess(call.name, call.arguments)
    failure = FailureMode.FAILED_CLOSED if assessment.failed_closed else FailureMode.NONE
    if assessment.failed_closed:
        logger.warning("guardrails.constraint_unchecked", extra={"agent_id": agent.pk, "tool": call.name})
    if assessment.decision == "block":
        return _refuse(agent, call, assessment.reason, failure)
    if assessment.decision == "require_approval":
        return _request_approval(agent, call, tools, assessment.reason, failure)
    return _allow_counted(agent, call, tools)


def tool_call_authorize_for(
    *, agent: Agent, tool: str, arguments: Any, conversation_id: str = "", trace_id: str = ""
) -> ToolCallVerdict:
    """The same decision for an agent that calls the API instead of the gateway."""
    return tool_call_authorize(
        ToolCall(
            agent_id=agent.pk,
            workspace_id=agent.workspace_id,
            name=tool,
            arguments=arguments,
            conversation_id=conversation_id,
            trace_id=trace_id,
            runs_on="client",
        )
    )
