"""The router's own evaluation: tier mix, cost, latency and quality per tier, how often it picked the best
tier, and how much of the quality gap between the cheapest tier and the best it recovered for its cost.

Pure module, no Django: the caller reads routing decisions and their shadow runs (the same request
sent through another tier off the caller's path, both answers scored) into `Outcome`s.

Definitions, for one agent's decisions and its enabled tiers (cheapest first):

- `best_tier_rate`: over decisions with a known quality and at least one shadow with a known quality,
  the share where the chosen tier's quality is within `BEST_TIER_TOLERANCE` of the best quality among
  the chosen answer and its shadows. `compared` counts those decisions.
- Quality gap recovered, after RouteLLM's PGR (RouteLLM reports APGR, its area over a sweep of
  thresholds; a live router runs at one threshold, so this is PGR at the operating point). The
  comparable set is the decisions whose chosen quality is known, whose cheapest tier's quality is
  known (chosen or shadow) and that have at least two known answers. Over it: `cheapest_quality` is
  the mean quality of the cheapest tier's answers, `best_quality` the mean of the best answer per
  decision, `router_quality` the mean of the router's answers, and
  `quality_gap_recovered = (router - cheapest) / (best - cheapest)`, None when the gap is not positive.
- Costs over the same set: the router's mean cost, the cheapest-only policy's and the all-best
  policy's (per decision, the cheapest answer of the best quality). `cost_ratio` = router / all-best.
  `added_cost_share = (router - cheapest) / (best - cheapest)` is the share of the all-best policy's
  extra spend the router spent, and `gap_recovered_per_cost = quality_gap_recovered / added_cost_share`:
  a router mixing the cheapest and the best tier at random scores 1; above 1, it spends its extra money
  where the quality is. None when either share is unknown or the added cost share is not positive.
- Bootstrap intervals (95%, percentile, seeded, `resamples` resamples of the decisions) for
  `best_tier_rate` and `quality_gap_recovered`.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final, TypeVar

T = TypeVar("T")

# Two answers whose qualities differ by less than this are as good as each other (judge noise).
BEST_TIER_TOLERANCE: Final = 0.02
BOOTSTRAP_RESAMPLES: Final = 1000
BOOTSTRAP_SEED: Final = 20240810


@dataclass(frozen=True, slots=True)
class ShadowOutcome:
    quality: float | None
    cost_usd: float | None
    latency_ms: float | None


@dataclass(frozen=True, slots=True)
class Outcome:
    tier: str
    quality: float | None
    cost_usd: float | None
    latency_ms: float | None
    shadow: Mapping[str, ShadowOutcome] = field(default_factory=dict)
    # The judge's score of the chosen answer, given beside its shadows' (None: not judged). Answers are
    # compared on it rather than on `quality`, which may come from elsewhere (signals, a person's score)
    # and so be on another scale than the shadows' judged qualities.
    judged_quality: float | None = None


@dataclass(frozen=True, slots=True)
class TierStats:
    tier: str
    count: int
    share: float
    mean_cost_usd: float | None
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    mean_quality: float | None

    def as_json(self) -> dict[str, Any]:
        return {
            "tier": self.tier,
            "count": self.count,
            "share": self.share,
            "mean_cost_usd": self.mean_cost_usd,
            "latency_p50_ms": self.latency_p50_ms,
            "latency_p95_ms": self.latency_p95_ms,
            "mean_quality": self.mean_quality,
        }


@dataclass(frozen=True, slots=True)
class RouterReport:
    total: int
    tiers: tuple[TierStats, ...]
    best_tier_rate: float | None
    best_tier_rate_interval: tuple[float, float] | None
    compared: int
    comparable: int
    cheapest_quality: float | None
    best_quality: float | None
    router_quality: float | None
    quality_gap_recovered: float | None
    quality_gap_recovered_interval: tuple[float, float] | None
    cheapest_cost_usd: float | None
    best_cost_usd: float | None
    router_cost_usd: float | None
    cost_ratio: float | None
    added_cost_share: float | None
    gap_recovered_per_cost: float | None

    def tier(self, name: str) -> TierStats | None:
        return next((stats for stats in self.tiers if stats.tier == name), None)

    def as_json(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "tiers": [stats.as_json() for stats in self.tiers],
            "best_tier_rate": self.best_tier_rate,
            "best_tier_rate_interval": _interval_json(self.best_tier_rate_interval),
            "compared": self.compared,
            "comparable": self.comparable,
            "cheapest_quality": self.cheapest_quality,
            "best_quality": self.best_quality,
            "router_quality": self.router_quality,
            "quality_gap_recovered": self.quality_gap_recovered,
            "quality_gap_recovered_interval": _interval_json(self.quality_gap_recovered_interval),
            "cheapest_cost_usd": self.cheapest_cost_usd,
            "best_cost_usd": self.best_cost_usd,
            "router_cost_usd": self.router_cost_usd,
            "cost_ratio": self.cost_ratio,
            "added_cost_share": self.added_cost_share,
            "gap_recovered_per_cost": self.gap_recovered_per_cost,
        }


@dataclass(frozen=True, slots=True)
class Bucket:
    start: datetime
    total: int
    tier_counts: dict[str, int]
    mean_quality: float | None
    mean_cost_usd: float | None

    def share(self, tier: str) -> float:
        return self.tier_counts.get(tier, 0) / self.total if self.total else 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "start": self.start.isoformat(),
            "total": self.total,
            "tier_counts": dict(self.tier_counts),
            "mean_quality": self.mean_quality,
            "mean_cost_usd": self.mean_cost_usd,
        }


@dataclass(frozen=True, slots=True)
class _Answer:
    tier: str
    quality: float
    cost_usd: float | None


@dataclass(frozen=True, slots=True)
class _Comparison:
    """One comparable decision: the cheapest tier's answer, the best answer and the router's."""

    cheapest: _Answer
    best: _Answer
    router: _Answer


def router_report(
    outcomes: Sequence[Outcome],
    tiers: Sequence[str],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> RouterReport:
    """The router's report over these decisions; `tiers` are the enabled tiers, cheapest first.

    Tiers that served decisions but are not in `tiers` are listed after them. With `resamples=0` no
    bootstrap intervals are computed.
    """
    total = len(outcomes)
    served = Counter(outcome.tier for outcome in outcomes)
    listed = list(dict.fromkeys([*tiers, *served]))
    stats = tuple(_tier_stats(tier, [o for o in outcomes if o.tier == tier], total) for tier in listed)

    best_flags = [flag for outcome in outcomes if (flag := _chose_best(outcome)) is not None]
    comparisons = [c for outcome in outcomes if tiers and (c := _comparison(outcome, tiers[0])) is not None]
    rng = random.Random(seed)  # noqa: S311 - resampling for an interval, not a secret

    cheapest_quality = _mean([c.cheapest.quality for c in comparisons])
    best_quality = _mean([c.best.quality for c in comparisons])
    router_quality = _mean([c.router.quality for c in comparisons])
    cheapest_cost = _mean([c.cheapest.cost_usd for c in comparisons if c.cheapest.cost_usd is not None])
    best_cost = _mean([c.best.cost_usd for c in comparisons if c.best.cost_usd is not None])
    router_cost = _mean([c.router.cost_usd for c in comparisons if c.router.cost_usd is not None])
    recovered = _gap_recovered(comparisons)
    added_cost_share = _share_of_gap(router_cost, cheapest_cost, best_cost)
    per_cost = None
    if recovered is not None and added_cost_share is not None and added_cost_share > 0:
        per_cost = recovered / added_cost_share

    return RouterReport(
        total=total,
        tiers=stats,
        best_tier_rate=_mean([1.0 if flag else 0.0 for flag in best_flags]),
        best_tier_rate_interval=_bootstrap(
            best_flags, lambda sample: sum(sample) / len(sample), rng=rng, resamples=resamples
        ),
        compared=len(best_flags),
        comparable=len(comparisons),
        cheapest_quality=cheapest_quality,
        best_quality=best_quality,
        router_quality=router_quality,
        quality_gap_recovered=recovered,
        quality_gap_recovered_interval=_bootstrap(comparisons, _gap_recovered, rng=rng, resamples=resamples),
        cheapest_cost_usd=cheapest_cost,
        best_cost_usd=best_cost,
        router_cost_usd=router_cost,
        cost_ratio=router_cost / best_cost if router_cost is not None and best_cost else None,
        added_cost_share=added_cost_share,
        gap_recovered_per_cost=per_cost,
    )


def _tier_stats(tier: str, served: Sequence[Outcome], total: int) -> TierStats:
    latencies = sorted(latency for o in served if (latency := _finite(o.latency_ms)) is not None)
    return TierStats(
        tier=tier,
        count=len(served),
        share=len(served) / total if total else 0.0,
        mean_cost_usd=_mean([cost for o in served if (cost := _finite(o.cost_usd)) is not None]),
        latency_p50_ms=_percentile(latencies, 0.5),
        latency_p95_ms=_percentile(latencies, 0.95),
        mean_quality=_mean([quality for o in served if (quality := _finite(o.quality)) is not None]),
    )


def _answers(outcome: Outcome) -> dict[str, _Answer]:
    """Every answer to this request with a known quality, by tier: the router's and its shadows'."""
    answers = {}
    for tier, shadow in outcome.shadow.items():
        quality = _finite(shadow.quality)
        if quality is not None and tier != outcome.tier:
            answers[tier] = _Answer(tier, quality, _finite(shadow.cost_usd))
    quality = _finite(outcome.judged_quality)
    if quality is None:
        quality = _finite(outcome.quality)
    if quality is not None:
        answers[outcome.tier] = _Answer(outcome.tier, quality, _finite(outcome.cost_usd))
    return answers


def _best(answers: Iterable[_Answer]) -> _Answer:
    # Of equally good answers, the cheaper one is the best: that is the one an oracle router would pick.
    return max(answers, key=lambda a: (a.quality, -(a.cost_usd if a.cost_usd is not None else math.inf)))


def _chose_best(outcome: Outcome) -> bool | None:
    answers = _answers(outcome)
    if outcome.tier not in answers or len(answers) < 2:
        return None
    return answers[outcome.tier].quality >= _best(answers.values()).quality - BEST_TIER_TOLERANCE


def _comparison(outcome: Outcome, cheapest_tier: str) -> _Comparison | None:
    answers = _answers(outcome)
    if outcome.tier not in answers or cheapest_tier not in answers or len(answers) < 2:
        return None
    return _Comparison(cheapest=answers[cheapest_tier], best=_best(answers.values()), router=answers[outcome.tier])


def _gap_recovered(comparisons: Sequence[_Comparison]) -> float | None:
    if not comparisons:
        return None
    cheapest = sum(c.cheapest.quality for c in comparisons) / len(comparisons)
    best = sum(c.best.quality for c in comparisons) / len(comparisons)
    router = sum(c.router.quality for c in comparisons) / len(comparisons)
    return _share_of_gap(router, cheapest, best)


def _share_of_gap(value: float | None, low: float | None, high: float | None) -> float | None:
    if value is None or low is None or high is None or high - low <= 0:
        return None
    return (value - low) / (high - low)


def _bootstrap(
    items: Sequence[T],
    statistic: Callable[[Sequence[T]], float | None],
    *,
    rng: random.Random,
    resamples: int,
) -> tuple[float, float] | None:
    """The 95% percentile interval of `statistic` over resamples of `items`; None with too little data."""
    if len(items) < 2 or resamples <= 0:
        return None
    values = sorted(
        value
        for _ in range(resamples)
        if (value := statistic(rng.choices(items, k=len(items)))) is not None and math.isfinite(value)
    )
    if len(values) < resamples / 2:
        # Most resamples had no gap to recover: an interval over the rest would mislead.
        return None
    return (_percentile(values, 0.025) or 0.0, _percentile(values, 0.975) or 0.0)


def bucketed(
    outcomes_with_time: Iterable[tuple[datetime, Outcome]], bucket: timedelta = timedelta(days=1)
) -> list[Bucket]:
    """Tier mix, mean quality and mean cost per time bucket (daily by default), oldest first.

    Buckets start at midnight (weeks on Monday) in each datetime's own time zone; buckets without a
    decision are left out.
    """
    if bucket <= timedelta(0):
        raise ValueError("bucket must be a positive duration")
    grouped: dict[datetime, list[Outcome]] = {}
    for moment, outcome in outcomes_with_time:
        # Monday 2000-01-03 at midnight, in the moment's own zone: days start at midnight, weeks on Monday.
        anchor = moment.replace(year=2000, month=1, day=3, hour=0, minute=0, second=0, microsecond=0)
        start = moment - (moment - anchor) % bucket
        grouped.setdefault(start, []).append(outcome)
    return [
        Bucket(
            start=start,
            total=len(members),
            tier_counts=dict(Counter(o.tier for o in members)),
            mean_quality=_mean([q for o in members if (q := _finite(o.quality)) is not None]),
            mean_cost_usd=_mean([c for o in members if (c := _finite(o.cost_usd)) is not None]),
        )
        for start, members in sorted(grouped.items())
    ]


def _finite(value: object) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _percentile(ordered: Sequence[float], fraction: float) -> float | None:
    """Linear interpolation between the closest ranks (numpy's default), of already sorted values."""
    if not ordered:
        return None
    position = (len(ordered) - 1) * fraction
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _interval_json(interval: tuple[float, float] | None) -> list[float] | None:
    return list(interval) if interval is not None else None
