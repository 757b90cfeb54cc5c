"""Security headers Django's own middleware does not set: a Content-Security-Policy and a
Permissions-Policy on every response (SecurityMiddleware sets HSTS, nosniff, the referrer and
cross-origin opener policies; XFrameOptionsMiddleware sets X-Frame-Options).

The dashboard is built for the policy in settings.KEEL_CONTENT_SECURITY_POLICY: its scripts are static
files, data for them travels in `json_script` blocks (JSON, never executed), no template has an inline
script or an inline event handler, and htmx is told not to evaluate anything (frontend/static/keel.js).
So a string that slipped past escaping still could not run. A view that needs another policy sets the
header itself and keeps it.
"""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse


class SecurityHeadersMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        self.content_security_policy: str = settings.KEEL_CONTENT_SECURITY_POLICY
        self.permissions_policy: str = settings.KEEL_PERMISSIONS_POLICY

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if self.content_security_policy:
            response.headers.setdefault("Content-Security-Policy", self.content_security_policy)
        if self.permissions_policy:
            response.headers.setdefault("Permissions-Policy", self.permissions_policy)
        return response
