"""A run every item of which errored is failed, its error naming the most common item error; a run with
some errored items completes and counts them. A failed run is no chart point, no regression baseline, and
a failed candidate is a regression of its own; comparisons say which side failed."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from agent_registry import services as registry_services
from agent_registry.models import PromptVersion, Role
from agent_registry.tests.factories import MembershipFactory
from evals import dataset_items, regressions, runs, selectors, services
from evals.models import Dataset, RegressionAlert, Run, RunItem, RunItemStatus, RunStatus, SuiteTarget
from evals.tests.test_runs import _script, _suite
from routing.tests import conftest as routing_fixtures
from routing.tests.conftest import Gateway
from routing.tests.fakes import FakeGatewayLLM

fake = routing_fixtures.fake
gateway = routing_fixtures.gateway

pytestmark = pytest.mark.django_db


def _dataset(gw: Gateway, *, with_variables: list[bool], name: str = "mixed") -> Dataset:
    """One item per flag; the gateway's prompt needs {{company}}, which only the flagged items give."""
    dataset = services.dataset_create(workspace=gw.workspace, name=name, agent=gw.agent)
    items = [
        dataset_items.ItemData(
            input_messages=({"role": "user", "content": f"question {n}"},),
            reference_output="ok",
            metadata={"variables": {"company": "Acme"}} if given else {},
        )
        for n, given in enumerate(with_variables)
    ]
    services.dataset_version_create_from_items(dataset=dataset, items=items)
    return dataset


def _execute(suite: Any, **create: Any) -> Run:
    run = runs.run_execute(run_id=runs.run_create(suite=suite, dispatch=False, **create).pk)
    assert run is not None
    return run


def test_a_run_whose_every_item_errored_fails_naming_the_most_common_error(gateway: Gateway) -> None:
    # The demo's case: a suite on a prompt whose variables the items do not give.
    suite = _suite(gateway, samples=2, dataset=_dataset(gateway, with_variables=[False] * 5))

    run = _execute(suite)

    assert run.status == RunStatus.FAILED
    assert run.error.startswith("every item errored (5 of 5); the most common error (5 items): missing_variables: ")
    assert "company" in run.error
    assert run.finished_at is not None
    # Each item counts once: 0 answered, 5 errored (an errored item used to count as done too: "10 of 5").
    assert (run.items_done, run.items_errored, run.item_count) == (0, 5, 5)
    assert runs.run_progress(run=run) | {"resume_after": None} == {
        "status": "failed",
        "items": 5,
        "done": 0,
        "errored": 5,
        "pending": 0,
        "running": 0,
        "pause_reason": "",
        "resume_after": None,
    }
    assert run.report["says_ok"]["overall"]["mean"] is None  # the report is kept: it shows 5 errored


def test_the_most_common_kind_of_error_is_named_with_its_count(gateway: Gateway) -> None:
    # Recorded target: three items were never recorded, one names a trajectory that is gone.
    dataset = services.dataset_create(workspace=gateway.workspace, name="recorded", agent=gateway.agent)
    items = [dataset_items.ItemData(task=f"task {n}") for n in range(3)]
    items.insert(1, dataset_items.ItemData(task="gone", source_trace_id="ab" * 16))
    services.dataset_version_create_from_items(dataset=dataset, items=items)
    suite = _suite(gateway, samples=1, dataset=dataset, target=SuiteTarget.RECORDED, name="recorded")

    run = _execute(suite)

    assert run.status == RunStatus.FAILED
    assert run.error == (
        "every item errored (4 of 4); the most common error (3 items): "
        "the item has no recorded trajectory (source_trace_id)"
    )
    kinds = runs.item_errors(run=run)
    assert [(kind.items, kind.first_position) for kind in kinds] == [(3, 0), (1, 1)]
    assert kinds[1].example == f"trajectory {'ab' * 16} is no longer stored"


def test_errors_of_one_code_with_different_details_are_one_kind(gateway: Gateway) -> None:
    suite = _suite(gateway, samples=1, dataset=_dataset(gateway, with_variables=[False, False]))
    run = _execute(suite)
    first, second = RunItem.objects.filter(run=run).order_by("position")
    RunItem.objects.filter(pk=second.pk).update(error="missing_variables: the prompt needs city")

    (kind,) = runs.item_errors(run=run)

    assert (kind.kind, kind.items, kind.example) == ("missing_variables", 2, first.error)


