"""A database that cannot be reached (down, restarting, failing over) is a 503 with Retry-After, not a 500.

The request did not happen: nothing was acknowledged, so the client keeps what it sent and tries again
later, and Keel itself recovers without a restart (each request checks its persistent connection first:
CONN_HEALTH_CHECKS). The API maps these errors here (config/api.py), the plain views and everything outside
a view through the 500 handler (config/views.py).
"""

from __future__ import annotations

from django.db import InterfaceError, OperationalError
from django.http import JsonResponse

# OperationalError: the server refused or dropped the connection, or stopped the statement (a shutdown,
# a restart, a timeout). InterfaceError: Django's connection was already closed under it.
DATABASE_UNAVAILABLE = (OperationalError, InterfaceError)
RETRY_AFTER_SECONDS = 2
CODE = "database_unavailable"
DETAIL = "the database is unavailable; nothing was stored, retry shortly"


def database_unavailable(error: BaseException | None) -> bool:
    return isinstance(error, DATABASE_UNAVAILABLE)


def database_unavailable_response(retry_after: int = RETRY_AFTER_SECONDS) -> JsonResponse:
    response = JsonResponse({"detail": DETAIL, "code": CODE}, status=503)
    response["Retry-After"] = str(retry_after)
    return response
