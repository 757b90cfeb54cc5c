"""The demo workspace seeded once per pytest worker, and its rows written back for each test that needs it.

A seed (agent_registry/demo.py: traces, triage, gateway traffic, guardrails, eval runs, a training job) took
45-65 s of a test's setup on the CI machine, and each browser test on it, and each module of the per-app
demo tests, seeded its own. `DemoSnapshot.take` seeds in a transaction, copies every table's rows out (COPY,
binary) and rolls back: the database is as before, and the rows stay in memory (4.3 MB, 62 of 81 tables).
`restore` deletes the rows of Keel's tables and copies the snapshot's back in, in one transaction, then
moves each id sequence past the largest id and never back, so that what the test creates gets new ids. It works the same
committed (the browser tests) and inside a transaction that is rolled back later (`demo_workspace`).

Every time in the rows moves on by the time since the seed (`timestamp with time zone` columns, and the
spans' nanosecond times): the demo's "the last 24 hours" and "the last 7 days" hold what they held right
after the seed. Rows with times are copied into a temporary table, moved on there and inserted from it,
since some tables refuse updates (versions, audit events: their triggers). Times inside JSON (span events,
routing features) and dates (budget periods) stay as seeded.

The seed's files (exports, adapters) stay in the snapshot's media folder, which a test points MEDIA_ROOT at.
The tasks a committed seed sends to the broker are not sent; no test on the demo runs a Celery worker to
take them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from django.apps import apps
from django.db import connection, transaction
from django.utils import timezone

if TYPE_CHECKING:
    from django.db.backends.utils import CursorWrapper

    from agent_registry.models import Workspace

# The spans keep their start and end as integer nanoseconds since the epoch (tracing.models.Span).
NANOSECOND_TIME_COLUMNS = ("start_time_ns", "end_time_ns")
# Where the rows of a table with times are moved on before they go into it.
STAGING = "keel_demo_restore"


def _tables() -> list[str]:
    return sorted(connection.introspection.django_table_names(only_existing=True, include_views=False))


def _time_columns(tables: list[str]) -> dict[str, tuple[str, ...]]:
    """Each table's columns that hold a moment: timestamptz, or bigint nanoseconds."""
    columns: dict[str, list[str]] = {}
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT table_name, column_name FROM information_schema.columns
            WHERE table_schema = current_schema() AND table_name = ANY(%s)
              AND (data_type = 'timestamp with time zone' OR (data_type = 'bigint' AND column_name = ANY(%s)))
            ORDER BY table_name, ordinal_position
            """,
            [tables, list(NANOSECOND_TIME_COLUMNS)],
        )
        for table, column in cursor.fetchall():
            columns.setdefault(table, []).append(column)
    return {table: tuple(names) for table, names in columns.items()}


@dataclass(frozen=True)
class DemoSnapshot:
    workspace_slug: str
    media: Path
    seeded_at: datetime
    rows: dict[str, bytes]  # table (one with rows): its rows in COPY's binary format
    times: dict[str, tuple[str, ...]]  # table: its columns of moments, moved on when restored

    @classmethod
    def take(cls, media: Path) -> DemoSnapshot:
        """Seed the demo (its files into `media`), keep a copy of every table's rows, roll the seed back."""
        from django.test import override_settings

        from agent_registry import demo

        rows: dict[str, bytes] = {}
        with override_settings(MEDIA_ROOT=media), transaction.atomic():
            slug = demo.demo_seed().slug
            seeded_at = timezone.now()
            tables = _tables()
            with connection.cursor() as cursor:
                for table in tables:
                    with cursor.copy(f"COPY {connection.ops.quote_name(table)} TO STDOUT (FORMAT BINARY)") as copy:
                        data = b"".join(bytes(chunk) for chunk in copy)
                    if cursor.rowcount:  # an empty table has nothing to write back
                        rows[table] = data
            transaction.set_rollback(True)
        return cls(workspace_slug=slug, media=media, seeded_at=seeded_at, rows=rows, times=_time_columns(tables))

    def restore(self) -> Workspace:
        """Keel's tables hold the snapshot's rows, their times moved on to now, and nothing else; the demo
        workspace. DELETE rather than TRUNCATE: inside a transaction kept open for a test module, TRUNCATE's
        exclusive locks would stop every other connection from reading any table until it ends."""
        from agent_registry.models import Workspace

        quote = connection.ops.quote_name
        microseconds = (timezone.now() - self.seeded_at) // timedelta(microseconds=1)
        with transaction.atomic(), connection.cursor() as cursor:
            for table in _tables():
                cursor.execute(f"DELETE FROM {quote(table)}")
            for table, data in self.rows.items():
                columns = self.times.get(table)
                if not columns:
                    _copy_in(cursor, quote(table), data)
                    continue
                cursor.execute(f"CREATE TEMPORARY TABLE {STAGING} (LIKE {quote(table)})")
                _copy_in(cursor, STAGING, data)
                moved = ", ".join(
                    f"{quote(column)} = {quote(column)} + {_step(column)} * %s::bigint" for column in columns
                )
                cursor.execute(f"UPDATE {STAGING} SET {moved}", [microseconds] * len(columns))
                cursor.execute(f"INSERT INTO {quote(table)} SELECT * FROM {STAGING}")
                cursor.execute(f"DROP TABLE {STAGING}")
            for model in apps.get_models(include_auto_created=True):
                if model._meta.managed and model._meta.pk.get_internal_type() in _AUTO_FIELDS:
                    _sequence_forward(cursor, model._meta.db_table, str(model._meta.pk.column))
        return Workspace.objects.get(slug=self.workspace_slug)


_AUTO_FIELDS = frozenset({"AutoField", "BigAutoField", "SmallAutoField"})


def _sequence_forward(cursor: CursorWrapper, table: str, column: str) -> None:
    """Move the column's id sequence past the table's largest id, never back. A sequence is not part of a
    transaction: setting it back to the snapshot's largest id would hand ids out again that earlier tests
    used, and a process keeps values by id (parsed requirements versions, a key's last use), which a new row
    with an old id would then read. (Django's sequence_reset_sql sets it to the largest id, back included.)"""
    quote = cursor.db.ops.quote_name
    cursor.execute(
        "SELECT setval(q.s, GREATEST("
        f"(SELECT COALESCE(MAX({quote(column)}), 0) FROM {quote(table)}), COALESCE(pg_sequence_last_value(q.s), 0)"
        ") + 1, false) FROM (SELECT pg_get_serial_sequence(%s, %s)::regclass AS s) AS q WHERE q.s IS NOT NULL",
        [quote(table), column],
    )


def _copy_in(cursor: CursorWrapper, table: str, data: bytes) -> None:
    with cursor.copy(f"COPY {table} FROM STDIN (FORMAT BINARY)") as copy:
        copy.write(data)


def _step(column: str) -> str:
    """A microsecond in the column's unit."""
    return "1000" if column in NANOSECOND_TIME_COLUMNS else "interval '1 microsecond'"
