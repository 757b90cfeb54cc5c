"""Dataset items and run items get a key, their identity across dataset versions.

Existing rows get the key a new item without one gets (evals.dataset_items.items_keyed): a hash of the
input, with "#2", "#3"... for repeats in one version or run. The derivation is copied here, not imported,
so that this migration keeps doing what it did when the code moves on.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from django.db import migrations, models


def _input_key(task: str, input_messages: Any) -> str:
    messages = input_messages if isinstance(input_messages, list) else []
    canonical = json.dumps(
        {"task": task, "input_messages": messages},
        ensure_ascii=False,
        sort_keys=True,
        separators=(",", ":"),
        default=str,
    )
    return "input:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:24]


def _free(base: str, taken: set[str]) -> str:
    key, repeat = base, 1
    while key in taken:
        repeat += 1
        key = f"{base}#{repeat}"
    taken.add(key)
    return key


def _fill(apps: Any, schema_editor: Any) -> None:
    DatasetItem = apps.get_model("evals", "DatasetItem")
    RunItem = apps.get_model("evals", "RunItem")
    batch: list[Any] = []
    taken: set[str] = set()
    current = None
    for item in DatasetItem.objects.order_by("version_id", "position").iterator(chunk_size=1000):
        if item.version_id != current:
            current, taken = item.version_id, set()
        item.key = _free(_input_key(item.task, item.input_messages), taken)
        batch.append(item)
        if len(batch) >= 1000:
            DatasetItem.objects.bulk_update(batch, ["key"])
            batch = []
    DatasetItem.objects.bulk_update(batch, ["key"])

    batch, taken, current = [], set(), None
    items = RunItem.objects.order_by("run_id", "position").values_list(
        "pk", "run_id", "task", "input_messages", "dataset_item__key"
    )
    for pk, run_id, task, input_messages, dataset_key in items.iterator(chunk_size=1000):
        if run_id != current:
            current, taken = run_id, set()
        key = dataset_key if dataset_key and dataset_key not in taken else None
        if key is None:
            key = _free(_input_key(task, input_messages), taken)
        taken.add(key)
        batch.append(RunItem(pk=pk, key=key))
        if len(batch) >= 1000:
            RunItem.objects.bulk_update(batch, ["key"])
            batch = []
    RunItem.objects.bulk_update(batch, ["key"])


class Migration(migrations.Migration):
    dependencies = [
        ("evals", "0004_suite_variables"),
    ]

    operations = [
        migrations.AddField(
            model_name="datasetitem",
            name="key",
            field=models.CharField(default="", max_length=200),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="runitem",
            name="key",
            field=models.CharField(default="", max_length=200),
            preserve_default=False,
        ),
        migrations.RunPython(_fill, migrations.RunPython.noop),
    ]
