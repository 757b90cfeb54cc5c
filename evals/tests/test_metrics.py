"""An eval run's statistics, a pure module: pass@k against brute-force enumeration, majority votes and their
ties, summaries that count errored items apart, seeded bootstrap intervals, subgroups and the worst group
(a group getting worse under an improving mean), paired comparisons, the report's JSON and bad inputs."""

from __future__ import annotations

import itertools
import json
import math
import random
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evals import metrics
from evals.metrics import (
    EXACT_SIGN_FLIP_ITEMS,
    ItemResult,
    Sample,
    aggregate,
    bootstrap_ci,
    by_subgroup,
    item_scores,
    item_stats,
    majority_at_k,
    majority_vote,
    paired_comparison,
    pass_at_k,
    run_report,
    sign_flip_test,
    summarize,
    worst_group,
)


def brute_force_pass_at_k(n: int, c: int, k: int) -> float:
    """The share of k-subsets of n samples (the first c passing) holding at least one pass."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(1 for subset in subsets if any(index < c for index in subset)) / len(subsets)


def item(item_id: str, outcomes: list[bool], tags: dict[str, str | list[str]] | None = None) -> ItemResult:
    """An item whose samples score 1.0 when they pass and 0.0 when they fail."""
    return ItemResult.from_pairs(item_id, [(1.0 if passed else 0.0, passed) for passed in outcomes], tags)


def scored_item(item_id: str, score: float, tags: dict[str, str | list[str]] | None = None) -> ItemResult:
    return ItemResult.from_pairs(item_id, [(score, score >= 0.5)], tags)


# --- pass@k -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 5])
def test_pass_at_k_is_zero_without_a_pass(k):
    assert pass_at_k(5, 0, k) == 0.0


@pytest.mark.parametrize("k", [1, 3, 5])
def test_pass_at_k_is_one_when_every_sample_passes(k):
    assert pass_at_k(5, 5, k) == 1.0


def test_pass_at_1_is_the_share_of_passes():
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)


def test_pass_at_k_is_one_when_too_few_samples_fail_to_fill_k():
    # 2 failures cannot fill a draw of 3.
    assert pass_at_k(5, 3, 3) == 1.0


def test_pass_at_k_matches_the_binomial_formula():
    assert pass_at_k(16, 2, 4) == pytest.approx(1 - math.comb(14, 4) / math.comb(16, 4))
    assert pass_at_k(10, 3, 4) == pytest.approx(1 - 35 / 210)


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_matches_enumerating_every_draw(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_force_pass_at_k(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_k_is_stable_for_many_samples():
    # C(1000, 500) overflows a float; the product form does not form it.
    assert pass_at_k(1000, 1, 500) == pytest.approx(0.5)
    assert pass_at_k(1000, 10, 1) == pytest.approx(0.01)
    assert pass_at_k(1000, 10, 100) == pytest.approx(1 - math.comb(990, 100) / math.comb(1000, 100))


@given(n=st.integers(1, 40), data=st.data())
def test_pass_at_k_is_a_probability_rising_with_k_and_c(n, data):
    c = data.draw(st.integers(0, n))
    k = data.draw(st.integers(1, n))
    value = pass_at_k(n, c, k)
    assert 0.0 <= value <= 1.0
    if k < n:
        assert pass_at_k(n, c, k + 1) >= value - 1e-12
    if c < n:
        assert pass_at_k(n, c + 1, k) >= value - 1e-12


@pytest.mark.parametrize(
    ("n", "c", "k"),
    [(5, 2, 6), (5, 2, 0), (5, 2, -1), (5, 6, 1), (5, -1, 1), (0, 0, 1), (5.0, 2, 1), (5, 2, 1.0), (5, True, 1)],
)
def test_pass_at_k_rejects_bad_input(n, c, k):
    with pytest.raises(ValueError):  # noqa: PT011 - each bad input has its own message
        pass_at_k(n, c, k)


# --- majority@k ---------------------------------------------------------------------------------------


def test_majority_vote_takes_the_most_frequent_answer_among_the_first_k():
    answers = ["7", "8", "8", "7", "7", "7"]
    assert majority_vote(answers, 3) == "8"
    assert majority_vote(answers, 6) == "7"


def test_majority_vote_tie_goes_to_the_answer_sampled_first():
    assert majority_vote(["b", "a", "a", "b"], 4) == "b"
    assert majority_vote(["a", "b", "b", "a"], 4) == "a"
    assert majority_vote(["x", "y", "z"], 3) == "x"


def test_missing_answers_take_a_place_but_cast_no_vote():
    assert majority_vote([None, None, "a", "b", "b"], 3) == "a"
    assert majority_vote([None, None, "a"], 2) is None


def test_majority_at_k_against_a_reference_or_a_set_of_correct_answers():
    answers = ["42", "41", "42", "40"]
    assert majority_at_k(answers, "42", 4) is True
    assert majority_at_k(answers, "41", 4) is False
    assert majority_at_k(answers, {"41", "42"}, 2) is True  # a tie between 42 and 41: 42 came first
    assert majority_at_k(["41", "42"], {"42"}, 2) is False
    assert majority_at_k([None, None], "42", 2) is False


@pytest.mark.parametrize("k", [0, 4, -1, True])
def test_majority_vote_rejects_a_k_outside_the_answers(k):
    with pytest.raises(ValueError, match="k must be between 1 and the number of answers"):
        majority_vote(["a", "b", "c"], k)


# --- Summaries ----------------------------------------------------------------------------------------


def test_summary_of_scores():
    summary = summarize([0.2, 0.4, 0.9, 0.5])
    assert summary.count == 4
    assert summary.errored == 0
    assert summary.mean == pytest.approx(0.5)
    assert summary.median == pytest.approx(0.45)
    assert summary.std == pytest.approx(statistics.stdev([0.2, 0.4, 0.9, 0.5]))


def test_summary_leaves_errored_items_out_and_counts_them():
    summary = summarize([1.0, None, 0.0, None, 0.5])
    assert (summary.count, summary.errored) == (3, 2)
    assert summary.mean == pytest.approx(0.5)
    assert summary.median == 0.5
    assert summary.std == pytest.approx(0.5)  # sample std of 0, 0.5, 1


def test_summary_of_one_value_has_no_std_and_of_none_no_statistics():
    assert summarize([0.7]).std is None
    assert summarize([0.7]).mean == 0.7
    empty = summarize([None, None])
    assert (empty.count, empty.errored, empty.mean, empty.median, empty.std) == (0, 2, None, None, None)


@pytest.mark.parametrize("bad", [math.nan, math.inf, "0.5", True])
def test_summary_rejects_a_score_that_is_not_a_finite_number(bad):
    with pytest.raises(ValueError, match="score must be"):
        summarize([0.5, bad])


# --- Bootstrap ----------------------------------------------------------------------------------------


def test_bootstrap_is_deterministic_given_a_seed():
    rng = random.Random(1)
    values = [rng.random() for _ in range(40)]
    assert bootstrap_ci(values, seed=7) == bootstrap_ci(values, seed=7)
    assert bootstrap_ci(values, seed=7) != bootstrap_ci(values, seed=8)


def test_bootstrap_interval_surrounds_the_estimate_and_widens_with_confidence():
    rng = random.Random(3)
    values = [rng.gauss(0.6, 0.1) for _ in range(60)]
    low, high = bootstrap_ci(values)
    assert low < statistics.fmean(values) < high
    narrow = bootstrap_ci(values, confidence=0.5)
    wide = bootstrap_ci(values, confidence=0.99)
    assert wide[0] < low < narrow[0] < narrow[1] < high < wide[1]


def test_bootstrap_of_constant_values_is_a_point():
    assert bootstrap_ci([0.25] * 10) == (0.25, 0.25)
    assert bootstrap_ci([1.0]) == (1.0, 1.0)


@pytest.mark.parametrize("size", [1, 2, 7, 56, 301])
def test_the_resampled_means_are_those_of_choices_and_fmean_bit_for_bit(size, monkeypatch):
    """The mean's fast path draws its resamples with numpy from the Random's state; it must give what the
    plain loop gives, in the same order, also from its later blocks of draws (whole resamples of at most
    1,000 values here, so 700 resamples take up to 234 blocks, each going on with the stream)."""
    monkeypatch.setattr(metrics, "_RESAMPLE_CHUNK_VALUES", 1000)
    rng = random.Random(size)
    points = [rng.uniform(-5.0, 5.0) for _ in range(size)]
    for seed in (0, 1, 20240810):
        plain = random.Random(seed)
        expected = [statistics.fmean(plain.choices(points, k=size)) for _ in range(700)]
        assert list(metrics._resample_means(points, 700, random.Random(seed))) == expected


@given(
    st.lists(st.floats(min_value=-1e6, max_value=1e6), min_size=1, max_size=80),
    st.integers(min_value=0, max_value=2**64),
    st.integers(min_value=1, max_value=300),
)
def test_the_interval_of_the_mean_is_the_one_the_plain_loop_gives(values, seed, resamples):
    def plain_mean(resample):  # another function than `mean`: bootstrap_ci takes the plain loop with it
        return statistics.fmean(resample)

    fast = bootstrap_ci(values, seed=seed, resamples=resamples)
    assert fast == bootstrap_ci(values, stat=plain_mean, seed=seed, resamples=resamples)


@pytest.mark.parametrize("size", [1, 3, 56, 301])
@pytest.mark.parametrize("kind", ["continuous", "discrete", "wide"])
def test_the_interval_of_the_mean_is_the_plain_loops_also_over_many_blocks_and_ties(size, kind, monkeypatch):
    """The mean's interval reads its two quantiles' ranks from numpy means, summing again with fsum only
    the resamples near them, from a second pass over the draws (blocks of at most 1,000 values here).
    Discrete points make many resample means equal; points of very different sizes make numpy's sums
    differ from fsum's."""
    monkeypatch.setattr(metrics, "_RESAMPLE_CHUNK_VALUES", 1000)

    def plain_mean(resample):
        return statistics.fmean(resample)

    rng = random.Random(size)
    choices = {"discrete": [0.0, 0.25, 1.0], "wide": [1e-12, -3.0, 1e9, -1e9, 0.1]}
    points = [rng.uniform(-5.0, 5.0) if kind == "continuous" else rng.choice(choices[kind]) for _ in range(size)]
    for seed, confidence in ((0, 0.95), (1, 0.5), (20240810, 0.999)):
        assert bootstrap_ci(points, confidence=confidence, resamples=700, seed=seed) == bootstrap_ci(
            points, stat=plain_mean, confidence=confidence, resamples=700, seed=seed
        )


