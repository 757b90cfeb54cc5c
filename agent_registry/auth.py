"""API authentication: `Authorization: Bearer <key>`, and HTTP Basic for Langfuse SDKs (secret key = the
Keel key). Each operation names the scope it needs; a key without it gets 403, an unknown key 401.

Rate limits (agent_registry/ratelimit.py) apply here: a key over its budget for the scope gets 429, and a
client address that sent too many unknown keys gets 429 before its next key is looked at."""

from __future__ import annotations

import base64
from typing import Any

from django.http import HttpRequest
from ninja.security import HttpBasicAuth, HttpBearer

from agent_registry import ratelimit, selectors, services
from agent_registry.middleware import client_ip
from agent_registry.models import ApiKey, Scope, Workspace
from config.errors import PermissionDenied, Unauthenticated


def api_key_authenticate(request: HttpRequest, raw_key: str) -> ApiKey | None:
    """The live key for `raw_key`, or None (401), counting failures against the client's address."""
    ip = client_ip(request)
    ratelimit.auth_blocked_check(ip=ip)
    api_key = services.apikey_authenticate(raw_key=raw_key.strip())
    if api_key is None:
        ratelimit.auth_failure_record(ip=ip)
    return api_key


def _key_with_scope(request: HttpRequest, raw_key: str, scope: Scope) -> ApiKey | None:
    api_key = api_key_authenticate(request, raw_key)
    if api_key is None:
        return None
    if scope not in api_key.scopes:
        raise PermissionDenied(f"this API key lacks the {scope.value!r} scope", code="insufficient_scope")
    ratelimit.apikey_check(api_key=api_key, scope=scope)
    return api_key


class ApiKeyBearer(HttpBearer):
    def __init__(self, scope: Scope) -> None:
        super().__init__()
        self.scope = scope

    def authenticate(self, request: HttpRequest, token: str) -> ApiKey | None:
        return _key_with_scope(request, token, self.scope)


class ApiKeyBasic(HttpBasicAuth):
    """Langfuse clients send Basic base64(public_key:secret_key); the secret key is a Keel API key."""

    def __init__(self, scope: Scope) -> None:
        super().__init__()
        self.scope = scope

    def authenticate(self, request: HttpRequest, username: str, password: str) -> ApiKey | None:
        return _key_with_scope(request, password, self.scope)


def api_key_from_headers(request: HttpRequest, scope: Scope) -> ApiKey | None:
    """The key in `Authorization: Bearer <key>` or Basic (Langfuse clients), for views outside ninja."""
    header = request.headers.get("Authorization", "")
    kind, _, value = header.partition(" ")
    if kind.lower() == "bearer" and value:
        return _key_with_scope(request, value, scope)
    if kind.lower() == "basic" and value:
        try:
            _, _, secret = base64.b64decode(value, validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return None
        return _key_with_scope(request, secret, scope) if secret else None
    return None


def key_auth(scope: Scope) -> list[Any]:
    return [ApiKeyBearer(scope)]


def langfuse_auth(scope: Scope) -> list[Any]:
    return [ApiKeyBasic(scope), ApiKeyBearer(scope)]


def request_api_key(request: HttpRequest) -> ApiKey:
    api_key = getattr(request, "auth", None)
    if not isinstance(api_key, ApiKey):
        raise Unauthenticated("this operation needs an API key")
    return api_key


def request_workspace(request: HttpRequest) -> Workspace:
    return request_api_key(request).workspace


def request_agent_ids(request: HttpRequest) -> frozenset[int] | None:
    """The agents the calling key may touch (None: all), computed once per request."""
    cache = request.__dict__
    if "_keel_agent_ids" not in cache:
        cache["_keel_agent_ids"] = selectors.apikey_agent_ids(api_key=request_api_key(request))
    agent_ids: frozenset[int] | None = cache["_keel_agent_ids"]
    return agent_ids