def test_a_run_with_some_errored_items_completes_and_counts_them(gateway: Gateway, fake: FakeGatewayLLM) -> None:
    suite = _suite(gateway, samples=1, dataset=_dataset(gateway, with_variables=[True, False, True, True]))
    _script(fake, ["ok"] * 3)

    run = _execute(suite)

    assert run.status == RunStatus.COMPLETED
    assert run.error == ""
    assert (run.items_done, run.items_errored) == (3, 1)
    assert RunItem.objects.get(run=run, position=1).status == RunItemStatus.ERRORED
    overall = run.report["says_ok"]["overall"]
    assert (overall["count"], overall["errored"], overall["mean"]) == (3, 1, 1.0)


def test_the_api_shows_a_failed_run_with_its_error(gateway: Gateway, api_client_for: Any) -> None:
    suite = _suite(gateway, samples=1, dataset=_dataset(gateway, with_variables=[False] * 3))
    run = _execute(suite)
    client: Client = api_client_for(gateway.workspace, scopes=("read",))

    body = client.get(f"/api/v1/runs/{run.pk}").json()

    assert (body["status"], body["progress"]["done"], body["progress"]["errored"]) == ("failed", 0, 3)
    assert body["error"].startswith("every item errored (3 of 3); the most common error (3 items): missing_variables")
    assert [found["id"] for found in client.get("/api/v1/runs?status=failed").json()] == [run.pk]
    assert client.get("/api/v1/runs?status=completed").json() == []


def test_a_failed_run_is_no_point_of_the_suites_history(gateway: Gateway, fake: FakeGatewayLLM) -> None:
    dataset = _dataset(gateway, with_variables=[True, True])
    suite = _suite(gateway, samples=1, dataset=dataset)
    _script(fake, ["ok", "ok"])
    good = _execute(suite)
    services.dataset_version_create_from_items(
        dataset=dataset, items=[dataset_items.ItemData(input_messages=({"role": "user", "content": "q"},))]
    )
    broken = _execute(suite)
    assert (good.status, broken.status) == (RunStatus.COMPLETED, RunStatus.FAILED)

    assert [point["run"] for point in selectors.metric_history(suite=suite, evaluator="says_ok")] == [good.pk]


def _v2(gateway: Gateway, content: str) -> PromptVersion:
    prompt = gateway.agent.prompts.get()
    registry_services.prompt_version_create(prompt=prompt, template=[{"role": "system", "content": content}])
    version = PromptVersion.objects.get(prompt=prompt, version=2)
    registry_services.prompt_label_move(prompt=prompt, label="production", version=version)
    return version


def _failure_alert(finished: Run | None, *, baseline: Run, candidate: Run) -> RegressionAlert:
    """The one regression alert a failed candidate run raised against its baseline."""
    assert finished is not None
    assert finished.status == RunStatus.FAILED
    alert = RegressionAlert.objects.get()
    assert (alert.metric, alert.baseline_run_id, alert.candidate_run_id) == (
        regressions.FAILED_METRIC,
        baseline.pk,
        candidate.pk,
    )
    return alert


def test_a_label_move_to_a_version_whose_run_fails_raises_a_regression(gateway: Gateway, fake: FakeGatewayLLM) -> None:
    suite = _suite(gateway, samples=1, dataset=_dataset(gateway, with_variables=[True] * 3))
    _script(fake, ["ok"] * 3)
    baseline = _execute(suite)
    _v2(gateway, "Serve riders in {{city}}.")  # the items give no city: every request is refused

    (candidate,) = regressions.label_moves_check()
    finished = runs.run_execute(run_id=candidate.pk)

    alert = _failure_alert(finished, baseline=baseline, candidate=candidate)
    assert alert.message.startswith("v2 failed where v1 completed: every item errored (3 of 3)")
    assert regressions.run_completed(run_id=candidate.pk) == []  # raised once


def test_a_failed_run_is_never_a_regression_baseline(gateway: Gateway, fake: FakeGatewayLLM) -> None:
    dataset = _dataset(gateway, with_variables=[False] * 2)
    suite = _suite(gateway, samples=1, dataset=dataset)
    failed = _execute(suite)
    assert failed.status == RunStatus.FAILED
    services.dataset_version_create_from_items(
        dataset=dataset,
        items=[
            dataset_items.ItemData(
                input_messages=({"role": "user", "content": "q"},), metadata={"variables": {"company": "Acme"}}
            )
        ],
    )
    _v2(gateway, "Acme's v2 for {{company}}.")

    (candidate,) = regressions.label_moves_check()

    assert candidate.baseline is not None
    assert candidate.baseline.pk != failed.pk  # a fresh v1 run, not the failed one
    assert candidate.baseline.status == RunStatus.QUEUED
    _script(fake, ["ok", "ok"])
    runs.run_execute(run_id=candidate.baseline.pk)
    runs.run_execute(run_id=candidate.pk)
    assert not RegressionAlert.objects.exists()


