"""The registry's REST API: agents, requirements versions, prompts, labels, keys; and Langfuse's prompt
endpoint, so `Langfuse().get_prompt(name, label=...)` works against Keel.

Each function parses, calls one service or selector, and shapes the answer. Reads need the `read`
scope, writes `write`; a key limited to some agents sees only those agents and their prompts.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.http import HttpRequest
from django.utils import timezone
from ninja import Query, Router, Schema, Status

from agent_registry import exceptions, requirements, selectors, services
from agent_registry.auth import key_auth, langfuse_auth, request_agent_ids, request_api_key, request_workspace
from agent_registry.models import Agent, ApiKey, AuditEvent, Prompt, PromptVersion, RequirementsVersion, Scope
from agent_registry.prompts import prompt_diff, template_variables
from agent_registry.schemas import (
    AgentDetailOut,
    AgentIn,
    AgentOut,
    AgentPatch,
    ApiKeyCreatedOut,
    ApiKeyIn,
    ApiKeyOut,
    AuditEventPageOut,
    AuditEventQuery,
    ConfigurationOut,
    ErrorOut,
    FindingOut,
    LabelMoveIn,
    LabelMoveOut,
    LabelOut,
    LangfusePromptIn,
    LangfusePromptOut,
    PromptDiffOut,
    PromptIn,
    PromptOut,
    PromptPatch,
    PromptVersionIn,
    PromptVersionOut,
    RenderIn,
    RenderOut,
    RequirementsCheckIn,
    RequirementsCheckOut,
    RequirementsDiffOut,
    RequirementsIn,
    RequirementsVersionOut,
    RequirementsVersionSummaryOut,
    WorkspaceOut,
    error_responses,
)
from config.errors import KeelError, PermissionDenied

router = Router(tags=["registry"])
langfuse_router = Router(tags=["langfuse"])

READ = key_auth(Scope.READ)
WRITE = key_auth(Scope.WRITE)
ERRORS = error_responses(409)


# --- Shaping ----------------------------------------------------------------------------------


def _author(user: Any, api_key: ApiKey | None = None) -> str | None:
    if user is not None:
        return str(user.get_username())
    if api_key is not None:
        return f"API key {api_key.prefix}"
    return None


def _findings(answers: dict[str, Any]) -> list[FindingOut]:
    parsed = requirements.Requirements.model_validate(answers)
    return [FindingOut(**finding.model_dump()) for finding in requirements.feasibility_check(parsed)]


def _agent_out(agent: Agent) -> dict[str, Any]:
    return {
        "slug": agent.slug,
        "name": agent.name,
        "description": agent.description,
        "status": agent.status,
        "owner": agent.owner.get_username() if agent.owner else None,
        "requirements_version": agent.current_requirements.version if agent.current_requirements else None,
        "trace_retention_days": agent.trace_retention_days,
        "created_at": agent.created_at,
        "updated_at": agent.updated_at,
    }


def _requirements_out(agent: Agent, version: RequirementsVersion) -> RequirementsVersionOut:
    return RequirementsVersionOut(
        version=version.version,
        current=agent.current_requirements_id == version.pk,
        message=version.message,
        author=_author(version.created_by, version.created_via_key),
        created_at=version.created_at,
        answers=version.answers,
        feasibility=_findings(version.answers),
    )


def _version_out(version: PromptVersion) -> dict[str, Any]:
    return {
        "name": version.prompt.name,
        "version": version.version,
        "type": version.type,
        "template": version.template,
        "config": version.config,
        "variables": template_variables(version.template),
        "labels": selectors.prompt_version_label_names(version=version),
        "commit_message": version.commit_message,
        "author": _author(version.created_by, version.created_via_key),
        "created_at": version.created_at,
    }


def _prompt_out(prompt: Prompt) -> dict[str, Any]:
    return {
        "name": prompt.name,
        "agent": prompt.agent.slug,
        "description": prompt.description,
        "tags": prompt.tags,
        "latest_version": getattr(prompt, "latest_version", None),
        "labels": [
            LabelOut(name=label.name, version=label.version.version, updated_at=label.updated_at)
            for label in prompt.labels.all()
        ],
        "created_at": prompt.created_at,
    }


def _key_out(api_key: ApiKey) -> dict[str, Any]:
    return {
        "id": api_key.pk,
        "name": api_key.name,
        "prefix": api_key.prefix,
        "scopes": api_key.scopes,
        "agents": sorted(agent.slug for agent in api_key.agents.all()),
        "created_at": api_key.created_at,
        "last_used_at": api_key.last_used_at,
        "expires_at": api_key.expires_at,
        "revoked_at": api_key.revoked_at,
    }


def _agent(request: HttpRequest, slug: str) -> Agent:
    return selectors.agent_get(workspace=request_workspace(request), slug=slug, agent_ids=request_agent_ids(request))


def _prompt(request: HttpRequest, name: str) -> Prompt:
    return selectors.prompt_get(workspace=request_workspace(request), name=name, agent_ids=request_agent_ids(request))


# --- Workspace --------------------------------------------------------------------------------


@router.get("/workspace", auth=READ, response={200: WorkspaceOut, **ERRORS})
def workspace_get_api(request: HttpRequest) -> Any:
    return request_workspace(request)


# --- Agents -----------------------------------------------------------------------------------


@router.get("/agents", auth=READ, response={200: list[AgentOut], **ERRORS})
def agent_list_api(request: HttpRequest, status: str | None = None) -> Any:
    agents = selectors.agent_list(
        workspace=request_workspace(request), agent_ids=request_agent_ids(request), status=status
    )
    return [_agent_out(agent) for agent in agents]


@router.post("/agents", auth=WRITE, response={201: AgentDetailOut, **ERRORS})
def agent_create_api(request: HttpRequest, payload: AgentIn) -> Any:
    if request_agent_ids(request) is not None:
        raise PermissionDenied("a key limited to some agents cannot create agents")
    with transaction.atomic():
        agent = services.agent_create(
            workspace=request_workspace(request),
            slug=payload.slug,
            name=payload.name,
            description=payload.description,
            status=payload.status,
            created_via_key=request_api_key(request),
        )
        if payload.requirements is not None:
            services.requirements_version_create(
                agent=agent,
                answers=payload.requirements,
                message="Initial requirements",
                created_via_key=request_api_key(request),
            )
    return Status(201, _agent_detail(agent))


def _agent_detail(agent: Agent) -> dict[str, Any]:
    findings = _findings(agent.current_requirements.answers) if agent.current_requirements else []
    return {**_agent_out(agent), "feasibility": findings}


@router.get("/agents/{slug}", auth=READ, response={200: AgentDetailOut, **ERRORS})
def agent_get_api(request: HttpRequest, slug: str) -> Any:
    return _agent_detail(_agent(request, slug))


@router.patch("/agents/{slug}", auth=WRITE, response={200: AgentDetailOut, **ERRORS})
def agent_update_api(request: HttpRequest, slug: str, payload: AgentPatch) -> Any:
    agent = services.agent_update(
        agent=_agent(request, slug), fields=payload.dict(exclude_unset=True), updated_via_key=request_api_key(request)
    )
    return _agent_detail(agent)


@router.delete("/agents/{slug}", auth=WRITE, response={204: None, **ERRORS})
def agent_delete_api(request: HttpRequest, slug: str) -> Any:
    services.agent_delete(agent=_agent(request, slug), deleted_via_key=request_api_key(request))
    return Status(204, None)


# --- Requirements -----------------------------------------------------------------------------


@router.get("/requirements/schema", auth=READ, response={200: dict[str, Any], **ERRORS})
def requirements_schema_api(request: HttpRequest) -> dict[str, Any]:
    """JSON Schema of the answers to the six forcing questions."""
    return requirements.Requirements.model_json_schema()


@router.post("/requirements/check", auth=READ, response={200: RequirementsCheckOut, **ERRORS})
def requirements_check_api(request: HttpRequest, payload: RequirementsCheckIn) -> Any:
    """Validate answers and run the feasibility check without saving anything."""
    parsed = services.requirements_parse(payload.answers)
    return {
        "feasibility": [finding.model_dump() for finding in requirements.feasibility_check(parsed)],
        "configuration": requirements.derived_configuration(parsed).model_dump(mode="json"),
    }


@router.get("/agents/{slug}/requirements", auth=READ, response={200: list[RequirementsVersionSummaryOut], **ERRORS})
def requirements_version_list_api(request: HttpRequest, slug: str) -> Any:
    agent = _agent(request, slug)
    return [
        {
            "version": version.version,
            "current": version.pk == agent.current_requirements_id,
            "message": version.message,
            "author": _author(version.created_by, version.created_via_key),
            "created_at": version.created_at,
        }
        for version in selectors.requirements_version_list(agent=agent)
    ]


@router.post("/agents/{slug}/requirements", auth=WRITE, response={201: RequirementsVersionOut, **ERRORS})
def requirements_version_create_api(request: HttpRequest, slug: str, payload: RequirementsIn) -> Any:
    agent = _agent(request, slug)
    version = services.requirements_version_create(
        agent=agent,
        answers=payload.answers,
        message=payload.message,
        created_via_key=request_api_key(request),
    )
    return Status(201, _requirements_out(agent, version))


@router.get("/agents/{slug}/requirements/current", auth=READ, response={200: RequirementsVersionOut, **ERRORS})
def requirements_current_api(request: HttpRequest, slug: str) -> Any:
    agent = _agent(request, slug)
    if agent.current_requirements is None:
        raise exceptions.RequirementsVersionNotFound(f"agent {slug!r} has no requirements yet")
    return _requirements_out(agent, agent.current_requirements)


class DiffQuery(Schema):
    from_version: int
    to_version: int


@router.get("/agents/{slug}/requirements/diff", auth=READ, response={200: RequirementsDiffOut, **ERRORS})
def requirements_diff_api(request: HttpRequest, slug: str, query: Query[DiffQuery]) -> Any:
    agent = _agent(request, slug)
    before = selectors.requirements_version_get(agent=agent, version=query.from_version)
    after = selectors.requirements_version_get(agent=agent, version=query.to_version)
    changes = requirements.requirements_diff(before.answers, after.answers)
    return {
        "from_version": before.version,
        "to_version": after.version,
        "changes": [change.model_dump() for change in changes],
    }


@router.get("/agents/{slug}/requirements/{int:version}", auth=READ, response={200: RequirementsVersionOut, **ERRORS})
def requirements_version_get_api(request: HttpRequest, slug: str, version: int) -> Any:
    agent = _agent(request, slug)
    return _requirements_out(agent, selectors.requirements_version_get(agent=agent, version=version))


@router.post(
    "/agents/{slug}/requirements/{int:version}/activate",
    auth=WRITE,
    response={200: RequirementsVersionOut, **ERRORS},
)
def requirements_version_activate_api(request: HttpRequest, slug: str, version: int) -> Any:
    """Make an existing version current again (a rollback moves the pointer; nothing is rewritten)."""
    agent = _agent(request, slug)
    target = selectors.requirements_version_get(agent=agent, version=version)
    services.requirements_version_activate(agent=agent, version=target, api_key=request_api_key(request))
    return _requirements_out(agent, target)


@router.get("/agents/{slug}/feasibility", auth=READ, response={200: list[FindingOut], **ERRORS})
def agent_feasibility_api(request: HttpRequest, slug: str) -> Any:
    agent = _agent(request, slug)
    return _findings(agent.current_requirements.answers) if agent.current_requirements else []


@router.get("/agents/{slug}/configuration", auth=READ, response={200: ConfigurationOut, **ERRORS})
def agent_configuration_api(request: HttpRequest, slug: str) -> Any:
    """What the current requirements configure elsewhere, each value with the answers it came from."""
    agent = _agent(request, slug)
    current = selectors.requirements_current(agent=agent)
    if current is None or agent.current_requirements is None:
        raise exceptions.RequirementsVersionNotFound(f"agent {slug!r} has no requirements yet")
    derived = requirements.derived_configuration(current).model_dump(mode="json")
    return {"requirements_version": agent.current_requirements.version, **derived}


# --- Prompts ----------------------------------------------------------------------------------


@router.get("/prompts", auth=READ, response={200: list[PromptOut], **ERRORS})
def prompt_list_api(request: HttpRequest, agent: str | None = None) -> Any:
    owner = _agent(request, agent) if agent else None
    prompts = selectors.prompt_list(
        workspace=request_workspace(request), agent=owner, agent_ids=request_agent_ids(request)
    )
    return [_prompt_out(prompt) for prompt in prompts]


@router.post("/prompts", auth=WRITE, response={201: PromptVersionOut, **ERRORS})
def prompt_create_api(request: HttpRequest, payload: PromptIn) -> Any:
    version = services.prompt_create(
        agent=_agent(request, payload.agent),
        name=payload.name,
        type=payload.type,
        template=payload.template,
        config=payload.config,
        description=payload.description,
        tags=payload.tags,
        commit_message=payload.commit_message,
        labels=payload.labels,
        created_via_key=request_api_key(request),
    )
    return Status(201, _version_out(version))


@router.get("/prompts/{path:name}/versions", auth=READ, response={200: list[PromptVersionOut], **ERRORS})
def prompt_version_list_api(request: HttpRequest, name: str) -> Any:
    return [_version_out(version) for version in selectors.prompt_version_list(prompt=_prompt(request, name))]


@router.post("/prompts/{path:name}/versions", auth=WRITE, response={201: PromptVersionOut, **ERRORS})
def prompt_version_create_api(request: HttpRequest, name: str, payload: PromptVersionIn) -> Any:
    version = services.prompt_version_create(
        prompt=_prompt(request, name),
        template=payload.template,
        type=payload.type,
        config=payload.config,
        commit_message=payload.commit_message,
        labels=payload.labels,
        created_via_key=request_api_key(request),
    )
    return Status(201, _version_out(version))


@router.get("/prompts/{path:name}/versions/{int:version}", auth=READ, response={200: PromptVersionOut, **ERRORS})
def prompt_version_get_api(request: HttpRequest, name: str, version: int) -> Any:
    return _version_out(selectors.prompt_version_get(prompt=_prompt(request, name), version=version))


@router.api_operation(
    ["PUT", "PATCH", "DELETE"],
    "/prompts/{path:name}/versions/{int:version}",
    auth=WRITE,
    response={405: ErrorOut, **ERRORS},
)
def prompt_version_edit_api(request: HttpRequest, name: str, version: int) -> Any:
    """Versions are immutable: publish a new version and move a label instead."""
    selectors.prompt_version_get(prompt=_prompt(request, name), version=version)
    raise exceptions.PromptVersionImmutable(
        "prompt versions are immutable; publish a new version and move a label to it"
    )


@router.get("/prompts/{path:name}/labels", auth=READ, response={200: list[LabelMoveOut], **ERRORS})
def prompt_label_history_api(request: HttpRequest, name: str) -> Any:
    """The deployment history: every label move, newest first."""
    return [
        {
            "label": move.label,
            "from_version": move.from_version.version if move.from_version else None,
            "to_version": move.to_version.version if move.to_version else None,
            "moved_by": _author(move.moved_by, move.moved_via_key),
            "moved_at": move.moved_at,
        }
        for move in selectors.prompt_label_move_list(prompt=_prompt(request, name))
    ]


@router.put("/prompts/{path:name}/labels/{label}", auth=WRITE, response={200: LabelOut, **ERRORS})
def prompt_label_move_api(request: HttpRequest, name: str, label: str, payload: LabelMoveIn) -> Any:
    """Point a label at a version: deploy (forward) or roll back (backward)."""
    prompt = _prompt(request, name)
    version = selectors.prompt_version_get(prompt=prompt, version=payload.version)
    moved = services.prompt_label_move(
        prompt=prompt, label=label, version=version, moved_via_key=request_api_key(request)
    )
    return {"name": moved.name, "version": version.version, "updated_at": moved.updated_at}


@router.delete("/prompts/{path:name}/labels/{label}", auth=WRITE, response={204: None, **ERRORS})
def prompt_label_delete_api(request: HttpRequest, name: str, label: str) -> Any:
    services.prompt_label_delete(prompt=_prompt(request, name), label=label, moved_via_key=request_api_key(request))
    return Status(204, None)


@router.get("/prompts/{path:name}/diff", auth=READ, response={200: PromptDiffOut, **ERRORS})
def prompt_diff_api(request: HttpRequest, name: str, query: Query[DiffQuery]) -> Any:
    prompt = _prompt(request, name)
    before = selectors.prompt_version_get(prompt=prompt, version=query.from_version)
    after = selectors.prompt_version_get(prompt=prompt, version=query.to_version)
    diff = prompt_diff(
        before.template,
        before.config,
        after.template,
        after.config,
        f"v{before.version}",
        f"v{after.version}",
    )
    return {"from_version": before.version, "to_version": after.version, **diff.model_dump()}


@router.post("/prompts/{path:name}/render", auth=READ, response={200: RenderOut, **ERRORS})
def prompt_render_api(request: HttpRequest, name: str, payload: RenderIn) -> Any:
    """Fill a version's variables; a missing variable is a 422 that names it."""
    version = selectors.prompt_version_resolve(
        workspace=request_workspace(request),
        name=name,
        label=payload.label,
        version=payload.version,
        agent_ids=request_agent_ids(request),
    )
    rendered = services.prompt_version_render(
        version=version, variables=payload.variables, placeholders=payload.placeholders
    )
    return {
        "name": version.prompt.name,
        "version": version.version,
        "type": version.type,
        "prompt": rendered,
        "config": version.config,
    }


