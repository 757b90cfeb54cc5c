"""Writes of the registry. Every function takes keyword arguments, validates, and either commits
whole or raises one of agent_registry.exceptions with nothing written."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Max, Q
from django.utils import timezone
from pydantic import ValidationError

from agent_registry import audit, exceptions, prompts, requirements, selectors
from agent_registry.models import (
    Agent,
    AgentStatus,
    ApiKey,
    AuditAction,
    Membership,
    Prompt,
    PromptLabel,
    PromptLabelMove,
    PromptVersion,
    RequirementsVersion,
    Role,
    Scope,
    User,
    WorkerHeartbeat,
    Workspace,
)

# --- Workspaces and people --------------------------------------------------------------------


@transaction.atomic
def workspace_create(*, slug: str, name: str, owner: User) -> Workspace:
    workspace = Workspace(slug=slug, name=name)
    workspace.full_clean()
    workspace.save()
    Membership.objects.create(workspace=workspace, user=owner, role=Role.OWNER)
    audit.record(workspace=workspace, action=AuditAction.WORKSPACE_CREATED, user=owner, target=workspace)
    return workspace


@transaction.atomic
def membership_set(*, workspace: Workspace, user: User, role: Role, set_by: User | None = None) -> Membership:
    """Give `user` `role` in the workspace (adding them if new). Setting the role they have changes nothing."""
    existing = Membership.objects.select_for_update().filter(workspace=workspace, user=user).first()
    if existing is not None and existing.role == role:
        return existing
    membership, created = Membership.objects.update_or_create(workspace=workspace, user=user, defaults={"role": role})
    audit.record(
        workspace=workspace,
        action=AuditAction.MEMBER_ADDED if created else AuditAction.MEMBER_ROLE_CHANGED,
        user=set_by,
        target=membership,
        target_name=user.get_username(),
        details={"role": role, **({"previous_role": existing.role} if existing is not None else {})},
    )
    return membership


# --- API keys ---------------------------------------------------------------------------------

API_KEY_PREFIX = "keel"


def _key_hash(raw_key: str) -> str:
    return hashlib.sha256(raw_key.encode()).hexdigest()


@transaction.atomic
def apikey_create(
    *,
    workspace: Workspace,
    name: str,
    scopes: Sequence[str],
    agents: Iterable[Agent] = (),
    created_by: User | None = None,
    created_via_key: ApiKey | None = None,
    expires_at: datetime | None = None,
) -> tuple[ApiKey, str]:
    """Create a key and return it with its plaintext, which is never stored and cannot be shown again.

    Precondition: every agent belongs to `workspace`.
    """
    unknown = sorted(set(scopes) - set(Scope.values))
    if unknown or not scopes:
        raise exceptions.ApiKeyInvalid(
            f"scopes must be a non-empty subset of {', '.join(Scope.values)}",
            errors=[{"field": "scopes", "message": f"unknown: {', '.join(unknown)}" if unknown else "empty"}],
        )
    agents = list(agents)
    if any(agent.workspace_id != workspace.pk for agent in agents):
        raise exceptions.AgentNotFound("an agent of another workspace cannot be given to this key")
    if not name.strip():
        raise exceptions.ApiKeyInvalid("a key needs a name", errors=[{"field": "name", "message": "required"}])
    public = secrets.token_hex(6)
    raw_key = f"{API_KEY_PREFIX}_{public}_{secrets.token_urlsafe(32)}"
    api_key = ApiKey.objects.create(
        workspace=workspace,
        name=name.strip()[:200],
        prefix=f"{API_KEY_PREFIX}_{public}",
        key_hash=_key_hash(raw_key),
        scopes=sorted(set(scopes)),
        created_by=created_by,
        expires_at=expires_at,
    )
    api_key.agents.set(agents)
    audit.record(
        workspace=workspace,
        action=AuditAction.APIKEY_CREATED,
        user=created_by,
        api_key=created_via_key,
        target=api_key,
        details={
            "prefix": api_key.prefix,
            "scopes": api_key.scopes,
            "agents": sorted(agent.slug for agent in agents),
            "expires_at": expires_at.isoformat() if expires_at else None,
        },
    )
    return api_key, raw_key


@transaction.atomic
def apikey_revoke(*, api_key: ApiKey, revoked_by: User | None = None, revoked_via_key: ApiKey | None = None) -> ApiKey:
    """Revoke the key (from now on it gets 401). Revoking a revoked key changes nothing."""
    revoked = ApiKey.objects.filter(pk=api_key.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
    api_key.refresh_from_db(fields=["revoked_at"])
    if revoked:
        audit.record(
            workspace=api_key.workspace_id,
            action=AuditAction.APIKEY_REVOKED,
            user=revoked_by,
            api_key=revoked_via_key,
            target=api_key,
            details={"prefix": api_key.prefix},
        )
    return api_key


def apikey_authenticate(*, raw_key: str) -> ApiKey | None:
    """The live key for `raw_key`, or None. Records the time of use at most once a minute per key."""
    parts = raw_key.split("_", 2)
    if len(parts) != 3 or parts[0] != API_KEY_PREFIX:
        return None
    api_key = selectors.apikey_live_by_prefix(prefix=f"{parts[0]}_{parts[1]}")
    if api_key is None or not hmac.compare_digest(api_key.key_hash, _key_hash(raw_key)):
        return None
    now = timezone.now()
    if api_key.expires_at is not None and api_key.expires_at <= now:
        return None
    stale = now - timedelta(seconds=settings.API_KEY_LAST_USED_RESOLUTION_SECONDS)
    written = _last_use_written.get(api_key.pk)
    if written is not None and (api_key.last_used_at is None or api_key.last_used_at < written):
        api_key.last_used_at = written  # the key's row was kept from before this process wrote it
    if api_key.last_used_at is None or api_key.last_used_at < stale:
        # A conditional UPDATE: concurrent requests with one key write once, not once each.
        ApiKey.objects.filter(pk=api_key.pk).filter(Q(last_used_at__isnull=True) | Q(last_used_at__lt=stale)).update(
            last_used_at=now
        )
        api_key.last_used_at = now
        if len(_last_use_written) >= _LAST_USE_KEEP:
            _last_use_written.clear()
        _last_use_written[api_key.pk] = now
    return api_key


# When this process last wrote each key's `last_used_at`. The key rows the process keeps
# (config/config_cache.py) are not renewed by that write, which changes no config.
_LAST_USE_KEEP = 10_000
_last_use_written: dict[int, datetime] = {}


# --- Agents -----------------------------------------------------------------------------------


def agent_create(
    *,
    workspace: Workspace,
    slug: str,
    name: str,
    description: str = "",
    owner: User | None = None,
    status: str = AgentStatus.DRAFT,
    created_by: User | None = None,
    created_via_key: ApiKey | None = None,
) -> Agent:
    agent = Agent(workspace=workspace, slug=slug, name=name, description=description, owner=owner, status=status)
    agent.full_clean(exclude=["current_requirements"], validate_unique=False, validate_constraints=False)
    try:
        with transaction.atomic():
            agent.save()
            audit.record(
                workspace=workspace,
                action=AuditAction.AGENT_CREATED,
                user=created_by,
                api_key=created_via_key,
                target=agent,
                details={"slug": agent.slug, "status": agent.status},
            )
    except IntegrityError:
        raise exceptions.AgentSlugTaken(f"an agent with slug {slug!r} already exists in this workspace") from None
    return agent


def _audit_value(value: Any) -> Any:
    if isinstance(value, User):
        return value.get_username()
    return value


@transaction.atomic
def agent_update(
    *,
    agent: Agent,
    fields: Mapping[str, Any],
    updated_by: User | None = None,
    updated_via_key: ApiKey | None = None,
) -> Agent:
    allowed = {"name", "description", "status", "owner", "trace_retention_days"}
    for field, value in fields.items():
        if field not in allowed:
            raise exceptions.AgentInvalid(
                f"{field} cannot be changed", errors=[{"field": field, "message": "read-only"}]
            )
        # full_clean lets None through a blank=True text field, which the NOT NULL column then refuses.
        if value is None and not Agent._meta.get_field(field).null:
            raise exceptions.AgentInvalid(f"{field} cannot be null", errors=[{"field": field, "message": "not null"}])
        setattr(agent, field, value)
    agent.full_clean(exclude=["current_requirements"], validate_unique=False, validate_constraints=False)
    agent.save()
    audit.record(
        workspace=agent.workspace_id,
        action=AuditAction.AGENT_CHANGED,
        user=updated_by,
        api_key=updated_via_key,
        target=agent,
        details={"changes": {field: _audit_value(value) for field, value in sorted(fields.items())}},
    )
    return agent


def agent_delete(*, agent: Agent, deleted_by: User | None = None, deleted_via_key: ApiKey | None = None) -> None:
    with transaction.atomic():
        # A key limited to this agent alone would serve every agent once the limit cascades away
        # (no agents means all of them): revoke it instead.
        limited = ApiKey.objects.filter(agents=agent).values("pk")
        elsewhere = ApiKey.objects.filter(agents__in=Agent.objects.exclude(pk=agent.pk)).values("pk")
        revoked = (
            ApiKey.objects.filter(pk__in=limited, revoked_at__isnull=True)
            .exclude(pk__in=elsewhere)
            .update(revoked_at=timezone.now())
        )
        audit.record(
            workspace=agent.workspace_id,
            action=AuditAction.AGENT_DELETED,
            user=deleted_by,
            api_key=deleted_via_key,
            target=agent,
            details={"slug": agent.slug, "keys_revoked": revoked},
        )
        # The current-requirements pointer protects its version; release it before the cascade.
        Agent.objects.filter(pk=agent.pk).update(current_requirements=None)
        # Labels protect versions; the prompts cascade with the agent, labels first.
        PromptLabel.objects.filter(prompt__agent=agent).delete()
        Agent.objects.filter(pk=agent.pk).delete()


# --- Requirements -----------------------------------------------------------------------------


def requirements_parse(answers: Mapping[str, Any]) -> requirements.Requirements:
    """Validate answers; a failure names every offending field (`io_gap.steps_p95`, ...).

    Answers that leave the router no tier at all are refused too: the gateway would otherwise fall back to
    a tier they never enabled, with none of their budgets."""
    try:
        parsed = requirements.Requirements.model_validate(answers)
    except ValidationError as error:
        errors = [
            {"field": ".".join(str(part) for part in item["loc"]) or "answers", "message": item["msg"]}
            for item in error.errors()
        ]
        summary = "; ".join(f"{item['field']}: {item['message']}" for item in errors[:5])
        raise exceptions.RequirementsInvalid(f"invalid requirements: {summary}", errors=errors) from None
    _requirements_workable_check(parsed)
    return parsed


def _requirements_workable_check(parsed: requirements.Requirements) -> None:
    """Refuse answers under which no enabled tier may run (today: an inline latency wall with only the
    agentic tier enabled). Other feasibility errors are shown, not refused: each still leaves a router."""
    if requirements.derived_configuration(parsed).allowed_tiers.value:
        return
    ruled_out = ", ".join(tier.value for tier in parsed.routing.enabled_tiers)
    message = (
        f"no enabled tier can serve a request: the {parsed.constraints.latency.latency_class.value} latency wall "
        f"rules out {ruled_out}; enable another tier (single_call, chain or human) or relax the latency class"
    )
    raise exceptions.RequirementsInvalid(
        f"invalid requirements: routing.enabled_tiers: {message}",
        errors=[
            {"field": "routing.enabled_tiers", "message": message},
            {"field": "constraints.latency.latency_class", "message": f"rules out {ruled_out}"},
        ],
    )


@transaction.atomic
def requirements_version_create(
    *,
    agent: Agent,
    answers: Mapping[str, Any],
    message: str = "",
    created_by: User | None = None,
    created_via_key: ApiKey | None = None,
) -> RequirementsVersion:
    """Save answers as the agent's next requirements version and make it current."""
    parsed = requirements_parse(answers)
    # Lock the agent so two concurrent saves cannot both take version N+1.
    locked = Agent.objects.select_for_update().get(pk=agent.pk)
    last = locked.requirements_versions.aggregate(Max("version"))["version__max"] or 0
    version = RequirementsVersion.objects.create(
        agent=locked,
        version=last + 1,
        answers=parsed.to_json(),
        message=message[:500],
        created_by=created_by,
        created_via_key=created_via_key,
    )
    Agent.objects.filter(pk=agent.pk).update(current_requirements=version, updated_at=timezone.now())
    agent.current_requirements = version
    return version


