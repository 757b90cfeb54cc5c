"""Keel's error hierarchy. Domain code raises these; the API maps them once, in config/api.py, to
`{"detail": ..., "code": ...}` with the class's status. No Django or HTTP imports here."""

from __future__ import annotations

from typing import Any


class KeelError(Exception):
    status = 400
    code = "bad_request"

    def __init__(self, detail: str, *, code: str | None = None, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        if code is not None:
            self.code = code
        self.extra = extra

    def body(self) -> dict[str, Any]:
        return {"detail": self.detail, "code": self.code, **self.extra}


class Unauthenticated(KeelError):
    status = 401
    code = "unauthenticated"


class PermissionDenied(KeelError):
    status = 403
    code = "permission_denied"


class NotFound(KeelError):
    status = 404
    code = "not_found"


class MethodNotAllowed(KeelError):
    status = 405
    code = "method_not_allowed"


class Conflict(KeelError):
    status = 409
    code = "conflict"


class PayloadTooLarge(KeelError):
    status = 413
    code = "payload_too_large"


class UnsupportedMediaType(KeelError):
    status = 415
    code = "unsupported_media_type"


class ValidationFailed(KeelError):
    """Input that parses but breaks a rule; `errors` names each field: [{"field", "message"}]."""

    status = 422
    code = "validation_error"


class InvalidJson(KeelError):
    """A body that is not JSON Keel can store: malformed, not UTF-8, NaN, nested past the limit, or
    holding a NUL character or a lone surrogate, which PostgreSQL text cannot hold."""

    code = "invalid_json"


class Throttled(KeelError):
    status = 429
    code = "throttled"


class Unavailable(KeelError):
    status = 503
    code = "unavailable"