class ResolveQuery(Schema):
    label: str | None = None
    version: int | None = None


@router.get("/prompts/{path:name}", auth=READ, response={200: PromptVersionOut, **ERRORS})
def prompt_get_api(request: HttpRequest, name: str, query: Query[ResolveQuery]) -> Any:
    """The version a client should use: `?version=N`, `?label=staging`, or the `production` label."""
    version = selectors.prompt_version_resolve(
        workspace=request_workspace(request),
        name=name,
        label=query.label,
        version=query.version,
        agent_ids=request_agent_ids(request),
    )
    return _version_out(version)


# After every `/prompts/{name}/...` route: the path converter would otherwise take their paths too.
@router.patch("/prompts/{path:name}", auth=WRITE, response={200: PromptOut, **ERRORS})
def prompt_update_api(request: HttpRequest, name: str, payload: PromptPatch) -> Any:
    """Change a prompt's description or tags (name and versions never change)."""
    prompt = services.prompt_update(prompt=_prompt(request, name), **payload.dict(exclude_unset=True))
    found = selectors.prompt_list(workspace=request_workspace(request), agent=prompt.agent).get(pk=prompt.pk)
    return _prompt_out(found)


@router.delete("/prompts/{path:name}", auth=WRITE, response={204: None, **ERRORS})
def prompt_delete_api(request: HttpRequest, name: str) -> Any:
    """Delete a prompt, its versions, labels and deployment history. 409 `prompt_in_use` while the
    production label points at a version, or trajectories or chain steps use one."""
    services.prompt_delete(prompt=_prompt(request, name), deleted_via_key=request_api_key(request))
    return Status(204, None)


