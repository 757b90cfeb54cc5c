"""The guardrails REST API: checking content, an agent's policy, violations, approvals and budgets.

Scopes:
- `POST /guardrails/check` and `POST /guardrails/tool-calls` take a key with the `gateway` scope (what a
  production agent holds, as for the gateway) or `write` (an operator trying a policy). Both record
  violations, so `read` is not enough.
- Reads need `read`; policy, budget and approval changes need `write`.
- Approvals are for people. A key can decide one only with the `write` scope, and the key is recorded as
  the decider in the audit trail; give agents gateway-only keys so no agent approves its own calls.
A key limited to some agents sees and changes only those agents' rows; budgets are workspace-wide, so such
a key may read them but not create or delete them.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
from django.http import HttpRequest
from ninja import Query, Router, Schema, Status
from ninja.security import HttpBearer
from pydantic import ValidationError

from agent_registry import ratelimit
from agent_registry import selectors as registry_selectors
from agent_registry.auth import api_key_authenticate, key_auth, request_agent_ids, request_api_key, request_workspace
from agent_registry.models import Agent, ApiKey, Scope
from agent_registry.schemas import error_responses
from config.errors import PermissionDenied, ValidationFailed
from config.json_body import json_body_loads
from guardrails import boundary, budgets, exceptions, selectors, services
from guardrails.models import ApprovalEvent, ApprovalRequest, Budget, BudgetScope, GuardrailViolation
from guardrails.schemas import (
    ApprovalDetailOut,
    ApprovalOut,
    ApprovalQuery,
    BudgetIn,
    BudgetOut,
    BudgetStatusOut,
    CheckIn,
    CheckOut,
    DecideIn,
    PolicyIn,
    PolicyOut,
    ToolCallIn,
    ToolCallOut,
    ViolationOut,
    ViolationQuery,
)

router = Router(tags=["guardrails"])

# The whole request body of a check, and the content in it (characters of its text).
MAX_BODY_BYTES = 1_048_576
MAX_CONTENT_CHARS = 200_000
# Control characters other than tab, newline and carriage return mark content as binary.
_CONTROL = frozenset(chr(code) for code in range(32) if chr(code) not in "\t\n\r") | {"\x7f"}


class GatewayOrWrite(HttpBearer):
    """A key with the `gateway` or the `write` scope."""

    def authenticate(self, request: HttpRequest, token: str) -> ApiKey | None:
        api_key = api_key_authenticate(request, token)
        if api_key is None:
            return None
        if not {Scope.GATEWAY, Scope.WRITE} & set(api_key.scopes):
            raise PermissionDenied("this API key needs the 'gateway' or 'write' scope", code="insufficient_scope")
        ratelimit.apikey_check(api_key=api_key, scope=Scope.GATEWAY if Scope.GATEWAY in api_key.scopes else Scope.WRITE)
        return api_key


READ = key_auth(Scope.READ)
WRITE = key_auth(Scope.WRITE)
CHECK = [GatewayOrWrite()]
ERRORS = error_responses(409)


def _agent(request: HttpRequest, slug: str) -> Agent:
    return registry_selectors.agent_get(
        workspace=request_workspace(request), slug=slug, agent_ids=request_agent_ids(request)
    )


def _body(request: HttpRequest, schema: type[Schema]) -> Any:
    """Parse a JSON body by hand, so that an oversized body is refused before it is parsed (413) and bytes
    that are not UTF-8 are a 400, not a 500; the JSON itself as every API reads it (config/json_body.py)."""
    if len(request.body) > MAX_BODY_BYTES:
        raise exceptions.ContentTooLarge(f"the request body is over {MAX_BODY_BYTES} bytes")
    try:
        request.body.decode("utf-8")
    except UnicodeDecodeError:
        raise exceptions.ContentNotText("the request body is not UTF-8 text") from None
    data = json_body_loads(request.body)
    try:
        return schema.model_validate(data)
    except ValidationError as error:
        errors = [
            {"field": ".".join(str(part) for part in item["loc"]) or "body", "message": item["msg"]}
            for item in error.errors()
        ]
        summary = "; ".join(f"{item['field']}: {item['message']}" for item in errors[:5])
        raise ValidationFailed(f"invalid request: {summary}", errors=errors) from None


def _content_text(content: Any) -> str:
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    if len(text) > MAX_CONTENT_CHARS:
        raise exceptions.ContentTooLarge(f"content is over {MAX_CONTENT_CHARS} characters")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise exceptions.ContentNotText("content holds characters that are not valid Unicode") from None
    if any(char in _CONTROL for char in text):
        raise exceptions.ContentNotText("content holds control characters: binary data is not checked")
    return text


def _context_check(context: dict[str, Any]) -> None:
    """Refuse a context whose known keys have the wrong shape: ignored, they would silently turn a check
    off (a canary that is not text, say) and the content would pass as allowed."""
    problems = [
        {"field": f"context.{key}", "message": "must be text"}
        for key in ("system_prompt", "canary", "prompt_name")
        if context.get(key) is not None and not isinstance(context[key], str)
    ]
    version = context.get("prompt_version")
    if version is not None and (isinstance(version, bool) or not isinstance(version, int)):
        problems.append({"field": "context.prompt_version", "message": "must be a whole number"})
    topics = context.get("allowed_topics")
    if topics is not None and (not isinstance(topics, list) or not all(isinstance(topic, str) for topic in topics)):
        problems.append({"field": "context.allowed_topics", "message": "must be a list of strings"})
    schema = context.get("json_schema")
    if schema is not None:
        if not isinstance(schema, dict):
            problems.append({"field": "context.json_schema", "message": "must be a JSON Schema object"})
        else:
            try:
                jsonschema.validators.validator_for(schema).check_schema(schema)
            except jsonschema.SchemaError as error:
                problems.append(
                    {"field": "context.json_schema", "message": f"is not a valid JSON Schema: {error.message}"}
                )
    if problems:
        summary = "; ".join(f"{item['field']}: {item['message']}" for item in problems)
        raise ValidationFailed(f"invalid context: {summary}", errors=problems)


def _schema_body(schema: type[Schema]) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema.model_json_schema()}}}}


# --- Checks -----------------------------------------------------------------------------------


@router.post(
    "/guardrails/check",
    auth=CHECK,
    response={200: CheckOut, **ERRORS},
    openapi_extra=_schema_body(CheckIn),
)
def guardrail_check_api(request: HttpRequest) -> Any:
    """Check content against the agent's policy for one layer. An unknown layer is 422, an unknown agent
    404, content over 200,000 characters 413, binary content 400, a context key of the wrong shape (a
    json_schema that is not a valid JSON Schema, say) 422; content that is not valid JSON for a JSON-schema
    check is a violation of `output_handling`, not an error."""
    payload: CheckIn = _body(request, CheckIn)
    _content_text(payload.content)
    _context_check(payload.context)
    agent = _agent(request, payload.agent)
    outcome = services.guardrail_evaluate(
        agent=agent,
        layer=payload.layer,
        content=payload.content,
        context=payload.context,
        source=payload.source,
        trace_id=payload.trace_id,
        api_key=request_api_key(request),
    )
    return {
        "verdict": outcome.verdict.value,
        "content": outcome.content,
        "violations": [
            {"check": item["check"], "score": item["score"], "evidence": item["evidence"]}
            for item in outcome.violations
        ],
        "latency_ms": outcome.latency_ms,
    }


@router.post("/guardrails/tool-calls", auth=CHECK, response={200: ToolCallOut, **ERRORS})
def tool_call_authorize_api(request: HttpRequest, payload: ToolCallIn) -> Any:
    """The action boundary for agents outside the gateway: may this tool call run now? A call that needs
    a person answers `allowed: false` with `pending_approval_id`; ask again with the same conversation and
    arguments once it is approved, and it is allowed once."""
    verdict = boundary.tool_call_authorize_for(
        agent=_agent(request, payload.agent),
        tool=payload.tool,
        arguments=payload.arguments,
        conversation_id=payload.conversation_id,
        trace_id=payload.trace_id,
    )
    return {"allowed": verdict.allowed, "reason": verdict.reason, "pending_approval_id": verdict.pending_approval_id}


# --- Policy -----------------------------------------------------------------------------------


def _policy_out(effective: services.EffectivePolicy) -> dict[str, Any]:
    tools = effective.tools()
    return {
        "agent": effective.agent.slug,
        "saved": effective.saved,
        "updated_at": effective.updated_at,
        "policy": effective.document,
        "mandatory": [
            {"check": item.check, "layer": item.layer.value, "why": item.why} for item in effective.mandatory
        ],
        "tool_boundary": {
            "allow_list": sorted(tools.allow_list),
            "approval_always": sorted(tools.approval_always),
            "constraints": list(tools.constraints),
        },
    }


@router.get("/agents/{slug}/guardrail-policy", auth=READ, response={200: PolicyOut, **ERRORS})
def guardrail_policy_get_api(request: HttpRequest, slug: str) -> Any:
    """The agent's policy: the saved one, or the default its requirements derive (`saved: false`)."""
    return _policy_out(services.guardrail_policy_get(agent=_agent(request, slug)))


