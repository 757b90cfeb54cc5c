"""Reads of the registry. Every function is scoped to a workspace (or to an agent already scoped to one);
`agent_ids` narrows further for keys limited to some agents (None: every agent of the workspace)."""

from __future__ import annotations

import base64
import binascii
import functools
import json
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache

from django.db import connection
from django.db.models import Count, F, Max, Prefetch, Q, QuerySet

from agent_registry import exceptions, requirements
from agent_registry.models import (
    Agent,
    ApiKey,
    AuditAction,
    AuditActorKind,
    AuditEvent,
    Membership,
    Prompt,
    PromptLabel,
    PromptLabelMove,
    PromptVersion,
    RequirementsVersion,
    Role,
    User,
    WorkerHeartbeat,
    Workspace,
)
from config.config_cache import NotifiedCache

AgentIds = Collection[int] | None


# --- Workspaces -------------------------------------------------------------------------------


def membership_list_for_user(*, user: User) -> QuerySet[Membership]:
    return Membership.objects.filter(user=user).select_related("workspace").order_by("workspace__name")


def membership_get(*, user: User, workspace_slug: str) -> Membership:
    membership = (
        Membership.objects.select_related("workspace").filter(user=user, workspace__slug=workspace_slug).first()
    )
    if membership is None:
        # The same answer whether the workspace exists or not: a slug alone reveals nothing.
        raise exceptions.WorkspaceNotFound(f"no workspace {workspace_slug!r}")
    return membership


def workspace_member_list(*, workspace: Workspace) -> QuerySet[Membership]:
    return workspace.memberships.select_related("user").order_by("user__username")


def workspace_owner(*, workspace: Workspace) -> User | None:
    """The workspace's first owner by username (as workspace_member_list orders them), if it has one."""
    return next((m.user for m in workspace_member_list(workspace=workspace) if m.role == Role.OWNER), None)


# --- API keys ---------------------------------------------------------------------------------


def _apikeys_within(*, workspace: Workspace, agent_ids: AgentIds) -> QuerySet[ApiKey]:
    """The keys a caller limited to `agent_ids` may see and revoke: those limited to some of its agents
    and to no other (a key limited to none serves every agent, so it is outside)."""
    keys = ApiKey.objects.filter(workspace=workspace)
    if agent_ids is None:
        return keys
    others = Agent.objects.exclude(pk__in=agent_ids)
    return keys.filter(pk__in=ApiKey.objects.filter(agents__in=agent_ids).values("pk")).exclude(
        pk__in=ApiKey.objects.filter(agents__in=others).values("pk")
    )


def apikey_list(*, workspace: Workspace, agent_ids: AgentIds = None) -> QuerySet[ApiKey]:
    return (
        _apikeys_within(workspace=workspace, agent_ids=agent_ids)
        .select_related("created_by")
        .prefetch_related("agents")
        # Live keys first (PostgreSQL puts NULLs last when ascending), newest first.
        .order_by(F("revoked_at").asc(nulls_first=True), "-created_at", "-pk")
    )


def apikey_get(*, workspace: Workspace, key_id: int, agent_ids: AgentIds = None) -> ApiKey:
    api_key = _apikeys_within(workspace=workspace, agent_ids=agent_ids).filter(pk=key_id).first()
    if api_key is None:
        raise exceptions.ApiKeyNotFound(f"no API key {key_id}")
    return api_key


@lru_cache(maxsize=1)
def _live_key_statement() -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    key_fields = ApiKey._meta.concrete_fields
    workspace_fields = Workspace._meta.concrete_fields
    quote = connection.ops.quote_name
    columns = [f"k.{quote(str(field.column))}" for field in key_fields]
    columns += [f"w.{quote(str(field.column))}" for field in workspace_fields]
    sql = (
        f"SELECT {', '.join(columns)} FROM {quote(ApiKey._meta.db_table)} k"
        f" JOIN {quote(Workspace._meta.db_table)} w ON w.id = k.{quote('workspace_id')}"
        " WHERE k.prefix = %s AND k.revoked_at IS NULL LIMIT 1"
    )
    return sql, tuple(field.attname for field in key_fields), tuple(field.attname for field in workspace_fields)


def _live_key_row(sql: str, prefix: str) -> tuple[object, ...] | None:
    with connection.cursor() as cursor:
        cursor.execute(sql, [prefix])
        row = cursor.fetchone()
    return None if row is None else tuple(row)


# The rows, not instances: each request gets instances of its own (the caller sets `last_used_at`).
_live_keys: NotifiedCache[str, tuple[object, ...] | None] = NotifiedCache(size=4096)