# --- API keys ---------------------------------------------------------------------------------


@router.get("/keys", auth=READ, response={200: list[ApiKeyOut], **ERRORS})
def apikey_list_api(request: HttpRequest) -> Any:
    keys = selectors.apikey_list(workspace=request_workspace(request), agent_ids=request_agent_ids(request))
    return [_key_out(api_key) for api_key in keys]


@router.post("/keys", auth=WRITE, response={201: ApiKeyCreatedOut, **ERRORS})
def apikey_create_api(request: HttpRequest, payload: ApiKeyIn) -> Any:
    """Create a key. A key can only create keys with no more power than its own: a subset of its scopes,
    limited to a subset of its agents."""
    caller = request_api_key(request)
    caller_agent_ids = request_agent_ids(request)
    extra_scopes = sorted(set(payload.scopes) - set(caller.scopes))
    if extra_scopes:
        raise PermissionDenied(
            f"a key cannot grant scopes it lacks: {', '.join(extra_scopes)}",
            errors=[{"field": "scopes", "message": "exceeds the calling key"}],
        )
    agents = [_agent(request, slug) for slug in payload.agents]
    if caller_agent_ids is not None and not agents:
        raise PermissionDenied(
            "a key limited to some agents can only create keys limited to them",
            errors=[{"field": "agents", "message": "required"}],
        )
    if payload.expires_at is not None and payload.expires_at <= timezone.now():
        # It would be shown once and never work (the dashboard's form refuses a past date too).
        raise exceptions.ApiKeyInvalid(
            "a key cannot expire in the past", errors=[{"field": "expires_at", "message": "in the past"}]
        )
    if caller.expires_at is not None and (payload.expires_at is None or payload.expires_at > caller.expires_at):
        raise PermissionDenied(
            "a key that expires can only create keys that expire no later than it does",
            errors=[{"field": "expires_at", "message": "exceeds the calling key"}],
        )
    api_key, raw_key = services.apikey_create(
        workspace=request_workspace(request),
        name=payload.name,
        scopes=payload.scopes,
        agents=agents,
        created_via_key=caller,
        expires_at=payload.expires_at,
    )
    return Status(201, {**_key_out(api_key), "key": raw_key})


