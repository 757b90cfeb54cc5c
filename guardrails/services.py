"""Writes of the guardrails: an agent's policy, evaluating content against it (and recording what it
found), and people's decisions on approval requests. The action boundary's own writes (approval
requests, their use, tool-call counters) live in `guardrails/boundary.py`, budgets in
`guardrails/budgets.py`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import hmac
import json
import logging
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from pydantic import ValidationError

from agent_registry import audit
from agent_registry import selectors as registry_selectors
from agent_registry.models import Agent, ApiKey, AuditAction, User
from agent_registry.requirements import Requirements
from config import crypto
from config.compiled_query import CompiledQuery
from config.config_cache import NotifiedCache
from guardrails import exceptions, model_checks, policy
from guardrails.checks import canary_token, run_checks
from guardrails.interface import Action, CheckContext, CheckResult, Layer
from guardrails.models import (
    EVIDENCE_MAX_CHARS,
    ApprovalEvent,
    ApprovalEventKind,
    ApprovalRequest,
    ApprovalStatus,
    FailureMode,
    GuardrailPolicy,
    GuardrailViolation,
)
from guardrails.pii import pseudonym_for
from routing import hooks
from routing.models import ModelTarget

logger = logging.getLogger("guardrails.services")


# --- Policy -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class EffectivePolicy:
    """The policy an agent runs: the saved one, or the default its requirements derive."""

    agent: Agent
    document: policy.PolicyDocument
    saved: bool
    mandatory: list[policy.Mandatory]
    requirements: Requirements | None = field(repr=False)
    canary_secret: str = field(repr=False)
    updated_at: datetime | None = None

    def tools(self) -> policy.ToolPolicy:
        return policy.tool_policy(self.requirements, self.document)


def _default_canary_secret(agent: Agent) -> str:
    # Stable without a write, so an agent with no saved policy still gets one canary per prompt version.
    return hmac.new(settings.SECRET_KEY.encode(), f"keel-canary:{agent.pk}".encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class _Derived:
    mandatory: list[policy.Mandatory]
    default: policy.PolicyDocument


# What a requirements version derives for the guardrails, kept per version id: versions never change, and
# the gateway asks for the policy several times a request.
_DERIVED_KEEP = 512
_derived: dict[int | None, _Derived] = {}


def _derived_policy(version_id: int | None, requirements: Requirements | None) -> _Derived:
    found = _derived.get(version_id)
    if found is None:
        if len(_derived) >= _DERIVED_KEEP:
            _derived.clear()
        found = _derived[version_id] = _Derived(
            policy.mandatory_checks(requirements), policy.default_policy(requirements)
        )
    return found


def guardrail_policy_get(*, agent: Agent) -> EffectivePolicy:
    """The agent's effective policy; read once per gateway request (a request sees one policy throughout),
    and kept per process until a policy or an agent changes (config/config_cache.py)."""
    return hooks.request_memo(("guardrail_policy", agent.pk), lambda: _policy_kept(agent))


_policies: NotifiedCache[tuple[int, int | None], EffectivePolicy] = NotifiedCache(size=1024)


def _policy_kept(agent: Agent) -> EffectivePolicy:
    kept = _policies.get((agent.pk, agent.current_requirements_id), functools.partial(_policy_read, agent))
    return kept if kept.agent is agent else dataclasses.replace(kept, agent=agent)


# Read once per gateway request (compiled once: config/compiled_query.py).
_saved_policy = CompiledQuery(
    GuardrailPolicy,
    lambda agent_id: GuardrailPolicy.objects.filter(agent_id=agent_id).order_by("pk")[:1],
    agent_id=-7_000_003,
)


def _policy_read(agent: Agent) -> EffectivePolicy:
    # Parsed once per requirements version and process (agent_registry.selectors), not on every call.
    requirements = registry_selectors.requirements_of(agent=agent)
    derived = _derived_policy(agent.current_requirements_id, requirements)
    mandatory = list(derived.mandatory)
    saved = _saved_policy.first(agent_id=agent.pk)
    if saved is None:
        return EffectivePolicy(
            agent=agent,
            document=derived.default,  # shared by every request of this version: read, never changed
            saved=False,
            mandatory=mandatory,
            requirements=requirements,
            canary_secret=_default_canary_secret(agent),
        )
    return EffectivePolicy(
        agent=agent,
        document=policy.policy_enforced(policy.PolicyDocument.model_validate(saved.document), requirements),
        saved=True,
        mandatory=mandatory,
        requirements=requirements,
        canary_secret=crypto.decrypt(saved.canary_secret_encrypted)
        if saved.canary_secret_encrypted
        else _default_canary_secret(agent),
        updated_at=saved.updated_at,
    )


def _validation_errors(error: ValidationError) -> list[dict[str, str]]:
    return [
        {"field": ".".join(str(part) for part in item["loc"]) or "document", "message": item["msg"]}
        for item in error.errors()
    ]


def _policy_invalid(errors: list[dict[str, str]]) -> exceptions.GuardrailPolicyInvalid:
    summary = "; ".join(f"{item['field']}: {item['message']}" for item in errors[:5])
    return exceptions.GuardrailPolicyInvalid(f"invalid guardrail policy: {summary}", errors=errors)


@transaction.atomic
def guardrail_policy_update(
    *,
    agent: Agent,
    document: Mapping[str, Any],
    rotate_canary: bool = False,
    user: User | None = None,
    api_key: ApiKey | None = None,
) -> EffectivePolicy:
    """Replace the agent's policy. Refused (422, nothing saved) when the document does not parse, drops or
    weakens a mandatory check, or names a model target the workspace does not have. The canary secret is
    made on the first save and kept, unless `rotate_canary`."""
    try:
        parsed = policy.PolicyDocument.model_validate(dict(document))
    except ValidationError as error:
        raise _policy_invalid(_validation_errors(error)) from None
    errors = policy.policy_errors(parsed, registry_selectors.requirements_current(agent=agent))
    aliases = {rule.target for rule in parsed.model_checks}
    known = set(
        ModelTarget.objects.filter(workspace_id=agent.workspace_id, alias__in=aliases).values_list("alias", flat=True)
    )
    errors += [
        {"field": f"model_checks.{rule.name}.target", "message": f"no model target {rule.target!r} in this workspace"}
        for rule in parsed.model_checks
        if rule.target not in known
    ]
    if errors:
        raise _policy_invalid(errors)
    # Lock the row (if any) so two concurrent saves keep one canary secret.
    saved = GuardrailPolicy.objects.select_for_update().filter(agent=agent).first()
    action = AuditAction.POLICY_CHANGED if saved is not None else AuditAction.POLICY_CREATED
    if saved is None:
        saved = GuardrailPolicy(agent=agent, workspace_id=agent.workspace_id)
    if rotate_canary or not saved.canary_secret_encrypted:
        saved.canary_secret_encrypted = crypto.encrypt(secrets.token_hex(32))
    saved.document = parsed.model_dump(mode="json")
    saved.updated_by = user
    saved.updated_via_key = api_key
    saved.full_clean()
    saved.save()
    audit.record(
        workspace=agent.workspace_id,
        action=action,
        user=user,
        api_key=api_key,
        target=saved,
        target_name=f"guardrail policy of {agent.slug}",
        details={"agent": agent.slug, "canary_rotated": rotate_canary},
    )
    return guardrail_policy_get(agent=agent)


# --- Evaluation -------------------------------------------------------------------------------


@dataclass
class GuardrailOutcome:
    verdict: Action
    content: Any  # the content as given, or its redacted text
    violations: list[dict[str, Any]]  # {"check", "score", "evidence", "action", "failure"}
    latency_ms: float
    results: list[CheckResult]
    pseudonym_key: str | None = field(default=None, repr=False)  # set when PII became pseudonyms

    def pseudonyms(self) -> dict[str, str]:
        """Each pseudonym in the content and the value it stands for (to restore server-side)."""
        if self.pseudonym_key is None:
            return {}
        return {
            pseudonym_for(finding.kind, finding.text, self.pseudonym_key): finding.text
            for result in self.results
            if result.check == "pii" and result.redacted is not None
            for finding in result.findings
        }


def _text(content: Any) -> str:
    return content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)


def _context(effective: EffectivePolicy, layer: Layer, source: str, context: Mapping[str, Any]) -> CheckContext:
    document = effective.document
    canary = context.get("canary")
    prompt_name, prompt_version = context.get("prompt_name"), context.get("prompt_version")
    if not isinstance(canary, str) and isinstance(prompt_name, str) and isinstance(prompt_version, int):
        canary = canary_token(effective.canary_secret, prompt_name, prompt_version)
    system_prompt = context.get("system_prompt")
    json_schema = context.get("json_schema")
    topics = context.get("allowed_topics")
    return CheckContext(
        layer=layer,
        source=source,
        system_prompt=system_prompt if isinstance(system_prompt, str) else None,
        canary=canary if isinstance(canary, str) else None,
        json_schema=json_schema if isinstance(json_schema, dict) else None,
        allowed_topics=tuple(document.allowed_topics)
        or (tuple(str(topic) for topic in topics) if isinstance(topics, list) else ()),
        pii_kinds=None if document.pii_kinds is None else frozenset(document.pii_kinds),
        pseudonymize=document.pseudonymize,
        pseudonym_key=hmac.new(effective.canary_secret.encode(), b"pseudonyms", hashlib.sha256).hexdigest(),
    )


@dataclass
class _Hit:
    check: str
    action: Action
    score: float
    evidence: str
    failure: FailureMode = FailureMode.NONE


def _hit_of(result: CheckResult, threshold: float | None) -> bool:
    return result.triggered if threshold is None else result.score >= threshold


def _builtin_checks(
    document: policy.PolicyDocument, layer: Layer, text: str, check_context: CheckContext
) -> tuple[str, list[_Hit], list[CheckResult]]:
    """Run the layer's built-in checks; redacting rules run one after another on the redacted text."""
    rules = document.rules_for(layer, check_context.source)
    hits: list[_Hit] = []
    results: list[CheckResult] = []
    plain = [rule for rule in rules if rule.action is not Action.REDACT]
    redacting = [rule for rule in rules if rule.action is Action.REDACT]
    by_name = {rule.check: rule for rule in plain}
    for result in run_checks(text, check_context, [rule.check for rule in plain]) if plain else []:
        results.append(result)
        rule = by_name[result.check]
        if result.error:
            # Built-in checks run offline and should not fail; when one does, it fails closed, so that a
            # crash can never switch a mandatory check off.
            hits.append(_Hit(rule.check, rule.action, 1.0, result.evidence, FailureMode.FAILED_CLOSED))
        elif _hit_of(result, rule.threshold):
            hits.append(_Hit(rule.check, rule.action, result.score, result.evidence))
    for rule in redacting:
        (result,) = run_checks(text, check_context, [rule.check])
        results.append(result)
        if result.error:
            hits.append(_Hit(rule.check, Action.BLOCK, 1.0, result.evidence, FailureMode.FAILED_CLOSED))
        elif _hit_of(result, rule.threshold):
            if result.redacted is None:
                # Nothing to take out though the policy asked to: the content cannot pass as it is.
                hits.append(_Hit(rule.check, Action.BLOCK, result.score, result.evidence))
            else:
                text = result.redacted
                hits.append(_Hit(rule.check, Action.REDACT, result.score, result.evidence))
    return text, hits, results