def apikey_live_by_prefix(*, prefix: str) -> ApiKey | None:
    """The unrevoked key with `prefix`, its workspace read with it: what
    `ApiKey.objects.select_related("workspace").filter(prefix=..., revoked_at__isnull=True).first()` returns.

    Every authenticated request reads this, so the statement is written once per process rather than built
    by the ORM each time (0.94 ms against 0.35 ms on the benchmark machine). Neither model has a field that
    converts what the database sends; test_apikey_live_by_prefix_reads_what_the_orm_reads holds that.
    The row is kept per process until the key or its workspace changes (config/config_cache.py)."""
    sql, key_fields, workspace_fields = _live_key_statement()
    row = _live_keys.get(prefix, functools.partial(_live_key_row, sql, prefix))
    if row is None:
        return None
    api_key = ApiKey.from_db(connection.alias, list(key_fields), list(row[: len(key_fields)]))
    workspace = Workspace.from_db(connection.alias, list(workspace_fields), list(row[len(key_fields) :]))
    ApiKey.workspace.field.set_cached_value(api_key, workspace)
    return api_key


def apikey_agent_ids(*, api_key: ApiKey) -> frozenset[int] | None:
    """The agents a key is limited to, or None when it serves the whole workspace."""
    ids = frozenset(api_key.agents.values_list("pk", flat=True))
    return ids or None


_key_agent_ids: NotifiedCache[int, frozenset[int] | None] = NotifiedCache(size=4096, in_transactions=True)


def apikey_agent_ids_kept(*, api_key: ApiKey) -> frozenset[int] | None:
    """`apikey_agent_ids`, kept per process until a key's agents change (config/config_cache.py): for the
    paths that read it on every request or batch (the gateway's proxying, span ingest)."""
    return _key_agent_ids.get(api_key.pk, functools.partial(apikey_agent_ids, api_key=api_key))


# --- Agents -----------------------------------------------------------------------------------


def agent_list(*, workspace: Workspace, agent_ids: AgentIds = None, status: str | None = None) -> QuerySet[Agent]:
    agents = Agent.objects.filter(workspace=workspace).select_related("owner", "current_requirements")
    if agent_ids is not None:
        agents = agents.filter(pk__in=agent_ids)
    if status:
        agents = agents.filter(status=status)
    return agents.annotate(prompt_count=Count("prompts", distinct=True)).order_by("name")


def agent_get(*, workspace: Workspace, slug: str, agent_ids: AgentIds = None) -> Agent:
    agent = Agent.objects.select_related("owner", "current_requirements", "workspace").filter(
        workspace=workspace, slug=slug
    )
    if agent_ids is not None:
        agent = agent.filter(pk__in=agent_ids)
    found = agent.first()
    if found is None:
        raise exceptions.AgentNotFound(f"no agent {slug!r} in this workspace")
    return found


# --- Requirements -----------------------------------------------------------------------------


def requirements_version_list(*, agent: Agent) -> QuerySet[RequirementsVersion]:
    return agent.requirements_versions.select_related("created_by", "created_via_key").order_by("-version")


def requirements_version_get(*, agent: Agent, version: int) -> RequirementsVersion:
    found = agent.requirements_versions.select_related("created_by").filter(version=version).first()
    if found is None:
        raise exceptions.RequirementsVersionNotFound(f"agent {agent.slug!r} has no requirements version {version}")
    return found


@lru_cache(maxsize=512)
def requirements_version_parsed(version_id: int) -> requirements.Requirements | None:
    """A requirements version's answers, parsed. Versions are immutable, so each process keeps what it
    parsed: the gateway reads them on every request and the worker for every batch of spans."""
    answers = RequirementsVersion.objects.filter(pk=version_id).values_list("answers", flat=True).first()
    return None if answers is None else requirements.Requirements.model_validate(answers)


@lru_cache(maxsize=512)
def requirements_version_derived(version_id: int) -> requirements.DerivedConfiguration | None:
    answers = requirements_version_parsed(version_id)
    return None if answers is None else requirements.derived_configuration(answers)


def derived_configuration(*, agent: Agent) -> requirements.DerivedConfiguration | None:
    if agent.current_requirements_id is None:
        return None
    return requirements_version_derived(agent.current_requirements_id)


def requirements_of(*, agent: Agent) -> requirements.Requirements | None:
    if agent.current_requirements_id is None:
        return None
    return requirements_version_parsed(agent.current_requirements_id)


def requirements_current(*, agent: Agent) -> requirements.Requirements | None:
    """The answers in force, parsed; None until the first save."""
    if agent.current_requirements is None:
        return None
    return requirements.Requirements.model_validate(agent.current_requirements.answers)


# --- Prompts ----------------------------------------------------------------------------------