@router.delete("/keys/{int:key_id}", auth=WRITE, response={200: ApiKeyOut, **ERRORS})
def apikey_revoke_api(request: HttpRequest, key_id: int) -> Any:
    """Revoke a key. As with creating one, a key can only revoke keys with no more power than its own: keys
    whose scopes it holds, among the agents it is limited to (it does not see the others)."""
    api_key = selectors.apikey_get(
        workspace=request_workspace(request), key_id=key_id, agent_ids=request_agent_ids(request)
    )
    extra_scopes = sorted(set(api_key.scopes) - set(request_api_key(request).scopes))
    if extra_scopes:
        raise PermissionDenied(f"a key cannot revoke a key with scopes it lacks: {', '.join(extra_scopes)}")
    return _key_out(services.apikey_revoke(api_key=api_key, revoked_via_key=request_api_key(request)))


# --- Audit log --------------------------------------------------------------------------------


def _audit_event_out(event: AuditEvent) -> dict[str, Any]:
    return {
        "id": event.pk,
        "action": event.action,
        "actor": {
            "kind": event.actor_kind,
            "name": event.actor_label,
            "username": event.actor_user.get_username() if event.actor_user else None,
            "key_prefix": event.actor_key.prefix if event.actor_key else None,
        },
        "target": {"type": event.target_type, "id": event.target_id, "name": event.target_name},
        "details": event.details,
        "ip_address": event.ip_address,
        "created_at": event.created_at,
    }


