"""Triage signals: precision and recall per signal, ranking quality of the triage score, throughput.

Run with `python -m bench.bench_triage` from the repository root; it prints a markdown report.

- Precision and recall compare the signals `tracing.signals.signals_compute` finds on each trajectory
  of `bench.triage_dataset` with the signals the dataset's recipes put there.
- Ranking: the share of truly problematic trajectories among the top 10% and 20% by triage score,
  against random sampling (its expected value, the base rate) and against ranking by length (number
  of steps, longest first). Ties are counted at their expected value under random tie-breaking.
- Throughput: `signals_compute` in one thread over `THROUGHPUT_COUNT` distinct 20-step trajectories,
  measured in CPU time (so other processes on a shared machine do not count against it) and wall time;
  the best of `THROUGHPUT_ROUNDS` rounds, as `timeit` reports, and the median.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

from bench.triage_dataset import LabelledTrajectory, throughput_trajectories, triage_dataset_build
from tracing.signals import SIGNAL_NAMES, SignalReport, signals_compute

THROUGHPUT_COUNT = 1000
THROUGHPUT_ROUNDS = 7
TOP_SHARES = (0.1, 0.2)


@dataclass(frozen=True)
class SignalScore:
    signal: str
    true_positives: int
    false_positives: int
    false_negatives: int

    @property
    def support(self) -> int:
        return self.true_positives + self.false_negatives

    @property
    def precision(self) -> float | None:
        found = self.true_positives + self.false_positives
        return self.true_positives / found if found else None

    @property
    def recall(self) -> float | None:
        return self.true_positives / self.support if self.support else None


def signal_scores(dataset: Sequence[LabelledTrajectory], reports: Sequence[SignalReport]) -> list[SignalScore]:
    scores = []
    for signal in SIGNAL_NAMES:
        tp = fp = fn = 0
        for item, report in zip(dataset, reports, strict=True):
            found, present = signal in report.signals, signal in item.signals
            tp += found and present
            fp += found and not present
            fn += present and not found
        scores.append(SignalScore(signal, tp, fp, fn))
    return scores


def top_share(keys: Sequence[float], problematic: Sequence[bool], share: float) -> float:
    """Share of problematic items among the top `share` by key, ties taken at their expected value."""
    budget = max(1, round(len(keys) * share))
    order = sorted(range(len(keys)), key=lambda index: keys[index], reverse=True)
    taken = 0.0
    hits = 0.0
    position = 0
    while position < len(order) and taken < budget:
        tied = [index for index in order[position:] if keys[index] == keys[order[position]]]
        room = min(budget - taken, len(tied))
        hits += room * sum(problematic[index] for index in tied) / len(tied)
        taken += room
        position += len(tied)
    return hits / budget


def _count(
    dataset: Sequence[LabelledTrajectory], reports: Sequence[SignalReport], *, problematic: bool, fired: bool
) -> int:
    return sum(
        1
        for item, report in zip(dataset, reports, strict=True)
        if item.problematic == problematic and (report.triage_score > 0) == fired
    )


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{value:.0%}"


@dataclass(frozen=True)
class Throughput:
    count: int
    best_cpu: float
    median_cpu: float
    best_wall: float


def throughput(count: int = THROUGHPUT_COUNT, rounds: int = THROUGHPUT_ROUNDS) -> Throughput:
    views = throughput_trajectories(count)
    # The views (and whatever the caller holds) are long-lived: keep the collector from walking them on
    # every collection, as a worker that handles one trajectory at a time would not hold them.
    gc.collect()
    gc.freeze()
    cpu_rates = []
    wall_rates = []
    try:
        for _ in range(rounds):
            wall, cpu = time.perf_counter(), time.process_time()
            for view in views:
                signals_compute(view)
            cpu_rates.append(len(views) / (time.process_time() - cpu))
            wall_rates.append(len(views) / (time.perf_counter() - wall))
    finally:
        gc.unfreeze()
    return Throughput(len(views), max(cpu_rates), statistics.median(cpu_rates), max(wall_rates))


def bench_triage_run() -> str:
    speed = throughput()
    started = time.perf_counter()
    dataset = triage_dataset_build()
    built = time.perf_counter() - started
    reports = [signals_compute(item.view, item.config) for item in dataset]
    problematic = [item.problematic for item in dataset]
    scenarios = sorted({item.scenario for item in dataset})
    errors = sum(len(report.detector_errors) for report in reports)
    lines = [
        "## Triage signals",
        "",
        f"Labelled set: {len(dataset)} trajectories ({sum(problematic)} problematic) across {len(scenarios)} "
        f"scenarios ({', '.join(scenarios)}), {len({item.recipe for item in dataset})} recipes; built through "
        f"OTLP decode, mapping and trajectory assembly in {built:.1f} s. Detector errors: {errors}.",
        "",
        "| signal | support | found | precision | recall |",
        "|---|---:|---:|---:|---:|",
    ]
    for score in signal_scores(dataset, reports):
        found = score.true_positives + score.false_positives
        lines.append(
            f"| {score.signal} | {score.support} | {found} | {_percent(score.precision)} | {_percent(score.recall)} |"
        )
    triage = [report.triage_score for report in reports]
    length = [float(len(item.view.steps)) for item in dataset]
    base_rate = sum(problematic) / len(problematic)
    lines += [
        "",
        "| ranking | top 10% problematic | top 20% problematic |",
        "|---|---:|---:|",
        f"| triage score | {top_share(triage, problematic, 0.1):.0%} | {top_share(triage, problematic, 0.2):.0%} |",
        f"| length (steps, longest first) | {top_share(length, problematic, 0.1):.0%} | "
        f"{top_share(length, problematic, 0.2):.0%} |",
        f"| random (expected) | {base_rate:.0%} | {base_rate:.0%} |",
        "",
        f"Problematic trajectories with no signal at all (score 0): "
        f"{_count(dataset, reports, problematic=True, fired=False)} of {sum(problematic)}; "
        f"unproblematic ones with a score above 0: {_count(dataset, reports, problematic=False, fired=True)} "
        f"of {len(dataset) - sum(problematic)}.",
    ]
    lines += [
        "",
        f"Throughput of `signals_compute` in one thread (one core) over {speed.count} distinct 20-step "
        f"trajectories: {speed.best_cpu:,.0f} trajectories per CPU-second (best of {THROUGHPUT_ROUNDS} rounds; "
        f"median {speed.median_cpu:,.0f}), {speed.best_wall:,.0f}/s wall clock. Target ≥ 2,000/s.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(bench_triage_run())
