"""Finished runs' item counts recounted, and runs every item of which errored marked failed.

Until now an errored item counted in `items_done` as well as in `items_errored` (a run of 13 errored items
showed "26 of 13 items finished"), and a run none of whose items could be answered ended "completed",
so it could be charted, compared and taken as a regression baseline. The rule is copied here, not
imported from evals.runs, so that this migration keeps doing what it did when the code moves on.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations
from django.db.models import Count, Min

FINISHED = ("completed", "failed", "cancelled")


def _recount(apps: Any, schema_editor: Any) -> None:
    Run = apps.get_model("evals", "Run")
    RunItem = apps.get_model("evals", "RunItem")
    for run in Run.objects.filter(items_errored__gt=0, status__in=FINISHED).iterator():
        counts = dict(
            RunItem.objects.filter(run=run).values_list("status").annotate(n=Count("pk")).values_list("status", "n")
        )
        done, errored = counts.get("done", 0), counts.get("errored", 0)
        fields: dict[str, Any] = {"items_done": done, "items_errored": errored}
        if run.status == "completed" and run.item_count > 0 and errored >= run.item_count:
            common = (
                RunItem.objects.filter(run=run, status="errored")
                .values("error")
                .annotate(n=Count("pk"), first=Min("position"))
                .order_by("-n", "first")
                .first()
            )
            error = f"every item errored ({errored} of {run.item_count})"
            if common is not None:
                error += f"; the most common error ({common['n']} item{'s' if common['n'] != 1 else ''}): "
                error += common["error"]
            fields |= {"status": "failed", "error": error[:4000]}
        Run.objects.filter(pk=run.pk).update(**fields)


class Migration(migrations.Migration):
    dependencies = [
        ("evals", "0006_item_key_unique"),
    ]

    operations = [
        migrations.RunPython(_recount, migrations.RunPython.noop, elidable=True),
    ]