def test_bootstrap_takes_another_statistic():
    values = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 100.0]
    low, high = bootstrap_ci(values, stat=statistics.median)
    assert 0.0 <= low <= high <= 1.0  # the outlier that drags the mean does not reach the median


def test_bootstrap_interval_covers_the_true_mean_about_as_often_as_it_says():
    rng = random.Random(11)
    covered = 0
    for trial in range(100):
        values = [rng.gauss(10.0, 2.0) for _ in range(50)]
        low, high = bootstrap_ci(values, resamples=400, seed=trial)
        covered += low <= 10.0 <= high
    # Nominal 95%; the percentile bootstrap runs a little narrow on 50 values, never this far.
    assert 85 <= covered <= 100


@pytest.mark.parametrize(
    ("values", "options", "message"),
    [
        ([], {}, "at least one value"),
        ([0.1, math.nan], {}, "value must be finite"),
        ([0.1, None], {}, "value must be a number"),
        ([0.1], {"confidence": 0.0}, "confidence"),
        ([0.1], {"confidence": 1.0}, "confidence"),
        ([0.1], {"confidence": 95}, "confidence"),
        ([0.1], {"resamples": 0}, "resamples"),
    ],
)
def test_bootstrap_rejects_bad_input(values, options, message):
    with pytest.raises(ValueError, match=message):
        bootstrap_ci(values, **options)


