"""The OpenAI-compatible gateway's HTTP layer: `POST /v1/chat/completions`, `GET /v1/models` and
`GET /v1/models/{model}`.

Plain Django views rather than ninja operations: the errors must be OpenAI's JSON (the `openai` client
reads `error.message`), and a streamed answer is a `text/event-stream`. Keel's `detail` and `code` travel
beside OpenAI's `error`. The conversation id comes from the `X-Keel-Conversation-Id` header (or
`metadata.conversation_id`); the answer carries `X-Keel-Trace-Id` and `X-Keel-Tier`.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.conf import settings
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt
from pydantic import ValidationError

from agent_registry.auth import api_key_from_headers
from agent_registry.models import ApiKey, Scope
from config import unavailable
from config.errors import InvalidJson, KeelError
from config.json_body import json_body_loads
from routing import gateway, selectors
from routing.chat import ChatCompletionRequest, error_body

logger = logging.getLogger("routing.gateway_api")

CONVERSATION_HEADER = "X-Keel-Conversation-Id"
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    502: "api_error",
    503: "api_error",
}


def _error(status: int, message: str, code: str, param: str | None = None, **extra: Any) -> JsonResponse:
    body = error_body(message, type_=_ERROR_TYPES.get(status, "api_error"), code=code, param=param)
    body.update(extra)
    response = JsonResponse(body, status=status)
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="keel"'
    return response


def _keel_error(error: KeelError) -> JsonResponse:
    extra = {key: value for key, value in error.extra.items() if key in ("errors", "attempts", "retry_after")}
    response = _error(error.status, error.detail, error.code, **extra)
    if "retry_after" in error.extra:
        response["Retry-After"] = str(error.extra["retry_after"])
    if "trace_id" in error.extra:  # the failed request was recorded: its trajectory is under this id
        response["X-Keel-Trace-Id"] = str(error.extra["trace_id"])
    return response


def _method_not_allowed(request: HttpRequest, allowed: str) -> JsonResponse | None:
    """OpenAI's error JSON for a wrong method (Django's own 405 has an empty body), or None when it is right."""
    if request.method == allowed:
        return None
    response = _error(405, f"{request.method} is not allowed here; use {allowed}", "method_not_allowed")
    response["Allow"] = allowed
    return response


def _database_unavailable() -> JsonResponse:
    response = _error(503, unavailable.DETAIL, unavailable.CODE)
    response["Retry-After"] = str(unavailable.RETRY_AFTER_SECONDS)
    return response


def _caller(request: HttpRequest, method: str) -> ApiKey | JsonResponse:
    """The calling key, or the OpenAI-style error answer: a wrong method, or no key with the gateway scope."""
    wrong_method = _method_not_allowed(request, method)
    return wrong_method if wrong_method is not None else _authenticate(request)


def _authenticate(request: HttpRequest) -> ApiKey | JsonResponse:
    try:
        api_key = api_key_from_headers(request, Scope.GATEWAY)
    except KeelError as error:
        return _keel_error(error)
    except unavailable.DATABASE_UNAVAILABLE:
        logger.warning("routing.gateway_database_unavailable", exc_info=True)
        return _database_unavailable()
    if api_key is None:
        return _error(401, "a valid API key is required: Authorization: Bearer <key>", "unauthenticated")
    return api_key


def _parse(request: HttpRequest) -> ChatCompletionRequest | JsonResponse:
    limit: int = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    declared = request.META.get("CONTENT_LENGTH")
    # Refused on the declared length before a byte is read; the bounded read catches a body that lied.
    if declared and declared.isdigit() and int(declared) > limit:
        return _error(413, f"the body is {declared} bytes; the limit is {limit}", "payload_too_large")
    body = request.read(limit + 1)
    if len(body) > limit:
        return _error(413, f"the body is over the limit of {limit} bytes", "payload_too_large")
    try:
        payload = json_body_loads(body)
    except InvalidJson as error:
        # A NUL in a message would pass to the model and then fail the trace's write (PostgreSQL text).
        return _error(400, error.detail, error.code)
    if not isinstance(payload, dict):
        return _error(400, "the body must be a JSON object", "invalid_request")
    try:
        return ChatCompletionRequest.model_validate(payload)
    except ValidationError as error:
        first = error.errors()[0]
        param = ".".join(str(part) for part in first["loc"])
        errors = [{"field": ".".join(map(str, e["loc"])), "message": e["msg"]} for e in error.errors()[:20]]
        return _error(400, f"{param}: {first['msg']}", "invalid_request", param=param, errors=errors)


@csrf_exempt
def chat_completions_api(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    api_key = _caller(request, "POST")
    if isinstance(api_key, JsonResponse):
        return api_key
    chat = _parse(request)
    if isinstance(chat, JsonResponse):
        return chat
    conversation_id = request.headers.get(CONVERSATION_HEADER, "")
    try:
        if chat.stream:
            trace_id, events = gateway.chat_completion_stream(
                api_key=api_key,
                request=chat,
                conversation_id=conversation_id,
                record_behind=settings.KEEL_GATEWAY_RECORD_BEHIND,
            )
            stream = StreamingHttpResponse(events, content_type="text/event-stream")
            stream["Cache-Control"] = "no-cache"
            stream["X-Keel-Trace-Id"] = trace_id
            return stream
        answer = gateway.chat_completion(
            api_key=api_key,
            request=chat,
            conversation_id=conversation_id,
            record_behind=settings.KEEL_GATEWAY_RECORD_BEHIND,
        )
    except KeelError as error:
        return _keel_error(error)
    except DatabaseError:
        logger.exception("routing.gateway_database_unavailable")
        return _database_unavailable()
    response = JsonResponse(answer.body)
    response["X-Keel-Trace-Id"] = answer.trace_id
    if answer.tier:
        response["X-Keel-Tier"] = answer.tier
    return response


@csrf_exempt
def models_api(request: HttpRequest) -> HttpResponse:
    api_key = _caller(request, "GET")
    if isinstance(api_key, JsonResponse):
        return api_key
    return JsonResponse({"object": "list", "data": _models(api_key)})


def _models(api_key: ApiKey) -> list[dict[str, Any]]:
    agents, targets = selectors.gateway_models(api_key=api_key)
    created = int(time.time())
    return [
        {"id": f"{gateway.AGENT_PREFIX}{agent.slug}", "object": "model", "created": created, "owned_by": "keel:agent"}
        for agent in agents
    ] + [
        {"id": target.alias, "object": "model", "created": created, "owned_by": f"keel:target:{target.model}"}
        for target in targets
    ]


@csrf_exempt
def model_api(request: HttpRequest, model: str) -> HttpResponse:
    """`GET /v1/models/{model}` (the openai client's `models.retrieve`): one of what `/v1/models` lists."""
    api_key = _caller(request, "GET")
    if isinstance(api_key, JsonResponse):
        return api_key
    for entry in _models(api_key):
        if entry["id"] == model:
            return JsonResponse(entry)
    return _error(404, f"there is no model {model!r} this key may call", "model_not_found", param="model")
