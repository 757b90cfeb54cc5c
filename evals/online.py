"""Online evals: rules that score a sampled share of an agent's production trajectories after a delay.

Every minute beat ticks each enabled rule: trajectories of its agent that ended between the rule's
watermark (`checked_until`) and `delay_seconds` ago, that match its filter and that fall in its sample,
are evaluated, and the watermark moves on. The delay gives a trajectory time to finish arriving (spans
come in batches, and triage signals are computed after). Sampling is a hash of the rule and the trace
id, so a backfill over the same range picks the same trajectories; each (rule, trajectory) is evaluated
once (a unique row), so a backfill or a repeated tick repeats nothing.

Each evaluator's verdict becomes a score on the trajectory (source "evaluator", the comment naming the
evaluator version), shown in the step-through view and filterable like any score; the rule's own row
keeps the full results.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from agent_registry.models import Agent, User
from evals import evaluators, exceptions, verifiers
from evals.models import Evaluator, OnlineEvaluation, OnlineRule
from tracing import services as tracing_services
from tracing.models import ScoreDataType, ScoreSource, Trajectory, TrajectoryStatus
from tracing.steps import TrajectoryView

logger = logging.getLogger("evals.online")

TICK_LIMIT = 500  # trajectories considered per rule and tick; the watermark resumes from the last one
FIRST_LOOKBACK = timedelta(hours=1)  # a new rule starts with the last hour
# Traffic Keel made itself is not production traffic.
DEFAULT_EXCLUDED_TAGS = ("eval", "shadow")
FILTER_KEYS = ("status", "tags", "exclude_tags", "tier", "signal", "prompt_version")


def filter_problems(value: object) -> list[dict[str, str]]:
    if not isinstance(value, Mapping):
        return [{"field": "filter", "message": "must be an object"}]
    problems = []
    for key, item in value.items():
        if key not in FILTER_KEYS:
            problems.append({"field": f"filter.{key}", "message": f"unknown; use {', '.join(FILTER_KEYS)}"})
        elif key == "status" and item not in ("ok", "error"):
            problems.append({"field": "filter.status", "message": "must be ok or error"})
        elif key in ("tags", "exclude_tags") and (
            not isinstance(item, list) or not all(isinstance(tag, str) for tag in item)
        ):
            problems.append({"field": f"filter.{key}", "message": "must be a list of strings"})
        elif key in ("tier", "signal") and not isinstance(item, str):
            problems.append({"field": f"filter.{key}", "message": "must be a string"})
        elif key == "prompt_version" and (isinstance(item, bool) or not isinstance(item, int)):
            problems.append({"field": "filter.prompt_version", "message": "must be an integer"})
    return problems


def sampled(rule_id: int, trace_id: str, rate: float) -> bool:
    """Whether the rule's sample holds the trajectory: stable for a rule and trace id."""
    if rate >= 1:
        return True
    if rate <= 0:
        return False
    digest = hashlib.sha256(f"{rule_id}:{trace_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < rate


def _matching(rule: OnlineRule) -> QuerySet[Trajectory]:
    spec: Mapping[str, Any] = rule.filter or {}
    trajectories = Trajectory.objects.filter(workspace_id=rule.workspace_id, agent_id=rule.agent_id).exclude(
        status=TrajectoryStatus.RUNNING
    )
    if spec.get("status"):
        trajectories = trajectories.filter(status=spec["status"])
    for tag in spec.get("tags") or ():
        trajectories = trajectories.filter(tags__contains=[tag])
    excluded = [*DEFAULT_EXCLUDED_TAGS, *(spec.get("exclude_tags") or ())]
    trajectories = trajectories.exclude(tags__overlap=excluded)
    if spec.get("tier"):
        trajectories = trajectories.filter(tags__contains=[f"tier:{spec['tier']}"])
    if spec.get("signal"):
        trajectories = trajectories.filter(signal_names__contains=[spec["signal"]])
    if spec.get("prompt_version") is not None:
        trajectories = trajectories.filter(prompt_versions__version=spec["prompt_version"])
    return trajectories


def _item(trajectory: Trajectory, view: TrajectoryView) -> verifiers.EvalItem:
    """What the trajectory was asked; a production trajectory has no reference."""
    from evals import services

    try:
        data = services.dataset_item_from_trajectory(trajectory=trajectory, view=view)
    except exceptions.TrajectoryNotUsable:
        return verifiers.EvalItem(input=trajectory.input_preview, metadata={"trace_id": trajectory.trace_id})
    return verifiers.EvalItem(
        input=[dict(message) for message in data.input_messages] or data.task,
        metadata={"trace_id": trajectory.trace_id, **dict(data.metadata)},
    )


def _score_record(trajectory: Trajectory, score: verifiers.Score) -> None:
    if score.errored or score.score is None:
        return
    tracing_services.score_create(
        trajectory=trajectory,
        name=score.evaluator,
        data_type=ScoreDataType.NUMERIC,
        value=score.score,
        comment=f"{score.evaluator} v{score.version} ({'passed' if score.passed else 'failed'}): {score.reason}"[:4000],
        source=ScoreSource.EVALUATOR,
    )


def trajectory_evaluate(
    *, rule: OnlineRule, trajectory: Trajectory, built: list[evaluators.Built]
) -> OnlineEvaluation | None:
    """Evaluate one trajectory under the rule, once; None when the rule already did (or a judge's model
    is unreachable: then the trajectory is left for the next tick)."""
    from evals import trajectory_facts

    if OnlineEvaluation.objects.filter(rule=rule, trace_id=trajectory.trace_id).exists():
        return None
    output, view = trajectory_facts.eval_output_and_view(trajectory=trajectory)
    item = _item(trajectory, view)
    scores: list[verifiers.Score] = []
    for evaluator in built:
        scores.extend(evaluator.scores(item, [output]))  # ModelUnavailable propagates to the tick
    try:
        with transaction.atomic():
            evaluation = OnlineEvaluation.objects.create(
                rule=rule,
                trace_id=trajectory.trace_id,
                trajectory_ended_at=trajectory.ended_at,
                results=[
                    {
                        "evaluator": score.evaluator,
                        "version": score.version,
                        "score": score.score,
                        "passed": score.passed,
                        "reason": score.reason[:2000],
                        "error": score.error,
                    }
                    for score in scores
                ],
            )
            for score in scores:
                _score_record(trajectory, score)
    except IntegrityError:  # a concurrent tick or backfill evaluated it first
        return None
    return evaluation


def _built(rule: OnlineRule) -> list[evaluators.Built]:
    chosen = list(rule.evaluators.order_by("name"))
    # A rule given another agent's evaluator before rules refused that scores nothing until it is edited:
    # like a broken evaluator, the tick logs it and the watermark waits.
    mismatches = evaluators.agent_mismatches(chosen, agent=rule.agent)
    if mismatches:
        raise evaluators.EvaluatorConfigError("evaluators", mismatches[0]["message"])
    return [
        evaluators.build(evaluators.Snapshot.of(evaluator), workspace_id=rule.workspace_id, agent_id=rule.agent_id)
        for evaluator in chosen
    ]


def rule_evaluate_range(
    *, rule: OnlineRule, start: datetime, end: datetime, limit: int = TICK_LIMIT
) -> tuple[int, datetime | None]:
    """Evaluate the rule's sample of trajectories that ended in [start, end), oldest first, at most
    `limit` considered. Returns (evaluated, the end time of the last one considered or None)."""
    built = _built(rule)
    evaluated = 0
    last: datetime | None = None
    candidates = _matching(rule).filter(ended_at__gte=start, ended_at__lt=end).select_related("agent")
    for trajectory in candidates.order_by("ended_at", "pk")[:limit]:
        if sampled(rule.pk, trajectory.trace_id, rule.sample_rate):
            try:
                if trajectory_evaluate(rule=rule, trajectory=trajectory, built=built) is not None:
                    evaluated += 1
            except evaluators.ModelUnavailable as error:
                logger.warning("online rule %s paused at %s: %s", rule.name, trajectory.trace_id, error)
                return evaluated, last
        last = trajectory.ended_at
    return evaluated, last


def rule_tick(*, rule: OnlineRule, now: datetime | None = None) -> int:
    """Advance one rule: evaluate what ended since its watermark, up to the delay; returns how many."""
    now = now or timezone.now()
    end = now - timedelta(seconds=rule.delay_seconds)
    start = rule.checked_until or max(rule.created_at, now - FIRST_LOOKBACK) - timedelta(seconds=rule.delay_seconds)
    if end <= start:
        return 0
    evaluated, last = rule_evaluate_range(rule=rule, start=start, end=end)
    considered_all = last is None or not _matching(rule).filter(ended_at__gt=last, ended_at__lt=end).exists()
    watermark = end if considered_all else last
    if watermark is not None:
        OnlineRule.objects.filter(pk=rule.pk).update(checked_until=watermark)
    return evaluated


def rules_tick(*, now: datetime | None = None) -> dict[int, int]:
    """Tick every enabled rule; rule id -> trajectories evaluated."""
    done: dict[int, int] = {}
    for rule in OnlineRule.objects.filter(enabled=True).select_related("agent"):
        try:
            done[rule.pk] = rule_tick(rule=rule, now=now)
        except evaluators.EvaluatorConfigError as error:
            logger.warning("online rule %s cannot build its evaluators: %s", rule.name, error)
    return done


def rule_backfill(*, rule: OnlineRule, start: datetime, end: datetime) -> int:
    """Evaluate the rule's sample over a past range (all of it, in batches); trajectories it already
    evaluated are skipped. Returns how many were evaluated now."""
    total = 0
    cursor = start
    while cursor < end:
        evaluated, last = rule_evaluate_range(rule=rule, start=cursor, end=end)
        total += evaluated
        if last is None or not _matching(rule).filter(ended_at__gt=last, ended_at__lt=end).exists():
            break
        cursor = last
    return total


# --- Writes ---------------------------------------------------------------------------------------------


def _rule_problems(*, sample_rate: object, delay_seconds: object, filter: object) -> list[dict[str, str]]:
    problems = filter_problems(filter)
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, int | float) or not 0 <= sample_rate <= 1:
        problems.append({"field": "sample_rate", "message": "must be a number from 0 to 1"})
    if isinstance(delay_seconds, bool) or not isinstance(delay_seconds, int) or not 0 <= delay_seconds <= 86_400:
        problems.append({"field": "delay_seconds", "message": "must be whole seconds from 0 to 86400"})
    return problems