# --- Items --------------------------------------------------------------------------------------------


def test_item_stats_leave_errored_samples_out_and_report_only_the_k_the_samples_allow():
    result = ItemResult.from_pairs("q1", [(1.0, True), (None, False), (0.0, False), (0.5, False), (1.0, True)])
    stats = item_stats(result)
    assert (stats.samples, stats.errored_samples, stats.passed) == (4, 1, 2)
    assert stats.score == pytest.approx(0.625)
    assert stats.pass_rate == 0.5
    assert stats.pass_at_k == {1: pytest.approx(0.5), 4: 1.0}
    assert stats.majority_at_k == {}  # the samples carry no answers
    assert stats.errored is False


def test_an_item_whose_samples_all_errored_is_errored_not_zero():
    stats = item_stats(ItemResult.from_pairs("q1", [(None, False), (None, False)]))
    assert stats.errored is True
    assert (stats.score, stats.pass_rate, stats.pass_at_k) == (None, None, {})


def test_item_majority_counts_an_answer_correct_when_its_samples_passed():
    samples = (
        Sample(0.0, passed=False, answer="12"),
        Sample(1.0, passed=True, answer="13"),
        Sample(1.0, passed=True, answer="13"),
        Sample(0.0, passed=False, answer="12"),
        Sample(None, answer="12"),  # errored: it does not vote
    )
    stats = item_stats(ItemResult("q1", samples))
    assert stats.majority_at_k == {1: False, 4: False}  # 12 and 13 tie at two votes; 12 came first
    stats = item_stats(ItemResult("q2", samples[1:]), ks=(1, 3))
    assert stats.majority_at_k == {1: True, 3: True}


