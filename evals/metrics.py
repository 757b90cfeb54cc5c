"""The statistics of an eval run: pass@k, majority@k, summaries, bootstrap intervals, subgroups and the
worst group, and the paired comparison of two runs on the same items.

Pure module, no Django: the caller reads an eval run's scores into `ItemResult`s (one per dataset
item, one `Sample` per sampled answer) and stores what `run_report` returns (`RunReport.as_json()`).

Definitions:

- A sample is *errored* when its score is None (the judge never gave a parsable answer, the provider
  failed): it is left out of every statistic and counted apart, never scored 0. An item is errored
  when all its samples are.
- An item's *score* is the mean score of its scored samples; its *pass rate* is passed / scored.
  Run-level mean, median, std (sample, n - 1) and the bootstrap interval are over item scores, each
  item weighted once however many samples it has.
- pass@k is Chen et al. (2021)'s unbiased estimator, per item from its n scored samples of which c
  passed, averaged over the items with n >= k. k is reported only where at least one item has k
  scored samples, with the number of items it was averaged over.
- majority@k: the first k scored samples of an item vote with their answers; the most frequent answer
  wins, a tie going to the tied answer sampled first. The item counts as correct when the winner is a
  correct answer. Averaged over the items with at least k scored samples that carry answers.
- Subgroups: an item's `tags` map a key (say "language") to one or several values; an item with two
  values under a key counts in both groups. Every metric is computed per group; the worst group
  (maximin: the group with the lowest value of a metric, ties to the first name) is reported beside
  the overall value, so an improving mean cannot hide a group getting worse. Groups with fewer than
  `min_group_size` scored items are flagged `small` and still reported.
- Paired comparison of run A and run B: per item, delta = B - A; the items missing or errored on
  either side are left out and counted. The interval resamples items (so pairs stay together) and the
  p-value is a two-sided sign-flip permutation test of the mean delta, exact for up to
  `EXACT_SIGN_FLIP_ITEMS` items and otherwise Monte Carlo with a fixed seed.

Every random draw comes from a `random.Random` seeded by the caller (a fixed default otherwise), so the
same inputs always give the same report.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import statistics
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

Interval = tuple[float, float]
Statistic = Callable[[Sequence[float]], float]

DEFAULT_KS: Final = (1, 4, 16)
DEFAULT_CONFIDENCE: Final = 0.95
BOOTSTRAP_RESAMPLES: Final = 2000
PERMUTATIONS: Final = 5000
DEFAULT_SEED: Final = 20240810
# Below this many scored items a group's numbers are flagged: one item moves its mean by 10% or more.
MIN_GROUP_SIZE: Final = 10
# 2**12 sign vectors is cheaper to enumerate than sampling 5000, and the p-value is then exact.
EXACT_SIGN_FLIP_ITEMS: Final = 12


# --- Estimators ---------------------------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimator, 1 - C(n - c, k) / C(n, k), for n samples of which c passed.

    The probability that at least one of k samples drawn without replacement from the n passes.
    Computed in the product form of Chen et al. (2021), 1 - prod_{i = n - c + 1}^{n} (1 - k / i),
    which never forms the (huge) binomial coefficients. Defined for 0 <= c <= n and 1 <= k <= n;
    anything else raises ValueError.
    """
    for name, value in (("n", n), ("c", c), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be an integer, got {value!r}")
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    if not 0 <= c <= n:
        raise ValueError(f"c must be between 0 and n={n}, got {c}")
    if not 1 <= k <= n:
        raise ValueError(f"k must be between 1 and n={n}, got {k}")
    if n - c < k:
        # Every draw of k contains a passing sample.
        return 1.0
    failing_only = 1.0
    for i in range(n - c + 1, n + 1):
        failing_only *= 1.0 - k / i
    return 1.0 - failing_only


def majority_vote(answers: Sequence[str | None], k: int) -> str | None:
    """The most frequent answer among the first k; a tie goes to the tied answer that came first.

    None answers (a sample with no extractable answer) take their place among the first k but cast no
    vote; with no vote at all the result is None. Raises ValueError unless 1 <= k <= len(answers).
    """
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= len(answers):
        raise ValueError(f"k must be between 1 and the number of answers ({len(answers)}), got {k!r}")
    counts: dict[str, int] = {}
    for answer in answers[:k]:
        if answer is not None:
            # dicts keep insertion order, so the first-seen answer wins ties in max() below.
            counts[answer] = counts.get(answer, 0) + 1
    if not counts:
        return None
    return max(counts, key=lambda answer: counts[answer])


def majority_at_k(answers: Sequence[str | None], correct: str | Collection[str], k: int) -> bool:
    """Whether the majority vote of the first k answers (see `majority_vote`) is a correct answer.

    `correct` is the reference answer, or the collection of answers that count as correct. Answers
    are compared exactly: normalise them (case, whitespace, number format) before calling.
    """
    winner = majority_vote(answers, k)
    if winner is None:
        return False
    if isinstance(correct, str):
        return winner == correct
    return winner in correct


# --- Summaries and intervals --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Summary:
    """Count, mean, median and sample standard deviation of scores, the errored ones counted apart."""

    count: int
    errored: int
    mean: float | None
    median: float | None
    std: float | None  # None below two values

    def as_json(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "errored": self.errored,
            "mean": self.mean,
            "median": self.median,
            "std": self.std,
        }


def summarize(scores: Iterable[float | None]) -> Summary:
    """Summarise scores; None marks an errored item, excluded from the statistics and counted.

    Raises ValueError on a score that is not a finite number.
    """
    values: list[float] = []
    errored = 0
    for score in scores:
        if score is None:
            errored += 1
        else:
            values.append(_finite(score, "score"))
    return Summary(
        count=len(values),
        errored=errored,
        mean=statistics.fmean(values) if values else None,
        median=statistics.median(values) if values else None,
        std=statistics.stdev(values) if len(values) >= 2 else None,
    )


def mean(values: Sequence[float]) -> float:
    """The arithmetic mean; the default statistic of `bootstrap_ci`."""
    return statistics.fmean(values)


def bootstrap_ci(
    values: Sequence[float],
    stat: Statistic = mean,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> Interval:
    """The percentile bootstrap interval of `stat` over `values`: (low, high).

    Draws `resamples` resamples of len(values) values with replacement, computes `stat` on each, and
    returns the (1 - confidence) / 2 and (1 + confidence) / 2 quantiles (linear interpolation, numpy's
    default). The same values and seed always give the same interval. Raises ValueError on no values,
    a non-finite value, a confidence outside (0, 1) or fewer than one resample.
    """
    if not values:
        raise ValueError("bootstrap_ci needs at least one value")
    points = [_finite(value, "value") for value in values]
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be strictly between 0 and 1, got {confidence!r}")
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 1:
        raise ValueError(f"resamples must be a positive integer, got {resamples!r}")
    rng = random.Random(seed)  # noqa: S311 - resampling for an interval, not a secret
    size = len(points)
    tail = (1.0 - confidence) / 2.0
    if stat is mean:
        ranks = {rank for fraction in (tail, 1.0 - tail) for rank in _quantile_ranks(resamples, fraction)[:2]}
        ranked = _resample_means_ranked(points, resamples, rng, ranks)
        return (_quantile(ranked.__getitem__, resamples, tail), _quantile(ranked.__getitem__, resamples, 1.0 - tail))
    estimates = sorted(stat(rng.choices(points, k=size)) for _ in range(resamples))
    return (_quantile(estimates.__getitem__, resamples, tail), _quantile(estimates.__getitem__, resamples, 1.0 - tail))


# Resamples drawn in one numpy call hold at most this many values (8 bytes each, twice: draws and indices).
_RESAMPLE_CHUNK_VALUES = 1 << 20


def _resample_blocks(points: Sequence[float], resamples: int, rng: random.Random) -> Iterator[Any]:
    """The resamples `rng.choices(points, k=n)` would draw, `resamples` times, as rows of numpy arrays of
    at most `_RESAMPLE_CHUNK_VALUES` values.

    `choices` picks `points[floor(random() * n)]`, and `random()` is MT19937's 53-bit double. numpy's
    legacy `RandomState` is the same generator and makes its doubles the same way, so, started from the
    Random's state (`_numpy_twin`), it draws the same stream in blocks. The Random itself is not moved on."""
    import numpy

    size = len(points)
    generator = _numpy_twin(rng)
    values = numpy.asarray(points, dtype=numpy.float64)
    rows = max(1, _RESAMPLE_CHUNK_VALUES // size)
    left = resamples
    while left:
        taken = min(rows, left)
        picks = numpy.floor(generator.random_sample(taken * size) * float(size)).astype(numpy.intp)
        yield values[picks].reshape(taken, size)
        left -= taken


def _resample_means(points: Sequence[float], resamples: int, rng: random.Random) -> Iterator[float]:
    """The means of `resamples` resamples of `points`, equal to `fmean(rng.choices(points, k=n))` called
    `resamples` times, bit for bit, without a Python call per drawn value (`fmean` is `fsum(values) / n`,
    applied to each resample as it is)."""
    size = len(points)
    for block in _resample_blocks(points, resamples, rng):
        for resample in block.tolist():
            yield math.fsum(resample) / size


def _resample_means_ranked(
    points: Sequence[float], resamples: int, rng: random.Random, ranks: Collection[int]
) -> dict[int, float]:
    """Rank -> the value at that rank of `sorted(_resample_means(points, resamples, rng))`, bit for bit,
    with `fsum` over the few resamples near those ranks rather than over all of them (2,000 resamples of
    10,000 points: 0.4 s instead of 1.4).

    numpy's mean of a resample is off its `fsum` mean by at most e = (n + 3)·2⁻⁵² times the largest
    |point| (the bound of a sum's rounding errors, and the divisions', with room to spare). So the value at
    rank r lies within e of v, the numpy means' value at r, and is the (r - below)-th of the `fsum` means
    of the resamples whose numpy mean is within `margin` = 2e of v, `below` counting those whose numpy mean
    lies further below: each of those is smaller than the value, and each further above larger. The draws
    are made again for the second pass, up to the last resample it needs."""
    import numpy

    size = len(points)
    means = numpy.concatenate([block.sum(axis=1) / size for block in _resample_blocks(points, resamples, rng)])
    if not numpy.isfinite(means).all():  # a sum beyond the doubles: the loop's fsum raises, and so does this
        ordered = sorted(_resample_means(points, resamples, rng))
        return {rank: ordered[rank] for rank in ranks}
    ordered_means = numpy.sort(means)
    margin = 2.0 * (size + 3) * 2.0**-52 * max(abs(point) for point in points)
    near = {rank: numpy.flatnonzero(numpy.abs(means - ordered_means[rank]) <= margin) for rank in ranks}
    wanted = numpy.unique(numpy.concatenate(list(near.values())))
    exact: dict[int, float] = {}
    start = 0
    for block in _resample_blocks(points, int(wanted[-1]) + 1, rng):
        rows = wanted[(wanted >= start) & (wanted < start + len(block))]
        exact.update(zip(rows.tolist(), (math.fsum(row) / size for row in block[rows - start].tolist()), strict=True))
        start += len(block)
    values: dict[int, float] = {}
    for rank, indices in near.items():
        below = int(numpy.count_nonzero(means < ordered_means[rank] - margin))
        values[rank] = sorted(exact[index] for index in indices.tolist())[rank - below]
    return values


def _numpy_twin(rng: random.Random) -> Any:
    """numpy's legacy `RandomState` in the Random's state: its `random_sample` draws the doubles that the
    Random's `random()` would, in the same order (see `_resample_blocks`). The Random is not moved on."""
    import numpy

    version, words, _ = rng.getstate()
    if version != 3 or len(words) != 625:  # the state of CPython's Mersenne Twister since Python 2.4
        raise RuntimeError(f"unexpected random.Random state (version {version})")
    generator = numpy.random.RandomState()
    generator.set_state(("MT19937", numpy.array(words[:624], dtype=numpy.uint32), words[624], 0, 0.0))
    return generator


def _sign_flip_hits(values: Sequence[float], permutations: int, rng: random.Random, threshold: float) -> int:
    """How many of `permutations` random sign patterns reach `threshold`: what the loop
    `abs(fsum(v if rng.random() < 0.5 else -v for v in values)) >= threshold`, once per pattern, counts,
    bit for bit, without a Python call per value (5,000 patterns of 10,000 differences: 3.5 s in that loop).

    The signs come from numpy's twin of the Random (`_numpy_twin`), pattern after pattern. numpy sums a
    pattern in its own order, which is off the correctly rounded `fsum` by less than (n + 1)·2⁻⁵³·Σ|v|;
    only the patterns whose numpy sum lies within twice that of the threshold are summed again with `fsum`."""
    import numpy

    size = len(values)
    points = numpy.asarray(values, dtype=numpy.float64)
    generator = _numpy_twin(rng)
    margin = 2.0 * (size + 1) * 2.0**-53 * math.fsum(abs(value) for value in values)
    rows = max(1, _RESAMPLE_CHUNK_VALUES // size)
    hits, left = 0, permutations
    while left:
        taken = min(rows, left)
        signed = numpy.where(generator.random_sample((taken, size)) < 0.5, points, -points)
        sums = numpy.abs(signed.sum(axis=1))
        hits += int(numpy.count_nonzero(sums >= threshold + margin))
        for row in numpy.flatnonzero((sums > threshold - margin) & (sums < threshold + margin)).tolist():
            hits += 1 if abs(math.fsum(signed[row].tolist())) >= threshold else 0
        left -= taken
    return hits


# --- Items and their samples --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sample:
    """One sampled answer to an item: its score (None when errored), whether it passed, its answer."""

    score: float | None
    passed: bool = False
    answer: str | None = None  # the extracted final answer, for majority@k

    @property
    def errored(self) -> bool:
        return self.score is None


@dataclass(frozen=True, slots=True)
class ItemResult:
    """A dataset item's samples in the order they were drawn, and its subgroup tags."""

    item_id: str
    samples: tuple[Sample, ...]
    tags: Mapping[str, str | Sequence[str]] = field(default_factory=dict)

    @classmethod
    def from_pairs(
        cls,
        item_id: str,
        pairs: Iterable[tuple[float | None, bool]],
        tags: Mapping[str, str | Sequence[str]] | None = None,
    ) -> ItemResult:
        """An item from (score, passed) pairs, one per sample."""
        return cls(item_id, tuple(Sample(score, passed) for score, passed in pairs), tags or {})

    def tag_values(self, key: str) -> tuple[str, ...]:
        """The item's values under a tag key, none when it has no such tag."""
        value = self.tags.get(key)
        if value is None:
            return ()
        if isinstance(value, str):
            return (value,)
        return tuple(dict.fromkeys(value))  # a value listed twice still puts the item in its group once


@dataclass(frozen=True, slots=True)
class ItemStats:
    """One item's statistics over its scored samples."""

    item_id: str
    samples: int  # scored samples
    errored_samples: int
    passed: int
    score: float | None  # mean sample score; None when every sample errored
    pass_rate: float | None
    pass_at_k: Mapping[int, float]  # only the k <= samples
    majority_at_k: Mapping[int, bool]  # only the k <= samples, and only when the samples carry answers

    @property
    def errored(self) -> bool:
        return self.samples == 0

    def as_json(self) -> dict[str, Any]:
        return {
            "item_id": self.item_id,
            "samples": self.samples,
            "errored_samples": self.errored_samples,
            "passed": self.passed,
            "score": self.score,
            "pass_rate": self.pass_rate,
            "pass_at_k": _keyed_json(self.pass_at_k),
            "majority_at_k": _keyed_json(self.majority_at_k),
        }


def item_stats(item: ItemResult, ks: Sequence[int] = DEFAULT_KS) -> ItemStats:
    """An item's score, pass rate, pass@k and majority@k for the k in `ks` its scored samples allow."""
    _check_ks(ks)
    scored = [sample for sample in item.samples if not sample.errored]
    scores = [_finite(sample.score, "score") for sample in scored if sample.score is not None]
    passed = sum(1 for sample in scored if sample.passed)
    n = len(scored)
    answers = [sample.answer for sample in scored]
    has_answers = any(answer is not None for answer in answers)
    correct = {sample.answer for sample in scored if sample.passed and sample.answer is not None}
    return ItemStats(
        item_id=item.item_id,
        samples=n,
        errored_samples=len(item.samples) - n,
        passed=passed,
        score=statistics.fmean(scores) if scores else None,
        pass_rate=passed / n if n else None,
        pass_at_k={k: pass_at_k(n, passed, k) for k in sorted(ks) if k <= n},
        majority_at_k={k: majority_at_k(answers, correct, k) for k in sorted(ks) if k <= n and has_answers},
    )


def item_scores(items: Iterable[ItemResult]) -> dict[str, float | None]:
    """Item id -> item score (None when errored), the input of `paired_comparison`."""
    return {stats.item_id: stats.score for stats in (item_stats(item, ks=()) for item in items)}


# --- Aggregates ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Aggregate:
    """Every metric over a set of items: the whole run, or one subgroup."""

    items: int
    summary: Summary  # over item scores; summary.errored counts the errored items
    errored_samples: int
    ci: Interval | None  # of the mean item score
    pass_rate: float | None  # mean of the items' pass rates
    pass_at_k: Mapping[int, float]
    pass_at_k_items: Mapping[int, int]  # how many items each pass@k is averaged over
    pass_at_k_ci: Mapping[int, Interval]
    majority_at_k: Mapping[int, float]
    majority_at_k_items: Mapping[int, int]
    confidence: float = DEFAULT_CONFIDENCE

    @property
    def mean(self) -> float | None:
        return self.summary.mean

    @property
    def median(self) -> float | None:
        return self.summary.median

    @property
    def std(self) -> float | None:
        return self.summary.std

    @property
    def errored(self) -> int:
        return self.summary.errored

    def metric(self, name: str) -> float | None:
        """A metric by name: "mean", "median", "pass_rate", "pass@<k>" or "majority@<k>".

        None when the aggregate has no value for it (no scored item, k above every item's samples).
        Raises ValueError on an unknown name.
        """
        kind, k = _parse_metric(name)
        if kind == "mean":
            return self.summary.mean
        if kind == "median":
            return self.summary.median
        if kind == "pass_rate":
            return self.pass_rate
        assert k is not None
        return (self.pass_at_k if kind == "pass" else self.majority_at_k).get(k)

    def as_json(self) -> dict[str, Any]:
        return {
            "items": self.items,
            **self.summary.as_json(),
            "errored_samples": self.errored_samples,
            "confidence": self.confidence,
            "ci": _interval_json(self.ci),
            "pass_rate": self.pass_rate,
            "pass_at_k": _keyed_json(self.pass_at_k),
            "pass_at_k_items": _keyed_json(self.pass_at_k_items),
            "pass_at_k_ci": {str(k): list(interval) for k, interval in sorted(self.pass_at_k_ci.items())},
            "majority_at_k": _keyed_json(self.majority_at_k),
            "majority_at_k_items": _keyed_json(self.majority_at_k_items),
        }


def aggregate(
    items: Iterable[ItemResult] | Iterable[ItemStats],
    ks: Sequence[int] = DEFAULT_KS,
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> Aggregate:
    """Every metric over `items` (see the module docstring for the definitions)."""
    _check_ks(ks)
    stats = [entry if isinstance(entry, ItemStats) else item_stats(entry, ks) for entry in items]
    scores = [entry.score for entry in stats if entry.score is not None]
    pass_rates = [entry.pass_rate for entry in stats if entry.pass_rate is not None]
    per_k_pass: dict[int, list[float]] = {}
    per_k_majority: dict[int, list[float]] = {}
    for entry in stats:
        for k, value in entry.pass_at_k.items():
            if k in ks:
                per_k_pass.setdefault(k, []).append(value)
        for k, correct in entry.majority_at_k.items():
            if k in ks:
                per_k_majority.setdefault(k, []).append(1.0 if correct else 0.0)

    def interval(values: Sequence[float]) -> Interval:
        return bootstrap_ci(values, confidence=confidence, resamples=resamples, seed=seed)

    return Aggregate(
        items=len(stats),
        summary=summarize(entry.score for entry in stats),
        errored_samples=sum(entry.errored_samples for entry in stats),
        ci=interval(scores) if scores else None,
        pass_rate=statistics.fmean(pass_rates) if pass_rates else None,
        pass_at_k={k: statistics.fmean(values) for k, values in sorted(per_k_pass.items())},
        pass_at_k_items={k: len(values) for k, values in sorted(per_k_pass.items())},
        pass_at_k_ci={k: interval(values) for k, values in sorted(per_k_pass.items())},
        majority_at_k={k: statistics.fmean(values) for k, values in sorted(per_k_majority.items())},
        majority_at_k_items={k: len(values) for k, values in sorted(per_k_majority.items())},
        confidence=confidence,
    )


# --- Subgroups ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GroupMetrics:
    """One subgroup's aggregate; `small` when it has fewer than the threshold's scored items."""

    name: str
    aggregate: Aggregate
    small: bool

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "small": self.small, **self.aggregate.as_json()}


@dataclass(frozen=True, slots=True)
class SubgroupTable:
    """Every metric per value of one tag key; groups in name order."""

    tag_key: str
    groups: tuple[GroupMetrics, ...]
    untagged: int  # items without the key, in no group
    min_group_size: int

    def group(self, name: str) -> GroupMetrics | None:
        return next((group for group in self.groups if group.name == name), None)

    def as_json(self) -> dict[str, Any]:
        return {
            "tag_key": self.tag_key,
            "untagged": self.untagged,
            "min_group_size": self.min_group_size,
            "groups": [group.as_json() for group in self.groups],
        }


def by_subgroup(
    items: Iterable[ItemResult],
    tag_key: str,
    ks: Sequence[int] = DEFAULT_KS,
    *,
    min_group_size: int = MIN_GROUP_SIZE,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> SubgroupTable:
    """Every metric per value of `tag_key`; an item with several values counts in each of their groups."""
    _check_ks(ks)
    if isinstance(min_group_size, bool) or not isinstance(min_group_size, int) or min_group_size < 1:
        raise ValueError(f"min_group_size must be a positive integer, got {min_group_size!r}")
    members: dict[str, list[ItemStats]] = {}
    untagged = 0
    for item in items:
        values = item.tag_values(tag_key)
        if not values:
            untagged += 1
            continue
        stats = item_stats(item, ks)
        for value in values:
            members.setdefault(value, []).append(stats)
    groups = []
    for name, group_items in sorted(members.items()):
        group_aggregate = aggregate(group_items, ks, confidence=confidence, resamples=resamples, seed=seed)
        groups.append(GroupMetrics(name, group_aggregate, small=group_aggregate.summary.count < min_group_size))
    return SubgroupTable(tag_key=tag_key, groups=tuple(groups), untagged=untagged, min_group_size=min_group_size)


@dataclass(frozen=True, slots=True)
class WorstGroup:
    """The group with the lowest value of a metric, beside the value over all items."""

    tag_key: str
    name: str
    metric: str
    value: float
    overall: float | None
    items: int  # scored items in the group
    small: bool

    @property
    def gap(self) -> float | None:
        """How far the worst group is below the overall value."""
        return None if self.overall is None else self.overall - self.value

    def as_json(self) -> dict[str, Any]:
        return {
            "tag_key": self.tag_key,
            "name": self.name,
            "metric": self.metric,
            "value": self.value,
            "overall": self.overall,
            "gap": self.gap,
            "items": self.items,
            "small": self.small,
        }


def worst_group(
    table: SubgroupTable,
    metric: str = "mean",
    *,
    overall: float | None = None,
    include_small: bool = True,
) -> WorstGroup | None:
    """The maximin group of `table` for `metric` (higher is better): the group with the lowest value.

    Ties go to the first group by name. Groups without a value for the metric are skipped; small groups
    are candidates unless `include_small` is False (the result says whether it is small). `overall` is
    the metric over all items, shown beside it. None when no group qualifies.
    """
    _parse_metric(metric)
    candidates = [
        (value, group)
        for group in table.groups
        if (include_small or not group.small) and (value := group.aggregate.metric(metric)) is not None
    ]
    if not candidates:
        return None
    value, group = min(candidates, key=lambda candidate: candidate[0])  # min() keeps the first of ties
    return WorstGroup(
        tag_key=table.tag_key,
        name=group.name,
        metric=metric,
        value=value,
        overall=overall,
        items=group.aggregate.summary.count,
        small=group.small,
    )


# --- The run report -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunReport:
    """An eval run's aggregate, its subgroup tables and worst groups, ready to store as JSON."""

    overall: Aggregate
    subgroups: Mapping[str, SubgroupTable]  # by tag key
    worst_groups: Mapping[str, WorstGroup | None]  # by tag key, for `worst_metric`
    worst_metric: str
    items: tuple[ItemStats, ...]

    @property
    def mean(self) -> float | None:
        return self.overall.mean

    @property
    def median(self) -> float | None:
        return self.overall.median

    @property
    def std(self) -> float | None:
        return self.overall.std

    @property
    def ci(self) -> Interval | None:
        return self.overall.ci

    @property
    def pass_at_k(self) -> Mapping[int, float]:
        return self.overall.pass_at_k

    @property
    def majority_at_k(self) -> Mapping[int, float]:
        return self.overall.majority_at_k

    @property
    def errored(self) -> int:
        """Errored items (every sample errored); `overall.errored_samples` counts samples."""
        return self.overall.errored

    @property
    def worst_group(self) -> WorstGroup | None:
        """The worst group over every tag key (the lowest value; ties to the first key, then name)."""
        found = [worst for _, worst in sorted(self.worst_groups.items()) if worst is not None]
        return min(found, key=lambda worst: worst.value) if found else None

    def as_json(self) -> dict[str, Any]:
        worst = self.worst_group
        return {
            "overall": self.overall.as_json(),
            "worst_metric": self.worst_metric,
            "worst_group": worst.as_json() if worst is not None else None,
            "worst_groups": {
                key: worst.as_json() if worst is not None else None for key, worst in sorted(self.worst_groups.items())
            },
            "subgroups": {key: table.as_json() for key, table in sorted(self.subgroups.items())},
            "items": [entry.as_json() for entry in self.items],
        }

    def to_json(self) -> str:
        """The report as a JSON document (keys sorted, so equal reports give equal text)."""
        return json.dumps(self.as_json(), sort_keys=True, allow_nan=False)


def run_report(
    items: Iterable[ItemResult],
    ks: Sequence[int] = DEFAULT_KS,
    *,
    tag_keys: Sequence[str] | None = None,
    worst_metric: str = "mean",
    min_group_size: int = MIN_GROUP_SIZE,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> RunReport:
    """The report of a run from its item results.

    Subgroup tables for `tag_keys` (by default every tag key an item carries), each with its worst
    group for `worst_metric`. Raises ValueError on duplicate item ids or an unknown metric.
    """
    _check_ks(ks)
    _parse_metric(worst_metric)
    results = list(items)
    seen: set[str] = set()
    for item in results:
        if item.item_id in seen:
            raise ValueError(f"item {item.item_id!r} appears twice; give each item all its samples at once")
        seen.add(item.item_id)
    options: dict[str, Any] = {"confidence": confidence, "resamples": resamples, "seed": seed}
    stats = tuple(item_stats(item, ks) for item in results)
    overall = aggregate(stats, ks, **options)
    overall_value = overall.metric(worst_metric)
    keys = sorted(set(tag_keys) if tag_keys is not None else {key for item in results for key in item.tags})
    subgroups = {key: by_subgroup(results, key, ks, min_group_size=min_group_size, **options) for key in keys}
    return RunReport(
        overall=overall,
        subgroups=subgroups,
        worst_groups={key: worst_group(table, worst_metric, overall=overall_value) for key, table in subgroups.items()},
        worst_metric=worst_metric,
        items=stats,
    )


# --- Comparing two runs -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PairedComparison:
    """Run B against run A on the items both scored: delta = B - A."""

    items: int  # items scored on both sides
    only_in_a: int
    only_in_b: int
    errored: int  # on both sides but errored on at least one
    mean_a: float | None
    mean_b: float | None
    mean_delta: float | None
    ci: Interval | None  # of the mean delta, resampling items
    p_value: float | None  # two-sided, paired sign-flip test of the mean delta
    improved: int
    worsened: int
    unchanged: int
    confidence: float = DEFAULT_CONFIDENCE

    @property
    def excluded(self) -> int:
        return self.only_in_a + self.only_in_b + self.errored

    def as_json(self) -> dict[str, Any]:
        return {
            "items": self.items,
            "only_in_a": self.only_in_a,
            "only_in_b": self.only_in_b,
            "errored": self.errored,
            "excluded": self.excluded,
            "mean_a": self.mean_a,
            "mean_b": self.mean_b,
            "mean_delta": self.mean_delta,
            "confidence": self.confidence,
            "ci": _interval_json(self.ci),
            "p_value": self.p_value,
            "improved": self.improved,
            "worsened": self.worsened,
            "unchanged": self.unchanged,
        }


def paired_comparison(
    a_scores: Mapping[str, float | None],
    b_scores: Mapping[str, float | None],
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = BOOTSTRAP_RESAMPLES,
    permutations: int = PERMUTATIONS,
    seed: int = DEFAULT_SEED,
) -> PairedComparison:
    """Compare two runs item by item (item id -> score, None when errored; see `item_scores`).

    Items missing from one side or errored on either are left out and counted. Raises ValueError on
    a non-finite score.
    """
    a_values = {item_id: None if score is None else _finite(score, "score") for item_id, score in a_scores.items()}
    b_values = {item_id: None if score is None else _finite(score, "score") for item_id, score in b_scores.items()}
    pairs: list[tuple[float, float]] = []
    errored = 0
    for item_id in sorted(a_values.keys() & b_values.keys()):
        a, b = a_values[item_id], b_values[item_id]
        if a is None or b is None:
            errored += 1
        else:
            pairs.append((a, b))
    deltas = [b - a for a, b in pairs]
    has_pairs = bool(pairs)
    return PairedComparison(
        items=len(pairs),
        only_in_a=len(a_values.keys() - b_values.keys()),
        only_in_b=len(b_values.keys() - a_values.keys()),
        errored=errored,
        mean_a=statistics.fmean(a for a, _ in pairs) if has_pairs else None,
        mean_b=statistics.fmean(b for _, b in pairs) if has_pairs else None,
        mean_delta=statistics.fmean(deltas) if has_pairs else None,
        ci=bootstrap_ci(deltas, confidence=confidence, resamples=resamples, seed=seed) if has_pairs else None,
        p_value=sign_flip_test(deltas, permutations=permutations, seed=seed) if has_pairs else None,
        improved=sum(1 for delta in deltas if delta > 0),
        worsened=sum(1 for delta in deltas if delta < 0),
        unchanged=sum(1 for delta in deltas if delta == 0),
        confidence=confidence,
    )


def sign_flip_test(deltas: Sequence[float], *, permutations: int = PERMUTATIONS, seed: int = DEFAULT_SEED) -> float:
    """Two-sided p-value of a paired permutation test that the mean of paired differences is zero.

    Under the null each difference is as likely to have either sign; the p-value is the share of sign
    assignments whose |sum| is at least the observed |sum|. All 2**n assignments are enumerated for up
    to `EXACT_SIGN_FLIP_ITEMS` differences; above, `permutations` random ones are drawn with the seed
    and the p-value is (hits + 1) / (permutations + 1), which is never 0. Raises ValueError on no
    differences or a non-finite one.
    """
    if not deltas:
        raise ValueError("sign_flip_test needs at least one difference")
    values = [_finite(delta, "difference") for delta in deltas]
    if isinstance(permutations, bool) or not isinstance(permutations, int) or permutations < 1:
        raise ValueError(f"permutations must be a positive integer, got {permutations!r}")
    observed = abs(math.fsum(values))
    # Sums that equal the observed one up to rounding count as "at least as extreme".
    threshold = observed - 1e-9 * max(1.0, math.fsum(abs(value) for value in values))
    if len(values) <= EXACT_SIGN_FLIP_ITEMS:
        hits = sum(
            1
            for signs in itertools.product((1.0, -1.0), repeat=len(values))
            if abs(math.fsum(sign * value for sign, value in zip(signs, values, strict=True))) >= threshold
        )
        return hits / (1 << len(values))
    rng = random.Random(seed)  # noqa: S311 - a permutation test, not a secret
    hits = _sign_flip_hits(values, permutations, rng, threshold)
    return (hits + 1) / (permutations + 1)


# --- Helpers ------------------------------------------------------------------------------------------


def _finite(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return number


def _parse_metric(name: str) -> tuple[str, int | None]:
    """("mean" | "median" | "pass_rate", None) or ("pass" | "majority", k); ValueError otherwise."""
    if name in ("mean", "median", "pass_rate"):
        return name, None
    kind, _, k_text = name.partition("@")
    if kind in ("pass", "majority") and k_text.isdigit() and int(k_text) >= 1:
        return kind, int(k_text)
    raise ValueError(f"unknown metric {name!r}: use mean, median, pass_rate, pass@<k> or majority@<k>")


def _check_ks(ks: Sequence[int]) -> None:
    for k in ks:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"every k must be a positive integer, got {k!r}")


def _quantile_ranks(count: int, fraction: float) -> tuple[int, int, float]:
    """The two ranks (0: the smallest) a quantile of `count` sorted values reads, and the weight of the higher."""
    position = (count - 1) * fraction
    low = math.floor(position)
    return low, min(low + 1, count - 1), position - low


def _quantile(value_at: Callable[[int], float], count: int, fraction: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default), of `count` sorted values, the one
    at a rank given by `value_at`."""
    low, high, weight = _quantile_ranks(count, fraction)
    return value_at(low) + (value_at(high) - value_at(low)) * weight


def _interval_json(interval: Interval | None) -> list[float] | None:
    return list(interval) if interval is not None else None


def _keyed_json(table: Mapping[int, Any]) -> dict[str, Any]:
    return {str(k): value for k, value in sorted(table.items())}
