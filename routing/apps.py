from typing import Any

from django.apps import AppConfig
from django.db.backends.signals import connection_created


def _iterative_scan_on(sender: Any, connection: Any, **kwargs: Any) -> None:
    """pgvector's HNSW scans with a filter go on walking the graph until enough rows pass it (iterative scan,
    rows in roughly nearest-first order), in every session from its start: the learned router's neighbour
    search (routing/selectors.py) is a prepared statement that runs alone, with no SET before it. The
    semantic cache sets its own scan settings per search (routing/cache.py). A SET when the session opens
    rather than a startup option, which a pooler such as PgBouncer may refuse."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET hnsw.iterative_scan = relaxed_order")


class RoutingConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "routing"

    def ready(self) -> None:
        connection_created.connect(_iterative_scan_on, dispatch_uid="routing.iterative_scan_on")