def prompt_list(*, workspace: Workspace, agent: Agent | None = None, agent_ids: AgentIds = None) -> QuerySet[Prompt]:
    found = Prompt.objects.filter(workspace=workspace).select_related("agent")
    if agent is not None:
        found = found.filter(agent=agent)
    if agent_ids is not None:
        found = found.filter(agent_id__in=agent_ids)
    return (
        found.annotate(latest_version=Max("versions__version"))
        .prefetch_related(Prefetch("labels", queryset=PromptLabel.objects.select_related("version")))
        .order_by("name")
    )


def prompt_get(*, workspace: Workspace, name: str, agent_ids: AgentIds = None) -> Prompt:
    found = Prompt.objects.select_related("agent").filter(workspace=workspace, name=name)
    if agent_ids is not None:
        found = found.filter(agent_id__in=agent_ids)
    prompt = found.first()
    if prompt is None:
        raise exceptions.PromptNotFound(f"no prompt named {name!r}")
    return prompt


def prompt_get_by_id(*, workspace: Workspace, prompt_id: int) -> Prompt:
    prompt = Prompt.objects.select_related("agent").filter(workspace=workspace, pk=prompt_id).first()
    if prompt is None:
        raise exceptions.PromptNotFound(f"no prompt {prompt_id}")
    return prompt


def prompt_version_list(*, prompt: Prompt) -> QuerySet[PromptVersion]:
    return (
        prompt.versions.select_related("created_by", "created_via_key").prefetch_related("labels").order_by("-version")
    )


def prompt_version_get(*, prompt: Prompt, version: int) -> PromptVersion:
    found = prompt.versions.select_related("created_by").filter(version=version).first()
    if found is None:
        raise exceptions.PromptVersionNotFound(f"prompt {prompt.name!r} has no version {version}")
    return found


def prompt_version_latest(*, prompt: Prompt) -> PromptVersion:
    found = prompt.versions.order_by("-version").first()
    if found is None:
        raise exceptions.PromptVersionNotFound(f"prompt {prompt.name!r} has no versions")
    return found


def prompt_version_get_by_label(*, prompt: Prompt, label: str) -> PromptVersion:
    if label == "latest":
        return prompt_version_latest(prompt=prompt)
    found = PromptVersion.objects.filter(prompt=prompt, labels__name=label).first()
    if found is None:
        raise exceptions.PromptLabelNotFound(f"prompt {prompt.name!r} has no label {label!r}")
    return found


def prompt_version_resolve(
    *,
    workspace: Workspace,
    name: str,
    label: str | None = None,
    version: int | None = None,
    agent_ids: AgentIds = None,
) -> PromptVersion:
    """The version a client asked for: by number, by label, or `production` when neither is given.
    Both at once is refused: which one wins would be a guess (Langfuse refuses it too)."""
    if label is not None and version is not None:
        raise exceptions.PromptResolveInvalid(
            "pass either label or version, not both",
            errors=[{"field": field, "message": "pass either label or version"} for field in ("label", "version")],
        )
    prompt = prompt_get(workspace=workspace, name=name, agent_ids=agent_ids)
    if version is not None:
        return prompt_version_get(prompt=prompt, version=version)
    return prompt_version_get_by_label(prompt=prompt, label=label or "production")


def prompt_version_label_names(*, version: PromptVersion) -> list[str]:
    """The labels on a version, `latest` included when it is the newest."""
    names = sorted(version.labels.values_list("name", flat=True))
    latest = version.prompt.versions.aggregate(Max("version"))["version__max"]
    if latest == version.version:
        names.append("latest")
    return names


def prompt_label_get(*, prompt: Prompt, label: str) -> PromptLabel:
    """A label of the prompt that exists (not `latest`, which only names the newest version)."""
    found = PromptLabel.objects.select_related("version").filter(prompt=prompt, name=label).first()
    if found is None:
        raise exceptions.PromptLabelNotFound(f"prompt {prompt.name!r} has no label {label!r}")
    return found


PRODUCTION_LABEL = "production"


def prompt_in_use_reasons(*, prompt: Prompt) -> list[str]:
    """Why the prompt cannot be deleted yet (agent_registry.services.prompt_delete); empty when it can."""
    reasons = []
    production = PromptLabel.objects.filter(prompt=prompt, name=PRODUCTION_LABEL).select_related("version").first()
    if production is not None:
        reasons.append(f"the production label points at v{production.version.version}; delete that label first")
    # Reverse relations (tracing's Trajectory.prompt_versions, routing's ChainStep.prompt_version), so that
    # the registry needs no import of the apps built on it.
    versions = PromptVersion.objects.filter(prompt=prompt)
    trajectories = versions.filter(trajectories__isnull=False).values("trajectories").distinct().count()
    if trajectories:
        reasons.append(f"{trajectories} trajector{'y' if trajectories == 1 else 'ies'} recorded its versions")
    chain_steps = versions.filter(chain_steps__isnull=False).values("chain_steps").distinct().count()
    if chain_steps:
        reasons.append(f"the router's chain runs its versions in {chain_steps} step{'' if chain_steps == 1 else 's'}")
    return reasons


