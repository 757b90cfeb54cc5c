"""The demo's rows as tests/demo_snapshot.py writes them back: whole, and moved on in time."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.models import Model

from agent_registry.models import AuditEvent, PromptVersion
from agent_registry.tests.factories import WorkspaceFactory
from tests.demo_snapshot import DemoSnapshot
from tracing.models import Span, Trajectory

pytestmark = pytest.mark.django_db

TWO_DAYS = timedelta(days=2)


def _counts() -> dict[str, int]:
    with connection.cursor() as cursor:
        counts = {}
        for table in connection.introspection.django_table_names(only_existing=True, include_views=False):
            cursor.execute(f"SELECT count(*) FROM {connection.ops.quote_name(table)}")
            counts[table] = cursor.fetchone()[0]
    return counts


def test_a_restore_holds_every_row_of_the_seed_and_only_those(demo_snapshot: DemoSnapshot) -> None:
    demo_snapshot.restore()
    seeded = _counts()
    Trajectory.objects.all().delete()  # what a test changed,
    WorkspaceFactory(slug="left-behind")  # and what it added

    demo_snapshot.restore()

    assert _counts() == seeded
    assert seeded[Trajectory._meta.db_table] > 50


def _moments(model: type[Model], moment: str) -> dict[int, Any]:
    """Each row's moment by its id (a restore keeps the ids)."""
    return dict(model._default_manager.values_list("pk", moment))


def _moves(before: dict[int, Any], after: dict[int, Any]) -> list[Any]:
    assert after.keys() == before.keys()
    return [after[key] - before[key] for key in before]


def test_times_move_on_by_the_time_since_the_seed(demo_snapshot: DemoSnapshot) -> None:
    demo_snapshot.restore()
    watched = [
        (Trajectory, "started_at"),
        (PromptVersion, "created_at"),  # its updates are refused by a trigger
        (AuditEvent, "created_at"),  # so are these
    ]
    before = [_moments(*columns) for columns in watched]
    spans = _moments(Span, "start_time_ns")

    # The same seed, as if it had been taken two days earlier: every moment moves two days further on.
    dataclasses.replace(demo_snapshot, seeded_at=demo_snapshot.seeded_at - TWO_DAYS).restore()

    for columns, moments in zip(watched, before, strict=True):
        moves = _moves(moments, _moments(*columns))
        assert moves, columns
        assert all(TWO_DAYS <= move < TWO_DAYS + timedelta(minutes=1) for move in moves), columns
    span_moves = _moves(spans, _moments(Span, "start_time_ns"))
    assert len(span_moves) > 500
    assert all(
        TWO_DAYS <= timedelta(microseconds=move / 1_000) < TWO_DAYS + timedelta(minutes=1) for move in span_moves
    )
