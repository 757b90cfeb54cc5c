"""The sampling strategies' properties and the informativeness arithmetic (tracing.sampling, pure)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracing import sampling
from tracing.sampling import Candidate

PROBLEMS = sorted(sampling.PROBLEM_SIGNALS)

candidate_lists = st.lists(
    st.builds(
        Candidate,
        trajectory_id=st.integers(min_value=1, max_value=400),
        agent_id=st.sampled_from([1, 2, 3, None]),
        triage_score=st.floats(min_value=0, max_value=1),
        signal_names=st.lists(st.sampled_from([*PROBLEMS[:5], "satisfaction"]), unique=True, max_size=3).map(tuple),
        step_count=st.integers(min_value=0, max_value=80),
    ),
    max_size=60,
    unique_by=lambda candidate: candidate.trajectory_id,  # the selectors read each trajectory once
)


@settings(max_examples=200, deadline=None)
@given(
    candidates=candidate_lists,
    budget=st.integers(min_value=0, max_value=40),
    strategy=st.sampled_from(list(sampling.STRATEGIES)),
)
def test_every_strategy_picks_distinct_candidates_within_the_budget(candidates, budget, strategy):
    chosen = sampling.sample_select(strategy, candidates, budget)

    ids = [candidate.trajectory_id for candidate in chosen]
    assert len(ids) == len(set(ids)) <= budget
    assert set(ids) <= {candidate.trajectory_id for candidate in candidates}


@settings(max_examples=200, deadline=None)
@given(candidates=candidate_lists, budget=st.integers(min_value=1, max_value=40))
def test_signal_sampling_draws_only_where_a_problem_signal_fired(candidates, budget):
    chosen = sampling.sample_select("signal", candidates, budget)

    assert all(set(candidate.signal_names) & sampling.PROBLEM_SIGNALS for candidate in chosen)
    eligible = {c.trajectory_id for c in candidates if set(c.signal_names) & sampling.PROBLEM_SIGNALS}
    assert len(chosen) == min(budget, len(eligible))


@settings(max_examples=200, deadline=None)
@given(candidates=candidate_lists, budget=st.integers(min_value=1, max_value=40))
def test_a_noisy_signal_cannot_fill_a_signal_sample(candidates, budget):
    """Round-robin: every signal present gets its turn, so each gets min(its candidates, budget // k)."""
    chosen = sampling.sample_select("signal", candidates, budget)

    distinct = {c.trajectory_id: c for c in candidates}
    present = sorted({name for c in distinct.values() for name in c.signal_names if name in sampling.PROBLEM_SIGNALS})
    for name in present:
        holding = sum(1 for c in distinct.values() if name in c.signal_names)
        drawn = sum(1 for c in chosen if name in c.signal_names)
        assert drawn >= min(holding, budget // len(present))


def test_signal_sampling_takes_turns_between_signals_best_score_first():
    loud = [Candidate(i, 1, 0.9 - i / 100, ("exhaustion",), 5) for i in range(1, 30)]
    rare = [Candidate(100, 1, 0.5, ("loop",), 5), Candidate(101, 1, 0.4, ("failure",), 5)]

    chosen = sampling.sample_select("signal", [*loud, *rare], 6)

    assert [c.trajectory_id for c in chosen] == [1, 100, 101, 2, 3, 4]


def test_signal_sampling_rotates_over_the_signals_each_agents_weights_make_problems():
    limited = [Candidate(i, 1, 0.6, ("exhaustion", "stagnation"), 5) for i in range(1, 11)]
    loops = [Candidate(i, 1, 0.5, ("loop",), 5) for i in range(20, 30)]
    satisfied = Candidate(40, 2, 0.3, ("satisfaction",), 5)

    def drawn(weights=None):
        chosen = sampling.sample_select("signal", [*limited, *loops, satisfied], 7, weights=weights)
        return [candidate.trajectory_id for candidate in chosen]

    # Defaults: exhaustion and stagnation each take a turn for the limited runs; satisfaction is no problem.
    assert drawn() == [1, 2, 20, 3, 4, 21, 5]
    # Agent 1 weighs exhaustion 0: only stagnation takes turns for its limited runs.
    assert drawn({1: {"exhaustion": 0.0}}) == [1, 20, 2, 21, 3, 22, 4]
    # Agent 2 weighs satisfaction positively: its satisfied run is drawn; agent 1's weights do not reach it.
    assert 40 in drawn({2: {"satisfaction": 0.5}})
    assert 40 not in drawn({1: {"satisfaction": 0.5}})
    assert sampling.problem_signals({"exhaustion": 0.0, "satisfaction": 0.5}) == (
        sampling.PROBLEM_SIGNALS - {"exhaustion"}
    ) | {"satisfaction"}


def test_length_and_random_keep_the_order_the_selector_gave():
    candidates = [Candidate(i, 1, 0.0, (), 50 - i) for i in range(1, 10)]

    assert [c.trajectory_id for c in sampling.sample_select("length", candidates, 3)] == [1, 2, 3]
    assert [c.trajectory_id for c in sampling.sample_select("random", candidates, 4)] == [1, 2, 3, 4]


@settings(max_examples=200, deadline=None)
@given(candidates=candidate_lists, budget=st.integers(min_value=1, max_value=40))
def test_stratified_samples_split_the_budget_evenly(candidates, budget):
    for strategy, stratum in (
        ("stratified_agent", lambda c: c.agent_id or 0),
        ("stratified_score", lambda c: sampling.score_bucket(c.triage_score)),
    ):
        chosen = sampling.sample_select(strategy, candidates, budget)
        distinct = {c.trajectory_id: c for c in reversed(candidates)}
        sizes: dict[object, int] = {}
        for c in {c.trajectory_id: c for c in candidates}.values():
            sizes[stratum(c)] = sizes.get(stratum(c), 0) + 1
        drawn: dict[object, int] = {}
        for c in chosen:
            drawn[stratum(c)] = drawn.get(stratum(c), 0) + 1
        assert len(chosen) == min(budget, len(distinct))
        fair = budget // max(len(sizes), 1)
        for key, size in sizes.items():
            assert drawn.get(key, 0) >= min(size, fair)


def test_allocate_gives_a_small_stratum_all_it_has_and_the_rest_to_the_others():
    assert sampling.allocate({"a": 1, "b": 10, "c": 10}, 9) == {"a": 1, "b": 4, "c": 4}
    assert sampling.allocate({"a": 2, "b": 2}, 10) == {"a": 2, "b": 2}
    assert sampling.allocate({"a": 5, "b": 5, "c": 5}, 4) == {"a": 2, "b": 1, "c": 1}


def test_score_buckets():
    assert [sampling.score_bucket(s) for s in (0, 0.01, 0.25, 0.49, 0.5, 0.75, 1)] == [0, 1, 2, 2, 3, 4, 4]


def test_an_unknown_strategy_is_refused():
    with pytest.raises(ValueError, match="unknown strategy"):
        sampling.sample_select("vibes", [], 3)


# --- Informativeness --------------------------------------------------------------------------------------


def test_wilson_interval_matches_the_textbook_values():
    low, high = sampling.wilson_interval(82, 100)
    assert (round(low, 4), round(high, 4)) == (0.7333, 0.883)
    low, high = sampling.wilson_interval(0, 10)
    assert low == 0.0
    assert round(high, 4) == 0.2775
    low, high = sampling.wilson_interval(10, 10)
    assert round(low, 4) == 0.7225
    assert high == 1.0


def test_wilson_interval_with_nothing_reviewed_is_the_whole_range():
    assert sampling.wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError, match="between 0 and total"):
        sampling.wilson_interval(3, 2)


@settings(max_examples=300, deadline=None)
@given(total=st.integers(min_value=1, max_value=5000), data=st.data())
def test_wilson_interval_holds_the_observed_share(total, data):
    successes = data.draw(st.integers(min_value=0, max_value=total))
    low, high = sampling.wilson_interval(successes, total)

    assert 0 <= low <= successes / total <= high <= 1
    assert high - low < 1


def test_the_papers_numbers_give_its_lift_and_a_clear_verdict():
    report = sampling.comparison(
        [sampling.informativeness("signal", 100, 82), sampling.informativeness("random", 100, 54)]
    )

    assert report.lift is not None
    assert math.isclose(report.lift, 82 / 54)
    assert report.verdict == "signal_better"


def test_a_few_reviews_leave_the_comparison_undecided():
    report = sampling.comparison([sampling.informativeness("signal", 5, 4), sampling.informativeness("random", 5, 3)])

    assert report.verdict == "undecided"
    assert sampling.comparison([sampling.informativeness("signal", 5, 4)]).verdict == "needs_reviews"
    assert sampling.comparison([]).lift is None


def test_failure_modes_put_the_fired_signals_first():
    order = sampling.failure_mode_order({"loop", "goal_drift"})

    assert order[:2] == ["goal_drift", "loop"]
    assert sorted(order) == sorted(sampling.FAILURE_MODES)
    assert "satisfaction" not in sampling.FAILURE_MODES
    assert set(sampling.FRAMEWORK_FAILURE_MODES) == {
        "infinite_loop",
        "hallucinated_tool_call",
        "context_exhaustion",
        "cascading_error",
        "reward_hacking",
        "goal_drift",
        "distribution_shift",
        "silent_tool_api_change",
    }
