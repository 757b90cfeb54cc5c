"""Writes of routing's management plane: model targets (from the API, the dashboard, or KEEL_MODEL_TARGETS),
an agent's router configuration, chain and tools, and the hand-off queue.

Every function takes keyword arguments, validates, and either commits whole or raises one of
routing.exceptions with nothing written. Validation errors name each field: `errors=[{"field", "message"}]`.
Secrets (provider keys, tool endpoint secrets) are stored encrypted (config/crypto.py) and never returned.
The data plane (routing decisions, shadow runs, the cache) writes its own rows elsewhere.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlsplit

import jsonschema
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError, transaction
from django.db.models import ProtectedError
from django.utils import timezone

from agent_registry import audit
from agent_registry.models import Agent, ApiKey, AuditAction, PromptVersion, User, Workspace
from config import crypto
from routing import cache, exceptions, router
from routing.models import (
    AgentTool,
    ChainStep,
    Handoff,
    HandoffStatus,
    ModelTarget,
    RouterConfig,
    TargetSource,
)
from tracing import outbound

Errors = list[dict[str, str]]


def _django_errors(error: DjangoValidationError, prefix: str = "") -> Errors:
    if hasattr(error, "error_dict"):
        return [
            {"field": f"{prefix}{name}" if name != "__all__" else prefix.rstrip("."), "message": message}
            for name, messages in error.message_dict.items()
            for message in messages
        ]
    return [{"field": prefix.rstrip("."), "message": message} for message in error.messages]


def _summary(errors: Errors) -> str:
    return "; ".join(f"{item['field']}: {item['message']}" if item["field"] else item["message"] for item in errors[:5])


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _schema_errors(schema: object, *, require_object_type: bool) -> list[str]:
    """What is wrong with `schema` as a JSON Schema (empty: nothing)."""
    if not isinstance(schema, dict):
        return ["must be a JSON object (a JSON Schema)"]
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as error:
        return [f"is not a valid JSON Schema: {error.message}"]
    if require_object_type and schema.get("type") != "object":
        return ['must describe an object: {"type": "object", "properties": {...}}']
    return []


# --- Model targets ----------------------------------------------------------------------------------

# What a model target's writer may set; health (failures, cooldown, last error) belongs to the gateway.
MODEL_TARGET_FIELDS: Final = frozenset(
    {
        "model",
        "api_base",
        "api_key",
        "tier",
        "timeout_seconds",
        "max_retries",
        "fallbacks",
        "failure_threshold",
        "cooldown_seconds",
        "enabled",
    }
)
TIMEOUT_SECONDS_MAX: Final = 600.0


def api_base_error(api_base: str) -> str | None:
    """What is wrong with an API base (None: nothing). Not Django's URLValidator: it wants a top-level
    domain, and a model server is often reached by a bare host name, such as a Compose service's
    (`http://ollama:11434`, `http://vllm:8000/v1`). litellm speaks HTTP to it, so http(s) only. Private and
    loopback hosts are fine; a cloud's metadata service is not (`OutboundPolicy.for_model_servers`), and
    each call checks again (`providers.call_arguments`)."""
    if not api_base:
        return None
    longest = ModelTarget._meta.get_field("api_base").max_length or 0
    if len(api_base) > longest:
        return f"must be at most {longest} characters"
    try:
        parts = urlsplit(api_base)
        # urlsplit reads the port only when asked: one that is not a number from 0 to 65535 raises here.
        host, _port = parts.hostname, parts.port
    except ValueError:
        return "is not a valid URL"
    if parts.scheme not in ("http", "https") or not host or any(char.isspace() for char in api_base):
        return "must be an http(s) URL with a host, e.g. http://127.0.0.1:8000/v1"
    return outbound.OutboundPolicy.for_model_servers().url_refusal(api_base)


def _destination(target: ModelTarget) -> tuple[str, str]:
    """Where a target's key goes: its endpoint and its provider (the model string's prefix)."""
    return target.api_base, target.model.partition("/")[0] if "/" in target.model else ""


def _model_target_apply(target: ModelTarget, fields: Mapping[str, Any], prefix: str = "") -> tuple[list[str], Errors]:
    """Set `fields` on the unsaved `target`; return the columns that changed and what is wrong."""
    errors: Errors = []
    changed: list[str] = []
    destination = _destination(target)
    unknown = sorted(set(fields) - MODEL_TARGET_FIELDS)
    for name in unknown:
        errors.append({"field": f"{prefix}{name}", "message": "unknown field"})

    def put(column: str, value: object) -> None:
        if getattr(target, column) != value:
            setattr(target, column, value)
            changed.append(column)

    for name, value in fields.items():
        if name in unknown:
            continue
        if name == "api_key":
            # None keeps the stored key; "" removes it.
            if value is None:
                continue
            if not isinstance(value, str):
                errors.append({"field": f"{prefix}api_key", "message": "must be a string"})
            elif value == "":
                put("api_key_encrypted", "")
            elif not target.api_key_encrypted or _decrypted(target.api_key_encrypted) != value:
                put("api_key_encrypted", crypto.encrypt(value))
        elif name == "fallbacks":
            if not isinstance(value, list | tuple) or not all(isinstance(alias, str) for alias in value):
                errors.append({"field": f"{prefix}fallbacks", "message": "must be a list of target aliases"})
                continue
            put("fallbacks", list(dict.fromkeys(alias.strip() for alias in value if alias.strip())))
        elif name in ("model", "api_base", "tier"):
            if value is not None and not isinstance(value, str):
                errors.append({"field": f"{prefix}{name}", "message": "must be a string"})
                continue
            put(name, (value or "").strip())
        elif name == "enabled":
            if not isinstance(value, bool):
                errors.append({"field": f"{prefix}enabled", "message": "must be true or false"})
                continue
            put("enabled", value)
        elif name == "timeout_seconds":
            if not _is_number(value) or not 0 < value <= TIMEOUT_SECONDS_MAX:
                errors.append(
                    {
                        "field": f"{prefix}timeout_seconds",
                        "message": f"must be above 0 and at most {TIMEOUT_SECONDS_MAX:g}",
                    }
                )
                continue
            put("timeout_seconds", float(value))
        else:  # max_retries, failure_threshold, cooldown_seconds
            limit = {"max_retries": 10, "failure_threshold": 100, "cooldown_seconds": 86_400}[name]
            low = 1 if name == "failure_threshold" else 0
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= limit:
                errors.append({"field": f"{prefix}{name}", "message": f"must be a whole number from {low} to {limit}"})
                continue
            put(name, value)
    if not target.model:
        errors.append(
            {"field": f"{prefix}model", "message": "a litellm model string is required, e.g. openai/gpt-4o-mini"}
        )
    if target.pk and target.api_key_encrypted and fields.get("api_key") is None and _destination(target) != destination:
        # Whoever may edit a target may not read its key: a key is never sent to a place it was not entered for.
        errors.append(
            {"field": f"{prefix}api_key", "message": 'enter the key again (or "" for none) to send it somewhere new'}
        )
    api_base_problem = api_base_error(target.api_base)
    if api_base_problem:
        errors.append({"field": f"{prefix}api_base", "message": api_base_problem})
    try:
        # Uniqueness and the fallbacks are checked against the database by the callers; the API base above.
        target.full_clean(
            exclude=["workspace", "fallbacks", "api_base"], validate_unique=False, validate_constraints=False
        )
    except DjangoValidationError as error:
        reported = {item["field"] for item in errors}
        errors.extend(item for item in _django_errors(error, prefix) if item["field"] not in reported)
    return changed, errors


def _decrypted(token: str) -> str | None:
    try:
        return crypto.decrypt(token)
    except crypto.DecryptionFailed:
        return None


def _fallback_errors(target: ModelTarget, prefix: str = "") -> Errors:
    if target.alias in target.fallbacks:
        return [{"field": f"{prefix}fallbacks", "message": "a target cannot fall back to itself"}]
    known = set(
        ModelTarget.objects.filter(workspace_id=target.workspace_id, alias__in=target.fallbacks).values_list(
            "alias", flat=True
        )
    )
    missing = [alias for alias in target.fallbacks if alias not in known]
    if missing:
        return [
            {"field": f"{prefix}fallbacks", "message": f"no model target named {', '.join(missing)} in this workspace"}
        ]
    return []


def _model_target_insert(target: ModelTarget) -> None:
    try:
        # A savepoint: a concurrent create of the same alias fails here without breaking the caller's transaction.
        with transaction.atomic():
            target.save()
    except IntegrityError:
        raise exceptions.ModelTargetAliasTaken(
            f"there is already a model target {target.alias!r} in this workspace"
        ) from None


@transaction.atomic
def model_target_create(
    *,
    workspace: Workspace,
    alias: str,
    model: str,
    api_base: str = "",
    api_key: str | None = None,
    tier: str = "",
    timeout_seconds: float = 30.0,
    max_retries: int = 2,
    fallbacks: Sequence[str] = (),
    failure_threshold: int = 3,
    cooldown_seconds: int = 30,
    enabled: bool = True,
    created_by: User | None = None,
    created_via_key: ApiKey | None = None,
) -> ModelTarget:
    """Add a target the workspace's agents (and direct gateway calls by alias) can use.

    `alias` is unique in the workspace (409 otherwise); every fallback names another target of it.
    """
    alias = alias.strip()
    if ModelTarget.objects.filter(workspace=workspace, alias=alias).exists():
        raise exceptions.ModelTargetAliasTaken(f"there is already a model target {alias!r} in this workspace")
    target = ModelTarget(workspace=workspace, alias=alias, source=TargetSource.API)
    _, errors = _model_target_apply(
        target,
        {
            "model": model,
            "api_base": api_base,
            "api_key": api_key or None,
            "tier": tier,
            "timeout_seconds": timeout_seconds,
            "max_retries": max_retries,
            "fallbacks": list(fallbacks),
            "failure_threshold": failure_threshold,
            "cooldown_seconds": cooldown_seconds,
            "enabled": enabled,
        },
    )
    errors = errors or _fallback_errors(target)
    if errors:
        raise exceptions.ModelTargetInvalid(f"invalid model target: {_summary(errors)}", errors=errors)
    _model_target_insert(target)
    audit.record(
        workspace=workspace,
        action=AuditAction.MODEL_TARGET_CREATED,
        user=created_by,
        api_key=created_via_key,
        target=target,
        target_name=target.alias,
        details={"model": target.model, "has_api_key": bool(target.api_key_encrypted)},
    )
    return target


def _audited_columns(changed: Sequence[str]) -> list[str]:
    """The changed columns under the names callers use (the key is `api_key`, never its ciphertext)."""
    return sorted(column.removesuffix("_encrypted") for column in changed)


def _writable(target: ModelTarget) -> None:
    if target.source == TargetSource.ENVIRONMENT:
        raise exceptions.ModelTargetReadOnly(
            f"model target {target.alias!r} comes from KEEL_MODEL_TARGETS; change it there and run modeltargets_sync"
        )


@transaction.atomic
def model_target_update(
    *, target: ModelTarget, updated_by: User | None = None, updated_via_key: ApiKey | None = None, **fields: Any
) -> ModelTarget:
    """Change some of a target's settings (`MODEL_TARGET_FIELDS`). `api_key=None` keeps the stored key and
    `api_key=""` removes it. The alias does not change (fallbacks and configurations name it).

    Only the columns that change are written, so the gateway's concurrent health updates are kept.
    """
    _writable(target)
    if "alias" in fields:
        errors = [{"field": "alias", "message": "an alias cannot change; create a new target instead"}]
        raise exceptions.ModelTargetInvalid("an alias cannot change", errors=errors)
    locked = ModelTarget.objects.select_for_update().get(pk=target.pk)
    changed, errors = _model_target_apply(locked, fields)
    errors = errors or _fallback_errors(locked)
    if errors:
        raise exceptions.ModelTargetInvalid(f"invalid model target: {_summary(errors)}", errors=errors)
    if changed:
        locked.save(update_fields=[*changed, "updated_at"])
        audit.record(
            workspace=locked.workspace_id,
            action=AuditAction.MODEL_TARGET_CHANGED,
            user=updated_by,
            api_key=updated_via_key,
            target=locked,
            target_name=locked.alias,
            details={"fields": _audited_columns(changed)},
        )
    return locked


@transaction.atomic
def model_target_delete(
    *, target: ModelTarget, deleted_by: User | None = None, deleted_via_key: ApiKey | None = None
) -> None:
    """Remove a target. Refused (409) while another target falls back to it or a chain step calls it;
    router configurations that named it fall back to the agent's defaults."""
    _writable(target)
    dependants = sorted(
        ModelTarget.objects.filter(workspace_id=target.workspace_id, fallbacks__contains=[target.alias]).values_list(
            "alias", flat=True
        )
    )
    if dependants:
        raise exceptions.ModelTargetInUse(
            f"model target {target.alias!r} is a fallback of {', '.join(dependants)}; remove it from there first"
        )
    # The cache review keeps the hits this target's answers served (and their flags) past the deletion.
    cache.cache_entries_retire_for_target(target=target)
    audit.record(
        workspace=target.workspace_id,
        action=AuditAction.MODEL_TARGET_DELETED,
        user=deleted_by,
        api_key=deleted_via_key,
        target=target,
        target_name=target.alias,
    )
    try:
        target.delete()
    except ProtectedError:
        steps = (
            ChainStep.objects.filter(model_target=target).select_related("agent").order_by("agent__slug", "position")
        )
        names = ", ".join(f"{step.agent.slug}/{step.name}" for step in steps)
        raise exceptions.ModelTargetInUse(
            f"model target {target.alias!r} is used by chain step {names}; change the chain first"
        ) from None