def test_a_failed_baseline_raises_no_alert_for_its_candidate(gateway: Gateway, fake: FakeGatewayLLM) -> None:
    # v1 needs {{company}}, which the items do not give; v2 needs nothing. The label move's fresh v1
    # baseline fails: it measured nothing, so the v2 run that answers badly is compared with nothing.
    suite = _suite(gateway, samples=1, dataset=_dataset(gateway, with_variables=[False, False]))
    _v2(gateway, "Be terse.")
    (candidate,) = regressions.label_moves_check()
    assert candidate.baseline is not None

    _script(fake, ["no", "no"])
    finished = runs.run_execute(run_id=candidate.pk)
    baseline = runs.run_execute(run_id=candidate.baseline.pk)

    assert finished is not None
    assert baseline is not None
    assert (finished.status, baseline.status) == (RunStatus.COMPLETED, RunStatus.FAILED)
    assert not RegressionAlert.objects.exists()
    assert suite.pk == finished.suite_id


def test_a_comparison_says_which_run_failed(gateway: Gateway, fake: FakeGatewayLLM, api_client_for: Any) -> None:
    dataset = _dataset(gateway, with_variables=[True, True])
    suite = _suite(gateway, samples=1, dataset=dataset)
    _script(fake, ["ok", "ok"])
    good = _execute(suite)
    services.dataset_version_create_from_items(
        dataset=dataset,
        items=[dataset_items.ItemData(input_messages=({"role": "user", "content": f"question {n}"},)) for n in (0, 1)],
    )
    broken = _execute(suite)
    client: Client = api_client_for(gateway.workspace, scopes=("read",))

    body = client.get(f"/api/v1/runs/compare?baseline={good.pk}&candidate={broken.pk}").json()

    assert (body["baseline_status"], body["candidate_status"]) == ("completed", "failed")
    assert (body["baseline_items_errored"], body["candidate_items_errored"]) == (0, 2)
    says_ok = body["metrics"]["says_ok"]
    assert (says_ok["items"], says_ok["mean_delta"], says_ok["errored"]) == (0, None, 2)

    viewer = Client()
    viewer.force_login(MembershipFactory.create(workspace=gateway.workspace, role=Role.VIEWER).user)
    page = viewer.get(f"/w/{gateway.workspace.slug}/evals/compare/?a={good.pk}&b={broken.pk}").content.decode()
    assert f'data-run-failed="{broken.pk}"' in page
    assert f'data-run-failed="{good.pk}"' not in page
    assert "every item errored (2 of 2)" in page


def test_the_dashboard_shows_a_failed_run_and_the_errored_count_of_a_completed_one(
    gateway: Gateway, fake: FakeGatewayLLM
) -> None:
    suite = _suite(gateway, samples=1, dataset=_dataset(gateway, with_variables=[True, False, True, False, True]))
    _script(fake, ["ok"] * 3)
    partial = _execute(suite)
    broken = _execute(
        _suite(gateway, samples=1, dataset=_dataset(gateway, with_variables=[False], name="bare"), name="bare")
    )
    viewer = Client()
    viewer.force_login(MembershipFactory.create(workspace=gateway.workspace, role=Role.VIEWER).user)
    slug = gateway.workspace.slug

    partial_page = viewer.get(f"/w/{slug}/evals/runs/{partial.pk}/").content.decode()
    broken_page = viewer.get(f"/w/{slug}/evals/runs/{broken.pk}/").content.decode()
    run_list = viewer.get(f"/w/{slug}/evals/runs/").content.decode()

    assert partial.status == RunStatus.COMPLETED
    assert "5 of 5 items finished (2 errored)" in partial_page  # was "7 of 5" with errored items counted twice
    assert 'data-items-errored="2"' in partial_page
    assert "<strong>2 of 5 items errored</strong> and are left out of the report" in partial_page
    assert "Most common (2 items): <code>missing_variables: " in partial_page
    assert 'data-run-status="failed"' in broken_page
    assert "every item errored (1 of 1); the most common error (1 item): missing_variables" in broken_page
    assert "items errored</strong>" not in broken_page  # the error says it; no second box
    assert '<span class="badge badge-warning" data-items-errored="2">2 errored</span>' in run_list
    assert '<span class="badge badge-error" data-items-errored="1">1 errored</span>' in run_list