def test_tag_values_accept_one_value_or_several():
    result = ItemResult("q1", (), {"language": "fr", "topics": ["billing", "refunds", "billing"]})
    assert result.tag_values("language") == ("fr",)
    assert result.tag_values("topics") == ("billing", "refunds")
    assert result.tag_values("region") == ()


# --- Aggregates ---------------------------------------------------------------------------------------


def test_aggregate_averages_pass_at_k_over_the_items_with_enough_samples():
    items = [
        item("a", [True, False, False, False]),
        item("b", [False] * 4),
        item("c", [True, True]),  # two samples: counts in pass@1 only
        ItemResult.from_pairs("d", [(None, False)] * 4),
    ]
    result = aggregate(items, ks=(1, 4, 16), resamples=200)
    assert result.items == 4
    assert result.errored == 1
    assert result.errored_samples == 4
    assert result.pass_at_k == {1: pytest.approx((0.25 + 0.0 + 1.0) / 3), 4: pytest.approx(0.5)}
    assert result.pass_at_k_items == {1: 3, 4: 2}
    assert set(result.pass_at_k_ci) == {1, 4}
    assert result.mean == pytest.approx((0.25 + 0.0 + 1.0) / 3)
    assert result.pass_rate == pytest.approx(result.pass_at_k[1])
    assert result.ci is not None
    assert result.mean is not None
    assert result.ci[0] <= result.mean <= result.ci[1]


def test_aggregate_of_answered_samples_reports_majority_at_k():
    def answered(item_id, answers, correct):
        return ItemResult(item_id, tuple(Sample(float(a == correct), a == correct, a) for a in answers))

    items = [
        answered("a", ["1", "2", "2", "2"], "2"),
        answered("b", ["1", "1", "1", "2"], "2"),
        answered("c", ["3", "3", "4", "4"], "3"),
    ]
    result = aggregate(items, ks=(1, 4), resamples=100)
    assert result.majority_at_k == {1: pytest.approx(1 / 3), 4: pytest.approx(2 / 3)}
    assert result.majority_at_k_items == {1: 3, 4: 3}
    assert result.metric("majority@4") == pytest.approx(2 / 3)
    assert result.metric("majority@16") is None


@pytest.mark.parametrize("name", ["max", "pass@", "pass@0", "pass@x", "majority", "@4"])
def test_an_unknown_metric_name_is_rejected(name):
    result = aggregate([item("a", [True])], resamples=10)
    with pytest.raises(ValueError, match="unknown metric"):
        result.metric(name)


@pytest.mark.parametrize("ks", [(0,), (1, -4), (1.5,), (True,)])
def test_bad_ks_are_rejected(ks):
    with pytest.raises(ValueError, match="every k must be a positive integer"):
        aggregate([item("a", [True])], ks=ks)


# --- Subgroups and the worst group --------------------------------------------------------------------


def test_every_metric_per_subgroup_with_items_in_several_groups():
    items = [
        item("a", [True, True, True, True], {"topic": ["billing", "refunds"]}),
        item("b", [False, False, True, False], {"topic": "billing"}),
        item("c", [False, False, False, False], {"topic": "refunds"}),
        item("d", [True, False, False, False]),  # untagged
    ]
    table = by_subgroup(items, "topic", min_group_size=2, resamples=100)
    assert [group.name for group in table.groups] == ["billing", "refunds"]
    assert table.untagged == 1
    billing = table.group("billing")
    refunds = table.group("refunds")
    assert billing is not None
    assert refunds is not None
    assert billing.aggregate.items == 2
    assert billing.aggregate.mean == pytest.approx(0.625)
    assert billing.aggregate.pass_at_k == {1: pytest.approx(0.625), 4: 1.0}
    assert refunds.aggregate.pass_at_k == {1: pytest.approx(0.5), 4: pytest.approx(0.5)}
    assert (billing.small, refunds.small) == (False, False)
    assert table.group("shipping") is None


