"""Sampling trajectories for human review, and the informativeness arithmetic. Pure module, no Django.

The Signals paper (Chen et al., 2026) reviews trajectories drawn three ways and reports the share a
reviewer found informative: 82% for signal-based sampling, 74% for a heuristic filter, 54% at random.
Keel draws samples the same ways on a team's own traffic, so the team can measure the same thing:

| strategy | what it picks |
|---|---|
| `signal` | the highest triage scores, taking turns across the signals that fired (see below) |
| `random` | a uniform random sample (the baseline) |
| `length` | the most steps (the paper's heuristic filter: long runs) |
| `stratified_agent` | the budget split evenly across agents, random within each |
| `stratified_score` | the budget split evenly across triage-score buckets (`SCORE_BUCKETS`), random within each |

Signal-based sampling goes round-robin over the problem signals (a positive weight): each turn takes,
for the next signal, the best-scored trajectory carrying it that is not taken yet; so one noisy signal
cannot fill the sample. Only trajectories where a problem signal fired are drawn. A trajectory's problem
signals are the ones its agent's triage settings weigh positively (`signals.DEFAULT_WEIGHTS` for the
signals they leave out): an agent that sets a weight to 0 has that signal take no turns for its
trajectories, one that gives a signal a positive weight has it sampled.

The selectors hand these functions candidates already in the order that matters (random strategies:
an order fixed by the sample's seed; `signal`: by triage score; `length`: by steps), so the choice
here is deterministic and testable without a database.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple

from tracing import signals

STRATEGIES: Final[Mapping[str, str]] = {
    "signal": "Signal-based",
    "random": "Random",
    "length": "Length-based",
    "stratified_agent": "Stratified by agent",
    "stratified_score": "Stratified by triage score",
}
# Lower bounds of the triage-score buckets, after the first (exactly 0: nothing fired, or only satisfaction).
SCORE_BUCKETS: Final[tuple[tuple[str, float], ...]] = (
    ("none", 0.0),
    ("low", 0.0),  # > 0
    ("medium", 0.25),
    ("high", 0.5),
    ("very_high", 0.75),
)


def problem_signals(weights: Mapping[str, float] | None = None) -> frozenset[str]:
    """The signals that mark a problem under an agent's `weights` (signal -> weight, as its triage
    settings store them; signals left out take `signals.DEFAULT_WEIGHTS`): those weighted positively."""
    merged = {**signals.DEFAULT_WEIGHTS, **(weights or {})}
    return frozenset(name for name, weight in merged.items() if name in signals.SIGNAL_CATEGORIES and weight > 0)


# Signals that mark a problem under the default weights: the ones signal-based sampling rotates over for an
# agent that sets no weights.
PROBLEM_SIGNALS: Final[frozenset[str]] = problem_signals()


def score_bucket(score: float) -> int:
    """The index in SCORE_BUCKETS of a triage score (the selectors compute the same in SQL)."""
    if score <= 0:
        return 0
    if score < 0.25:
        return 1
    if score < 0.5:
        return 2
    if score < 0.75:
        return 3
    return 4


class Candidate(NamedTuple):
    trajectory_id: int
    agent_id: int | None
    triage_score: float
    signal_names: tuple[str, ...]
    step_count: int


def _signal_based(
    candidates: Sequence[Candidate], budget: int, weights: Mapping[int, Mapping[str, float]]
) -> list[Candidate]:
    """Round-robin over the problem signals, each turn the best candidate carrying that signal."""
    problems: dict[int | None, frozenset[str]] = {}
    by_signal: dict[str, list[Candidate]] = {}
    for candidate in sorted(candidates, key=lambda c: (-c.triage_score, c.trajectory_id)):
        agent_id = candidate.agent_id
        if agent_id not in problems:
            problems[agent_id] = problem_signals(weights.get(agent_id)) if agent_id is not None else PROBLEM_SIGNALS
        for name in candidate.signal_names:
            if name in problems[agent_id]:
                by_signal.setdefault(name, []).append(candidate)
    # The signal whose best candidate scores highest goes first; ties by name, so the order is stable.
    order = sorted(by_signal, key=lambda name: (-by_signal[name][0].triage_score, name))
    cursors = dict.fromkeys(order, 0)
    chosen: list[Candidate] = []
    taken: set[int] = set()
    while len(chosen) < budget and order:
        for name in list(order):
            group = by_signal[name]
            position = cursors[name]
            while position < len(group) and group[position].trajectory_id in taken:
                position += 1
            cursors[name] = position + 1
            if position >= len(group):
                order.remove(name)
                continue
            chosen.append(group[position])
            taken.add(group[position].trajectory_id)
            if len(chosen) >= budget:
                break
    return chosen


def _in_order(candidates: Sequence[Candidate], budget: int) -> list[Candidate]:
    seen: set[int] = set()
    chosen = []
    for candidate in candidates:
        if candidate.trajectory_id not in seen:
            seen.add(candidate.trajectory_id)
            chosen.append(candidate)
        if len(chosen) >= budget:
            break
    return chosen


def allocate(sizes: Mapping[object, int], budget: int) -> dict[object, int]:
    """Split `budget` as evenly as possible across strata of the given sizes: each stratum gets the same
    share, a stratum too small for it gives its surplus to the others; never more than a stratum holds."""
    allocation = dict.fromkeys(sizes, 0)
    remaining = min(budget, sum(sizes.values()))
    open_strata = sorted((key for key, size in sizes.items() if size > 0), key=str)
    while remaining > 0 and open_strata:
        share = max(1, remaining // len(open_strata))
        for key in list(open_strata):
            if remaining <= 0:
                break
            give = min(share, sizes[key] - allocation[key], remaining)
            allocation[key] += give
            remaining -= give
            if allocation[key] >= sizes[key]:
                open_strata.remove(key)
    return allocation


def _stratified(
    candidates: Sequence[Candidate], budget: int, stratum: Callable[[Candidate], object]
) -> list[Candidate]:
    groups: dict[object, list[Candidate]] = {}
    for candidate in _in_order(candidates, len(candidates)):
        groups.setdefault(stratum(candidate), []).append(candidate)
    allocation = allocate({key: len(group) for key, group in groups.items()}, budget)
    chosen = [candidate for key, group in groups.items() for candidate in group[: allocation[key]]]
    # Interleave the strata so a reviewer who stops early has seen every one of them.
    position = {
        candidate.trajectory_id: index for index, candidate in enumerate(_in_order(candidates, len(candidates)))
    }
    ranks: dict[int, int] = {}
    for group in groups.values():
        for rank, candidate in enumerate(group):
            ranks[candidate.trajectory_id] = rank
    return sorted(chosen, key=lambda c: (ranks[c.trajectory_id], position[c.trajectory_id]))


def sample_select(
    strategy: str,
    candidates: Sequence[Candidate],
    budget: int,
    *,
    weights: Mapping[int, Mapping[str, float]] | None = None,
) -> list[Candidate]:
    """Pick at most `budget` distinct candidates by `strategy`, in review order.

    `weights`: agent id -> the signal weights its triage settings set, which decide the problem signals
    of its trajectories (`problem_signals`); agents left out, and trajectories of no agent, take the defaults.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}")
    if budget <= 0:
        return []
    if strategy == "signal":
        return _signal_based(candidates, budget, weights or {})
    if strategy in ("random", "length"):
        return _in_order(candidates, budget)
    if strategy == "stratified_agent":
        return _stratified(candidates, budget, lambda candidate: candidate.agent_id or 0)
    return _stratified(candidates, budget, lambda candidate: score_bucket(candidate.triage_score))


