"""OTLP/HTTP trace ingest: `POST /v1/traces`, and Langfuse's path `/api/public/otel/v1/traces`.

A plain Django view rather than a ninja operation: the body is protobuf or JSON bytes, maybe gzipped,
read once with a hard cap, and the answer follows the OTLP spec (an ExportTraceServiceResponse in the
request's encoding, with `partial_success` when spans were rejected). Errors are Keel's
`{"detail", "code"}` JSON with the status OTLP clients understand: 400 (do not retry), 413, 415,
401/403, and 503 with Retry-After when the backlog is full (retry later).
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceResponse,
)

from agent_registry.auth import api_key_from_headers
from agent_registry.models import Scope
from config import unavailable
from config.errors import KeelError
from tracing import services
from tracing.exceptions import IngestPayloadTooLarge
from tracing.otlp import CONTENT_TYPE_JSON

logger = logging.getLogger("tracing.views")


def _error(error: KeelError) -> JsonResponse:
    response = JsonResponse(error.body(), status=error.status)
    retry_after = error.extra.get("retry_after")
    if retry_after is not None:
        response["Retry-After"] = str(retry_after)
    return response


def _success(content_type: str, rejected: int, message: str) -> HttpResponse:
    # OTLP answers in the request's encoding: the request was protobuf unless it was JSON (ingest takes
    # application/protobuf, which some clients send, as well as application/x-protobuf).
    if content_type != CONTENT_TYPE_JSON:
        answer = ExportTraceServiceResponse()
        if rejected:
            answer.partial_success.CopyFrom(ExportTracePartialSuccess(rejected_spans=rejected, error_message=message))
        return HttpResponse(answer.SerializeToString(), content_type=content_type)
    body: dict[str, object] = {}
    if rejected:
        body["partialSuccess"] = {"rejectedSpans": str(rejected), "errorMessage": message}
    return JsonResponse(body)


def _read_body(request: HttpRequest) -> bytes:
    limit: int = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    declared = request.META.get("CONTENT_LENGTH")
    if declared and declared.isdigit() and int(declared) > limit:
        raise IngestPayloadTooLarge(f"the body is {declared} bytes; the limit is {limit}")
    body = request.read(limit + 1)
    if len(body) > limit:
        raise IngestPayloadTooLarge(f"the body is over the limit of {limit} bytes")
    return body


@csrf_exempt
@require_POST
def traces_ingest_api(request: HttpRequest) -> HttpResponse:
    content_type = (request.content_type or "").lower()
    try:
        api_key = api_key_from_headers(request, Scope.INGEST)
        if api_key is None:
            response = JsonResponse(
                {"detail": "a valid API key is required: Authorization: Bearer <key>", "code": "unauthenticated"},
                status=401,
            )
            response["WWW-Authenticate"] = 'Bearer realm="keel"'
            return response
        accepted = services.ingest_otlp_accept(
            api_key=api_key,
            body=_read_body(request),
            content_type=content_type,
            content_encoding=request.headers.get("Content-Encoding", "").strip().lower(),
        )
    except KeelError as error:
        return _error(error)
    except DatabaseError:
        # Nothing was acknowledged; the client keeps the batch and retries.
        logger.exception("tracing.ingest_database_unavailable")
        return unavailable.database_unavailable_response(retry_after=settings.KEEL_INGEST_RETRY_AFTER_SECONDS)
    return _success(content_type, accepted.rejected_spans, accepted.error_message)