# --- Every score errored -------------------------------------------------------------------------------


def _scored_by_exact_match(gw: Gateway, *, references: list[str | None], samples: int = 2, name: str = "exact") -> Any:
    """A suite whose items are all answered (their variables are given) and scored by exact match, which
    cannot judge an item without a reference output: its score errors."""
    dataset = services.dataset_create(workspace=gw.workspace, name=name, agent=gw.agent)
    services.dataset_version_create_from_items(dataset=dataset, items=_exact_items(references))
    evaluator = services.evaluator_create(workspace=gw.workspace, name="exact", config={"type": "exact_match"})
    return services.suite_create(
        workspace=gw.workspace,
        name=name,
        agent=gw.agent,
        dataset=dataset,
        samples=samples,
        concurrency=1,
        tier="single_call",
        evaluators_used=[evaluator],
    )


def _exact_items(references: list[str | None]) -> list[dataset_items.ItemData]:
    return [
        dataset_items.ItemData(
            input_messages=({"role": "user", "content": f"question {n}"},),
            reference_output=reference or "",
            metadata={"variables": {"company": "Acme"}},
        )
        for n, reference in enumerate(references)
    ]


NO_REFERENCE = "EvaluationError: the item has no reference output"


def test_a_run_whose_every_score_errored_fails_naming_the_first_error(gateway: Gateway, fake: FakeGatewayLLM) -> None:
    suite = _scored_by_exact_match(gateway, references=[None, None, None], samples=2)
    _script(fake, ["ok"] * 6)

    run = _execute(suite)

    # Every item was answered (none errored), yet no evaluator could score one answer: nothing was measured.
    assert (run.items_done, run.items_errored, run.item_count) == (3, 0, 3)
    assert run.status == RunStatus.FAILED
    assert run.error == f"every score errored (6 of 6); the first error (exact on item 0): {NO_REFERENCE}"
    assert run.finished_at is not None
    overall = run.report["exact"]["overall"]  # the report is kept: it shows every item errored
    assert (overall["count"], overall["errored"], overall["errored_samples"]) == (0, 3, 6)


def test_a_run_only_some_of_whose_scores_errored_completes_and_shows_the_errored_count(
    gateway: Gateway, fake: FakeGatewayLLM, api_client_for: Any
) -> None:
    suite = _scored_by_exact_match(gateway, references=["ok", None, "ok"], samples=1)
    _script(fake, ["ok"] * 3)

    run = _execute(suite)

    assert run.status == RunStatus.COMPLETED
    assert run.error == ""
    overall = run.report["exact"]["overall"]
    assert (overall["count"], overall["errored"], overall["errored_samples"], overall["mean"]) == (2, 1, 1, 1.0)
    client: Client = api_client_for(gateway.workspace, scopes=("read",))
    body = client.get(f"/api/v1/runs/{run.pk}").json()
    assert (body["status"], body["report"]["exact"]["overall"]["errored"]) == ("completed", 1)
    viewer = Client()
    viewer.force_login(MembershipFactory.create(workspace=gateway.workspace, role=Role.VIEWER).user)
    page = viewer.get(f"/w/{gateway.workspace.slug}/evals/runs/{run.pk}/").content.decode()
    assert "3 items, 2 scored, 1 errored (1 errored samples)" in page


def test_a_label_move_to_a_version_whose_every_score_errored_raises_a_regression(
    gateway: Gateway, fake: FakeGatewayLLM
) -> None:
    suite = _scored_by_exact_match(gateway, references=["ok", "ok"], samples=1)
    _script(fake, ["ok", "ok"])
    baseline = _execute(suite)
    assert baseline.status == RunStatus.COMPLETED
    # The dataset's next version lost its references: the new prompt version's answers cannot be scored.
    assert suite.dataset is not None
    services.dataset_version_create_from_items(dataset=suite.dataset, items=_exact_items([None, None]))
    _v2(gateway, "Acme's v2 for {{company}}.")

    (candidate,) = regressions.label_moves_check()
    _script(fake, ["ok", "ok"])
    finished = runs.run_execute(run_id=candidate.pk)

    alert = _failure_alert(finished, baseline=baseline, candidate=candidate)
    assert alert.message == (
        f"v2 failed where v1 completed: every score errored (2 of 2); the first error (exact on item 0): {NO_REFERENCE}"
    )
    assert regressions.run_completed(run_id=candidate.pk) == []  # raised once
    # Nor is it a point of the suite's history.
    assert [point["run"] for point in selectors.metric_history(suite=suite, evaluator="exact")] == [baseline.pk]