@transaction.atomic
def requirements_version_activate(
    *, agent: Agent, version: RequirementsVersion, user: User | None = None, api_key: ApiKey | None = None
) -> Agent:
    """Make an earlier (or later) version current again: a rollback is a pointer move. Saving a version
    records its author on the version; a move changes what the rest of Keel reads without a new version,
    so it is an audit event."""
    if version.agent_id != agent.pk:
        raise exceptions.RequirementsVersionNotFound("that version belongs to another agent")
    # A version saved before the rule that refuses it (requirements_parse) must not become current either.
    _requirements_workable_check(requirements.Requirements.model_validate(version.answers))
    locked = Agent.objects.select_for_update(of=("self",)).select_related("current_requirements").get(pk=agent.pk)
    previous = locked.current_requirements
    agent.current_requirements = version
    if previous is not None and previous.pk == version.pk:
        return agent
    Agent.objects.filter(pk=agent.pk).update(current_requirements=version, updated_at=timezone.now())
    audit.record(
        workspace=agent.workspace_id,
        action=AuditAction.REQUIREMENTS_ACTIVATED,
        user=user,
        api_key=api_key,
        target=agent,
        details={"from_version": previous.version if previous is not None else None, "to_version": version.version},
    )
    return agent


# --- Prompts ----------------------------------------------------------------------------------