@router.put("/agents/{slug}/guardrail-policy", auth=WRITE, response={200: PolicyOut, **ERRORS})
def guardrail_policy_update_api(request: HttpRequest, slug: str, payload: PolicyIn) -> Any:
    """Replace the agent's policy; 422 `guardrail_policy_invalid` when it drops or weakens a mandatory check."""
    effective = services.guardrail_policy_update(
        agent=_agent(request, slug),
        document=payload.model_dump(mode="json", exclude={"rotate_canary"}),
        rotate_canary=payload.rotate_canary,
        api_key=request_api_key(request),
    )
    return _policy_out(effective)


# --- Violations -------------------------------------------------------------------------------


def _violation_out(violation: GuardrailViolation) -> dict[str, Any]:
    return {
        "id": violation.pk,
        "agent": violation.agent.slug,
        "layer": violation.layer,
        "check": violation.check_name,
        "action": violation.action,
        "score": violation.score,
        "evidence": violation.evidence,
        "source": violation.source,
        "failure": violation.failure,
        "trace_id": violation.trace_id,
        "created_at": violation.created_at,
    }


@router.get("/guardrails/violations", auth=READ, response={200: list[ViolationOut], **ERRORS})
def violation_list_api(request: HttpRequest, query: Query[ViolationQuery]) -> Any:
    agent = _agent(request, query.agent) if query.agent else None
    violations = selectors.violation_list(
        workspace=request_workspace(request),
        agent_ids=request_agent_ids(request),
        agent_id=agent.pk if agent else None,
        check=query.check,
        layer=query.layer,
        since=query.since,
        until=query.until,
    )
    return [_violation_out(violation) for violation in violations[: query.limit]]