def _evaluator_problems(agent: Agent, evaluators_used: Sequence[Evaluator]) -> list[dict[str, str]]:
    problems: list[dict[str, str]] = []
    if any(evaluator.workspace_id != agent.workspace_id for evaluator in evaluators_used):
        problems.append({"field": "evaluators", "message": "an evaluator of another workspace"})
    # A pairwise judge compares two answers; a rule has one trajectory to score, so it could never run.
    if any(evaluator.type in evaluators.PAIRWISE_TYPES for evaluator in evaluators_used):
        problems.append(
            {"field": "evaluators", "message": "a pairwise judge compares two runs; it cannot score a trajectory"}
        )
    return problems


def _rule_refused(problems: list[dict[str, str]], mismatches: list[dict[str, str]]) -> exceptions.OnlineRuleInvalid:
    """The error for a rule's problems; another agent's evaluator comes first and gives the error its code."""
    if mismatches:
        return exceptions.OnlineRuleEvaluatorAgentMismatch(
            f"invalid online rule: {mismatches[0]['message']}", errors=[*mismatches, *problems]
        )
    return exceptions.OnlineRuleInvalid(f"invalid online rule: {problems[0]['message']}", errors=problems)


@transaction.atomic
def online_rule_create(
    *,
    agent: Agent,
    name: str,
    evaluators_used: list[Evaluator],
    filter: Mapping[str, Any] | None = None,
    sample_rate: float = 1.0,
    delay_seconds: int = 60,
    enabled: bool = True,
    proposed: bool = False,
    created_by: User | None = None,
) -> OnlineRule:
    problems = _rule_problems(sample_rate=sample_rate, delay_seconds=delay_seconds, filter=dict(filter or {}))
    if not evaluators_used:
        problems.append({"field": "evaluators", "message": "name at least one evaluator"})
    problems += _evaluator_problems(agent, evaluators_used)
    if OnlineRule.objects.filter(workspace_id=agent.workspace_id, name=name).exists():
        problems.append({"field": "name", "message": "a rule with this name exists"})
    mismatches = evaluators.agent_mismatches(evaluators_used, agent=agent)
    if problems or mismatches:
        raise _rule_refused(problems, mismatches)
    rule = OnlineRule(
        workspace_id=agent.workspace_id,
        agent=agent,
        name=name,
        filter=dict(filter or {}),
        sample_rate=float(sample_rate),
        delay_seconds=delay_seconds,
        enabled=enabled,
        proposed=proposed,
        created_by=created_by,
    )
    try:
        rule.full_clean(exclude=["workspace", "agent"], validate_constraints=False)
    except DjangoValidationError as error:
        raise exceptions.OnlineRuleInvalid(
            "invalid online rule",
            errors=[{"field": key, "message": "; ".join(value)} for key, value in error.message_dict.items()],
        ) from None
    rule.save()
    rule.evaluators.set(evaluators_used)
    return rule


