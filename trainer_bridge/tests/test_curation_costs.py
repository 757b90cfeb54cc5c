"""A curated trajectory's figures for a trainer's logs: a cost nothing priced is left out, not logged as $0."""

from __future__ import annotations

from decimal import Decimal

import pytest

from tracing.tests.factories import TrajectoryFactory
from trainer_bridge import curation

pytestmark = pytest.mark.django_db


def test_a_trajectory_whose_model_calls_had_no_price_logs_no_cost(workspace):
    priced = TrajectoryFactory.create(workspace=workspace, cost_usd=Decimal("0.0035"))
    unpriced = TrajectoryFactory.create(workspace=workspace, cost_usd=None, unpriced_call_count=2)

    found = {
        item.trace_id: item.metrics
        for item in curation.curated(workspace=workspace, query={}, reward={"source": "trajectory"})
    }

    assert found[priced.trace_id]["cost_usd"] == 0.0035
    assert "cost_usd" not in found[unpriced.trace_id]
    assert found[unpriced.trace_id]["steps"] == unpriced.step_count