# --- Approvals --------------------------------------------------------------------------------


def _decider(approval: ApprovalRequest) -> str | None:
    if approval.decided_by is not None:
        return str(approval.decided_by.get_username())
    if approval.decided_by_key is not None:
        return f"API key {approval.decided_by_key.prefix}"
    return None


def _approval_out(approval: ApprovalRequest) -> dict[str, Any]:
    return {
        "id": approval.pk,
        "agent": approval.agent.slug,
        "tool": approval.tool,
        "arguments": approval.arguments,
        "reason": approval.reason,
        "status": approval.status,
        "trace_id": approval.trace_id,
        "conversation_id": approval.conversation_id,
        "decided_by": _decider(approval),
        "decided_at": approval.decided_at,
        "decision_note": approval.decision_note,
        "used_at": approval.used_at,
        "expires_at": approval.expires_at,
        "created_at": approval.created_at,
    }


def _event_out(event: ApprovalEvent) -> dict[str, Any]:
    actor = None
    if event.actor_user is not None:
        actor = str(event.actor_user.get_username())
    elif event.actor_key is not None:
        actor = f"API key {event.actor_key.prefix}"
    return {
        "kind": event.kind,
        "actor": actor,
        "note": event.note,
        "trace_id": event.trace_id,
        "created_at": event.created_at,
    }


def _approval_detail(approval: ApprovalRequest) -> dict[str, Any]:
    events = approval.events.select_related("actor_user", "actor_key").order_by("created_at", "pk")
    return {**_approval_out(approval), "events": [_event_out(event) for event in events]}


@router.get("/approvals", auth=READ, response={200: list[ApprovalOut], **ERRORS})
def approval_list_api(request: HttpRequest, query: Query[ApprovalQuery]) -> Any:
    agent = _agent(request, query.agent) if query.agent else None
    approvals = selectors.approval_list(
        workspace=request_workspace(request),
        agent_ids=request_agent_ids(request),
        status=query.status,
        agent_id=agent.pk if agent else None,
    )
    return [_approval_out(approval) for approval in approvals[: query.limit]]


@router.get("/approvals/{int:approval_id}", auth=READ, response={200: ApprovalDetailOut, **ERRORS})
def approval_get_api(request: HttpRequest, approval_id: int) -> Any:
    approval = selectors.approval_get(
        workspace=request_workspace(request), approval_id=approval_id, agent_ids=request_agent_ids(request)
    )
    return _approval_detail(approval)


