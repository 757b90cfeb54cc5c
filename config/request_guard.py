"""Guards on every request, before any view reads it: what no view could handle is refused here once."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, JsonResponse


class UrlNulRefusalMiddleware:
    """Refuse, with 400 `invalid_url`, a request whose path or query string holds a NUL character (%00).

    PostgreSQL can neither store nor compare one, so a NUL in a path parameter (an agent's slug) or a
    query filter reached the database as a DataError, a 500, on any view that looks a value up. No
    valid identifier or filter in Keel holds one; refusing it here covers every view at once."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if "\x00" in request.path or any(
            "\x00" in key or any("\x00" in value for value in values) for key, values in request.GET.lists()
        ):
            return JsonResponse(
                {"detail": "the URL holds a NUL character (%00), which Keel cannot look up", "code": "invalid_url"},
                status=400,
            )
        return self.get_response(request)


class ChunkedBodyRefusalMiddleware:
    """Refuse, with 411 `length_required`, a body sent chunked without a Content-Length.

    Django reads a request body up to its Content-Length and no further: without one the body reads as
    empty. OTLP ingest then answered 200 to a chunked export and stored nothing, and the API named a
    missing field the client had sent. Refused, the client knows to send the length."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        chunked = "chunked" in request.META.get("HTTP_TRANSFER_ENCODING", "").lower()
        if chunked and not request.META.get("CONTENT_LENGTH"):
            return JsonResponse(
                {
                    "detail": "send the body with a Content-Length: a chunked body without one is not read",
                    "code": "length_required",
                },
                status=411,
            )
        return self.get_response(request)