def _model_checks(
    *, agent: Agent, document: policy.PolicyDocument, layer: Layer, text: str
) -> tuple[list[_Hit], list[CheckResult]]:
    rules = document.model_rules_for(layer)
    if not rules:
        return [], []
    targets = {
        target.alias: target
        for target in ModelTarget.objects.filter(workspace_id=agent.workspace_id, alias__in={r.target for r in rules})
    }
    hits: list[_Hit] = []
    results: list[CheckResult] = []
    # One after another: each has its own timeout, and the provider layer records target health in the
    # database, which a thread would do on a connection of its own.
    for rule in rules:
        result = model_checks.model_check_run(rule=rule, target=targets.get(rule.target), content=text)
        results.append(result)
        if result.error:
            if rule.fail_open:
                hits.append(_Hit(rule.name, Action.ALLOW, 0.0, result.evidence, FailureMode.FAILED_OPEN))
            else:
                hits.append(_Hit(rule.name, rule.action, 1.0, result.evidence, FailureMode.FAILED_CLOSED))
        elif result.triggered:
            hits.append(_Hit(rule.name, rule.action, result.score, result.evidence))
    return hits, results


def _layer(layer: str | Layer) -> Layer:
    try:
        return Layer(layer)
    except ValueError:
        raise exceptions.LayerUnknown(
            f"unknown layer {layer!r}; the layers are {', '.join(item.value for item in Layer)}"
        ) from None