def prompt_label_move_list(*, prompt: Prompt, limit: int = 50) -> QuerySet[PromptLabelMove]:
    return prompt.label_moves.select_related("from_version", "to_version", "moved_by", "moved_via_key")[:limit]


# --- Operations -------------------------------------------------------------------------------


def worker_heartbeat_latest() -> datetime | None:
    last: datetime | None = WorkerHeartbeat.objects.aggregate(last=Max("last_seen_at"))["last"]
    return last


# --- Dashboard --------------------------------------------------------------------------------


def agent_feasibility_list(*, workspace: Workspace) -> list[tuple[Agent, list[requirements.Finding]]]:
    """Every agent of the workspace with the feasibility findings of its current requirements, errors
    first; an agent without requirements has none."""
    found = []
    for agent in agent_list(workspace=workspace):
        current = requirements_current(agent=agent)
        found.append((agent, requirements.feasibility_check(current) if current is not None else []))
    return found


def prompt_label_move_list_for_workspace(*, workspace: Workspace, limit: int = 10) -> QuerySet[PromptLabelMove]:
    """The latest deployments (label moves) across every prompt of the workspace, newest first."""
    return (
        PromptLabelMove.objects.filter(prompt__workspace=workspace)
        .select_related("prompt", "prompt__agent", "from_version", "to_version", "moved_by", "moved_via_key")
        .order_by("-moved_at", "-id")[:limit]
    )


# --- Audit log --------------------------------------------------------------------------------

AUDIT_PAGE_MAX = 200


@dataclass(frozen=True)
class AuditEventPage:
    events: list[AuditEvent]
    next_cursor: str | None


def _audit_cursor_encode(event: AuditEvent) -> str:
    raw = json.dumps([event.created_at.isoformat(), event.pk]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _audit_cursor_decode(cursor: str) -> tuple[datetime, int]:
    try:
        moment, pk = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        parsed = datetime.fromisoformat(moment)
        if not isinstance(pk, int) or parsed.tzinfo is None:
            raise ValueError("bad cursor")
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise exceptions.AuditEventListInvalid(
            "invalid cursor", errors=[{"field": "cursor", "message": "not a cursor this list gave out"}]
        ) from None
    return parsed, pk


def audit_event_list(
    *,
    workspace: Workspace,
    action: str | None = None,
    actor: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    cursor: str | None = None,
    limit: int = 50,
) -> AuditEventPage:
    """The workspace's audit events, newest first, `limit` at a time; `next_cursor` reads on (keyset, so
    a page stays right while events arrive). `action` is one action, or a prefix ending in a dot
    (`apikey.`); `actor` a username, an API key's prefix, or `keel`."""
    events = AuditEvent.objects.filter(workspace=workspace).select_related("actor_user", "actor_key")
    if action:
        if action.endswith("."):
            if not any(value.startswith(action) for value in AuditAction.values):
                raise exceptions.AuditEventListInvalid(
                    f"no audit action starts with {action!r}", errors=[{"field": "action", "message": "unknown"}]
                )
            events = events.filter(action__startswith=action)
        elif action in AuditAction.values:
            events = events.filter(action=action)
        else:
            raise exceptions.AuditEventListInvalid(
                f"unknown audit action {action!r}", errors=[{"field": "action", "message": "unknown"}]
            )
    if actor:
        if actor.strip().lower() == AuditActorKind.KEEL:
            events = events.filter(actor_kind=AuditActorKind.KEEL)
        else:
            events = events.filter(Q(actor_user__username=actor.strip()) | Q(actor_key__prefix=actor.strip()))
    if since is not None:
        events = events.filter(created_at__gte=since)
    if until is not None:
        events = events.filter(created_at__lt=until)
    if cursor:
        moment, pk = _audit_cursor_decode(cursor)
        events = events.filter(Q(created_at__lt=moment) | Q(created_at=moment, pk__lt=pk))
    limit = max(1, min(limit, AUDIT_PAGE_MAX))
    page = list(events.order_by("-created_at", "-pk")[: limit + 1])
    more = len(page) > limit
    page = page[:limit]
    return AuditEventPage(events=page, next_cursor=_audit_cursor_encode(page[-1]) if more and page else None)


def audit_actor_list(*, workspace: Workspace) -> list[str]:
    """The people and keys that appear in the workspace's audit log, for a filter's choices."""
    events = AuditEvent.objects.filter(workspace=workspace)
    usernames = events.filter(actor_user__isnull=False).values_list("actor_user__username", flat=True).distinct()
    prefixes = events.filter(actor_key__isnull=False).values_list("actor_key__prefix", flat=True).distinct()
    return sorted(usernames) + sorted(prefixes)
