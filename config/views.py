"""Error handlers: JSON for API paths, the dashboard's pages for everything else."""

from __future__ import annotations

import sys

from django.http import HttpRequest, HttpResponse, JsonResponse

from config import unavailable
from frontend import views as frontend_views

API_PREFIXES = ("/api/", "/v1/")


def page_not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if request.path.startswith(API_PREFIXES):
        return JsonResponse({"detail": f"no endpoint at {request.path}", "code": "not_found"}, status=404)
    return frontend_views.page_not_found(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    # Django calls this handler while it handles the exception, which it does not pass on: a database
    # that went away is a 503 to retry, wherever it surfaced (a view, a middleware, the key lookup).
    if unavailable.database_unavailable(sys.exc_info()[1]):
        if request.path.startswith(API_PREFIXES):
            return unavailable.database_unavailable_response()
        page = frontend_views.server_error(request)
        page.status_code = 503
        page["Retry-After"] = str(unavailable.RETRY_AFTER_SECONDS)
        return page
    if request.path.startswith(API_PREFIXES):
        return JsonResponse({"detail": "internal error", "code": "internal_error"}, status=500)
    return frontend_views.server_error(request)