# --- Model targets from the environment ------------------------------------------------------------

SPEC_SETTING: Final = "KEEL_MODEL_TARGETS"
_SPEC_KEYS: Final = frozenset(
    {"alias", "model", "api_base", "api_key", "tier", "timeout_seconds", "max_retries", "fallbacks"}
)


@dataclass(frozen=True)
class ModelTargetSync:
    """What one sync did, by alias."""

    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    retired: list[str] = field(default_factory=list)


def model_target_spec_parse(spec: str) -> list[dict[str, Any]]:
    """The targets KEEL_MODEL_TARGETS declares: a JSON list of {"alias", "model", "api_base"?, "api_key"?,
    "tier"?, "timeout_seconds"?, "max_retries"?, "fallbacks"?}. Empty declares none."""
    if not spec.strip():
        return []
    try:
        items = json.loads(spec)
    except json.JSONDecodeError as error:
        errors = [{"field": SPEC_SETTING, "message": f"not valid JSON: {error.msg} at character {error.pos}"}]
        raise exceptions.ModelTargetSpecInvalid(f"{SPEC_SETTING} is not valid JSON", errors=errors) from None
    if not isinstance(items, list):
        errors = [{"field": SPEC_SETTING, "message": "must be a JSON list of targets"}]
        raise exceptions.ModelTargetSpecInvalid(f"{SPEC_SETTING} must be a JSON list", errors=errors)
    errors = []
    seen: set[str] = set()
    for index, item in enumerate(items):
        where = f"{SPEC_SETTING}[{index}]"
        if not isinstance(item, dict):
            errors.append({"field": where, "message": "must be a JSON object"})
            continue
        errors.extend({"field": f"{where}.{key}", "message": "unknown key"} for key in sorted(set(item) - _SPEC_KEYS))
        alias = item.get("alias")
        if not isinstance(alias, str) or not alias.strip():
            errors.append({"field": f"{where}.alias", "message": "required"})
        elif alias.strip() in seen:
            errors.append({"field": f"{where}.alias", "message": f"{alias!r} is declared twice"})
        else:
            seen.add(alias.strip())
    if errors:
        raise exceptions.ModelTargetSpecInvalid(f"{SPEC_SETTING} is invalid: {_summary(errors)}", errors=errors)
    return items


