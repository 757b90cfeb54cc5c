"""The API root: one NinjaAPI for Keel's own API (/api/v1/, OpenAPI at /api/v1/openapi.json) and one for
the paths Langfuse clients call (/api/public/). Errors of every kind leave here as
`{"detail": ..., "code": ...}` (plus `errors: [{"field", "message"}]` for validation).

A body over DATA_UPLOAD_MAX_MEMORY_SIZE is 413 before it is read, and JSON that PostgreSQL could not store
(NaN, a NUL character, a lone surrogate) is 400 `invalid_json` (config/json_body.py), not a 500 from the
database halfway through a write."""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import DataError, InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponse
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError
from ninja.errors import ValidationError as NinjaValidationError
from ninja.parser import Parser

from agent_registry.api import langfuse_router
from agent_registry.api import router as registry_router
from config import unavailable
from config.errors import KeelError
from config.json_body import json_body_loads
from evals.api import router as evals_router
from evals.suites_api import router as eval_suites_router
from guardrails.api import router as guardrails_router
from routing.api import router as routing_router
from tracing.alerts_api import router as alerts_router
from tracing.api import router as tracing_router
from tracing.langfuse_api import router as langfuse_mirror_router
from tracing.langfuse_scores_api import router as langfuse_scores_router
from tracing.triage_api import router as triage_router
from trainer_bridge.api import router as training_router

logger = logging.getLogger("config.api")


class KeelNinjaAPI(NinjaAPI):
    """The OpenAPI schema is built once per process and path prefix: it depends on the code alone, and building
    it takes about half a second of CPU, which an anonymous client could otherwise ask for in a loop."""

    def get_openapi_schema(self, *, path_prefix: str | None = None, path_params: dict[str, Any] | None = None) -> Any:
        if path_prefix is None:
            path_prefix = self.get_root_path(path_params or {})
        cache: dict[str, Any] = self.__dict__.setdefault("_openapi_schemas", {})
        if path_prefix not in cache:
            cache[path_prefix] = super().get_openapi_schema(path_prefix=path_prefix)
        return cache[path_prefix]


class JsonParser(Parser):
    """Bodies through `json_body_loads`: JSON PostgreSQL can store, or a 400 `invalid_json`."""

    def parse_body(self, request: HttpRequest) -> dict[str, Any]:
        return json_body_loads(request.body)  # type: ignore[no-any-return]  # a list body is a list


def _error(api: NinjaAPI, request: HttpRequest, status: int, body: dict[str, Any]) -> HttpResponse:
    return api.create_response(request, body, status=status)


def _field(location: tuple[Any, ...] | list[Any]) -> str:
    # ninja prefixes body fields with ("body", "payload"); the client only knows its own field names.
    parts = [str(part) for part in location]
    while parts and parts[0] in ("body", "payload", "query", "path"):
        parts.pop(0)
    return ".".join(parts) or "body"


