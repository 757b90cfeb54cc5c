"""Stored trajectory views take the detail API's key names, so the API can send them without parsing them
(tracing.steps.view_document_json), and only trajectories of 50 spans or more keep one: the API builds a
shorter trajectory's view from its spans when asked."""

from typing import Any

import orjson
from django.db import migrations

# tracing.services.VIEW_DOCUMENT_MIN_SPANS when this migration was written.
MIN_SPANS = 50
CHUNK = 200
RENAMED = (
    ("steps", "step_details"),
    ("conversation", "conversation"),
    ("tool_calls", "tool_calls_detail"),
    ("tool_definitions", "tool_definitions"),
)


def rename_keys(apps: Any, schema_editor: Any) -> None:
    Trajectory = apps.get_model("tracing", "Trajectory")
    Trajectory.objects.filter(span_count__lt=MIN_SPANS).exclude(view_document="").update(view_document="")
    kept = Trajectory.objects.exclude(view_document="").order_by("pk").values_list("pk", flat=True)
    last = 0
    while True:
        ids = list(kept.filter(pk__gt=last)[:CHUNK])
        if not ids:
            return
        rows = list(Trajectory.objects.filter(pk__in=ids).only("pk", "view_document"))
        for row in rows:
            old = orjson.loads(row.view_document)
            if "step_details" not in old:
                row.view_document = orjson.dumps({new: old.get(key, []) for key, new in RENAMED}).decode()
        Trajectory.objects.bulk_update(rows, ["view_document"])
        last = ids[-1]


class Migration(migrations.Migration):
    dependencies = [
        ("tracing", "0013_tool_result_shapes"),
    ]

    operations = [migrations.RunPython(rename_keys, migrations.RunPython.noop)]