def test_small_groups_are_flagged_and_still_reported():
    items = [scored_item(f"en{i}", 0.8, {"language": "en"}) for i in range(12)]
    items += [scored_item("fr0", 0.2, {"language": "fr"})]
    table = by_subgroup(items, "language", resamples=50)
    assert [(group.name, group.small) for group in table.groups] == [("en", False), ("fr", True)]
    worst = worst_group(table, overall=0.75)
    assert worst is not None
    assert (worst.name, worst.value, worst.small, worst.items) == ("fr", 0.2, True, 1)
    assert worst.gap == pytest.approx(0.55)
    without_small = worst_group(table, include_small=False)
    assert without_small is not None
    assert without_small.name == "en"


def test_worst_group_ties_go_to_the_first_name_and_empty_tables_have_none():
    items = [scored_item("a", 0.5, {"lang": "fr"}), scored_item("b", 0.5, {"lang": "de"})]
    table = by_subgroup(items, "lang", resamples=20)
    worst = worst_group(table)
    assert worst is not None
    assert worst.name == "de"
    empty = by_subgroup(items, "region", resamples=20)
    assert empty.groups == ()
    assert empty.untagged == 2
    assert worst_group(empty) is None
    with pytest.raises(ValueError, match="unknown metric"):
        worst_group(empty, "best")


def test_worst_group_by_pass_at_k():
    items = [
        item("a", [True, False, False, False], {"lang": "en"}),
        item("b", [False, False, False, True], {"lang": "fr"}),
        item("c", [False, False, False, False], {"lang": "fr"}),
    ]
    worst = worst_group(by_subgroup(items, "lang", resamples=20), "pass@4")
    assert worst is not None
    assert (worst.name, worst.value) == ("fr", 0.5)
    assert worst_group(by_subgroup(items, "lang", resamples=20), "pass@16") is None


def test_a_group_getting_worse_under_an_improving_mean_is_the_worst_group():
    def run(english: float, french: float) -> list[ItemResult]:
        return [scored_item(f"en{i}", english, {"language": "en"}) for i in range(18)] + [
            scored_item(f"fr{i}", french, {"language": "fr"}) for i in range(6)
        ]

    before = run_report(run(english=0.6, french=0.6), resamples=100, min_group_size=5)
    after = run_report(run(english=0.8, french=0.4), resamples=100, min_group_size=5)
    assert before.mean is not None
    assert after.mean is not None
    assert after.mean > before.mean
    worst = after.worst_group
    assert worst is not None
    assert (worst.tag_key, worst.name, worst.small) == ("language", "fr", False)
    assert worst.value == pytest.approx(0.4)
    assert worst.overall == pytest.approx(after.mean)
    before_french = before.subgroups["language"].group("fr")
    assert before_french is not None
    assert before_french.aggregate.mean is not None
    assert worst.value < before_french.aggregate.mean


def test_bad_group_size_is_rejected():
    with pytest.raises(ValueError, match="min_group_size"):
        by_subgroup([scored_item("a", 1.0)], "lang", min_group_size=0)


# --- Paired comparison --------------------------------------------------------------------------------


def test_a_consistent_shift_is_significant():
    rng = random.Random(5)
    a = {f"q{i}": rng.uniform(0.2, 0.7) for i in range(40)}
    b = {item_id: score + 0.1 + rng.uniform(-0.05, 0.05) for item_id, score in a.items()}
    comparison = paired_comparison(a, b, resamples=500, permutations=2000)
    assert comparison.items == 40
    assert comparison.mean_delta is not None
    assert comparison.mean_delta == pytest.approx(0.1, abs=0.02)
    assert comparison.p_value is not None
    assert comparison.p_value < 0.01
    assert comparison.ci is not None
    assert 0.0 < comparison.ci[0] < comparison.mean_delta < comparison.ci[1]
    assert (comparison.improved, comparison.worsened, comparison.unchanged) == (40, 0, 0)