# Path segments that the API uses after a prompt name; a name may not contain them.
RESERVED_NAME_SEGMENTS = frozenset({"versions", "labels", "diff", "render"})


def _prompt_name_check(name: str) -> None:
    problems = []
    if not name or len(name) > 200:
        problems.append("must be 1 to 200 characters")
    elif name.startswith("/") or name.endswith("/") or "//" in name:
        problems.append("must not start or end with '/' or contain '//'")
    elif RESERVED_NAME_SEGMENTS & set(name.split("/")):
        problems.append(f"must not contain a path segment named {', '.join(sorted(RESERVED_NAME_SEGMENTS))}")
    elif any(ch in name for ch in "?#%\\") or any(ord(ch) < 32 for ch in name):
        problems.append("must not contain ?, #, %, \\ or control characters")
    if problems:
        raise exceptions.PromptInvalid(f"prompt name {problems[0]}", errors=[{"field": "name", "message": problems[0]}])


def _template_check(prompt_type: str, template: Any, config: Any) -> str | list[dict[str, Any]]:
    if prompt_type not in ("text", "chat"):
        raise exceptions.PromptInvalid(
            "type must be text or chat", errors=[{"field": "type", "message": "must be text or chat"}]
        )
    if not isinstance(config, dict):
        raise exceptions.PromptInvalid(
            "config must be an object", errors=[{"field": "config", "message": "must be an object"}]
        )
    try:
        return prompts.template_validate("text" if prompt_type == "text" else "chat", template)
    except prompts.TemplateError as error:
        raise exceptions.PromptInvalid(str(error), errors=[{"field": "template", "message": str(error)}]) from None


