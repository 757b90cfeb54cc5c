"""Regression alerts: a newly labelled prompt version is run and compared with the version before it.

When a label that a suite targets moves to a new version (`production` by default), the suite runs on
the new version, with the previous version's latest completed run as its baseline (or a fresh baseline
run when there is none; a failed run, every item or every score of which errored, is never a baseline).
Once both are done, each committed metric (an evaluator named like a metric of the agent's evaluation
commitment; every evaluator when the agent has no commitment) is compared item by item. A metric is a
regression when the new version is worse with confidence (the bootstrap interval of the mean delta lies
below zero, or the sign-flip test gives p ≤ `SIGNIFICANCE`), or when it falls short of the commitment's
target that the old version met. A new version whose run failed (every item or every score errored) is a
regression of its own.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from agent_registry import selectors as registry_selectors
from agent_registry.models import PromptLabelMove
from agent_registry.requirements import Comparator
from evals import runs
from evals.models import RegressionAlert, Run, RunStatus, RunTrigger, Suite, SuiteTarget
from routing import selectors as routing_selectors

logger = logging.getLogger("evals.regressions")

SIGNIFICANCE = 0.05
# The alert of a candidate run that failed; not an evaluator name (those have no '-'), so it meets no metric's.
FAILED_METRIC = "run-failed"
MOVES_LOOKBACK = timedelta(days=2)


def _suites_for(move: PromptLabelMove) -> list[Suite]:
    """The suites that evaluate the label on the moved prompt: a move of another prompt of the agent (one
    the gateway does not serve under that label) changes nothing they run."""
    suites = list(
        Suite.objects.filter(
            agent_id=move.prompt.agent_id,
            target=SuiteTarget.AGENT,
            prompt_version__isnull=True,
            prompt_label=move.label,
            dataset__isnull=False,
        ).select_related("agent", "dataset")
    )
    if not suites:
        return []
    assert suites[0].agent is not None
    served = routing_selectors.labelled_prompt_version(agent=suites[0].agent, label=move.label)
    return suites if served is not None and served.prompt_id == move.prompt_id else []


def label_moves_check(*, now: datetime | None = None) -> list[Run]:
    """Runs for label moves of the last two days that have none yet (idempotent: keyed by move and suite)."""
    now = now or timezone.now()
    made: list[Run] = []
    moves = PromptLabelMove.objects.filter(
        moved_at__gte=now - MOVES_LOOKBACK, to_version__isnull=False, from_version__isnull=False
    ).select_related("prompt", "to_version", "from_version")
    for move in moves:
        for suite in _suites_for(move):
            key = f"label-move-{move.pk}-suite-{suite.pk}"
            if Run.objects.filter(workspace_id=suite.workspace_id, idempotency_key=key).exists():
                continue
            try:
                made.append(_candidate_with_baseline(suite, move, key))
            except runs.RunNotStartable as error:
                logger.info("no regression run for suite %s: %s", suite.name, error.detail)
    return made


@transaction.atomic
def _candidate_with_baseline(suite: Suite, move: PromptLabelMove, key: str) -> Run:
    assert move.from_version is not None
    assert move.to_version is not None
    baseline = (
        Run.objects.filter(suite=suite, prompt_version=move.from_version, status=RunStatus.COMPLETED)
        .order_by("-finished_at")
        .first()
    )
    if baseline is None:
        baseline = runs.run_create(
            suite=suite,
            trigger=RunTrigger.LABEL,
            prompt_version=move.from_version,
            idempotency_key=f"{key}-baseline",
            name=f"{suite.name} v{move.from_version.version} (baseline for {move.label} → v{move.to_version.version})",
        )
    candidate = runs.run_create(
        suite=suite,
        trigger=RunTrigger.LABEL,
        prompt_version=move.to_version,
        idempotency_key=key,
        name=f"{suite.name} v{move.to_version.version} ({move.label} moved from v{move.from_version.version})",
    )
    Run.objects.filter(pk=candidate.pk).update(baseline=baseline)
    candidate.baseline = baseline
    return candidate


def _committed(run: Run) -> dict[str, tuple[float, str] | None]:
    """Evaluator name -> (target, comparator) for the metrics the agent committed to; None for evaluators
    without a commitment (then every evaluator counts and only significance matters)."""
    names = [data["name"] for data in run.evaluators]
    requirements = registry_selectors.requirements_of(agent=run.agent) if run.agent is not None else None
    if requirements is None:
        return dict.fromkeys(names)
    metrics = {
        m.name: m for m in [*requirements.evaluation.output_metrics, *requirements.evaluation.trajectory_metrics]
    }
    committed: dict[str, tuple[float, str] | None] = {
        name: (metrics[name].target, metrics[name].comparator.value) for name in names if name in metrics
    }
    return committed or dict.fromkeys(names)


def _meets(value: float | None, target: tuple[float, str] | None) -> bool | None:
    if value is None or target is None:
        return None
    goal, comparator = target
    return value <= goal if comparator == Comparator.AT_MOST.value else value >= goal


def _alert(
    candidate: Run, baseline: Run, metric: str, comparison: dict[str, Any], message: str
) -> RegressionAlert | None:
    assert candidate.suite is not None  # regression_check compares suite runs only
    try:
        with transaction.atomic():
            alert = RegressionAlert.objects.create(
                workspace_id=candidate.workspace_id,
                agent=candidate.agent,
                suite=candidate.suite,
                baseline_run=baseline,
                candidate_run=candidate,
                metric=metric,
                comparison=comparison,
                message=message,
            )
    except IntegrityError:  # already raised for this run and metric
        return None
    logger.warning("eval regression: %s", message)
    return alert


def _version_of(run: Run) -> str:
    return f"v{run.prompt_version.version}" if run.prompt_version else "?"


def regression_check(*, candidate: Run) -> list[RegressionAlert]:
    """Compare a completed run with its completed baseline; one alert per committed metric that got worse.
    A candidate that failed (every item or every score errored) against a completed baseline is one alert,
    `run-failed`: the new version answered nothing the suite could score, which no metric's delta would
    show. A failed baseline measured nothing to compare with: no alert."""
    baseline = candidate.baseline
    if candidate.suite is None or baseline is None or baseline.status != RunStatus.COMPLETED:
        return []
    if candidate.status == RunStatus.FAILED:
        message = f"{_version_of(candidate)} failed where {_version_of(baseline)} completed: {candidate.error}"
        alert = _alert(candidate, baseline, FAILED_METRIC, {}, message[:4000])
        return [alert] if alert is not None else []
    if candidate.status != RunStatus.COMPLETED:
        return []
    committed = _committed(candidate)
    comparison = runs.runs_compare(baseline=baseline, candidate=candidate, evaluators_named=list(committed))
    alerts: list[RegressionAlert] = []
    for name, result in comparison["metrics"].items():
        delta, interval, p_value = result["mean_delta"], result["ci"], result["p_value"]
        if delta is None or delta >= 0:
            continue
        # A lower score is worse for every evaluator (scores are 0..1, higher is better).
        confident = (interval is not None and interval[1] < 0) or (p_value is not None and p_value <= SIGNIFICANCE)
        target = committed.get(name)
        crossed = _meets(result["mean_a"], target) is True and _meets(result["mean_b"], target) is False
        if not (confident or crossed):
            continue
        why = "below the committed target" if crossed and not confident else "worse with confidence"
        message = (
            f"{name}: v{candidate.prompt_version.version if candidate.prompt_version else '?'} scores "
            f"{result['mean_b']:.3f} against {result['mean_a']:.3f} for "
            f"v{baseline.prompt_version.version if baseline.prompt_version else '?'} "
            f"(Δ {delta:+.3f}, p = {p_value:.3f}; {why})"
        )
        alert = _alert(candidate, baseline, name, result, message)
        if alert is not None:
            alerts.append(alert)
    return alerts


def run_completed(*, run_id: int) -> list[RegressionAlert]:
    """After a run finishes (completed or failed): check it against its baseline, and any run waiting on it
    as a baseline."""
    run = Run.objects.select_related("baseline__prompt_version", "prompt_version", "agent", "suite").get(pk=run_id)
    if run.suite is None:
        return []
    alerts = regression_check(candidate=run)
    for candidate in Run.objects.filter(
        baseline=run, status__in=[RunStatus.COMPLETED, RunStatus.FAILED]
    ).select_related("baseline__prompt_version", "prompt_version", "agent", "suite"):
        alerts.extend(regression_check(candidate=candidate))
    return alerts
