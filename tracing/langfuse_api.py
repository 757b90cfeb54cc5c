"""The Langfuse mirror's settings and status: `/api/v1/integrations/langfuse`."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.http import HttpRequest
from ninja import Field, Router, Schema, Status

from agent_registry.auth import key_auth, request_api_key, request_workspace
from agent_registry.models import Scope
from agent_registry.schemas import error_responses
from tracing import langfuse_bridge, selectors

router = Router(tags=["langfuse mirror"])
ERRORS = error_responses()


class LangfuseMirrorIn(Schema):
    host: str = Field(max_length=500, description="e.g. https://cloud.langfuse.com or your self-hosted URL")
    public_key: str = Field(min_length=1, max_length=200)
    secret_key: str | None = Field(None, min_length=1, max_length=500, description="omit to keep the stored one")
    enabled: bool = True


class LangfuseMirrorOut(Schema):
    host: str
    public_key: str
    secret_key_set: bool
    enabled: bool
    last_success_at: datetime | None
    last_error: str
    last_error_at: datetime | None
    delivered_spans: int
    delivered_scores: int
    pending: int
    failed: int


def _status_out(request: HttpRequest) -> dict[str, Any]:
    status = selectors.langfuse_mirror_status(workspace=request_workspace(request))
    mirror = status.mirror
    return {
        "host": mirror.host,
        "public_key": mirror.public_key,
        "secret_key_set": bool(mirror.secret_key_encrypted),
        "enabled": mirror.enabled,
        "last_success_at": mirror.last_success_at,
        "last_error": mirror.last_error,
        "last_error_at": mirror.last_error_at,
        "delivered_spans": mirror.delivered_spans,
        "delivered_scores": mirror.delivered_scores,
        "pending": status.pending,
        "failed": status.failed,
    }


@router.get("/integrations/langfuse", auth=key_auth(Scope.READ), response={200: LangfuseMirrorOut, **ERRORS})
def langfuse_mirror_get_api(request: HttpRequest) -> Any:
    """Where the workspace mirrors to, and how delivery is going (the secret key is never returned)."""
    return _status_out(request)


@router.put("/integrations/langfuse", auth=key_auth(Scope.WRITE), response={200: LangfuseMirrorOut, **ERRORS})
def langfuse_mirror_configure_api(request: HttpRequest, payload: LangfuseMirrorIn) -> Any:
    langfuse_bridge.langfuse_mirror_configure(
        workspace=request_workspace(request),
        host=payload.host,
        public_key=payload.public_key,
        secret_key=payload.secret_key,
        enabled=payload.enabled,
        configured_via_key=request_api_key(request),
    )
    return _status_out(request)


@router.delete("/integrations/langfuse", auth=key_auth(Scope.WRITE), response={204: None, **ERRORS})
def langfuse_mirror_delete_api(request: HttpRequest) -> Any:
    langfuse_bridge.langfuse_mirror_delete(
        workspace=request_workspace(request), deleted_via_key=request_api_key(request)
    )
    return Status(204, None)


@router.post("/integrations/langfuse/retry", auth=key_auth(Scope.WRITE), response={200: LangfuseMirrorOut, **ERRORS})
def langfuse_export_retry_api(request: HttpRequest) -> Any:
    """Send the deliveries that failed for good once more (after fixing the keys, say)."""
    langfuse_bridge.langfuse_export_retry_failed(workspace=request_workspace(request))
    return _status_out(request)
