"""Request context for the audit log: the client's address, which the services that record events do not
otherwise see."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse

from agent_registry import audit


def client_ip(request: HttpRequest) -> str | None:
    """The client's address. Behind KEEL_TRUSTED_PROXY_HOPS reverse proxies, the address the outermost of
    them saw (an X-Forwarded-For entry a client wrote itself is further left, and never read); otherwise
    the peer's own address."""
    hops: int = settings.KEEL_TRUSTED_PROXY_HOPS
    candidate = request.META.get("REMOTE_ADDR", "")
    if hops > 0:
        forwarded = [part.strip() for part in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if part.strip()]
        if len(forwarded) >= hops:
            candidate = forwarded[-hops]
    try:
        return str(ipaddress.ip_address(candidate))
    except ValueError:
        return None


class AuditContextMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        with audit.request_ip(client_ip(request)):
            return self.get_response(request)