@transaction.atomic
def model_targets_sync_from_env(*, workspace: Workspace, spec: str) -> ModelTargetSync:
    """Make the workspace's environment targets what `spec` (KEEL_MODEL_TARGETS) declares.

    A declared alias is created, or updated in place (a target made in the dashboard with that alias is
    taken over: the environment is the operator's word). Environment targets no longer declared are
    disabled rather than deleted, so chain steps and configurations that name them stay valid. The
    gateway's health counters are never touched. All or nothing: one bad entry writes nothing.
    """
    items = model_target_spec_parse(spec)
    result = ModelTargetSync()
    existing = {target.alias: target for target in ModelTarget.objects.select_for_update().filter(workspace=workspace)}
    errors: Errors = []
    saved: list[tuple[int, ModelTarget]] = []
    for index, item in enumerate(items):
        alias = item["alias"].strip()
        target = existing.get(alias) or ModelTarget(workspace=workspace, alias=alias)
        fields: dict[str, Any] = {
            "model": item.get("model"),
            "api_base": item.get("api_base", ""),
            "api_key": item.get("api_key") or "",
            "tier": item.get("tier", ""),
            "timeout_seconds": item.get("timeout_seconds", 30.0),
            "max_retries": item.get("max_retries", 2),
            "fallbacks": item.get("fallbacks", []),
            "enabled": True,
        }
        changed, item_errors = _model_target_apply(target, fields, prefix=f"{SPEC_SETTING}[{index}].")
        if target.source != TargetSource.ENVIRONMENT:
            target.source = TargetSource.ENVIRONMENT
            changed.append("source")
        errors.extend(item_errors)
        if item_errors:
            continue
        if target._state.adding:
            _model_target_insert(target)
            audit.record(workspace=workspace, action=AuditAction.MODEL_TARGET_CREATED, target=target, target_name=alias)
            result.created.append(alias)
        elif changed:
            target.save(update_fields=[*changed, "updated_at"])
            audit.record(
                workspace=workspace,
                action=AuditAction.MODEL_TARGET_CHANGED,
                target=target,
                target_name=alias,
                details={"fields": _audited_columns(changed)},
            )
            result.updated.append(alias)
        else:
            result.unchanged.append(alias)
        saved.append((index, target))
    # Fallbacks may name targets declared after them: check once every declared target is saved.
    for index, target in saved:
        errors.extend(_fallback_errors(target, prefix=f"{SPEC_SETTING}[{index}]."))
    if errors:
        raise exceptions.ModelTargetSpecInvalid(f"{SPEC_SETTING} is invalid: {_summary(errors)}", errors=errors)
    declared = {item["alias"].strip() for item in items}
    for alias, target in sorted(existing.items()):
        if target.source == TargetSource.ENVIRONMENT and alias not in declared and target.enabled:
            target.enabled = False
            target.save(update_fields=["enabled", "updated_at"])
            audit.record(
                workspace=workspace,
                action=AuditAction.MODEL_TARGET_CHANGED,
                target=target,
                target_name=alias,
                details={"fields": ["enabled"], "reason": f"no longer in {SPEC_SETTING}"},
            )
            result.retired.append(alias)
    return result


