"""The embedded server checkpoints less often than PostgreSQL's defaults (config.embedded_postgres)."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from config import embedded_postgres

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(not settings.DATABASE_EMBEDDED, reason="DATABASE_URL names a server Keel does not configure"),
]


@pytest.fixture
def admin() -> Iterator[psycopg.Connection]:
    """A connection outside the test's transaction (ALTER SYSTEM refuses to run in one)."""
    server = embedded_postgres.server_start(settings.EMBEDDED_DATA_DIR)
    with server.admin_connection() as conn:
        yield conn
        conn.execute("ALTER SYSTEM SET max_wal_size = '4GB'")
        conn.execute("SELECT pg_reload_conf()")


def _in_file(admin: psycopg.Connection, name: str) -> str | None:
    """The value the configuration files give `name` now (the last line that sets it wins)."""
    row = admin.execute(
        "SELECT setting FROM pg_file_settings WHERE name = %s ORDER BY seqno DESC LIMIT 1", [name]
    ).fetchone()
    return None if row is None else str(row[0])


def test_the_running_server_has_keels_checkpoint_settings() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('max_wal_size'), current_setting('checkpoint_timeout')")
        assert cursor.fetchone() == ("4GB", "15min")


def test_a_process_attaching_sets_them_again(admin: psycopg.Connection) -> None:
    admin.execute("ALTER SYSTEM SET max_wal_size = '1GB'")
    admin.execute("SELECT pg_reload_conf()")

    embedded_postgres.server_start(settings.EMBEDDED_DATA_DIR)

    assert _in_file(admin, "max_wal_size") == "4GB"
    assert _in_file(admin, "checkpoint_timeout") == "15min"


def test_a_server_that_refuses_them_is_used_as_it_is(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise psycopg.OperationalError("permission denied to set parameter")

    monkeypatch.setattr(psycopg, "connect", refuse)

    server = embedded_postgres.server_start(settings.EMBEDDED_DATA_DIR)

    assert server.port > 0
    assert "embedded_postgres.checkpoint_settings_failed" in caplog.messages
