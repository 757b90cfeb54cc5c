"""Comparing two runs over different dataset versions: items pair on their key (given, or their input's
hash), not their position; an item only one run has is shown as such and left out of the deltas."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from agent_registry.models import Role
from agent_registry.tests.factories import MembershipFactory
from evals import dataset_items, gym, interchange, runs, services
from evals.models import Dataset, Run, RunItem
from evals.tests.test_runs import _script, _suite
from routing.tests import conftest as routing_fixtures
from routing.tests.conftest import Gateway
from routing.tests.fakes import FakeGatewayLLM, say

fake = routing_fixtures.fake
gateway = routing_fixtures.gateway

pytestmark = pytest.mark.django_db


def _item(text: str, *, key: str = "", reference: str = "ok") -> dataset_items.ItemData:
    return dataset_items.ItemData(
        key=key, input_messages=({"role": "user", "content": text},), reference_output=reference
    )


def _version(dataset: Dataset, items: list[dataset_items.ItemData]) -> None:
    services.dataset_version_create_from_items(dataset=dataset, items=items)


def _run(suite: Any, fake: FakeGatewayLLM, answers: list[str]) -> Run:
    _script(fake, answers)  # one worker: the items are answered in their order
    run = runs.run_execute(run_id=runs.run_create(suite=suite, dispatch=False).pk)
    assert run is not None
    return run


@pytest.fixture
def two_versions(gateway: Gateway, fake: FakeGatewayLLM) -> tuple[Run, Run]:
    """v1: A B C D; v2 drops B, puts a new E first and fixes C's reference. Baseline on v1 (A, C pass),
    candidate on v2 (all pass)."""
    dataset = services.dataset_create(workspace=gateway.workspace, name="shifting", agent=gateway.agent)
    _version(dataset, [_item("A?"), _item("B?"), _item("C?", reference="old"), _item("D?")])
    suite = _suite(gateway, samples=1, dataset=dataset, variables={"company": "Acme"})
    baseline = _run(suite, fake, ["ok", "no", "ok", "no"])
    _version(dataset, [_item("E?"), _item("A?"), _item("C?", reference="new"), _item("D?")])
    candidate = _run(suite, fake, ["ok", "ok", "ok", "ok"])
    assert baseline.dataset_version_id != candidate.dataset_version_id
    return baseline, candidate


def test_runs_over_two_dataset_versions_pair_items_by_identity_not_position(two_versions: tuple[Run, Run]) -> None:
    baseline, candidate = two_versions

    result = runs.runs_compare(baseline=baseline, candidate=candidate)

    # By position, B (failed) would pair with A, and A with E: four "pairs", one improved by accident.
    comparison = result["metrics"]["says_ok"]
    assert (comparison["items"], comparison["only_in_a"], comparison["only_in_b"]) == (3, 1, 1)
    assert (comparison["improved"], comparison["worsened"], comparison["unchanged"]) == (1, 0, 2)
    assert comparison["mean_a"] == pytest.approx(2 / 3)  # A, C, D on the baseline
    assert comparison["mean_delta"] == pytest.approx(1 / 3)  # D went from 0 to 1
    assert (result["items_in_both"], result["items_only_in_baseline"], result["items_only_in_candidate"]) == (3, 1, 1)

    rows = runs.runs_compare_items(baseline=baseline, candidate=candidate, evaluators_named=["says_ok"])
    shown = [
        (row["presence"], row["baseline_position"], row["candidate_position"], row["scores"]["says_ok"]["delta"])
        for row in rows
    ]
    assert shown == [
        ("candidate_only", None, 0, None),  # E
        ("both", 0, 1, 0.0),  # A moved from 0 to 1
        ("both", 2, 2, 0.0),  # C, its reference changed: the same item
        ("both", 3, 3, 1.0),  # D
        ("baseline_only", 1, None, None),  # B
    ]


def test_an_item_given_a_key_stays_the_same_item_when_its_input_is_edited(
    gateway: Gateway, fake: FakeGatewayLLM
) -> None:
    dataset = services.dataset_create(workspace=gateway.workspace, name="keyed", agent=gateway.agent)
    _version(dataset, [_item("Wher is my recept?", key="receipt"), _item("Refund me", key="refund")])
    suite = _suite(gateway, samples=1, dataset=dataset, variables={"company": "Acme"})
    baseline = _run(suite, fake, ["no", "ok"])
    _version(dataset, [_item("Refund me", key="refund"), _item("Where is my receipt?", key="receipt")])
    candidate = _run(suite, fake, ["ok", "ok"])

    comparison = runs.runs_compare(baseline=baseline, candidate=candidate)["metrics"]["says_ok"]

    assert (comparison["items"], comparison["only_in_a"], comparison["only_in_b"]) == (2, 0, 0)
    assert (comparison["improved"], comparison["unchanged"]) == (1, 1)  # receipt 0 -> 1, refund 1 -> 1
    assert list(RunItem.objects.filter(run=candidate).values_list("key", flat=True)) == ["refund", "receipt"]


def test_the_api_lists_items_by_identity_and_the_pairwise_judge_pairs_them_the_same_way(
    api_client_for: Any, gateway: Gateway, fake: FakeGatewayLLM, two_versions: tuple[Run, Run]
) -> None:
    baseline, candidate = two_versions
    client: Client = api_client_for(gateway.workspace, scopes=("read", "write"))
    created = client.post(
        "/api/v1/evaluators",
        data=json.dumps({"name": "prefer", "config": {"type": "pairwise_judge", "model": "fast"}}),
        content_type="application/json",
    )
    assert created.status_code == 201, created.content
    # Three shared items (A, C, D), each judged in both orders: the candidate wins each time.
    fake.script("fast", *[say(json.dumps({"reasoning": "r", "winner": w})) for _ in range(3) for w in ("2", "1")])

    response = client.get(
        f"/api/v1/runs/compare?baseline={baseline.pk}&candidate={candidate.pk}&items=true&judge=prefer"
    )

    assert response.status_code == 200, response.content
    body = response.json()
    assert [row["presence"] for row in body["items"]] == [
        "candidate_only",
        "both",
        "both",
        "both",
        "baseline_only",
    ]
    pairwise = body["pairwise"]
    assert (pairwise["items"], pairwise["candidate_wins"]) == (3, 3)
    assert [(d["baseline_position"], d["position"]) for d in pairwise["details"]] == [(0, 1), (2, 2), (3, 3)]
    # Without items=true the list is not sent.
    plain = client.get(f"/api/v1/runs/compare?baseline={baseline.pk}&candidate={candidate.pk}").json()
    assert "items" not in plain
    assert plain["items_only_in_baseline"] == 1


def test_the_dashboard_shows_items_only_one_run_has(gateway: Gateway, two_versions: tuple[Run, Run]) -> None:
    baseline, candidate = two_versions
    client = Client()
    client.force_login(MembershipFactory.create(workspace=gateway.workspace, role=Role.VIEWER).user)

    response = client.get(f"/w/{gateway.workspace.slug}/evals/compare/?a={baseline.pk}&b={candidate.pk}")

    assert response.status_code == 200
    (metric,) = response.context["metrics"]
    assert [(row.presence, row.position_a, row.position_b, row.input_text) for row in metric.items] == [
        ("candidate_only", None, 0, "E?"),
        ("both", 0, 1, "A?"),
        ("both", 2, 2, "C?"),
        ("both", 3, 3, "D?"),
        ("baseline_only", 1, None, "B?"),
    ]
    content = response.content.decode()
    assert "3 items in both runs compared; 1 only in A and 1 only in B" in content
    assert "not in A" in content
    assert "not in B" in content


def test_a_run_exported_as_rollouts_and_imported_back_keeps_its_item_keys(
    gateway: Gateway, fake: FakeGatewayLLM
) -> None:
    dataset = services.dataset_create(workspace=gateway.workspace, name="keyed", agent=gateway.agent)
    _version(dataset, [_item("Refund me", key="refund"), _item("Where is my receipt?", key="receipt")])
    suite = _suite(gateway, samples=2, dataset=dataset, variables={"company": "Acme"})
    candidate = _run(suite, fake, ["ok", "no", "ok", "ok"])
    content = b"".join(gym.rollouts_lines(interchange.run_rollouts(run=candidate)))
    # The imported run's tasks are numbered afresh; its items still pair with the run it came from.
    imported = interchange.run_import(workspace=gateway.workspace, content=content)

    assert list(RunItem.objects.filter(run=imported).values_list("key", flat=True)) == list(
        RunItem.objects.filter(run=candidate).values_list("key", flat=True)
    )
    assert list(RunItem.objects.filter(run=imported).values_list("key", flat=True)) == ["refund", "receipt"]
    assert runs.runs_compare(baseline=candidate, candidate=imported)["items_in_both"] == 2


def test_a_plain_rollouts_file_without_keys_gets_its_inputs_hashes(gateway: Gateway) -> None:
    lines = [
        {"responses_create_params": {"input": "same"}, "response": "x", "reward": 1.0},
        {"responses_create_params": {"input": "other"}, "response": "x", "reward": 0.0},
    ]
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()

    imported = interchange.run_import(workspace=gateway.workspace, content=content)

    keys = list(RunItem.objects.filter(run=imported).values_list("key", flat=True))
    assert keys == [dataset_items.input_key("same", ()), dataset_items.input_key("other", ())]
