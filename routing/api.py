"""Routing's management API: model targets, an agent's router configuration, chain and tools, routing
decisions, the router report and the hand-off queue. (The gateway itself is routing/gateway_api.py.)

Reads need the `read` scope, writes `write`. A key limited to some agents sees only those agents'
decisions, hand-offs and configuration, and cannot change the workspace's model targets. Secrets go
in and never come out.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.http import HttpRequest
from django.utils import timezone
from ninja import Query, Router, Status

from agent_registry import exceptions as registry_exceptions
from agent_registry import selectors as registry_selectors
from agent_registry.auth import key_auth, request_agent_ids, request_api_key, request_workspace
from agent_registry.models import Agent, Scope
from agent_registry.schemas import error_responses
from config.errors import PermissionDenied, ValidationFailed
from routing import reports, services
from routing.models import AgentTool, ChainStep, Handoff, ModelTarget, RouterConfig, RoutingDecision, ShadowRun
from routing.schemas import (
    AgentToolIn,
    AgentToolOut,
    AgentToolPatch,
    ChainIn,
    ChainOut,
    ChainStepIn,
    HandoffListQuery,
    HandoffOut,
    HandoffResolveIn,
    ModelTargetIn,
    ModelTargetOut,
    ModelTargetPatch,
    RouterConfigIn,
    RouterConfigOut,
    RouterReportQuery,
    RoutingDecisionDetailOut,
    RoutingDecisionListQuery,
    RoutingDecisionPageOut,
)

router = Router(tags=["routing"])

READ = key_auth(Scope.READ)
WRITE = key_auth(Scope.WRITE)
ERRORS = error_responses(409)


# --- Shaping ----------------------------------------------------------------------------------------


def _target_out(target: ModelTarget) -> dict[str, Any]:
    health = reports.model_target_health(target)
    return {
        "alias": target.alias,
        "model": target.model,
        "api_base": target.api_base,
        "has_api_key": bool(target.api_key_encrypted),
        "tier": target.tier,
        "timeout_seconds": target.timeout_seconds,
        "max_retries": target.max_retries,
        "fallbacks": target.fallbacks,
        "failure_threshold": target.failure_threshold,
        "cooldown_seconds": target.cooldown_seconds,
        "enabled": target.enabled,
        "source": target.source,
        "health": {
            "state": health.state,
            "consecutive_failures": health.consecutive_failures,
            "cooldown_until": health.cooldown_until,
            "last_error": health.last_error,
        },
        "created_at": target.created_at,
        "updated_at": target.updated_at,
    }


def _alias(target: ModelTarget | None) -> str | None:
    return target.alias if target is not None else None


def _config_out(config: RouterConfig, agent: Agent) -> dict[str, Any]:
    return {
        "agent": agent.slug,
        "single_call_target": _alias(config.single_call_target),
        "agentic_target": _alias(config.agentic_target),
        "judge_target": _alias(config.judge_target),
        "embedding_target": _alias(config.embedding_target),
        "rules": config.rules,
        "intents": config.intents,
        "neighbours": config.neighbours,
        "min_neighbours": config.min_neighbours,
        "cost_weight": config.cost_weight,
        "latency_weight": config.latency_weight,
        "risk_weight": config.risk_weight,
        "shadow_rate": config.shadow_rate,
        "speculative_single_call": config.speculative_single_call,
        "cache_enabled": config.cache_enabled,
        "cache_threshold": config.cache_threshold,
        "cache_ttl_seconds": config.cache_ttl_seconds,
        "cache_end_user_requests": config.cache_end_user_requests,
        "human_message": config.human_message,
        "updated_at": config.updated_at if config.pk else None,
    }


def _step_out(step: ChainStep) -> dict[str, Any]:
    version = step.prompt_version
    return {
        "position": step.position,
        "name": step.name,
        "prompt_version": version.pk if version is not None else None,
        "prompt": f"{version.prompt.name}:{version.version}" if version is not None else None,
        "instructions": step.instructions,
        "model_target": _alias(step.model_target),
        "output_schema": step.output_schema,
    }


def _step_in(agent: Agent, index: int, step: ChainStepIn) -> dict[str, Any]:
    """A step as the service takes it: a `prompt` given as "<name>:<version>" becomes its version's id."""
    data = step.dict()
    reference = data.pop("prompt")
    if reference is None:
        return data
    field = f"steps[{index}].prompt"
    if data["prompt_version"] is not None:
        raise ValidationFailed(
            "give prompt or prompt_version, not both", errors=[{"field": field, "message": "both given"}]
        )
    name, _, number = reference.rpartition(":")
    try:
        found = registry_selectors.prompt_get(workspace=agent.workspace, name=name, agent_ids=[agent.pk])
        data["prompt_version"] = registry_selectors.prompt_version_get(
            prompt=found, version=int(number) if number.isascii() and number.isdigit() else 0
        ).pk
    except (registry_exceptions.PromptNotFound, registry_exceptions.PromptVersionNotFound):
        raise ValidationFailed(
            f'{field}: no version {reference!r} of this agent\'s prompts (give "<name>:<version>")',
            errors=[{"field": field, "message": "no such version of this agent's prompts"}],
        ) from None
    return data