def guardrail_evaluate(
    *,
    agent: Agent,
    layer: str | Layer,
    content: Any,
    context: Mapping[str, Any] | None = None,
    source: str = "user",
    trace_id: str = "",
    api_key: ApiKey | None = None,
    redact_only: bool = False,
) -> GuardrailOutcome:
    """Run the agent's checks for one layer on `content` (text, or JSON which is checked as its text) and
    record a `GuardrailViolation` per hit. `context` may carry `system_prompt`, `canary` (or `prompt_name`
    and `prompt_version` to derive it), `json_schema` and `allowed_topics`. The verdict is the most severe
    action among the hits; a model-based check that fails is recorded and follows its fail_open setting.
    `api_key` is the caller's key when the API asks (logged with the hits). Raises LayerUnknown; never fails on
    the content itself (invalid JSON for a schema is a violation).

    `redact_only` runs just the redacting rules and records nothing: for content that already passed the
    checks once (earlier turns of a conversation sent again) but must still reach the model redacted."""
    started = time.perf_counter()
    resolved_layer = _layer(layer)
    effective = guardrail_policy_get(agent=agent)
    document = effective.document
    check_context = _context(effective, resolved_layer, source, context or {})
    original = _text(content)
    if redact_only:
        document = document.model_copy(
            update={"checks": [rule for rule in document.checks if rule.action is Action.REDACT], "model_checks": []}
        )
    text, hits, results = _builtin_checks(document, resolved_layer, original, check_context)
    model_hits, model_results = _model_checks(agent=agent, document=document, layer=resolved_layer, text=text)
    hits += model_hits
    results += model_results
    if redact_only:
        return GuardrailOutcome(
            verdict=policy.action_combine(hit.action for hit in hits),
            content=text if text != original else content,
            violations=[],
            latency_ms=round((time.perf_counter() - started) * 1000, 3),
            results=results,
            pseudonym_key=check_context.pseudonym_key if check_context.pseudonymize else None,
        )
    verdict = policy.action_combine(hit.action for hit in hits if hit.failure != FailureMode.FAILED_OPEN)
    if hits:  # bulk_create opens a transaction even when there is nothing to write
        GuardrailViolation.objects.bulk_create(
            GuardrailViolation(
                workspace_id=agent.workspace_id,
                agent=agent,
                layer=resolved_layer.value,
                check_name=hit.check,
                action=hit.action.value,
                score=hit.score,
                evidence=hit.evidence[:EVIDENCE_MAX_CHARS],
                source=source[:32],
                failure=hit.failure,
                trace_id=trace_id[:64],
            )
            for hit in hits
        )
        logger.info(
            "guardrails.violations_recorded",
            extra={
                "agent_id": agent.pk,
                "api_key_id": api_key.pk if api_key else None,
                "layer": resolved_layer.value,
                "verdict": verdict.value,
                "count": len(hits),
            },
        )
    return GuardrailOutcome(
        verdict=verdict,
        content=text if text != original else content,
        violations=[
            {
                "check": hit.check,
                "score": hit.score,
                "evidence": hit.evidence[:EVIDENCE_MAX_CHARS],
                "action": hit.action.value,
                "failure": hit.failure.value,
            }
            for hit in hits
        ],
        latency_ms=round((time.perf_counter() - started) * 1000, 3),
        results=results,
        pseudonym_key=check_context.pseudonym_key if check_context.pseudonymize else None,
    )


