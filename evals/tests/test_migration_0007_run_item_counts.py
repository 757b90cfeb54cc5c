"""Migration 0007 on a database that has runs: finished runs' item counts are recounted from their items,
and a completed run every item of which errored becomes failed, its error naming the most common one."""

from __future__ import annotations

from typing import Any

import pytest
from django.apps.registry import Apps
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from agent_registry.models import Workspace

pytestmark = pytest.mark.django_db

BEFORE = ("evals", "0006_item_key_unique")
AFTER = ("evals", "0007_run_item_counts")


def _migrate(target: tuple[str, str]) -> Apps:
    """The database migrated to `target` (inside the test's transaction, which rolls it back); the models
    as they were there."""
    executor = MigrationExecutor(connection)
    executor.migrate([target])
    return executor.loader.project_state([target]).apps


def _run(
    apps: Apps, workspace: Workspace, *, status: str, done: int, errored: int, items: list[str], **fields: Any
) -> int:
    """A run as the code before 0007 left it: `items` gives each item's status ("done", "pending"), or the
    error text of an errored item."""
    run = apps.get_model("evals", "Run").objects.create(
        workspace_id=workspace.pk,
        status=status,
        item_count=len(items),
        items_done=done,
        items_errored=errored,
        **fields,
    )
    apps.get_model("evals", "RunItem").objects.bulk_create(
        [
            apps.get_model("evals", "RunItem")(
                run=run,
                position=position,
                key=f"item-{position}",
                status=item if item in ("done", "pending") else "errored",
                error="" if item in ("done", "pending") else item,
            )
            for position, item in enumerate(items)
        ]
    )
    pk: int = run.pk
    return pk


def test_0007_recounts_finished_runs_and_fails_the_completed_ones_every_item_of_which_errored(
    workspace: Workspace,
) -> None:
    old = _migrate(BEFORE)
    # An errored item counted in `items_done` as well: "4 of 3 items finished".
    some_errored = _run(old, workspace, status="completed", done=3, errored=1, items=["done", "boom", "done"])
    all_errored = _run(
        old, workspace, status="completed", done=3, errored=3, items=["missing_variables: a", "timeout", "timeout"]
    )
    tie = _run(old, workspace, status="completed", done=2, errored=2, items=["second", "first"])
    failed = _run(old, workspace, status="failed", done=2, errored=2, items=["x", "y"], error="evaluator settings: bad")
    cancelled = _run(old, workspace, status="cancelled", done=2, errored=2, items=["x", "y"])
    running = _run(old, workspace, status="running", done=2, errored=1, items=["done", "x", "pending"])
    clean = _run(old, workspace, status="completed", done=2, errored=0, items=["done", "done"])

    new = _migrate(AFTER)

    runs = {
        run["pk"]: run
        for run in new.get_model("evals", "Run").objects.values("pk", "status", "items_done", "items_errored", "error")
    }

    def shown(pk: int) -> tuple[str, int, int, str]:
        return runs[pk]["status"], runs[pk]["items_done"], runs[pk]["items_errored"], runs[pk]["error"]

    assert shown(some_errored) == ("completed", 2, 1, "")
    assert shown(all_errored) == (
        "failed",
        0,
        3,
        "every item errored (3 of 3); the most common error (2 items): timeout",
    )
    # Equally common errors: the one met first in the run.
    assert shown(tie) == ("failed", 0, 2, "every item errored (2 of 2); the most common error (1 item): second")
    # Already failed or cancelled: recounted, status and error kept.
    assert shown(failed) == ("failed", 0, 2, "evaluator settings: bad")
    assert shown(cancelled) == ("cancelled", 0, 2, "")
    # A run still going, or one no item of which errored, is left as it was.
    assert shown(running) == ("running", 2, 1, "")
    assert shown(clean) == ("completed", 2, 0, "")