# --- Informativeness -----------------------------------------------------------------------------------

Z_95: Final = 1.959963984540054


def wilson_interval(successes: int, total: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a proportion (95% by default); (0, 1) when nothing was counted.

    Better than the normal approximation at the small counts a review queue has: it stays inside
    [0, 1] and is not zero-width at 0 or n successes.
    """
    if total <= 0:
        return 0.0, 1.0
    if not 0 <= successes <= total:
        raise ValueError("successes must be between 0 and total")
    share = successes / total
    denominator = 1 + z * z / total
    centre = (share + z * z / (2 * total)) / denominator
    half = z * math.sqrt(share * (1 - share) / total + z * z / (4 * total * total)) / denominator
    # At 0 or n successes the bound is exactly 0 or 1; floating point would leave it a hair inside.
    low = 0.0 if successes == 0 else max(0.0, min(share, centre - half))
    high = 1.0 if successes == total else min(1.0, max(share, centre + half))
    return low, high


@dataclass(frozen=True, slots=True)
class Informativeness:
    strategy: str
    reviewed: int
    informative: int
    low: float
    high: float

    @property
    def label(self) -> str:
        return STRATEGIES.get(self.strategy, self.strategy)

    @property
    def share(self) -> float | None:
        return self.informative / self.reviewed if self.reviewed else None


def informativeness(strategy: str, reviewed: int, informative: int) -> Informativeness:
    low, high = wilson_interval(informative, reviewed)
    return Informativeness(strategy=strategy, reviewed=reviewed, informative=informative, low=low, high=high)


@dataclass(frozen=True, slots=True)
class Comparison:
    """Signal-based against random sampling: the paper's headline, on the team's own reviews."""

    signal: Informativeness
    random: Informativeness

    @property
    def lift(self) -> float | None:
        """How many times more often a signal-sampled trajectory was informative (the paper: 82/54 = 1.52)."""
        if self.signal.share is None or not self.random.share:
            return None
        return self.signal.share / self.random.share

    @property
    def verdict(self) -> str:
        if not self.signal.reviewed or not self.random.reviewed:
            return "needs_reviews"
        if self.signal.low > self.random.high:
            return "signal_better"
        if self.random.low > self.signal.high:
            return "random_better"
        return "undecided"


def comparison(rows: Iterable[Informativeness]) -> Comparison:
    found = {row.strategy: row for row in rows}
    return Comparison(
        signal=found.get("signal") or informativeness("signal", 0, 0),
        random=found.get("random") or informativeness("random", 0, 0),
    )


# --- Failure modes a reviewer can pick -------------------------------------------------------------------

# The framework's taxonomy (agent-lifecycle series, step 07), then Keel's problem signals, then "other".
FRAMEWORK_FAILURE_MODES: Final[Mapping[str, str]] = {
    "infinite_loop": "Infinite loop",
    "hallucinated_tool_call": "Hallucinated tool call",
    "context_exhaustion": "Context exhaustion",
    "cascading_error": "Cascading error",
    "reward_hacking": "Reward hacking",
    "goal_drift": "Goal drift",
    "distribution_shift": "Distribution shift",
    "silent_tool_api_change": "Silent tool API change",
}
SIGNAL_FAILURE_MODES: Final[Mapping[str, str]] = {
    "misalignment": "Misalignment (misunderstood the user)",
    "stagnation": "Stagnation (no progress)",
    "disengagement": "Disengagement (user gave up)",
    "failure": "Tool or agent failure",
    "loop": "Loop",
    "exhaustion": "Exhaustion (limits, rate limits, timeouts)",
}
FAILURE_MODES: Final[Mapping[str, str]] = {
    **FRAMEWORK_FAILURE_MODES,
    **SIGNAL_FAILURE_MODES,
    "other": "Other",
}


def failure_mode_order(fired: Collection[str]) -> list[str]:
    """The failure modes in the order a reviewer sees them: the ones whose signal fired on this
    trajectory first (keys 1-9 pick the first nine), then the rest in the documented order."""
    first = [name for name in FAILURE_MODES if name in fired]
    return [*first, *(name for name in FAILURE_MODES if name not in fired)]
