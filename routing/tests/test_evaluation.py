"""The router's report on hand-computed examples: tier mix and per-tier numbers, best-tier rate, the
quality gap recovered (0, 0.5, 1) and what it cost, bootstrap intervals, and the daily series."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest

from routing.evaluation import Bucket, Outcome, ShadowOutcome, TierStats, bucketed, router_report

TIERS = ("single_call", "chain")
# Qualities and costs that are exact in binary, so the report's arithmetic can be compared exactly.
CHEAP = {"quality": 0.25, "cost_usd": 0.25, "latency_ms": 100.0}
GOOD = {"quality": 0.75, "cost_usd": 1.0, "latency_ms": 400.0}


def served(tier: str, answer: dict[str, float], shadow_tier: str, shadow_answer: dict[str, float]) -> Outcome:
    return Outcome(tier=tier, **answer, shadow={shadow_tier: ShadowOutcome(**shadow_answer)})


CHOSE_CHAIN_WELL = served("chain", GOOD, "single_call", CHEAP)
CHOSE_CHEAP_BADLY = served("single_call", CHEAP, "chain", GOOD)
CHOSE_CHEAP_WELL = served("single_call", GOOD | {"cost_usd": 0.25}, "chain", GOOD)
CHOSE_CHAIN_NEEDLESSLY = served("chain", GOOD, "single_call", GOOD | {"cost_usd": 0.25})


def test_a_router_that_always_picks_the_best_recovers_the_whole_gap() -> None:
    report = router_report([CHOSE_CHAIN_WELL, CHOSE_CHEAP_WELL], TIERS, resamples=0)

    assert (report.comparable, report.compared) == (2, 2)
    assert (report.cheapest_quality, report.best_quality, report.router_quality) == (0.5, 0.75, 0.75)
    assert report.quality_gap_recovered == 1.0
    assert (report.cheapest_cost_usd, report.best_cost_usd, report.router_cost_usd) == (0.25, 0.625, 0.625)
    assert report.cost_ratio == 1.0
    assert report.added_cost_share == 1.0
    assert report.gap_recovered_per_cost == 1.0
    assert report.best_tier_rate == 1.0


def test_a_router_that_never_escalates_recovers_nothing() -> None:
    report = router_report([CHOSE_CHEAP_BADLY, CHOSE_CHEAP_WELL], TIERS, resamples=0)

    assert (report.cheapest_quality, report.best_quality, report.router_quality) == (0.5, 0.75, 0.5)
    assert report.quality_gap_recovered == 0.0
    assert report.router_cost_usd == 0.25
    assert report.cost_ratio == 0.25 / 0.625
    assert report.added_cost_share == 0.0
    assert report.gap_recovered_per_cost is None  # no added cost to divide by
    assert report.best_tier_rate == 0.5


def test_a_router_right_half_the_time_recovers_half_the_gap_for_half_the_added_cost() -> None:
    report = router_report([CHOSE_CHAIN_WELL, CHOSE_CHEAP_BADLY], TIERS, resamples=0)

    assert (report.cheapest_quality, report.best_quality, report.router_quality) == (0.25, 0.75, 0.5)
    assert report.quality_gap_recovered == 0.5
    assert (report.cheapest_cost_usd, report.best_cost_usd, report.router_cost_usd) == (0.25, 1.0, 0.625)
    assert report.cost_ratio == 0.625
    assert report.added_cost_share == 0.5
    assert report.gap_recovered_per_cost == 1.0  # what a random mix of the two tiers would do
    assert report.best_tier_rate == 0.5


def test_escalating_without_need_costs_without_recovering() -> None:
    report = router_report([CHOSE_CHAIN_WELL, CHOSE_CHAIN_NEEDLESSLY], TIERS, resamples=0)

    # The best answer on the second request is the cheap one: equally good, cheaper.
    assert (report.cheapest_quality, report.best_quality, report.router_quality) == (0.5, 0.75, 0.75)
    assert (report.best_cost_usd, report.router_cost_usd) == (0.625, 1.0)
    assert report.quality_gap_recovered == 1.0
    assert report.added_cost_share == (1.0 - 0.25) / (0.625 - 0.25)
    assert report.gap_recovered_per_cost == 0.5
    assert report.best_tier_rate == 1.0  # the quality is the best; the cost is what the other numbers show


def test_the_best_tier_allows_a_small_tolerance() -> None:
    nearly = served(
        "single_call", {"quality": 0.79, "cost_usd": 0.1, "latency_ms": 1.0}, "chain", GOOD | {"quality": 0.8}
    )
    missed = served(
        "single_call", {"quality": 0.77, "cost_usd": 0.1, "latency_ms": 1.0}, "chain", GOOD | {"quality": 0.8}
    )

    assert router_report([nearly], TIERS, resamples=0).best_tier_rate == 1.0
    assert router_report([missed], TIERS, resamples=0).best_tier_rate == 0.0


def test_decisions_without_a_known_comparison_are_left_out() -> None:
    outcomes = [
        Outcome("single_call", 0.5, 0.1, 10.0, {}),  # no shadow
        Outcome("chain", None, 0.1, 10.0, {"single_call": ShadowOutcome(0.5, 0.1, 10.0)}),  # unknown quality
        Outcome("chain", 0.5, 0.1, 10.0, {"single_call": ShadowOutcome(None, None, None)}),  # shadow unscored
        Outcome("agentic", 0.9, 1.0, 10.0, {"chain": ShadowOutcome(0.5, 0.1, 10.0)}),  # no cheapest answer
    ]

    report = router_report(outcomes, ("single_call", "chain", "agentic"), resamples=0)

    assert (report.total, report.compared, report.comparable) == (4, 1, 0)
    assert report.best_tier_rate == 1.0
    assert (report.quality_gap_recovered, report.cheapest_quality, report.cost_ratio) == (None, None, None)


def test_no_gap_to_recover_gives_none() -> None:
    report = router_report([CHOSE_CHEAP_WELL], TIERS, resamples=0)

    assert report.quality_gap_recovered is None
    assert report.added_cost_share is None


def test_tier_mix_and_per_tier_numbers() -> None:
    outcomes = [Outcome("single_call", 0.5, 0.01, latency, {}) for latency in (100.0, 200.0, 300.0, 400.0, 500.0)]
    outcomes += [Outcome("chain", None, None, None, {}), Outcome("chain", 1.0, 0.05, 1000.0, {})]
    outcomes += [Outcome("human", 1.0, 4.0, 3_600_000.0, {})]

    report = router_report(outcomes, TIERS, resamples=0)

    assert report.total == 8
    assert report.tiers == (
        TierStats("single_call", 5, 5 / 8, 0.01, 300.0, 480.0, 0.5),
        TierStats("chain", 2, 2 / 8, 0.05, 1000.0, 1000.0, 1.0),
        TierStats("human", 1, 1 / 8, 4.0, 3_600_000.0, 3_600_000.0, 1.0),
    )
    assert report.tier("chain") == report.tiers[1]
    assert report.tier("agentic") is None


def test_an_empty_report() -> None:
    report = router_report([], TIERS)

    assert report.total == 0
    assert report.tiers == (
        TierStats("single_call", 0, 0.0, None, None, None, None),
        TierStats("chain", 0, 0.0, None, None, None, None),
    )
    assert (report.best_tier_rate, report.best_tier_rate_interval, report.quality_gap_recovered_interval) == (
        None,
        None,
        None,
    )


def test_bootstrap_intervals_are_seeded_and_hold_the_estimate() -> None:
    outcomes = [CHOSE_CHAIN_WELL] * 30 + [CHOSE_CHEAP_BADLY] * 10 + [CHOSE_CHEAP_WELL] * 20

    report = router_report(outcomes, TIERS)
    again = router_report(outcomes, TIERS)

    assert report.best_tier_rate == 50 / 60
    assert report.best_tier_rate_interval == again.best_tier_rate_interval
    assert report.quality_gap_recovered_interval == again.quality_gap_recovered_interval
    assert report.best_tier_rate_interval is not None
    assert report.quality_gap_recovered is not None
    assert report.quality_gap_recovered_interval is not None
    low, high = report.best_tier_rate_interval
    assert low < report.best_tier_rate < high
    low, high = report.quality_gap_recovered_interval
    assert low < report.quality_gap_recovered < high


def test_a_unanimous_sample_has_a_point_interval() -> None:
    report = router_report([CHOSE_CHAIN_WELL] * 5, TIERS)

    assert report.best_tier_rate_interval == (1.0, 1.0)
    assert report.quality_gap_recovered_interval == (1.0, 1.0)


def test_the_report_serialises_to_json() -> None:
    report = router_report([CHOSE_CHAIN_WELL, CHOSE_CHEAP_BADLY], TIERS, resamples=50)

    data = json.loads(json.dumps(report.as_json(), allow_nan=False))

    assert data["quality_gap_recovered"] == 0.5
    assert data["tiers"][0] == {
        "tier": "single_call",
        "count": 1,
        "share": 0.5,
        "mean_cost_usd": 0.25,
        "latency_p50_ms": 100.0,
        "latency_p95_ms": 100.0,
        "mean_quality": 0.25,
    }


# --- Over time ---------------------------------------------------------------------------------


def test_bucketed_groups_by_day_in_order() -> None:
    day = datetime(2026, 3, 2, tzinfo=UTC)
    series = bucketed(
        [
            (day + timedelta(days=1, hours=9), Outcome("chain", 0.5, 0.5, 1.0, {})),
            (day + timedelta(hours=23, minutes=59), Outcome("single_call", 1.0, 0.25, 1.0, {})),
            (day, Outcome("single_call", None, None, None, {})),
            (day + timedelta(days=1), Outcome("chain", 1.0, None, 1.0, {})),
        ]
    )

    assert series == [
        Bucket(start=day, total=2, tier_counts={"single_call": 2}, mean_quality=1.0, mean_cost_usd=0.25),
        Bucket(start=day + timedelta(days=1), total=2, tier_counts={"chain": 2}, mean_quality=0.75, mean_cost_usd=0.5),
    ]
    assert series[0].share("single_call") == 1.0
    assert series[0].as_json()["start"] == "2026-03-02T00:00:00+00:00"


def test_bucketed_days_start_at_local_midnight_and_weeks_on_monday() -> None:
    tokyo = timezone(timedelta(hours=9))
    moment = datetime(2026, 3, 5, 1, 30, tzinfo=tokyo)  # a Thursday
    outcome = Outcome("chain", 1.0, 1.0, 1.0, {})

    assert bucketed([(moment, outcome)])[0].start == datetime(2026, 3, 5, tzinfo=tokyo)
    assert bucketed([(moment, outcome)], timedelta(weeks=1))[0].start == datetime(2026, 3, 2, tzinfo=tokyo)
    assert bucketed([(moment, outcome)], timedelta(hours=1))[0].start == datetime(2026, 3, 5, 1, tzinfo=tokyo)


def test_bucketed_needs_a_positive_bucket() -> None:
    with pytest.raises(ValueError, match="bucket must be a positive duration"):
        bucketed([], timedelta(0))