# --- Router configuration ---------------------------------------------------------------------------

ROUTER_TARGET_FIELDS: Final = ("single_call_target", "agentic_target", "judge_target", "embedding_target")
ROUTER_CONFIG_FIELDS: Final = frozenset(
    {
        *ROUTER_TARGET_FIELDS,
        "rules",
        "intents",
        "neighbours",
        "min_neighbours",
        "cost_weight",
        "latency_weight",
        "risk_weight",
        "shadow_rate",
        "speculative_single_call",
        "cache_enabled",
        "cache_threshold",
        "cache_ttl_seconds",
        "cache_end_user_requests",
        "human_message",
    }
)
_RULE_KEYS: Final = ("name", "kind", "value", "to_tier", "reason")
NEIGHBOURS_MAX: Final = 200
CACHE_TTL_MAX_SECONDS: Final = 90 * 24 * 3600


def router_config_get_or_create(*, agent: Agent) -> RouterConfig:
    config, _ = RouterConfig.objects.get_or_create(agent=agent)
    return config


def _target_resolve(*, workspace_id: int, value: object, name: str) -> tuple[ModelTarget | None, Errors]:
    """A target given as itself or by alias; None or "" clears. Another workspace's target is refused."""
    if value is None or value == "":
        return None, []
    if isinstance(value, ModelTarget):
        if value.workspace_id != workspace_id:
            return None, [{"field": name, "message": "no such model target in this workspace"}]
        return value, []
    if isinstance(value, str):
        target = ModelTarget.objects.filter(workspace_id=workspace_id, alias=value.strip()).first()
        if target is None:
            return None, [{"field": name, "message": f"no model target {value!r} in this workspace"}]
        return target, []
    return None, [{"field": name, "message": "must be a model target alias"}]