# --- Approvals --------------------------------------------------------------------------------


def approval_decide(
    *,
    approval: ApprovalRequest,
    approved: bool,
    note: str = "",
    user: User | None = None,
    api_key: ApiKey | None = None,
) -> ApprovalRequest:
    """A person's decision on a pending request, by a user (the dashboard) or through a key with the `write`
    scope (recorded as the decider). One decision only: a request already decided, used or expired is
    refused with 409 and left as it was (a pending one past its time is marked expired)."""
    if user is None and api_key is None:
        raise exceptions.ApprovalDeciderMissing("a decision needs a decider: a user or an API key")
    now = timezone.now()
    status = ApprovalStatus.APPROVED if approved else ApprovalStatus.REJECTED
    with transaction.atomic():
        # Conditional UPDATE: of two concurrent decisions, one finds the request pending.
        decided = ApprovalRequest.objects.filter(
            pk=approval.pk, status=ApprovalStatus.PENDING, expires_at__gt=now
        ).update(status=status, decided_by=user, decided_by_key=api_key, decided_at=now, decision_note=note)
        if decided:
            event = ApprovalEvent.objects.create(
                approval_id=approval.pk,
                kind=ApprovalEventKind.APPROVED if approved else ApprovalEventKind.REJECTED,
                actor_user=user,
                actor_key=api_key,
                note=note,
            )
            audit.record(
                workspace=approval.workspace_id,
                action=AuditAction.APPROVAL_DECIDED,
                user=user,
                api_key=api_key,
                target=approval,
                target_name=f"approval {approval.pk}: {approval.tool}",
                details={"status": status, "tool": approval.tool, "approval_event_id": event.pk},
            )
    if not decided:
        current = ApprovalRequest.objects.get(pk=approval.pk)
        if current.status == ApprovalStatus.PENDING and approval_expire(approval=current):
            current.status = ApprovalStatus.EXPIRED
        raise exceptions.ApprovalAlreadyDecided(f"approval {approval.pk} is {current.status}, not pending")
    logger.info("guardrails.approval_decided", extra={"approval_id": approval.pk, "status": status})
    approval.refresh_from_db()
    return approval


@transaction.atomic
def approval_expire(*, approval: ApprovalRequest) -> bool:
    """Expire a pending or approved-but-unused request past its time; True if this call expired it."""
    expired = ApprovalRequest.objects.filter(
        pk=approval.pk,
        status__in=[ApprovalStatus.PENDING, ApprovalStatus.APPROVED],
        expires_at__lte=timezone.now(),
    ).update(status=ApprovalStatus.EXPIRED)
    if expired:
        ApprovalEvent.objects.create(approval_id=approval.pk, kind=ApprovalEventKind.EXPIRED, note="past its expiry")
    return bool(expired)


def approval_requests_expire() -> int:
    """Expire every request past its time (the periodic sweep); returns how many."""
    count = 0
    due = ApprovalRequest.objects.filter(
        status__in=[ApprovalStatus.PENDING, ApprovalStatus.APPROVED], expires_at__lte=timezone.now()
    ).only("pk")
    for approval in due.iterator():
        count += approval_expire(approval=approval)
    return count
