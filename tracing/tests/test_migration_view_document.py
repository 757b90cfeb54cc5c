"""Migration 0014: stored views take the detail API's keys; short trajectories keep none."""

from __future__ import annotations

import importlib

import orjson
import pytest
from django.apps import apps

from tracing.models import Trajectory
from tracing.tests.factories import TrajectoryFactory

pytestmark = pytest.mark.django_db

migration = importlib.import_module("tracing.migrations.0014_view_document_api_keys")

OLD = {
    "steps": [{"index": 0, "kind": "agent"}],
    "conversation": [{"role": "user"}],
    "tool_calls": [],
    "tool_definitions": [],
}
NEW = {"step_details": [{"index": 0}], "conversation": [], "tool_calls_detail": [], "tool_definitions": []}


def test_long_views_are_renamed_short_ones_dropped_new_ones_kept():
    short = TrajectoryFactory.create(span_count=10, view_document=orjson.dumps(OLD).decode())
    long = TrajectoryFactory.create(span_count=401, view_document=orjson.dumps(OLD).decode())
    current = TrajectoryFactory.create(span_count=60, view_document=orjson.dumps(NEW).decode())
    none = TrajectoryFactory.create(span_count=80, view_document="")

    migration.rename_keys(apps, None)

    stored = dict(Trajectory.objects.values_list("pk", "view_document"))
    assert stored[short.pk] == ""
    assert orjson.loads(stored[long.pk]) == {
        "step_details": OLD["steps"],
        "conversation": OLD["conversation"],
        "tool_calls_detail": [],
        "tool_definitions": [],
    }
    assert stored[current.pk] == orjson.dumps(NEW).decode()
    assert stored[none.pk] == ""
