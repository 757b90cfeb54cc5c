"""The demo's eval dataset: a golden set with subgroup tags, then production cases that keep their trace
ids; seeded once however often `demo_seed` runs."""

from __future__ import annotations

import pytest

from agent_registry import demo as registry_demo
from evals import demo, selectors
from evals.models import Dataset, DatasetVersion
from tracing.models import Trajectory

pytestmark = pytest.mark.django_db


@pytest.fixture
def seeded():
    return registry_demo.demo_seed()


def test_the_regression_set_has_a_tagged_golden_version_and_production_cases(seeded):
    dataset = Dataset.objects.get(workspace=seeded, name=demo.DATASET)
    first, second = DatasetVersion.objects.filter(dataset=dataset).order_by("version")

    golden = selectors.dataset_version_items(version=first)
    latest = selectors.dataset_version_items(version=second)
    assert (first.item_count, second.item_count) == (len(demo.GOLDEN), len(demo.GOLDEN) + demo.PRODUCTION_CASES)
    assert {item.metadata["tags"]["language"] for item in golden} == {"en", "es", "fr"}
    from_production = [item for item in latest if item.source_trace_id]
    assert len(from_production) == demo.PRODUCTION_CASES
    known = set(Trajectory.objects.filter(workspace=seeded).values_list("trace_id", flat=True))
    assert {item.source_trace_id for item in from_production} <= known
    assert all(item.input_messages for item in from_production)


def test_seeding_again_adds_nothing(seeded):
    before = DatasetVersion.objects.count()

    registry_demo.demo_seed()

    assert DatasetVersion.objects.count() == before == 2