def _tool_out(tool: AgentTool) -> dict[str, Any]:
    return {
        "name": tool.name,
        "description": tool.description,
        "parameters": tool.parameters,
        "endpoint_url": tool.endpoint_url,
        "has_endpoint_secret": bool(tool.endpoint_secret_encrypted),
        "timeout_seconds": tool.timeout_seconds,
    }


def _money(value: Any) -> float | None:
    return float(value) if value is not None else None


def _decision_out(decision: RoutingDecision, request: HttpRequest) -> dict[str, Any]:
    workspace = request_workspace(request)
    return {
        "id": decision.pk,
        "agent": decision.agent.slug,
        "trace_id": decision.trace_id,
        "conversation_id": decision.conversation_id,
        "request_text": decision.request_text,
        "tier": decision.tier,
        "method": decision.method,
        "rule": decision.rule,
        "reason": decision.reason,
        "decision_us": decision.decision_us,
        "cache_hit": decision.cache_hit,
        "status": decision.status,
        "latency_ms": decision.latency_ms,
        "cost_usd": _money(decision.cost_usd),
        "quality": decision.quality,
        "quality_source": decision.quality_source,
        "created_at": decision.created_at,
        "trajectory_url": reports.trajectory_path(workspace=workspace, trace_id=decision.trace_id),
    }


def _shadow_out(shadow: ShadowRun, request: HttpRequest) -> dict[str, Any]:
    workspace = request_workspace(request)
    return {
        "tier": shadow.tier,
        "trace_id": shadow.trace_id,
        "status": shadow.status,
        "latency_ms": shadow.latency_ms,
        "cost_usd": _money(shadow.cost_usd),
        "quality": shadow.quality,
        "primary_quality": shadow.primary_quality,
        "judge_reason": shadow.judge_reason,
        "error": shadow.error,
        "created_at": shadow.created_at,
        "finished_at": shadow.finished_at,
        "trajectory_url": (
            reports.trajectory_path(workspace=workspace, trace_id=shadow.trace_id) if shadow.trace_id else None
        ),
    }


def _handoff_out(handoff: Handoff, request: HttpRequest) -> dict[str, Any]:
    return {
        "id": handoff.pk,
        "agent": handoff.agent.slug,
        "trace_id": handoff.trace_id,
        "conversation_id": handoff.conversation_id,
        "end_user": handoff.end_user,
        "reason": handoff.reason,
        "messages": handoff.messages,
        "status": handoff.status,
        "assigned_to": handoff.assigned_to.get_username() if handoff.assigned_to is not None else None,
        "resolution": handoff.resolution,
        "created_at": handoff.created_at,
        "resolved_at": handoff.resolved_at,
        "decision_id": handoff.decision_id,
        "trajectory_url": reports.trajectory_path(workspace=request_workspace(request), trace_id=handoff.trace_id),
    }


def _agent(request: HttpRequest, slug: str) -> Agent:
    return registry_selectors.agent_get(
        workspace=request_workspace(request), slug=slug, agent_ids=request_agent_ids(request)
    )


def _target(request: HttpRequest, alias: str) -> ModelTarget:
    return reports.model_target_get(workspace=request_workspace(request), alias=alias)