def online_rule_update(*, rule: OnlineRule, **fields: Any) -> OnlineRule:
    allowed = {"filter", "sample_rate", "delay_seconds", "enabled"}
    unknown = sorted(set(fields) - allowed - {"evaluators_used"})
    problems = [{"field": key, "message": "cannot be changed"} for key in unknown]
    problems += _rule_problems(
        sample_rate=fields.get("sample_rate", rule.sample_rate),
        delay_seconds=fields.get("delay_seconds", rule.delay_seconds),
        filter=fields.get("filter", rule.filter),
    )
    problems += _evaluator_problems(rule.agent, fields.get("evaluators_used", ()))
    mismatches = evaluators.agent_mismatches(fields.get("evaluators_used", ()), agent=rule.agent)
    if problems or mismatches:
        raise _rule_refused(problems, mismatches)
    with transaction.atomic():
        for key in allowed & set(fields):
            setattr(rule, key, fields[key])
        rule.save()
        if "evaluators_used" in fields:
            rule.evaluators.set(fields["evaluators_used"])
    return rule


def rule_summary(*, rule: OnlineRule, since: datetime | None = None) -> dict[str, Any]:
    """Per evaluator: how many trajectories the rule scored and their mean, since `since`."""
    evaluations = rule.evaluations.all()
    if since is not None:
        evaluations = evaluations.filter(trajectory_ended_at__gte=since)
    totals: dict[str, list[float]] = {}
    errored: dict[str, int] = {}
    count = 0
    for results in evaluations.values_list("results", flat=True).iterator():
        count += 1
        for result in results:
            name = str(result.get("evaluator"))
            if result.get("score") is None:
                errored[name] = errored.get(name, 0) + 1
            else:
                totals.setdefault(name, []).append(float(result["score"]))
    return {
        "trajectories": count,
        "evaluators": {
            name: {
                "scored": len(values),
                "mean": sum(values) / len(values) if values else None,
                "errored": errored.get(name, 0),
            }
            for name, values in sorted(totals.items())
        }
        | {name: {"scored": 0, "mean": None, "errored": n} for name, n in errored.items() if name not in totals},
    }