@router.get("/audit-events", auth=WRITE, response={200: AuditEventPageOut, **ERRORS})
def audit_event_list_api(request: HttpRequest, query: Query[AuditEventQuery]) -> Any:
    """The workspace's audit log, newest first: who changed keys, policies, budgets, model targets, labels,
    approvals, exports and settings. Needs the `write` scope on a key not limited to some agents (the log
    covers the whole workspace); in the dashboard, owners read it."""
    if request_agent_ids(request) is not None:
        raise PermissionDenied("a key limited to some agents cannot read the workspace's audit log")
    page = selectors.audit_event_list(
        workspace=request_workspace(request),
        action=query.action,
        actor=query.actor,
        since=query.since,
        until=query.until,
        cursor=query.cursor,
        limit=query.limit,
    )
    return {"items": [_audit_event_out(event) for event in page.events], "next_cursor": page.next_cursor}


# --- Langfuse compatibility -------------------------------------------------------------------


def _langfuse_out(version: PromptVersion) -> dict[str, Any]:
    return {
        "type": version.type,
        "name": version.prompt.name,
        "version": version.version,
        "prompt": version.template,
        "config": version.config,
        "labels": selectors.prompt_version_label_names(version=version),
        "tags": version.prompt.tags,
        "commitMessage": version.commit_message or None,
    }


