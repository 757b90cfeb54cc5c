"""The Langfuse bridge: teams already on Langfuse keep it, and Keel mirrors to it.

When a workspace has an enabled `LangfuseMirror`, every batch of new spans and every new score also
writes a `LangfuseExport` row in the same transaction (an outbox: nothing is mirrored that was not
stored, and nothing stored is forgotten). A worker delivers each row through the Langfuse SDK's API
client: spans to Langfuse's OTLP endpoint with `langfuse.*` attributes, scores to its scores API.
A failed delivery is retried with exponential backoff; the mirror shows the last success and the last
error, and a row that keeps failing ends `failed` with its error, visible and re-sendable.

The host is chosen by the workspace's owner, so it goes only where alert webhooks may
(tracing/outbound.py: public addresses unless the operator permits more; a Langfuse on Keel's own network
needs `KEEL_OUTBOUND_ALLOWED_HOSTS`), checked when configured and on every connection, redirects included.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import orjson
from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from agent_registry import audit
from agent_registry.models import ApiKey, AuditAction, User, Workspace
from config import crypto, dispatch
from config.config_cache import NotifiedCache
from config.redact import basic_credential, redact
from tracing import exceptions, otlp, outbound
from tracing.langfuse_encode import EncodedResource, encode_spans, encoded_from_json, encoded_to_json
from tracing.models import ExportKind, ExportStatus, LangfuseExport, LangfuseMirror, Score, ScoreDataType

if TYPE_CHECKING:
    import httpx

logger = logging.getLogger("tracing.langfuse_bridge")

MAX_ATTEMPTS = 10
LEASE = timedelta(minutes=2)
# Keel retries on its own schedule, with the state on the row; the SDK's own retries would hide that.
NO_SDK_RETRIES: Any = {"max_retries": 0}


class DeliveryError(Exception):
    """Langfuse did not take the delivery (a network error, an HTTP error, rejected items)."""


# --- Configuration -----------------------------------------------------------------------------------


@transaction.atomic
def langfuse_mirror_configure(
    *,
    workspace: Workspace,
    host: str,
    public_key: str,
    secret_key: str | None,
    enabled: bool = True,
    configured_by: User | None = None,
    configured_via_key: ApiKey | None = None,
) -> LangfuseMirror:
    """Point the workspace's mirror at a Langfuse project. `secret_key=None` keeps the stored one, for the same
    host only."""
    problems = []
    if not host.startswith(("http://", "https://")):
        problems.append({"field": "host", "message": "must be an http(s) URL"})
    else:
        refusal = outbound.OutboundPolicy.from_settings().url_refusal(host)
        if refusal is not None:
            problems.append({"field": "host", "message": refusal})
    if not public_key.strip():
        problems.append({"field": "public_key", "message": "required"})
    existing = LangfuseMirror.objects.filter(workspace=workspace).first()
    if secret_key is None and existing is None:
        problems.append({"field": "secret_key", "message": "required"})
    elif secret_key is None and existing is not None and existing.host != host.rstrip("/"):
        # Whoever can change the host must not be able to send the stored secret to a server of their own.
        problems.append({"field": "secret_key", "message": "required when the host changes"})
    if problems:
        raise exceptions.LangfuseMirrorInvalid(
            "invalid Langfuse settings: " + "; ".join(f"{p['field']}: {p['message']}" for p in problems),
            errors=problems,
        )
    defaults: dict[str, Any] = {"host": host.rstrip("/"), "public_key": public_key.strip(), "enabled": enabled}
    if secret_key is not None:
        defaults["secret_key_encrypted"] = crypto.encrypt(secret_key)
    mirror, _ = LangfuseMirror.objects.update_or_create(workspace=workspace, defaults=defaults)
    audit.record(
        workspace=workspace,
        action=AuditAction.LANGFUSE_MIRROR_CHANGED,
        user=configured_by,
        api_key=configured_via_key,
        target=mirror,
        target_name=mirror.host,
        details={
            "host": mirror.host,
            "public_key": mirror.public_key,
            "enabled": mirror.enabled,
            "secret_key_changed": secret_key is not None,
        },
    )
    return mirror


@transaction.atomic
def langfuse_mirror_delete(
    *, workspace: Workspace, deleted_by: User | None = None, deleted_via_key: ApiKey | None = None
) -> None:
    mirror = LangfuseMirror.objects.filter(workspace=workspace).first()
    if mirror is not None:
        audit.record(
            workspace=workspace,
            action=AuditAction.LANGFUSE_MIRROR_DELETED,
            user=deleted_by,
            api_key=deleted_via_key,
            target=mirror,
            target_name=mirror.host,
        )
    LangfuseMirror.objects.filter(workspace=workspace).delete()
    LangfuseExport.objects.filter(workspace=workspace, status__in=[ExportStatus.PENDING, ExportStatus.SENDING]).delete()


def _mirror_enabled_read(workspace_id: int) -> bool:
    return LangfuseMirror.objects.filter(workspace_id=workspace_id, enabled=True).exists()


# Asked for every batch of spans, in the transaction that stores them (config_free_transaction); kept per
# process until a mirror is set up, changed or removed (config/config_cache.py; a delivery's status is not a
# change).
_mirrors_enabled: NotifiedCache[int, bool] = NotifiedCache(size=1024, in_transactions=True)


def _mirror_enabled(workspace_id: int) -> bool:
    return _mirrors_enabled.get(workspace_id, functools.partial(_mirror_enabled_read, workspace_id))


# --- Enqueueing (called inside the transactions that store spans and scores) --------------------------


def _enqueue(export: LangfuseExport) -> None:
    from tracing import tasks

    dispatch.task_send_on_commit(tasks.langfuse_export_deliver, export.pk)


def langfuse_export_spans(*, workspace_id: int, spans: Sequence[otlp.Span]) -> LangfuseExport | None:
    """Queue the spans for the mirror, if the workspace has one. Precondition: inside the transaction
    that stores them."""
    if not spans or not _mirror_enabled(workspace_id):
        return None
    payload = orjson.dumps(encoded_to_json(encode_spans(spans)), default=str).decode()
    export = LangfuseExport.objects.create(
        workspace_id=workspace_id, kind=ExportKind.SPANS, payload=payload, item_count=len(spans)
    )
    _enqueue(export)
    return export


def langfuse_export_score(*, score: Score) -> LangfuseExport | None:
    if not _mirror_enabled(score.workspace_id):
        return None
    export = LangfuseExport.objects.create(workspace_id=score.workspace_id, kind=ExportKind.SCORE, score=score)
    _enqueue(export)
    return export


# --- Delivery ----------------------------------------------------------------------------------------


def _client(mirror: LangfuseMirror, http: httpx.Client) -> Any:
    from langfuse.api import LangfuseAPI

    return LangfuseAPI(
        base_url=mirror.host,
        username=mirror.public_key,
        password=crypto.decrypt(mirror.secret_key_encrypted),
        x_langfuse_public_key=mirror.public_key,
        x_langfuse_sdk_name="keel",
        x_langfuse_sdk_version=settings.KEEL_VERSION,
        # Langfuse's real-time write path for direct OTLP exporters.
        headers={"x-langfuse-ingestion-version": "4"},
        httpx_client=http,
    )


def _attribute(key: str, value: Any) -> Any:
    from langfuse.api.opentelemetry import OtelAttribute, OtelAttributeValue

    if isinstance(value, bool):
        typed = OtelAttributeValue(bool_value=value)
    elif isinstance(value, int):
        typed = OtelAttributeValue(int_value=value)
    elif isinstance(value, float):
        typed = OtelAttributeValue(double_value=value)
    else:
        typed = OtelAttributeValue(string_value=str(value))
    return OtelAttribute(key=key, value=typed)


def _resource_spans(resources: list[EncodedResource]) -> list[Any]:
    from langfuse.api.opentelemetry import OtelResource, OtelResourceSpan, OtelScope, OtelScopeSpan, OtelSpan

    return [
        OtelResourceSpan(
            resource=OtelResource(attributes=[_attribute(k, v) for k, v in resource.attributes.items()]),
            scope_spans=[
                OtelScopeSpan(
                    scope=OtelScope(name=resource.scope_name or "keel"),
                    spans=[
                        OtelSpan(
                            trace_id=span.trace_id,
                            span_id=span.span_id,
                            parent_span_id=span.parent_span_id,
                            name=span.name,
                            kind=span.kind,
                            start_time_unix_nano=str(span.start_time_unix_nano),
                            end_time_unix_nano=str(span.end_time_unix_nano),
                            attributes=[_attribute(k, v) for k, v in span.attributes.items()],
                            status={"code": span.status_code, "message": span.status_message},
                        )
                        for span in resource.spans
                    ],
                )
            ],
        )
        for resource in resources
    ]


def _score_request(score: Score) -> Any:
    from langfuse.api.commons import ScoreDataType as LangfuseDataType
    from langfuse.api.scores import CreateScoreRequest

    value: Any
    if score.data_type == ScoreDataType.NUMERIC:
        value, data_type = score.value, LangfuseDataType.NUMERIC
    elif score.data_type == ScoreDataType.BOOLEAN:
        value, data_type = 1.0 if score.value else 0.0, LangfuseDataType.BOOLEAN
    elif score.data_type == ScoreDataType.CATEGORICAL:
        value, data_type = score.string_value, LangfuseDataType.CATEGORICAL
    else:
        value, data_type = score.string_value, LangfuseDataType.CORRECTION
    optional: dict[str, Any] = {}
    if score.span_id:
        optional["observation_id"] = score.span_id
    if score.comment:
        optional["comment"] = score.comment
    return CreateScoreRequest(
        id=f"keel-score-{score.pk}",  # Langfuse upserts by id: a re-sent score is not doubled
        trace_id=score.trajectory.trace_id,
        name=score.name,
        value=value,
        data_type=data_type,
        **optional,
    )


def _deliver(mirror: LangfuseMirror, export: LangfuseExport) -> None:
    import httpx
    import pydantic
    from langfuse.api.core.api_error import ApiError

    # Every connection, a redirect's too, goes to an address the outbound policy checked.
    http = outbound.checked_client(timeout=settings.KEEL_LANGFUSE_TIMEOUT_SECONDS, follow_redirects=True)
    try:
        client = _client(mirror, http)
        if export.kind == ExportKind.SPANS:
            resources = encoded_from_json(orjson.loads(export.payload))
            answer = client.opentelemetry.export_traces(
                resource_spans=_resource_spans(resources), request_options=NO_SDK_RETRIES
            )
            rejected = getattr(answer, "partial_success", None)
            if rejected and getattr(rejected, "rejected_spans", 0):
                raise DeliveryError(f"Langfuse rejected {rejected.rejected_spans} spans: {rejected.error_message}")
        else:
            assert export.score is not None
            answer = client.scores.create(request=[_score_request(export.score)], request_options=NO_SDK_RETRIES)
            errors = getattr(answer, "errors", None) or getattr(getattr(answer, "results", None), "errors", None)
            if errors:
                raise DeliveryError(f"Langfuse rejected the score: {errors}")
    except outbound.HostUnresolved as error:
        raise DeliveryError(str(error)[:500]) from error
    except outbound.AddressRefused as error:
        raise DeliveryError(f"refused: {str(error)[:500]}") from error
    except (ApiError, httpx.HTTPError, pydantic.ValidationError, ValueError) as error:
        # HTTP errors, network errors and answers the SDK cannot read: recorded on the row and retried.
        # The row's error is shown in the API and the dashboard: a server that quotes the credentials it
        # was sent must not put them there.
        secret = crypto.decrypt(mirror.secret_key_encrypted)
        text = redact(str(error), secret, basic_credential(mirror.public_key, secret))
        raise DeliveryError(f"{type(error).__name__}: {text[:500]}") from error
    finally:
        http.close()


def _claim(export_id: int) -> LangfuseExport | None:
    now = timezone.now()
    claimed = LangfuseExport.objects.filter(
        Q(status=ExportStatus.PENDING, next_attempt_at__lte=now)
        | Q(status=ExportStatus.SENDING, claimed_at__lt=now - LEASE),
        pk=export_id,
    ).update(status=ExportStatus.SENDING, claimed_at=now, attempts=F("attempts") + 1)
    if not claimed:
        return None
    return LangfuseExport.objects.select_related("score__trajectory").get(pk=export_id)


def langfuse_export_deliver(*, export_id: int) -> bool:
    """Send one outbox row; returns whether Langfuse took it. A failure schedules a retry with
    exponential backoff (5 s, 10 s, 20 s, ... up to an hour) and records the error on the row and the
    mirror; after MAX_ATTEMPTS the row is failed."""
    export = _claim(export_id)
    if export is None:
        return False
    mirror = LangfuseMirror.objects.filter(workspace_id=export.workspace_id, enabled=True).first()
    if mirror is None:
        LangfuseExport.objects.filter(pk=export.pk).update(status=ExportStatus.FAILED, last_error="mirror disabled")
        return False
    now = timezone.now()
    try:
        _deliver(mirror, export)
    except (DeliveryError, crypto.DecryptionFailed) as error:
        message = str(error)
        failed = export.attempts >= MAX_ATTEMPTS
        delay = timedelta(seconds=min(3600, 5 * 2 ** (export.attempts - 1)))
        LangfuseExport.objects.filter(pk=export.pk).update(
            status=ExportStatus.FAILED if failed else ExportStatus.PENDING,
            next_attempt_at=now + delay,
            last_error=message,
        )
        LangfuseMirror.objects.filter(pk=mirror.pk).update(last_error=message, last_error_at=now)
        logger.warning("tracing.langfuse_delivery_failed", extra={"export_id": export.pk, "error": message})
        return False
    LangfuseExport.objects.filter(pk=export.pk).update(status=ExportStatus.DONE, sent_at=now, last_error="", payload="")
    counter = "delivered_spans" if export.kind == ExportKind.SPANS else "delivered_scores"
    LangfuseMirror.objects.filter(pk=mirror.pk).update(last_success_at=now, **{counter: F(counter) + export.item_count})
    return True


def langfuse_export_due() -> list[int]:
    """Rows to send now: retries whose time has come, and rows a dead worker left half-sent."""
    now = timezone.now()
    return list(
        LangfuseExport.objects.filter(
            Q(status=ExportStatus.PENDING, next_attempt_at__lte=now - timedelta(seconds=30))
            | Q(status=ExportStatus.SENDING, claimed_at__lt=now - LEASE)
        )
        .order_by("next_attempt_at")
        .values_list("pk", flat=True)[:500]
    )


def langfuse_export_retry_failed(*, workspace: Workspace) -> int:
    """Send the failed rows again (after fixing the keys, say); returns how many."""
    ids = list(
        LangfuseExport.objects.filter(workspace=workspace, status=ExportStatus.FAILED).values_list("pk", flat=True)
    )
    LangfuseExport.objects.filter(pk__in=ids).update(
        status=ExportStatus.PENDING, attempts=0, next_attempt_at=timezone.now()
    )
    from tracing import tasks

    for export_id in ids:
        dispatch.task_send_on_commit(tasks.langfuse_export_deliver, export_id)
    return len(ids)
