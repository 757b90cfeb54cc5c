"""The demo's eval dataset: a golden set with subgroup tags, then production cases that keep their trace
ids; seeded once however often `demo_seed` runs."""

from __future__ import annotations

import pytest

from agent_registry import demo as registry_demo
from evals import demo, selectors
from evals.models import Dataset, DatasetVersion
from tracing.models import Trajectory

pytestmark = pytest.mark.django_db


def test_the_regression_set_has_a_tagged_golden_version_and_production_cases(demo_workspace):
    dataset = Dataset.objects.get(workspace=demo_workspace, name=demo.DATASET)
    first, second = DatasetVersion.objects.filter(dataset=dataset).order_by("version")

    golden = selectors.dataset_version_items(version=first)
    latest = selectors.dataset_version_items(version=second)
    assert (first.item_count, second.item_count) == (len(demo.GOLDEN), len(demo.GOLDEN) + demo.PRODUCTION_CASES)
    assert {item.metadata["tags"]["language"] for item in golden} == {"en", "es", "fr"}
    from_production = [item for item in latest if item.source_trace_id]
    assert len(from_production) == demo.PRODUCTION_CASES
    known = set(Trajectory.objects.filter(workspace=demo_workspace).values_list("trace_id", flat=True))
    assert {item.source_trace_id for item in from_production} <= known
    assert all(item.input_messages for item in from_production)


def test_seeding_again_adds_nothing(demo_workspace):
    before = DatasetVersion.objects.count()

    registry_demo.demo_seed()

    assert DatasetVersion.objects.count() == before == 2


def test_the_ride_suite_is_proposed_and_run_on_both_prompt_versions_with_k_4(demo_workspace):
    from evals.models import OnlineEvaluation, Run, RunStatus, Suite

    suite = Suite.objects.get(workspace=demo_workspace, name="ride-support-output-quality")
    assert suite.samples == 4
    assert suite.schedule_enabled
    assert suite.dataset is not None
    assert suite.dataset.name == demo.DATASET
    names = [link.evaluator.name for link in suite.suite_evaluators.order_by("position")]
    assert names[-2:] == ["reference_similarity", "group_rank"]
    baseline, candidate = Run.objects.filter(suite=suite).order_by("pk")
    assert (baseline.status, candidate.status) == (RunStatus.COMPLETED, RunStatus.COMPLETED)
    assert candidate.baseline_id == baseline.pk
    assert baseline.prompt_version is not None
    assert candidate.prompt_version is not None
    assert (baseline.prompt_version.version, candidate.prompt_version.version) == (1, 2)
    for run in (baseline, candidate):
        assert run.items_errored == 0
        for name in names:
            overall = run.report[name]["overall"]
            assert overall["errored_samples"] == 0, (name, overall)
            assert set(overall["pass_at_k"]) == {"1", "4"}
        assert run.report[names[0]]["worst_groups"]["language"] is not None
    # The online rule scored production trajectories, and a person rated some of them too.
    assert OnlineEvaluation.objects.filter(rule__workspace=demo_workspace).exists()
    calibration = selectors.evaluator_calibration(workspace=demo_workspace, name="action_appropriateness").calibration
    assert calibration.n >= 4
    assert calibration.agreement is not None
    assert calibration.agreement < 1
    # The shopping assistant's proposal waits for a dataset.
    shopping = Suite.objects.get(workspace=demo_workspace, name="shopping-assistant-output-quality")
    assert shopping.dataset is None
    assert not shopping.schedule_enabled


def test_seeding_again_runs_nothing_again(demo_workspace):
    from evals.models import OnlineEvaluation, Run

    before = (Run.objects.count(), OnlineEvaluation.objects.count())
    registry_demo.demo_seed()
    assert (Run.objects.count(), OnlineEvaluation.objects.count()) == before
