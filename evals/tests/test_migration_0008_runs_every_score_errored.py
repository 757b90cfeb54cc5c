"""Migration 0008 on a database that has runs: a completed run every score of which errored becomes failed,
its error the one evals.runs.score_failure gives a run finishing now; every other run is left as it was."""

from __future__ import annotations

import importlib
from typing import Any

import pytest
from django.apps.registry import Apps
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from agent_registry.models import Workspace
from evals import runs
from evals.models import Run

pytestmark = pytest.mark.django_db

BEFORE = ("evals", "0007_run_item_counts")
AFTER = ("evals", "0008_runs_every_score_errored")
migration = importlib.import_module("evals.migrations.0008_runs_every_score_errored")

# A sample's scores: (evaluator, score, error); a sample that is a string is one the target failed to answer.
Scores = list[tuple[str, float | None, str]]
Sample = Scores | str


def _migrate(target: tuple[str, str]) -> Apps:
    """The database migrated to `target` (inside the test's transaction, which rolls it back); the models
    as they were there."""
    executor = MigrationExecutor(connection)
    executor.migrate([target])
    return executor.loader.project_state([target]).apps


def _run(apps: Apps, workspace: Workspace, *, status: str, items: dict[int, list[Sample]], **fields: Any) -> int:
    """A finished run as the code before eba3598 left it: `items` maps an item's position to its samples.
    Items are stored from the last position to the first, so that the order scores were stored in is not
    the order of the items."""
    run_model = apps.get_model("evals", "Run")
    item_model = apps.get_model("evals", "RunItem")
    sample_model = apps.get_model("evals", "RunSample")
    score_model = apps.get_model("evals", "RunScore")
    run = run_model.objects.create(
        workspace_id=workspace.pk, status=status, item_count=len(items), items_done=len(items), **fields
    )
    for position in sorted(items, reverse=True):
        item = item_model.objects.create(run=run, position=position, key=f"item-{position}", status="done")
        for index, sample in enumerate(items[position]):
            if isinstance(sample, str):
                sample_model.objects.create(item=item, sample=index, error=sample)
                continue
            stored = sample_model.objects.create(item=item, sample=index, output_text="an answer")
            for evaluator, score, error in sample:
                score_model.objects.create(
                    sample=stored, evaluator_name=evaluator, evaluator_version=1, score=score, error=error
                )
    pk: int = run.pk
    return pk


def test_0008_fails_the_completed_runs_every_score_of_which_errored_as_a_run_finishing_now_would(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(migration, "BATCH_SIZE", 2)  # the runs below span four batches
    old = _migrate(BEFORE)
    judge_down: Scores = [("judge", None, "judge: the rubric names no scale"), ("exact", None, "exact: no reference")]
    every_score_errored = _run(
        old,
        workspace,
        status="completed",
        report={"judge": {"mean": None}},
        items={1: [judge_down, judge_down], 0: [[("judge", None, "first on item 0")], judge_down]},
    )
    one_scored = _run(
        old, workspace, status="completed", items={0: [judge_down], 1: [[("judge", 0.5, ""), ("exact", None, "x")]]}
    )
    # A score with neither a value nor an error; the target's failed answers carry no scores and do not count.
    no_error_text = _run(old, workspace, status="completed", items={0: ["timeout"], 1: [[("judge", None, "")]]})
    no_scores = _run(old, workspace, status="completed", items={0: [[]], 1: ["timeout"]})
    already_failed = _run(old, workspace, status="failed", items={0: [judge_down]}, error="evaluator settings: bad")
    cancelled = _run(old, workspace, status="cancelled", items={0: [judge_down]})
    running = _run(old, workspace, status="running", items={0: [judge_down]})
    clean = _run(old, workspace, status="completed", items={0: [[("judge", 1.0, "")]]})

    _migrate(AFTER)

    shown = {run["pk"]: (run["status"], run["error"]) for run in Run.objects.values("pk", "status", "error")}
    assert shown[every_score_errored] == (
        "failed",
        "every score errored (7 of 7); the first error (judge on item 0): first on item 0",
    )
    assert shown[no_error_text] == (
        "failed",
        "every score errored (1 of 1); the first error (judge on item 1): no score given",
    )
    # The text a run finishing now gets, from the code that gives it.
    for pk in (every_score_errored, no_error_text):
        assert shown[pk][1] == runs.score_failure(run=Run.objects.get(pk=pk))
    assert Run.objects.get(pk=every_score_errored).report == {"judge": {"mean": None}}  # kept
    assert shown[one_scored] == ("completed", "")
    assert shown[no_scores] == ("completed", "")
    assert shown[already_failed] == ("failed", "evaluator settings: bad")
    assert shown[cancelled] == ("cancelled", "")
    assert shown[running] == ("running", "")
    assert shown[clean] == ("completed", "")

    # Reversed, it changes nothing back (the runs' first state is not kept anywhere).
    _migrate(BEFORE)
    assert shown == {run["pk"]: (run["status"], run["error"]) for run in Run.objects.values("pk", "status", "error")}
