"""Django's PostgreSQL backend, pointed at the embedded server, which it starts on first connection.

Starting the server lazily keeps settings import free of side effects: `manage.py --help`, the
production settings' checks and Celery's start-up touch no database. The first connection of a
process starts the server (about 0.5 s on a new data directory, 0.1 s on an existing one) or attaches
to the one another Keel process started, and creates the configured database if it is missing.
"""

from __future__ import annotations

import threading
from typing import Any

from django.conf import settings
from django.db.backends.postgresql import base as postgresql

from config import embedded_postgres

_lock = threading.Lock()
_server: embedded_postgres.EmbeddedServer | None = None


def embedded_server() -> embedded_postgres.EmbeddedServer:
    global _server
    with _lock:
        if _server is None:
            server = embedded_postgres.server_start(settings.EMBEDDED_DATA_DIR)
            embedded_postgres.database_ensure(server, settings.EMBEDDED_DATABASE_NAME)
            _server = server
        return _server


class DatabaseWrapper(postgresql.DatabaseWrapper):
    def get_connection_params(self) -> dict[str, Any]:
        server = embedded_server()
        self.settings_dict["HOST"] = server.socket_dir
        self.settings_dict["PORT"] = str(server.port)
        params: dict[str, Any] = super().get_connection_params()
        return params