def test_noise_is_not_significant():
    rng = random.Random(6)
    a = {f"q{i}": rng.uniform(0.2, 0.7) for i in range(40)}
    # Differences of +0.1 and -0.1 in equal numbers: no shift at all.
    b = {item_id: score + (0.1 if index % 2 else -0.1) for index, (item_id, score) in enumerate(a.items())}
    comparison = paired_comparison(a, b, resamples=500, permutations=2000)
    assert comparison.mean_delta == pytest.approx(0.0, abs=1e-12)
    assert comparison.p_value is not None
    assert comparison.p_value > 0.9
    assert comparison.ci is not None
    assert comparison.ci[0] < 0.0 < comparison.ci[1]


def test_random_noise_is_not_significant():
    rng = random.Random(8)
    a = {f"q{i}": rng.uniform(0.2, 0.7) for i in range(60)}
    b = {item_id: score + rng.gauss(0.0, 0.1) for item_id, score in a.items()}
    comparison = paired_comparison(a, b, resamples=500, permutations=2000)
    assert comparison.p_value is not None
    assert comparison.p_value > 0.05


def test_paired_comparison_leaves_out_missing_and_errored_items_and_counts_them():
    a = {"q1": 0.5, "q2": 0.5, "q3": None, "q4": 0.5, "only_a": 1.0}
    b = {"q1": 0.7, "q2": 0.5, "q3": 0.9, "q4": None, "only_b1": 0.0, "only_b2": 0.0}
    comparison = paired_comparison(a, b, resamples=100)
    assert comparison.items == 2
    assert (comparison.only_in_a, comparison.only_in_b, comparison.errored, comparison.excluded) == (1, 2, 2, 5)
    assert comparison.mean_a == 0.5
    assert comparison.mean_b == pytest.approx(0.6)
    assert comparison.mean_delta == pytest.approx(0.1)
    assert (comparison.improved, comparison.worsened, comparison.unchanged) == (1, 0, 1)


def test_paired_comparison_without_common_items_has_no_statistics():
    comparison = paired_comparison({"q1": 0.5}, {"q2": 0.5})
    assert comparison.items == 0
    assert (comparison.mean_delta, comparison.ci, comparison.p_value) == (None, None, None)
    assert json.loads(json.dumps(comparison.as_json()))["excluded"] == 2


def test_paired_comparison_is_deterministic_and_rejects_non_finite_scores():
    rng = random.Random(9)
    a = {f"q{i}": rng.random() for i in range(30)}
    b = {f"q{i}": rng.random() for i in range(30)}
    assert paired_comparison(a, b, seed=3) == paired_comparison(a, b, seed=3)
    with pytest.raises(ValueError, match="score must be finite"):
        paired_comparison({"q1": math.nan}, {"q1": 0.5})


def test_item_scores_feed_a_paired_comparison_of_two_runs():
    run_a = [item("q1", [True, False]), item("q2", [False, False]), ItemResult.from_pairs("q3", [(None, False)])]
    run_b = [item("q1", [True, True]), item("q2", [True, False]), item("q3", [True])]
    assert item_scores(run_a) == {"q1": 0.5, "q2": 0.0, "q3": None}
    comparison = paired_comparison(item_scores(run_a), item_scores(run_b), resamples=50)
    assert (comparison.items, comparison.errored) == (2, 1)
    assert comparison.mean_delta == pytest.approx(0.5)


def test_sign_flip_test_is_exact_for_few_items():
    # Of the 8 sign patterns of three equal differences, the two all-same ones are as extreme.
    assert sign_flip_test([1.0, 1.0, 1.0]) == pytest.approx(0.25)
    assert sign_flip_test([0.0, 0.0]) == 1.0
    assert sign_flip_test([0.3]) == 1.0
    many = [0.1] * (EXACT_SIGN_FLIP_ITEMS + 8)
    p_value = sign_flip_test(many, permutations=999)
    assert p_value == pytest.approx(1 / 1000)  # no sampled pattern reaches it: (0 + 1) / (999 + 1)


def _plain_sign_flip(values: list[float], permutations: int, seed: int) -> float:
    """The sign-flip test's Monte Carlo branch as a plain loop: one `random()` and one sign per value."""
    threshold = abs(math.fsum(values)) - 1e-9 * max(1.0, math.fsum(abs(value) for value in values))
    rng = random.Random(seed)
    hits = 0
    for _ in range(permutations):
        if abs(math.fsum(value if rng.random() < 0.5 else -value for value in values)) >= threshold:
            hits += 1
    return (hits + 1) / (permutations + 1)