def _install_error_handlers(api: NinjaAPI) -> None:
    @api.exception_handler(KeelError)
    def keel_error(request: HttpRequest, error: KeelError) -> HttpResponse:
        response = _error(api, request, error.status, error.body())
        if "retry_after" in error.extra:
            response["Retry-After"] = str(error.extra["retry_after"])
        return response

    @api.exception_handler(NinjaValidationError)
    def validation_error(request: HttpRequest, error: NinjaValidationError) -> HttpResponse:
        errors = [
            {"field": _field(item.get("loc", ())), "message": item.get("msg", "invalid")} for item in error.errors
        ]
        summary = "; ".join(f"{item['field']}: {item['message']}" for item in errors[:5])
        return _error(
            api,
            request,
            422,
            {"detail": f"invalid request: {summary}", "code": "validation_error", "errors": errors},
        )

    @api.exception_handler(DjangoValidationError)
    def model_validation_error(request: HttpRequest, error: DjangoValidationError) -> HttpResponse:
        if hasattr(error, "error_dict"):
            errors = [
                {"field": field, "message": message}
                for field, messages in error.message_dict.items()
                for message in messages
            ]
        else:
            errors = [{"field": "body", "message": message} for message in error.messages]
        summary = "; ".join(f"{item['field']}: {item['message']}" for item in errors[:5])
        return _error(
            api,
            request,
            422,
            {"detail": f"invalid request: {summary}", "code": "validation_error", "errors": errors},
        )

    @api.exception_handler(AuthenticationError)
    def authentication_error(request: HttpRequest, error: AuthenticationError) -> HttpResponse:
        response = _error(
            api,
            request,
            401,
            {"detail": "a valid API key is required: Authorization: Bearer <key>", "code": "unauthenticated"},
        )
        response["WWW-Authenticate"] = 'Bearer realm="keel"'
        return response

    @api.exception_handler(Http404)
    def not_found(request: HttpRequest, error: Http404) -> HttpResponse:
        return _error(api, request, 404, {"detail": "not found", "code": "not_found"})

    @api.exception_handler(RequestDataTooBig)
    def request_too_big(request: HttpRequest, error: RequestDataTooBig) -> HttpResponse:
        # Django refuses before reading when Content-Length is over the limit.
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return _error(
            api, request, 413, {"detail": f"the body is over the limit of {limit} bytes", "code": "payload_too_large"}
        )

    @api.exception_handler(DataError)
    @api.exception_handler(OverflowError)
    def value_out_of_range(request: HttpRequest, error: DataError | OverflowError) -> HttpResponse:
        # A value that validated but that PostgreSQL or date arithmetic cannot hold: a time zone offset
        # past ±15:59, a window reaching before year 1. The request's data is at fault, so 400, not 500;
        # logged with its traceback all the same, in case a computed value is.
        logger.warning("config.api_value_out_of_range", exc_info=True, extra={"path": request.path})
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        return _error(
            api,
            request,
            400,
            {"detail": f"a value is out of the range Keel can handle: {reason}", "code": "value_out_of_range"},
        )

    @api.exception_handler(HttpError)
    def http_error(request: HttpRequest, error: HttpError) -> HttpResponse:
        # ninja wraps what the parser raises in "Cannot parse request body"; the parser's own words are clearer.
        if isinstance(error.__cause__, KeelError):
            return keel_error(request, error.__cause__)
        code = {400: "bad_request", 405: "method_not_allowed", 413: "payload_too_large"}.get(error.status_code, "error")
        return _error(api, request, error.status_code, {"detail": str(error), "code": code})

    @api.exception_handler(OperationalError)
    @api.exception_handler(InterfaceError)
    def database_unavailable(request: HttpRequest, error: Exception) -> HttpResponse:
        logger.warning("config.api_database_unavailable", extra={"path": request.path, "error": str(error)[:500]})
        response = _error(api, request, 503, {"detail": unavailable.DETAIL, "code": unavailable.CODE})
        response["Retry-After"] = str(unavailable.RETRY_AFTER_SECONDS)
        return response

    @api.exception_handler(Exception)
    def unexpected_error(request: HttpRequest, error: Exception) -> HttpResponse:
        logger.exception("config.api_unexpected_error", extra={"path": request.path})
        return _error(api, request, 500, {"detail": "internal error", "code": "internal_error"})


api = KeelNinjaAPI(
    title="Keel API",
    version="1",
    description="Agents and their requirements, prompts, keys. Authenticate with `Authorization: Bearer <key>`.",
    urls_namespace="api",
    parser=JsonParser(),
)
api.add_router("/", registry_router)
api.add_router("/", tracing_router)
api.add_router("/", langfuse_mirror_router)
api.add_router("/", triage_router)
api.add_router("/", alerts_router)
api.add_router("/", routing_router)
api.add_router("/", guardrails_router)
api.add_router("/", evals_router)
api.add_router("/", eval_suites_router)
api.add_router("/", training_router)
_install_error_handlers(api)

langfuse_api = KeelNinjaAPI(
    title="Keel: Langfuse-compatible API",
    version="1",
    description="The subset of Langfuse's public API that its SDKs call, served from Keel's data.",
    urls_namespace="langfuse",
    docs_url=None,
    parser=JsonParser(),
)
langfuse_api.add_router("/", langfuse_router)
langfuse_api.add_router("/", langfuse_scores_router)
_install_error_handlers(langfuse_api)