def _whole_workspace(request: HttpRequest) -> None:
    # Targets serve every agent of the workspace: a key confined to some agents may not change them.
    if request_agent_ids(request) is not None:
        raise PermissionDenied("a key limited to some agents cannot change the workspace's model targets")


# --- Model targets ----------------------------------------------------------------------------------


@router.get("/model-targets", auth=READ, response={200: list[ModelTargetOut], **ERRORS})
def model_target_list_api(request: HttpRequest) -> Any:
    return [_target_out(target) for target in reports.model_target_list(workspace=request_workspace(request))]


@router.post("/model-targets", auth=WRITE, response={201: ModelTargetOut, **ERRORS})
def model_target_create_api(request: HttpRequest, payload: ModelTargetIn) -> Any:
    _whole_workspace(request)
    target = services.model_target_create(
        workspace=request_workspace(request), created_via_key=request_api_key(request), **payload.dict()
    )
    return Status(201, _target_out(target))


@router.get("/model-targets/{alias}", auth=READ, response={200: ModelTargetOut, **ERRORS})
def model_target_get_api(request: HttpRequest, alias: str) -> Any:
    return _target_out(_target(request, alias))


@router.patch("/model-targets/{alias}", auth=WRITE, response={200: ModelTargetOut, **ERRORS})
def model_target_update_api(request: HttpRequest, alias: str, payload: ModelTargetPatch) -> Any:
    _whole_workspace(request)
    target = services.model_target_update(
        target=_target(request, alias), updated_via_key=request_api_key(request), **payload.dict(exclude_unset=True)
    )
    return _target_out(target)


@router.delete("/model-targets/{alias}", auth=WRITE, response={204: None, **ERRORS})
def model_target_delete_api(request: HttpRequest, alias: str) -> Any:
    _whole_workspace(request)
    services.model_target_delete(target=_target(request, alias), deleted_via_key=request_api_key(request))
    return Status(204, None)


# --- An agent's router, chain and tools -------------------------------------------------------------


@router.get("/agents/{slug}/router", auth=READ, response={200: RouterConfigOut, **ERRORS})
def router_config_get_api(request: HttpRequest, slug: str) -> Any:
    agent = _agent(request, slug)
    return _config_out(reports.router_config_get(agent=agent), agent)


@router.put("/agents/{slug}/router", auth=WRITE, response={200: RouterConfigOut, **ERRORS})
def router_config_update_api(request: HttpRequest, slug: str, payload: RouterConfigIn) -> Any:
    agent = _agent(request, slug)
    fields = payload.dict(exclude_unset=True)
    services.router_config_update(agent=agent, updated_via_key=request_api_key(request), **fields)
    return _config_out(reports.router_config_get(agent=agent), agent)


@router.get("/agents/{slug}/chain", auth=READ, response={200: ChainOut, **ERRORS})
def chain_get_api(request: HttpRequest, slug: str) -> Any:
    agent = _agent(request, slug)
    return {"agent": agent.slug, "steps": [_step_out(step) for step in reports.chain_step_list(agent=agent)]}


@router.put("/agents/{slug}/chain", auth=WRITE, response={200: ChainOut, **ERRORS})
def chain_set_api(request: HttpRequest, slug: str, payload: ChainIn) -> Any:
    agent = _agent(request, slug)
    steps = [_step_in(agent, index, step) for index, step in enumerate(payload.steps)]
    services.chain_steps_set(agent=agent, steps=steps, updated_via_key=request_api_key(request))
    return {"agent": agent.slug, "steps": [_step_out(step) for step in reports.chain_step_list(agent=agent)]}


@router.get("/agents/{slug}/tools", auth=READ, response={200: list[AgentToolOut], **ERRORS})
def agent_tool_list_api(request: HttpRequest, slug: str) -> Any:
    return [_tool_out(tool) for tool in reports.agent_tool_list(agent=_agent(request, slug))]


@router.post("/agents/{slug}/tools", auth=WRITE, response={201: AgentToolOut, **ERRORS})
def agent_tool_create_api(request: HttpRequest, slug: str, payload: AgentToolIn) -> Any:
    tool = services.agent_tool_create(
        agent=_agent(request, slug), created_via_key=request_api_key(request), **payload.dict()
    )
    return Status(201, _tool_out(tool))


