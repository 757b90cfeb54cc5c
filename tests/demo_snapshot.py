"""The demo workspace seeded once per pytest worker, and its rows written back for each test that needs it.

A seed (agent_registry/demo.py: traces, triage, gateway traffic, guardrails, eval runs, a training job) took
45-65 s of a browser test's setup on the CI machine, and each browser test on it seeded its own.
`DemoSnapshot.take` seeds in a transaction, copies every table's rows out (COPY, binary) and rolls back: the
database is as before, and the rows stay in memory (4.3 MB, 62 of 81 tables). `restore` empties Keel's tables
and copies the rows back in, in one transaction (0.44-0.61 s), then moves each id sequence past the largest
id, so that what the test creates gets new ids.
The seed's files (exports, adapters) stay in the snapshot's media folder, which a test points MEDIA_ROOT at.

A restored demo is the seed as it was when taken, minutes earlier in the same run: times in it are that
much older than a fresh seed's (the demo's windows are hours and days wide). The tasks a committed seed sends
to the broker are not sent; no browser test on the demo runs a Celery worker to take them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from django.apps import apps
from django.core.management.color import no_style
from django.db import connection, transaction

if TYPE_CHECKING:
    from agent_registry.models import Workspace


def _tables() -> list[str]:
    return sorted(connection.introspection.django_table_names(only_existing=True, include_views=False))


@dataclass(frozen=True)
class DemoSnapshot:
    workspace_slug: str
    media: Path
    rows: dict[str, bytes]  # table: its rows in COPY's binary format

    @classmethod
    def take(cls, media: Path) -> DemoSnapshot:
        """Seed the demo (its files into `media`), keep a copy of every table's rows, roll the seed back."""
        from django.test import override_settings

        from agent_registry import demo

        rows: dict[str, bytes] = {}
        with override_settings(MEDIA_ROOT=media), transaction.atomic():
            slug = demo.demo_seed().slug
            with connection.cursor() as cursor:
                for table in _tables():
                    with cursor.copy(f"COPY {connection.ops.quote_name(table)} TO STDOUT (FORMAT BINARY)") as copy:
                        rows[table] = b"".join(bytes(chunk) for chunk in copy)
            transaction.set_rollback(True)
        return cls(workspace_slug=slug, media=media, rows=rows)

    def restore(self) -> Workspace:
        """Keel's tables hold the snapshot's rows and nothing else; the demo workspace."""
        from agent_registry.models import Workspace

        quote = connection.ops.quote_name
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"TRUNCATE {', '.join(quote(table) for table in _tables())}")
            for table, data in self.rows.items():
                with cursor.copy(f"COPY {quote(table)} FROM STDIN (FORMAT BINARY)") as copy:
                    copy.write(data)
            models = [model for model in apps.get_models(include_auto_created=True) if model._meta.managed]
            for statement in connection.ops.sequence_reset_sql(no_style(), models):
                cursor.execute(statement)
        return Workspace.objects.get(slug=self.workspace_slug)