@pytest.mark.parametrize("size", [EXACT_SIGN_FLIP_ITEMS + 1, 40, 301])
@pytest.mark.parametrize("kind", ["continuous", "discrete", "wide"])
def test_the_sampled_sign_flip_test_is_the_plain_loop_bit_for_bit(size, kind, monkeypatch):
    """The sampled branch draws its signs with numpy from the Random's state and sums with numpy, summing
    again with fsum the patterns near the threshold; it must count what the plain loop counts, also from
    its later blocks of draws (at most 1,000 values a block here). Discrete differences (many patterns
    exactly as extreme as the observed one) and values of very different sizes test the threshold."""
    monkeypatch.setattr(metrics, "_RESAMPLE_CHUNK_VALUES", 1000)
    rng = random.Random(size)
    choices = {"discrete": [-1.0, -0.25, 0.0, 0.25, 1.0], "wide": [1e-12, -3.0, 1e9, -1e9, 0.1]}
    deltas = [rng.uniform(-1.0, 1.0) if kind == "continuous" else rng.choice(choices[kind]) for _ in range(size)]
    for seed in (0, 1, 20240810):
        assert sign_flip_test(deltas, permutations=700, seed=seed) == _plain_sign_flip(deltas, 700, seed)


@pytest.mark.parametrize(
    ("deltas", "options", "message"),
    [
        ([], {}, "at least one difference"),
        ([math.inf], {}, "difference must be finite"),
        ([0.1], {"permutations": 0}, "permutations"),
    ],
)
def test_sign_flip_test_rejects_bad_input(deltas, options, message):
    with pytest.raises(ValueError, match=message):
        sign_flip_test(deltas, **options)


# --- The run report -----------------------------------------------------------------------------------


def test_run_report_bundles_the_aggregate_and_serialises_to_json():
    items = [
        item(f"q{i}", [i % 2 == 0, i % 3 == 0, True, False], {"language": "en" if i < 8 else "fr"}) for i in range(12)
    ]
    items.append(ItemResult.from_pairs("broken", [(None, False)] * 4, {"language": "fr"}))
    report = run_report(items, resamples=200, min_group_size=5)
    assert report.errored == 1
    assert report.overall.errored_samples == 4
    assert set(report.pass_at_k) == {1, 4}
    assert report.median is not None
    assert report.std is not None
    assert report.ci is not None
    assert report.majority_at_k == {}
    document = json.loads(report.to_json())
    assert document["overall"]["pass_at_k"].keys() == {"1", "4"}
    assert document["overall"]["errored"] == 1
    assert document["overall"]["ci"] == list(report.ci)
    assert [group["name"] for group in document["subgroups"]["language"]["groups"]] == ["en", "fr"]
    assert document["subgroups"]["language"]["groups"][1]["small"] is True  # four scored French items
    assert document["worst_group"]["tag_key"] == "language"
    assert document["worst_metric"] == "mean"
    assert len(document["items"]) == 13
    assert report.to_json() == run_report(items, resamples=200, min_group_size=5).to_json()


def test_run_report_takes_chosen_tag_keys_and_a_worst_metric():
    items = [item("a", [True, False], {"lang": "en", "tier": "free"}), item("b", [False, False], {"lang": "fr"})]
    report = run_report(items, ks=(1, 2), tag_keys=["lang"], worst_metric="pass@2", resamples=20)
    assert list(report.subgroups) == ["lang"]
    worst = report.worst_groups["lang"]
    assert worst is not None
    assert (worst.name, worst.metric, worst.value, worst.overall) == ("fr", "pass@2", 0.0, 0.5)


def test_run_report_rejects_duplicate_items_and_unknown_metrics():
    with pytest.raises(ValueError, match="appears twice"):
        run_report([item("a", [True]), item("a", [False])])
    with pytest.raises(ValueError, match="unknown metric"):
        run_report([item("a", [True])], worst_metric="best")


def test_an_empty_run_reports_no_statistics():
    report = run_report([])
    assert (report.mean, report.ci, report.worst_group) == (None, None, None)
    assert json.loads(report.to_json())["overall"]["count"] == 0
