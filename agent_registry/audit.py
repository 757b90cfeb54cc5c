"""The audit log: one `record(...)` call per administrative action, made by the service that performs the
action, inside its transaction (an action that fails or rolls back leaves no event).

The actor is whoever the caller names: a person (`user=`), an API key (`api_key=`), or neither, which
is Keel itself (a sweep, a sync from the environment, a finished training job). The client's IP address
comes from the request being served (`agent_registry.middleware.AuditContextMiddleware` sets it); work
outside a request has none.

`details` is for what a reader needs to understand the event (the fields that changed, a version number)
and never for values of secrets: a key whose name says it holds one is stored as "[redacted]".
"""

from __future__ import annotations

import contextvars
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from django.db import models

from agent_registry.models import ApiKey, AuditAction, AuditActorKind, AuditEvent, User, Workspace

_request_ip: contextvars.ContextVar[str | None] = contextvars.ContextVar("keel_audit_request_ip", default=None)

# Keys of `details` whose values are never stored. `has_api_key: true` and `fields: ["api_key"]` are fine:
# a boolean says a secret exists, and a list of field names names it without holding it.
_SECRET_KEY = re.compile(r"(secret|password|passwd|token|api_key|apikey|authorization|credential)", re.IGNORECASE)
REDACTED = "[redacted]"


@contextmanager
def request_ip(ip: str | None) -> Iterator[None]:
    """Events recorded inside this block carry `ip` (the request's client address)."""
    token = _request_ip.set(ip)
    try:
        yield
    finally:
        _request_ip.reset(token)


def _clean(details: Mapping[str, Any]) -> dict[str, Any]:
    cleaned: dict[str, Any] = {}
    for key, value in details.items():
        if _SECRET_KEY.search(key) and not isinstance(value, bool) and value not in (None, ""):
            cleaned[key] = REDACTED
        elif isinstance(value, Mapping):
            cleaned[key] = _clean(value)
        else:
            cleaned[key] = value
    return cleaned


def _actor(user: User | None, api_key: ApiKey | None) -> tuple[str, str]:
    if user is not None:
        return AuditActorKind.USER, user.get_username()
    if api_key is not None:
        return AuditActorKind.API_KEY, f"API key {api_key.name} ({api_key.prefix}…)"[:200]
    return AuditActorKind.KEEL, "Keel"


def record(
    *,
    workspace: Workspace | int,
    action: AuditAction,
    user: User | None = None,
    api_key: ApiKey | None = None,
    target: models.Model | None = None,
    target_name: str = "",
    details: Mapping[str, Any] | None = None,
) -> AuditEvent:
    """Record `action` in `workspace`. Call it inside the action's transaction, after its writes; for a
    deletion, before the delete (`Model.delete` clears the instance's primary key)."""
    kind, label = _actor(user, api_key)
    return AuditEvent.objects.create(
        workspace_id=workspace if isinstance(workspace, int) else workspace.pk,
        action=action,
        actor_kind=kind,
        actor_user=user,
        actor_key=api_key,
        actor_label=label[:200],
        target_type=target._meta.label_lower if target is not None else "",
        target_id=str(target.pk) if target is not None and target.pk is not None else "",
        target_name=(target_name or (str(target) if target is not None else ""))[:200],
        details=_clean(details or {}),
        ip_address=_request_ip.get(),
    )
