"""The comparison summary of two runs is counted and averaged in the database: the figures are those of
`metrics.paired_comparison` over the runs' item scores, and its queries do not grow with the runs."""

from __future__ import annotations

import json
import random

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agent_registry.models import Workspace
from evals import interchange, metrics, runs
from evals.models import Run, RunScore

pytestmark = pytest.mark.django_db

REWARD = interchange.IMPORTED_EVALUATOR
Rewards = dict[str, list[float | None]]  # item key -> each sample's reward; None: the sample errored

SHARED = [f"k{n:02}" for n in range(14)]
# "B" sorts before "a" by code point (as Python sorts the item ids) but after it in most locales' collations.
BASELINE: Rewards = {
    "a": [1.0],
    "B": [0.5, 1.0],
    "c": [0.0, None],
    "d": [None],  # every sample errored: the item is errored on the baseline's side
    "e": [0.25],  # only the baseline has it
    "g": [0.5],
    **{key: [(n % 4) / 4] for n, key in enumerate(SHARED)},
}
CANDIDATE: Rewards = {
    "a": [1.0],
    "B": [1.0, 1.0],
    "c": [0.5],
    "d": [1.0],
    "f": [0.5],  # only the candidate has it
    "g": [0.75, 0.25],  # the 0.75 is turned into an evaluator's error below
    **{key: [((n + 1) % 4) / 4] for n, key in enumerate(SHARED)},
}
# The item scores these give: the mean over each item's scored samples, None when none was scored.
BASELINE_SCORES = {"a": 1.0, "B": 0.75, "c": 0.0, "d": None, "e": 0.25, "g": 0.5} | {
    key: (n % 4) / 4 for n, key in enumerate(SHARED)
}
CANDIDATE_SCORES = {"a": 1.0, "B": 1.0, "c": 0.5, "d": 1.0, "f": 0.5, "g": 0.25} | {
    key: ((n + 1) % 4) / 4 for n, key in enumerate(SHARED)
}


def _imported(workspace: Workspace, rewards: Rewards, name: str) -> Run:
    lines = [
        {
            "responses_create_params": {"input": f"question {key}"},
            "response": f"answer {key}",
            "reward": reward,
            "keel": {"task_index": index, "sample": sample, "metadata": {"item_key": key}},
        }
        for index, (key, samples) in enumerate(rewards.items())
        for sample, reward in enumerate(samples)
    ]
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    return interchange.run_import(workspace=workspace, content=content, name=name)


@pytest.fixture
def known(workspace: Workspace) -> tuple[Run, Run]:
    baseline = _imported(workspace, BASELINE, "baseline")
    candidate = _imported(workspace, CANDIDATE, "candidate")
    # An evaluator that could not judge stores its error and no score: left out, never counted as 0.
    RunScore.objects.filter(sample__item__run=candidate, sample__item__key="g", sample__sample=0).update(
        score=None, error="judge_unparsable: no verdict"
    )
    return baseline, candidate


def test_the_summary_gives_the_paired_comparison_of_the_item_scores(known: tuple[Run, Run]) -> None:
    baseline, candidate = known

    result = runs.runs_compare(baseline=baseline, candidate=candidate)

    comparison = result["metrics"][REWARD]
    # The figures `metrics.paired_comparison` gives for these item scores, interval and p-value included
    # (18 pairs: the sign-flip test draws at random, so the deltas must come in the same order).
    assert comparison == metrics.paired_comparison(BASELINE_SCORES, CANDIDATE_SCORES).as_json()
    assert (comparison["items"], comparison["only_in_a"], comparison["only_in_b"], comparison["errored"]) == (
        18,
        1,
        1,
        1,
    )
    assert (comparison["improved"], comparison["worsened"], comparison["unchanged"]) == (13, 4, 1)
    assert comparison["mean_a"] == (1.0 + 0.75 + 0.0 + 0.5 + 4 * 0 + 4 * 0.25 + 3 * 0.5 + 3 * 0.75) / 18
    assert comparison["mean_b"] == (1.0 + 1.0 + 0.5 + 0.25 + 4 * 0.25 + 4 * 0.5 + 3 * 0.75 + 3 * 0) / 18
    assert (result["items_in_both"], result["items_only_in_baseline"], result["items_only_in_candidate"]) == (19, 1, 1)


def test_the_summary_matches_the_item_scores_of_runs_with_errors_and_several_samples(workspace: Workspace) -> None:
    rng = random.Random(7)

    def rewards(keys: list[str]) -> Rewards:
        return {key: [None if rng.random() < 0.15 else rng.random() for _ in range(3)] for key in keys}

    keys = [f"item-{n}" for n in range(40)]
    baseline = _imported(workspace, rewards(keys[:35]), "baseline")
    candidate = _imported(workspace, rewards(keys[5:]), "candidate")

    comparison = runs.runs_compare(baseline=baseline, candidate=candidate)["metrics"][REWARD]

    expected = metrics.paired_comparison(
        runs.item_scores(run=baseline, evaluator=REWARD), runs.item_scores(run=candidate, evaluator=REWARD)
    ).as_json()
    counts = ("items", "only_in_a", "only_in_b", "errored", "excluded", "improved", "worsened", "unchanged")
    assert {name: comparison[name] for name in counts} == {name: expected[name] for name in counts}
    assert (comparison["only_in_a"], comparison["only_in_b"]) == (5, 5)
    # The database sums in its own order: the means may differ from Python's in the last bits, no more.
    for name in ("mean_a", "mean_b", "mean_delta", "p_value"):
        assert comparison[name] == pytest.approx(expected[name], rel=1e-12)
    assert comparison["ci"] == pytest.approx(expected["ci"], rel=1e-12)


def test_an_evaluator_neither_run_has_counts_every_shared_item_errored(known: tuple[Run, Run]) -> None:
    baseline, candidate = known

    comparison = runs.runs_compare(baseline=baseline, candidate=candidate, evaluators_named=["missing"])

    assert (
        comparison["metrics"]["missing"]
        == metrics.paired_comparison(dict.fromkeys(BASELINE_SCORES), dict.fromkeys(CANDIDATE_SCORES)).as_json()
    )
    assert comparison["metrics"]["missing"]["errored"] == 19


def _queries(workspace: Workspace, items: int) -> int:
    keys = [f"k{n}" for n in range(items)]
    baseline = _imported(workspace, {key: [1.0, 0.5] for key in keys}, f"baseline-{items}")
    candidate = _imported(workspace, {key: [0.5, None] for key in keys[1:]} | {"new": [1.0]}, f"candidate-{items}")
    with CaptureQueriesContext(connection) as captured:
        result = runs.runs_compare(baseline=baseline, candidate=candidate)
    assert result["metrics"][REWARD]["items"] == items - 1
    # Grouped in the database: no query reads the runs' items, samples or scores row by row.
    assert all("GROUP BY" in query["sql"] for query in captured.captured_queries)
    return len(captured.captured_queries)


def test_the_summary_queries_do_not_grow_with_the_items(workspace: Workspace) -> None:
    few, many = _queries(workspace, 5), _queries(workspace, 300)

    # One for the items each run has, two per evaluator (the totals, and the paired deltas).
    assert few == many == 3