def _rules_check(value: object) -> tuple[list[dict[str, str]], Errors]:
    if not isinstance(value, list | tuple):
        return [], [{"field": "rules", "message": "must be a list of rules"}]
    rules: list[dict[str, str]] = []
    errors: Errors = []
    for index, item in enumerate(value):
        if not isinstance(item, Mapping):
            errors.append({"field": f"rules[{index}]", "message": "must be an object"})
            continue
        unknown = sorted(set(item) - set(_RULE_KEYS))
        errors.extend({"field": f"rules[{index}].{key}", "message": "unknown key"} for key in unknown)
        if any(not isinstance(item.get(key, ""), str) for key in _RULE_KEYS):
            errors.append({"field": f"rules[{index}]", "message": "every part of a rule is text"})
            continue
        rule = {key: str(item.get(key, "")).strip() for key in _RULE_KEYS}
        if not rule["name"]:
            errors.append({"field": f"rules[{index}].name", "message": "a rule needs a name (decisions cite it)"})
        elif rule["name"] in {earlier["name"] for earlier in rules}:
            errors.append({"field": f"rules[{index}].name", "message": f"{rule['name']!r} names two rules"})
        rules.append(rule)
    if errors:
        return rules, errors
    parsed = [router.Rule(**rule) for rule in rules]
    errors.extend({"field": "rules", "message": message} for message in router.rule_errors(parsed))
    return rules, errors


def _intents_check(value: object) -> tuple[dict[str, list[str]], Errors]:
    if not isinstance(value, Mapping):
        return {}, [{"field": "intents", "message": "must map an intent label to its phrases"}]
    intents: dict[str, list[str]] = {}
    for label, phrases in value.items():
        if not isinstance(label, str) or not label.strip():
            return {}, [{"field": "intents", "message": "an intent label cannot be empty"}]
        if not isinstance(phrases, list | tuple) or not all(isinstance(phrase, str) for phrase in phrases):
            return {}, [{"field": f"intents.{label}", "message": "must be a list of phrases"}]
        cleaned = [phrase.strip() for phrase in phrases if phrase.strip()]
        if not cleaned:
            return {}, [{"field": f"intents.{label}", "message": "needs at least one phrase"}]
        intents[label.strip()] = cleaned
    return intents, []


def _number_error(name: str, value: object, low: float, high: float, *, low_open: bool = False) -> Errors:
    if not _is_number(value):
        return [{"field": name, "message": "must be a number"}]
    assert isinstance(value, int | float)
    if value > high or value < low or (low_open and value == low):
        bound = "above" if low_open else "from"
        return [{"field": name, "message": f"must be {bound} {low:g} and at most {high:g}"}]
    return []