@router.post("/approvals/{int:approval_id}/decide", auth=WRITE, response={200: ApprovalDetailOut, **ERRORS})
def approval_decide_api(request: HttpRequest, approval_id: int, payload: DecideIn) -> Any:
    """Approve or reject a pending request; the key is recorded as the decider. 409 if it is not pending."""
    approval = selectors.approval_get(
        workspace=request_workspace(request), approval_id=approval_id, agent_ids=request_agent_ids(request)
    )
    decided = services.approval_decide(
        approval=approval, approved=payload.approved, note=payload.note, api_key=request_api_key(request)
    )
    return _approval_detail(decided)


# --- Budgets ----------------------------------------------------------------------------------


def _budget_out(budget: Budget, agents: dict[str, str]) -> dict[str, Any]:
    return {
        "id": budget.pk,
        "scope": budget.scope,
        "agent": agents.get(budget.scope_value) if budget.scope == BudgetScope.AGENT else None,
        "api_key_id": int(budget.scope_value) if budget.scope == BudgetScope.API_KEY else None,
        "end_user": budget.scope_value if budget.scope == BudgetScope.END_USER else None,
        "period": budget.period,
        "limit_usd": budget.limit_usd,
        "limit_tokens": budget.limit_tokens,
        "soft_limit_share": budget.soft_limit_share,
        "created_at": budget.created_at,
    }


def _agent_slugs(request: HttpRequest) -> dict[str, str]:
    return {str(agent.pk): agent.slug for agent in registry_selectors.agent_list(workspace=request_workspace(request))}


def _workspace_wide(request: HttpRequest) -> None:
    if request_agent_ids(request) is not None:
        raise PermissionDenied("a key limited to some agents cannot manage the workspace's budgets")


@router.get("/budgets", auth=READ, response={200: list[BudgetOut], **ERRORS})
def budget_list_api(request: HttpRequest) -> Any:
    agents = _agent_slugs(request)
    return [_budget_out(budget, agents) for budget in selectors.budget_list(workspace=request_workspace(request))]


@router.post("/budgets", auth=WRITE, response={201: BudgetOut, **ERRORS})
def budget_create_api(request: HttpRequest, payload: BudgetIn) -> Any:
    _workspace_wide(request)
    workspace = request_workspace(request)
    api_key = (
        registry_selectors.apikey_get(workspace=workspace, key_id=payload.api_key_id)
        if payload.api_key_id is not None
        else None
    )
    budget = budgets.budget_create(
        workspace=workspace,
        scope=payload.scope,
        period=payload.period,
        agent=_agent(request, payload.agent) if payload.agent else None,
        api_key=api_key,
        end_user=payload.end_user or "",
        limit_usd=payload.limit_usd,
        limit_tokens=payload.limit_tokens,
        soft_limit_share=payload.soft_limit_share,
        created_via_key=request_api_key(request),
    )
    return Status(201, _budget_out(budget, _agent_slugs(request)))


@router.delete("/budgets/{int:budget_id}", auth=WRITE, response={204: None, **ERRORS})
def budget_delete_api(request: HttpRequest, budget_id: int) -> Any:
    _workspace_wide(request)
    budget = selectors.budget_get(workspace=request_workspace(request), budget_id=budget_id)
    budgets.budget_delete(budget=budget, deleted_via_key=request_api_key(request))
    return Status(204, None)


@router.get("/budgets/status", auth=READ, response={200: list[BudgetStatusOut], **ERRORS})
def budget_status_api(request: HttpRequest) -> Any:
    """Each budget in its current period: spent, reserved by requests in flight, what is left."""
    agents = _agent_slugs(request)
    statuses = []
    for status in selectors.budget_status_list(workspace=request_workspace(request)):
        budget = status.budget
        used_usd = status.spent_usd + status.reserved_usd
        used_tokens = status.spent_tokens + status.reserved_tokens
        statuses.append(
            {
                "budget": _budget_out(budget, agents),
                "period_start": status.period_start,
                "spent_usd": status.spent_usd,
                "reserved_usd": status.reserved_usd,
                "spent_tokens": status.spent_tokens,
                "reserved_tokens": status.reserved_tokens,
                "remaining_usd": None if budget.limit_usd is None else max(budget.limit_usd - used_usd, 0),
                "remaining_tokens": None if budget.limit_tokens is None else max(budget.limit_tokens - used_tokens, 0),
                "soft_limit_reached": status.soft_limit_reached,
                "exhausted": status.exhausted,
            }
        )
    return statuses