def _label_check(label: str) -> None:
    if label == "latest":
        raise exceptions.PromptLabelInvalid(
            "latest always points at the newest version and cannot be moved",
            errors=[{"field": "label", "message": "reserved"}],
        )
    if not re.fullmatch(r"[a-z0-9][a-z0-9_.\-]{0,63}", label):
        raise exceptions.PromptLabelInvalid(
            f"label {label!r} must be lowercase letters, digits, '_', '.' or '-' (at most 64)",
            errors=[{"field": "label", "message": "invalid"}],
        )


@transaction.atomic
def prompt_create(
    *,
    agent: Agent,
    name: str,
    type: str,
    template: Any,
    config: Mapping[str, Any] | None = None,
    description: str = "",
    tags: Sequence[str] = (),
    commit_message: str = "",
    labels: Sequence[str] = (),
    created_by: User | None = None,
    created_via_key: ApiKey | None = None,
) -> PromptVersion:
    """Create a prompt with its first version (and labels on it)."""
    _prompt_name_check(name)
    _template_check(type, template, dict(config or {}))
    for label in labels:
        _label_check(label)
    # The column's varchar(64) would silently cut a longer tag: refuse it, as prompt_update does.
    cleaned_tags = _tags_clean(tags)
    try:
        with transaction.atomic():
            prompt = Prompt.objects.create(
                workspace_id=agent.workspace_id,
                agent=agent,
                name=name,
                description=description,
                tags=cleaned_tags,
            )
    except IntegrityError:
        raise exceptions.PromptNameTaken(f"a prompt named {name!r} already exists in this workspace") from None
    return prompt_version_create(
        prompt=prompt,
        type=type,
        template=template,
        config=config,
        commit_message=commit_message,
        labels=labels,
        created_by=created_by,
        created_via_key=created_via_key,
    )