@transaction.atomic
def router_config_update(
    *, agent: Agent, updated_by: User | None = None, updated_via_key: ApiKey | None = None, **fields: Any
) -> RouterConfig:
    """Change some of the agent's router settings (`ROUTER_CONFIG_FIELDS`); the rest stay.

    Targets are given as `ModelTarget`s or aliases and must be the agent's workspace's; rules are
    `{"name", "kind", "value", "to_tier", "reason"}` and checked by `routing.router.rule_errors`;
    `shadow_rate` is a share (0..1); `cache_threshold` a cosine similarity (above 0, at most 1).
    """
    errors: Errors = [
        {"field": name, "message": "unknown field"} for name in sorted(set(fields) - ROUTER_CONFIG_FIELDS)
    ]
    config = router_config_get_or_create(agent=agent)
    config = RouterConfig.objects.select_for_update().get(pk=config.pk)
    for name, value in fields.items():
        if name in ROUTER_TARGET_FIELDS:
            target, target_errors = _target_resolve(workspace_id=agent.workspace_id, value=value, name=name)
            errors.extend(target_errors)
            setattr(config, name, target)
        elif name == "rules":
            config.rules, rule_errors = _rules_check(value)
            errors.extend(rule_errors)
        elif name == "intents":
            config.intents, intent_errors = _intents_check(value)
            errors.extend(intent_errors)
        elif name in ("neighbours", "min_neighbours", "cache_ttl_seconds"):
            high = {"neighbours": NEIGHBOURS_MAX, "min_neighbours": NEIGHBOURS_MAX}.get(name, CACHE_TTL_MAX_SECONDS)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= high:
                errors.append({"field": name, "message": f"must be a whole number from 1 to {high}"})
            else:
                setattr(config, name, value)
        elif name in ("cost_weight", "latency_weight", "risk_weight"):
            number_errors = _number_error(name, value, 0, router.WEIGHT_MAX)
            errors.extend(number_errors)
            if not number_errors:
                setattr(config, name, float(value))
        elif name == "shadow_rate":
            number_errors = _number_error(name, value, 0, 1)
            errors.extend(number_errors)
            if not number_errors:
                config.shadow_rate = float(value)
        elif name == "cache_threshold":
            number_errors = _number_error(name, value, 0, 1, low_open=True)
            errors.extend(number_errors)
            if not number_errors:
                config.cache_threshold = float(value)
        elif name in ("speculative_single_call", "cache_enabled", "cache_end_user_requests"):
            if not isinstance(value, bool):
                errors.append({"field": name, "message": "must be true or false"})
            else:
                setattr(config, name, value)
        elif name == "human_message":
            if not isinstance(value, str) or len(value) > 2000:
                errors.append({"field": name, "message": "must be text of at most 2000 characters"})
            else:
                config.human_message = value.strip()
    if not errors and config.min_neighbours > config.neighbours:
        errors.append({"field": "min_neighbours", "message": "cannot be more than the neighbours looked at"})
    if errors:
        raise exceptions.RouterConfigInvalid(f"invalid router configuration: {_summary(errors)}", errors=errors)
    config.save()
    audit.record(
        workspace=agent.workspace_id,
        action=AuditAction.ROUTER_CHANGED,
        user=updated_by,
        api_key=updated_via_key,
        target=agent,
        details={"fields": sorted(fields)},
    )
    return config


# --- Chain ------------------------------------------------------------------------------------------

CHAIN_STEPS_MAX: Final = 20
_STEP_KEYS: Final = frozenset({"name", "prompt_version", "instructions", "model_target", "output_schema"})
_STEP_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")


@transaction.atomic
def chain_steps_set(
    *,
    agent: Agent,
    steps: Sequence[Mapping[str, Any]],
    updated_by: User | None = None,
    updated_via_key: ApiKey | None = None,
) -> list[ChainStep]:
    """Replace the agent's whole chain with `steps`, run in the order given.

    Each step: `name` (a slug, unique in the chain); `prompt_version` (the id of a version of one of the
    agent's prompts) or `instructions`, not both; `model_target` (an alias of the workspace, or none for
    the agent's single-call target); `output_schema` (a JSON Schema the step's JSON answer must pass, or
    none). An empty list removes the chain.
    """
    # Lock the agent so two concurrent saves cannot interleave their deletes and inserts.
    agent = Agent.objects.select_for_update().get(pk=agent.pk)
    errors: Errors = []
    if len(steps) > CHAIN_STEPS_MAX:
        errors.append({"field": "steps", "message": f"a chain has at most {CHAIN_STEPS_MAX} steps"})
    version_ids = {step.get("prompt_version") for step in steps} - {None, ""}
    versions = {
        version.pk: version
        for version in PromptVersion.objects.filter(
            pk__in=[value for value in version_ids if isinstance(value, int) and not isinstance(value, bool)],
            prompt__agent=agent,
        )
    }
    built: list[ChainStep] = []
    names: set[str] = set()
    for index, step in enumerate(steps):
        where = f"steps[{index}]."
        errors.extend({"field": f"{where}{key}", "message": "unknown key"} for key in sorted(set(step) - _STEP_KEYS))
        name = step.get("name")
        if not isinstance(name, str) or not _STEP_NAME.match(name.strip()):
            errors.append(
                {"field": f"{where}name", "message": "lower-case letters, digits, - and _; at most 64 characters"}
            )
            name = ""
        elif name.strip() in names:
            errors.append({"field": f"{where}name", "message": f"{name!r} names two steps"})
        name = str(name).strip()
        names.add(name)
        version_id = step.get("prompt_version")
        version = None
        if version_id not in (None, ""):
            version = versions.get(version_id) if isinstance(version_id, int) else None
            if version is None:
                errors.append({"field": f"{where}prompt_version", "message": "no such version of this agent's prompts"})
        instructions = step.get("instructions") or ""
        if not isinstance(instructions, str):
            errors.append({"field": f"{where}instructions", "message": "must be text"})
            instructions = ""
        instructions = instructions.strip()
        if version_id in (None, "") and not instructions:
            errors.append(
                {"field": f"{where}instructions", "message": "give the step instructions or a prompt version"}
            )
        elif version_id not in (None, "") and instructions:
            errors.append(
                {"field": f"{where}instructions", "message": "give instructions or a prompt version, not both"}
            )
        target, target_errors = _target_resolve(
            workspace_id=agent.workspace_id, value=step.get("model_target"), name=f"{where}model_target"
        )
        errors.extend(target_errors)
        schema = step.get("output_schema")
        if schema is not None:
            errors.extend(
                {"field": f"{where}output_schema", "message": message}
                for message in _schema_errors(schema, require_object_type=False)
            )
        built.append(
            ChainStep(
                agent=agent,
                position=index + 1,
                name=name,
                prompt_version=version,
                instructions=instructions,
                model_target=target,
                output_schema=schema,
            )
        )
    if errors:
        raise exceptions.ChainInvalid(f"invalid chain: {_summary(errors)}", errors=errors)
    ChainStep.objects.filter(agent=agent).delete()
    audit.record(
        workspace=agent.workspace_id,
        action=AuditAction.ROUTER_CHANGED,
        user=updated_by,
        api_key=updated_via_key,
        target=agent,
        details={"fields": ["chain"], "chain": [step.name for step in built]},
    )
    return ChainStep.objects.bulk_create(built)


