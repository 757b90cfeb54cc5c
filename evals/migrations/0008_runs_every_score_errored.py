"""Completed runs every score of which errored marked failed, as runs finishing now are (since eba3598).

Such a run answered its items but no evaluator could judge any answer: it measured nothing, yet it ended
"completed", so it could be charted, compared and taken as a regression baseline. Its error is the one
`evals.runs.score_failure` gives: how many scores, and the first error (by item, sample, then the order
the scores were stored in). The rule is copied here, not imported from evals.runs (which reads the live
models), so that this migration keeps doing what it did when the code moves on. The runs' reports and
their regression alerts are left as they are; reversing changes nothing back.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, transaction
from django.db.models import Count

# Runs per transaction: a batch's runs stay locked only until it commits, so workers go on meanwhile.
BATCH_SIZE = 500


def _score_failure(run_score_model: Any, run_pk: int) -> str:
    """evals.runs.score_failure of the run as it was written at eba3598."""
    scores = run_score_model.objects.filter(sample__item__run=run_pk, sample__error="")
    counts = scores.aggregate(scores=Count("pk"), scored=Count("score"))
    if not counts["scores"] or counts["scored"]:
        return ""
    first = (
        scores.order_by("sample__item__position", "sample__sample", "pk")
        .values_list("evaluator_name", "sample__item__position", "error")
        .first()
    )
    evaluator, position, text = first
    return (
        f"every score errored ({counts['scores']} of {counts['scores']}); "
        f"the first error ({evaluator} on item {position}): {text or 'no score given'}"
    )[:4000]


def runs_every_score_errored_fail(apps: Any, schema_editor: Any) -> None:
    run_model = apps.get_model("evals", "Run")
    run_score_model = apps.get_model("evals", "RunScore")
    last_pk = 0
    while True:
        with transaction.atomic():
            batch = list(
                run_model.objects.filter(pk__gt=last_pk, status="completed")
                .order_by("pk")
                .select_for_update()
                .values_list("pk", flat=True)[:BATCH_SIZE]
            )
            if not batch:
                return
            last_pk = batch[-1]
            # The batch's runs that have scores none of which was given: one query for the batch.
            unscored = (
                run_score_model.objects.filter(sample__item__run__in=batch, sample__error="")
                .values("sample__item__run")
                .annotate(scored=Count("score"))
                .filter(scored=0)
                .values_list("sample__item__run", flat=True)
            )
            for run_pk in sorted(unscored):
                error = _score_failure(run_score_model, run_pk)
                if error:
                    run_model.objects.filter(pk=run_pk, status="completed").update(status="failed", error=error)


class Migration(migrations.Migration):
    # The runs are re-marked batch by batch.
    atomic = False

    dependencies = [
        ("evals", "0007_run_item_counts"),
    ]

    operations = [
        migrations.RunPython(runs_every_score_errored_fail, migrations.RunPython.noop, elidable=True),
    ]