@transaction.atomic
def prompt_version_create(
    *,
    prompt: Prompt,
    template: Any,
    type: str | None = None,
    config: Mapping[str, Any] | None = None,
    commit_message: str = "",
    labels: Sequence[str] = (),
    created_by: User | None = None,
    created_via_key: ApiKey | None = None,
) -> PromptVersion:
    """Publish the prompt's next version; `labels` move to it in the same transaction."""
    # Lock the prompt so two concurrent publishes cannot both take version N+1.
    locked = Prompt.objects.select_for_update().get(pk=prompt.pk)
    last_version = locked.versions.order_by("-version").first()
    prompt_type = type or (last_version.type if last_version else "text")
    config_value = dict(config) if config is not None else {}
    canonical = _template_check(prompt_type, template, config_value)
    if last_version is not None and prompt_type != last_version.type:
        # Callers fetch a label and expect its shape (the Langfuse SDK picks its client class by type); a
        # rollback across types would change it under them. Langfuse refuses the same way.
        raise exceptions.PromptTypeChanged(
            f"{locked.name} is a {last_version.type} prompt; a new version cannot be {prompt_type} (create a "
            "prompt with another name instead)",
            errors=[{"field": "type", "message": f"must be {last_version.type}, as the earlier versions"}],
        )
    for label in labels:
        _label_check(label)
    version = PromptVersion.objects.create(
        prompt=locked,
        version=(last_version.version if last_version else 0) + 1,
        type=prompt_type,
        template=canonical,
        config=config_value,
        commit_message=commit_message[:500],
        created_by=created_by,
        created_via_key=created_via_key,
    )
    for label in dict.fromkeys(labels):
        prompt_label_move(
            prompt=locked, label=label, version=version, moved_by=created_by, moved_via_key=created_via_key
        )
    return version


@transaction.atomic
def prompt_label_move(
    *,
    prompt: Prompt,
    label: str,
    version: PromptVersion,
    moved_by: User | None = None,
    moved_via_key: ApiKey | None = None,
) -> PromptLabel:
    """Point `label` at `version` (creating the label if new): a deploy, or a rollback."""
    _label_check(label)
    if version.prompt_id != prompt.pk:
        raise exceptions.PromptVersionNotFound("that version belongs to another prompt")
    existing = PromptLabel.objects.select_for_update().filter(prompt=prompt, name=label).first()
    if existing is not None and existing.version_id == version.pk:
        return existing
    previous = existing.version if existing is not None else None
    if existing is None:
        existing = PromptLabel.objects.create(prompt=prompt, name=label, version=version)
    else:
        existing.version = version
        existing.save(update_fields=["version", "updated_at"])
    move = PromptLabelMove.objects.create(
        prompt=prompt,
        label=label,
        from_version=previous,
        to_version=version,
        moved_by=moved_by,
        moved_via_key=moved_via_key,
    )
    audit.record(
        workspace=prompt.workspace_id,
        action=AuditAction.PROMPT_LABEL_MOVED,
        user=moved_by,
        api_key=moved_via_key,
        target=prompt,
        details={
            "label": label,
            "from_version": previous.version if previous is not None else None,
            "to_version": version.version,
            "label_move_id": move.pk,
        },
    )
    return existing


@transaction.atomic
def prompt_label_delete(
    *, prompt: Prompt, label: str, moved_by: User | None = None, moved_via_key: ApiKey | None = None
) -> None:
    existing = PromptLabel.objects.select_for_update().filter(prompt=prompt, name=label).first()
    if existing is None:
        raise exceptions.PromptLabelNotFound(f"prompt {prompt.name!r} has no label {label!r}")
    move = PromptLabelMove.objects.create(
        prompt=prompt,
        label=label,
        from_version_id=existing.version_id,
        to_version=None,
        moved_by=moved_by,
        moved_via_key=moved_via_key,
    )
    audit.record(
        workspace=prompt.workspace_id,
        action=AuditAction.PROMPT_LABEL_DELETED,
        user=moved_by,
        api_key=moved_via_key,
        target=prompt,
        details={"label": label, "from_version": existing.version.version, "label_move_id": move.pk},
    )
    existing.delete()


# The limits the API's schemas put on a prompt's description and tags, enforced here for every caller.
PROMPT_DESCRIPTION_MAX = 10_000
PROMPT_TAGS_MAX = 50
PROMPT_TAG_LENGTH_MAX = 64