# --- Tools ------------------------------------------------------------------------------------------

TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
TOOL_FIELDS: Final = frozenset(
    {"name", "description", "parameters", "endpoint_url", "endpoint_secret", "timeout_seconds"}
)
TOOL_TIMEOUT_MAX_SECONDS: Final = 120.0
EMPTY_PARAMETERS: Final[dict[str, Any]] = {"type": "object", "properties": {}}


def _endpoint_refusal(url: str) -> str | None:
    """Why Keel may not call a tool endpoint at `url`, or None. Whoever edits an agent's tools chooses where
    Keel's web process sends requests, so the outbound rule of webhooks holds (tracing/outbound.py): public
    addresses unless the operator permits others."""
    if urlsplit(url).scheme not in ("http", "https"):
        return "must be an http(s) URL"
    return outbound.OutboundPolicy.from_settings().url_refusal(url)


def _agent_tool_apply(tool: AgentTool, fields: Mapping[str, Any]) -> Errors:
    errors: Errors = [{"field": name, "message": "unknown field"} for name in sorted(set(fields) - TOOL_FIELDS)]
    endpoint = tool.endpoint_url
    for name, value in fields.items():
        if name == "name":
            if not isinstance(value, str) or not TOOL_NAME.match(value.strip()):
                errors.append({"field": "name", "message": "letters, digits, _ and -; 1 to 64 characters"})
            else:
                tool.name = value.strip()
        elif name == "description":
            if not isinstance(value, str):
                errors.append({"field": "description", "message": "must be text"})
            else:
                tool.description = value.strip()
        elif name == "parameters":
            value = value or dict(EMPTY_PARAMETERS)
            messages = _schema_errors(value, require_object_type=True)
            errors.extend({"field": "parameters", "message": message} for message in messages)
            if not messages:
                tool.parameters = value
        elif name == "endpoint_url":
            if value is not None and not isinstance(value, str):
                errors.append({"field": "endpoint_url", "message": "must be a URL"})
                continue
            url = (value or "").strip()
            refusal = _endpoint_refusal(url) if url else None
            if refusal is not None:
                errors.append({"field": "endpoint_url", "message": refusal})
            else:
                tool.endpoint_url = url
        elif name == "endpoint_secret":
            # None keeps the stored secret; "" removes it.
            if value is None:
                continue
            if not isinstance(value, str):
                errors.append({"field": "endpoint_secret", "message": "must be text"})
            else:
                tool.endpoint_secret_encrypted = crypto.encrypt(value) if value else ""
        elif name == "timeout_seconds":
            number_errors = _number_error("timeout_seconds", value, 0, TOOL_TIMEOUT_MAX_SECONDS, low_open=True)
            errors.extend(number_errors)
            if not number_errors:
                tool.timeout_seconds = float(value)
    moved = tool.pk and tool.endpoint_url and tool.endpoint_url != endpoint
    if moved and tool.endpoint_secret_encrypted and fields.get("endpoint_secret") is None:
        # A secret is never sent to an endpoint it was not entered for (whoever edits a tool cannot read it).
        errors.append(
            {"field": "endpoint_secret", "message": 'enter the secret again (or "" for none) for the new endpoint'}
        )
    if not tool.endpoint_url and tool.endpoint_secret_encrypted:
        if fields.get("endpoint_secret"):
            errors.append({"field": "endpoint_secret", "message": "a secret signs calls to an endpoint: give its URL"})
        else:
            # Without an endpoint the tool call goes back to the client; a secret would sign nothing.
            tool.endpoint_secret_encrypted = ""
    try:
        tool.full_clean(exclude=["agent", "parameters"], validate_unique=False, validate_constraints=False)
    except DjangoValidationError as error:
        reported = {item["field"] for item in errors}
        errors.extend(item for item in _django_errors(error) if item["field"] not in reported)
    return errors


def _agent_tool_save(tool: AgentTool) -> None:
    taken = AgentTool.objects.filter(agent_id=tool.agent_id, name=tool.name).exclude(pk=tool.pk).exists()
    if taken:
        raise exceptions.AgentToolNameTaken(f"the agent already has a tool named {tool.name!r}")
    try:
        with transaction.atomic():
            tool.save()
    except IntegrityError:
        raise exceptions.AgentToolNameTaken(f"the agent already has a tool named {tool.name!r}") from None