@langfuse_router.get(
    "/v2/prompts/{path:name}", auth=langfuse_auth(Scope.READ), response={200: LangfusePromptOut, **ERRORS}
)
def langfuse_prompt_get_api(request: HttpRequest, name: str, query: Query[ResolveQuery]) -> Any:
    """Langfuse's `GET /api/public/v2/prompts/{name}`: by version, by label, else `production`."""
    if query.label is not None and query.version is not None:
        raise KeelError("pass either label or version, not both", code="bad_request")
    version = selectors.prompt_version_resolve(
        workspace=request_workspace(request),
        name=name,
        label=query.label,
        version=query.version,
        agent_ids=request_agent_ids(request),
    )
    return _langfuse_out(version)


@langfuse_router.post("/v2/prompts", auth=langfuse_auth(Scope.WRITE), response={201: LangfusePromptOut, **ERRORS})
def langfuse_prompt_create_api(request: HttpRequest, payload: LangfusePromptIn) -> Any:
    """Langfuse's `create_prompt`: a new version of an existing prompt, or a new prompt. A new prompt
    needs an agent, so it is only possible with a key limited to exactly one agent."""
    workspace = request_workspace(request)
    agent_ids = request_agent_ids(request)
    api_key = request_api_key(request)
    try:
        prompt = selectors.prompt_get(workspace=workspace, name=payload.name, agent_ids=agent_ids)
    except exceptions.PromptNotFound:
        if agent_ids is None or len(agent_ids) != 1:
            raise exceptions.PromptNotFound(
                f"no prompt named {payload.name!r}; to create one from a Langfuse client, use a key "
                "limited to exactly one agent (or create it in Keel first)"
            ) from None
        (agent_id,) = agent_ids
        agent = selectors.agent_list(workspace=workspace, agent_ids=agent_ids).get(pk=agent_id)
        version = services.prompt_create(
            agent=agent,
            name=payload.name,
            type=payload.type,
            template=payload.prompt,
            config=payload.config or {},
            tags=payload.tags or [],
            commit_message=payload.commitMessage or "",
            labels=payload.labels,
            created_via_key=api_key,
        )
        return Status(201, _langfuse_out(version))
    with transaction.atomic():
        version = services.prompt_version_create(
            prompt=prompt,
            type=payload.type,
            template=payload.prompt,
            config=payload.config,
            commit_message=payload.commitMessage or "",
            labels=payload.labels,
            created_via_key=api_key,
        )
        # Langfuse applies `tags` to every version of the prompt: in Keel, tags are the prompt's.
        if payload.tags is not None:
            services.prompt_update(prompt=version.prompt, tags=payload.tags)
    return Status(201, _langfuse_out(version))