def _tags_clean(tags: Sequence[str]) -> list[str]:
    cleaned = sorted({tag.strip() for tag in tags if tag.strip()})
    too_long = [tag for tag in cleaned if len(tag) > PROMPT_TAG_LENGTH_MAX]
    if too_long:
        raise exceptions.PromptInvalid(
            f"tag {too_long[0][:20]!r}… is longer than {PROMPT_TAG_LENGTH_MAX} characters",
            errors=[{"field": "tags", "message": f"at most {PROMPT_TAG_LENGTH_MAX} characters each"}],
        )
    if len(cleaned) > PROMPT_TAGS_MAX:
        raise exceptions.PromptInvalid(
            f"a prompt has at most {PROMPT_TAGS_MAX} tags",
            errors=[{"field": "tags", "message": f"at most {PROMPT_TAGS_MAX}"}],
        )
    return cleaned


def prompt_update(*, prompt: Prompt, description: str | None = None, tags: Sequence[str] | None = None) -> Prompt:
    """Change what describes a prompt; None leaves a field as it is. Name, agent and versions never change:
    clients find a prompt by its name, and its versions are immutable."""
    changes: dict[str, Any] = {}
    if description is not None:
        if len(description) > PROMPT_DESCRIPTION_MAX:
            raise exceptions.PromptInvalid(
                f"the description is longer than {PROMPT_DESCRIPTION_MAX} characters",
                errors=[{"field": "description", "message": f"at most {PROMPT_DESCRIPTION_MAX} characters"}],
            )
        changes["description"] = description
    if tags is not None:
        changes["tags"] = _tags_clean(tags)
    if changes:
        Prompt.objects.filter(pk=prompt.pk).update(**changes)
        for field, value in changes.items():
            setattr(prompt, field, value)
    return prompt


@transaction.atomic
def prompt_delete(*, prompt: Prompt, deleted_by: User | None = None, deleted_via_key: ApiKey | None = None) -> None:
    """Delete a prompt with its versions, labels and deployment history (label moves).

    Refused with `PromptInUse`, nothing deleted, while something still depends on one of its versions
    (`agent_registry.selectors.prompt_in_use_reasons`):
    - the `production` label points at one: clients asking for the prompt would start getting 404s, so
      taking it out of production is a separate, deliberate step (delete the label first);
    - a trajectory recorded one: its record of which prompt produced it would silently vanish;
    - a chain step of the routing tier runs one (that foreign key protects the version).
    What goes with the versions: the gateway's cached answers for them (they cascade), and a replay that
    tried one keeps its result with the version unset (that foreign key sets null).
    """
    # Lock the prompt so that no version is published while it is being deleted.
    locked = Prompt.objects.select_for_update().get(pk=prompt.pk)
    reasons = selectors.prompt_in_use_reasons(prompt=locked)
    if reasons:
        raise exceptions.PromptInUse(
            f"prompt {locked.name!r} is in use: {'; '.join(reasons)}",
            errors=[{"field": "prompt", "message": reason} for reason in reasons],
        )
    audit.record(
        workspace=locked.workspace_id,
        action=AuditAction.PROMPT_DELETED,
        user=deleted_by,
        api_key=deleted_via_key,
        target=locked,
        details={"versions": locked.versions.count()},
    )
    # Labels protect their versions; they go first, then the prompt with everything that cascades from it.
    PromptLabel.objects.filter(prompt=locked).delete()
    Prompt.objects.filter(pk=locked.pk).delete()


def prompt_version_render(
    *,
    version: PromptVersion,
    variables: Mapping[str, Any],
    placeholders: Mapping[str, list[dict[str, Any]]] | None = None,
) -> str | list[dict[str, Any]]:
    """Fill the version's variables as the gateway does: the version's defaults (`config.variables`), then
    the caller's values over them."""
    defaults = version.config.get("variables") if isinstance(version.config, dict) else None
    merged = {**(defaults if isinstance(defaults, dict) else {}), **variables}
    try:
        return prompts.template_render(version.template, merged, placeholders)
    except prompts.MissingVariables as error:
        raise exceptions.PromptVariablesMissing(
            f"missing values for: {', '.join(error.names)}",
            errors=[{"field": f"variables.{name}", "message": "required"} for name in error.names],
        ) from None


# --- Operations -------------------------------------------------------------------------------


def worker_heartbeat_record(*, hostname: str) -> None:
    now = timezone.now()
    updated = WorkerHeartbeat.objects.filter(hostname=hostname).update(last_seen_at=now, beats=F("beats") + 1)
    if not updated:
        WorkerHeartbeat.objects.get_or_create(hostname=hostname, defaults={"last_seen_at": now, "beats": 1})