@transaction.atomic
def agent_tool_create(
    *,
    agent: Agent,
    name: str,
    description: str = "",
    parameters: Mapping[str, Any] | None = None,
    endpoint_url: str = "",
    endpoint_secret: str | None = None,
    timeout_seconds: float = 10.0,
    created_by: User | None = None,
    created_via_key: ApiKey | None = None,
) -> AgentTool:
    """Offer the agentic tier a tool. `parameters` is the JSON Schema of its arguments (an object); with
    `endpoint_url` Keel calls the endpoint (signing with `endpoint_secret`), without it the client does."""
    tool = AgentTool(agent=agent)
    errors = _agent_tool_apply(
        tool,
        {
            "name": name,
            "description": description,
            "parameters": dict(parameters) if parameters else None,
            "endpoint_url": endpoint_url,
            "endpoint_secret": endpoint_secret or None,
            "timeout_seconds": timeout_seconds,
        },
    )
    if errors:
        raise exceptions.AgentToolInvalid(f"invalid tool: {_summary(errors)}", errors=errors)
    _agent_tool_save(tool)
    audit.record(
        workspace=agent.workspace_id,
        action=AuditAction.TOOL_CREATED,
        user=created_by,
        api_key=created_via_key,
        target=tool,
        details={"endpoint_url": tool.endpoint_url, "has_endpoint_secret": bool(tool.endpoint_secret_encrypted)},
    )
    return tool


@transaction.atomic
def agent_tool_update(
    *, tool: AgentTool, updated_by: User | None = None, updated_via_key: ApiKey | None = None, **fields: Any
) -> AgentTool:
    """Change some of a tool (`TOOL_FIELDS`); `endpoint_secret=None` keeps the stored secret, "" removes it."""
    locked = AgentTool.objects.select_for_update().get(pk=tool.pk)
    errors = _agent_tool_apply(locked, fields)
    if errors:
        raise exceptions.AgentToolInvalid(f"invalid tool: {_summary(errors)}", errors=errors)
    _agent_tool_save(locked)
    audit.record(
        workspace=locked.agent.workspace_id,
        action=AuditAction.TOOL_CHANGED,
        user=updated_by,
        api_key=updated_via_key,
        target=locked,
        details={"fields": sorted(fields)},
    )
    return locked


@transaction.atomic
def agent_tool_delete(
    *, tool: AgentTool, deleted_by: User | None = None, deleted_via_key: ApiKey | None = None
) -> None:
    audit.record(
        workspace=tool.agent.workspace_id,
        action=AuditAction.TOOL_DELETED,
        user=deleted_by,
        api_key=deleted_via_key,
        target=tool,
    )
    tool.delete()


# --- Hand-offs --------------------------------------------------------------------------------------


def _who(user: User | None) -> str:
    return user.get_username() if user is not None else "someone"


@transaction.atomic
def handoff_claim(*, handoff: Handoff, user: User) -> Handoff:
    """Take an open hand-off. Claiming one's own claim again changes nothing; another person's claim or a
    resolved hand-off is a conflict (409)."""
    locked = Handoff.objects.select_for_update(of=("self",)).select_related("assigned_to").get(pk=handoff.pk)
    if locked.status == HandoffStatus.RESOLVED:
        raise exceptions.HandoffConflict("this hand-off is already resolved")
    if locked.status == HandoffStatus.CLAIMED:
        if locked.assigned_to_id == user.pk:
            return locked
        raise exceptions.HandoffConflict(f"this hand-off is already claimed by {_who(locked.assigned_to)}")
    locked.status = HandoffStatus.CLAIMED
    locked.assigned_to = user
    locked.save(update_fields=["status", "assigned_to"])
    return locked


HANDOFF_RESOLUTION_MAX: Final = 10_000


@transaction.atomic
def handoff_resolve(*, handoff: Handoff, user: User | None, resolution: str) -> Handoff:
    """Close an open or claimed hand-off with what was done. Anyone with write access may close a hand-off
    someone else claimed (a colleague stepping in); resolving a resolved one is a conflict (409).
    `user` is None when an API key resolves it."""
    resolution = resolution.strip()
    if not resolution or len(resolution) > HANDOFF_RESOLUTION_MAX:
        errors = [{"field": "resolution", "message": f"say what was done (1 to {HANDOFF_RESOLUTION_MAX} characters)"}]
        raise exceptions.HandoffInvalid("a resolution is required", errors=errors)
    locked = Handoff.objects.select_for_update().get(pk=handoff.pk)
    if locked.status == HandoffStatus.RESOLVED:
        raise exceptions.HandoffConflict("this hand-off is already resolved")
    locked.status = HandoffStatus.RESOLVED
    locked.resolution = resolution
    locked.resolved_at = timezone.now()
    if locked.assigned_to_id is None and user is not None:
        locked.assigned_to = user
    locked.save(update_fields=["status", "resolution", "resolved_at", "assigned_to"])
    return locked