@router.patch("/agents/{slug}/tools/{name}", auth=WRITE, response={200: AgentToolOut, **ERRORS})
def agent_tool_update_api(request: HttpRequest, slug: str, name: str, payload: AgentToolPatch) -> Any:
    tool = reports.agent_tool_get(agent=_agent(request, slug), name=name)
    return _tool_out(
        services.agent_tool_update(
            tool=tool, updated_via_key=request_api_key(request), **payload.dict(exclude_unset=True)
        )
    )


@router.delete("/agents/{slug}/tools/{name}", auth=WRITE, response={204: None, **ERRORS})
def agent_tool_delete_api(request: HttpRequest, slug: str, name: str) -> Any:
    services.agent_tool_delete(
        tool=reports.agent_tool_get(agent=_agent(request, slug), name=name), deleted_via_key=request_api_key(request)
    )
    return Status(204, None)


# --- Decisions and the report -------------------------------------------------------------------------


@router.get("/routing-decisions", auth=READ, response={200: RoutingDecisionPageOut, **ERRORS})
def routing_decision_list_api(request: HttpRequest, query: Query[RoutingDecisionListQuery]) -> Any:
    agent = _agent(request, query.agent) if query.agent else None
    page = reports.routing_decision_list(
        workspace=request_workspace(request),
        agent_ids=request_agent_ids(request),
        agent=agent,
        tier=query.tier,
        method=query.method,
        since=query.since,
        until=query.until,
        cursor=query.cursor,
        limit=query.limit,
    )
    return {"items": [_decision_out(decision, request) for decision in page.decisions], "next_cursor": page.next_cursor}


@router.get("/routing-decisions/{int:decision_id}", auth=READ, response={200: RoutingDecisionDetailOut, **ERRORS})
def routing_decision_get_api(request: HttpRequest, decision_id: int) -> Any:
    decision = reports.routing_decision_get(
        workspace=request_workspace(request), decision_id=decision_id, agent_ids=request_agent_ids(request)
    )
    return {
        **_decision_out(decision, request),
        "features": decision.features,
        "estimates": decision.estimates,
        "shadows": [_shadow_out(shadow, request) for shadow in decision.shadows.all()],
    }


@router.get("/agents/{slug}/router-report", auth=READ, response={200: dict[str, Any], **ERRORS})
def router_report_api(request: HttpRequest, slug: str, query: Query[RouterReportQuery]) -> Any:
    """The router measured over the last `days`: tier mix, cost, latency and quality per tier, and, from
    shadow runs, how often it picked the best tier and how much of the quality gap it recovered per cost."""
    agent = _agent(request, slug)
    until = timezone.now()
    view = reports.router_report(agent=agent, since=until - timedelta(days=query.days), until=until)
    return {
        "agent": agent.slug,
        "since": view.since,
        "until": view.until,
        "tiers": list(view.tiers),
        "report": view.report.as_json(),
        "daily": [bucket.as_json() for bucket in view.daily],
        "speculation": view.speculation.as_json(),
    }


# --- Hand-offs ------------------------------------------------------------------------------------------


@router.get("/handoffs", auth=READ, response={200: list[HandoffOut], **ERRORS})
def handoff_list_api(request: HttpRequest, query: Query[HandoffListQuery]) -> Any:
    handoffs = reports.handoff_list(
        workspace=request_workspace(request),
        agent_ids=request_agent_ids(request),
        status=query.status,
        limit=query.limit,
    )
    return [_handoff_out(handoff, request) for handoff in handoffs]


@router.post("/handoffs/{int:handoff_id}/resolve", auth=WRITE, response={200: HandoffOut, **ERRORS})
def handoff_resolve_api(request: HttpRequest, handoff_id: int, payload: HandoffResolveIn) -> Any:
    handoff = reports.handoff_get(
        workspace=request_workspace(request), handoff_id=handoff_id, agent_ids=request_agent_ids(request)
    )
    resolved = services.handoff_resolve(handoff=handoff, user=None, resolution=payload.resolution)
    return _handoff_out(reports.handoff_get(workspace=request_workspace(request), handoff_id=resolved.pk), request)
