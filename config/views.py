"""Error handlers: JSON for API paths, the dashboard's pages for everything else."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse

from frontend import views as frontend_views

API_PREFIXES = ("/api/", "/v1/")


def page_not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if request.path.startswith(API_PREFIXES):
        return JsonResponse({"detail": f"no endpoint at {request.path}", "code": "not_found"}, status=404)
    return frontend_views.page_not_found(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    if request.path.startswith(API_PREFIXES):
        return JsonResponse({"detail": "internal error", "code": "internal_error"}, status=500)
    return frontend_views.server_error(request)
