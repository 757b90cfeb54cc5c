"""Triage settings, review samples and the reviewers' decisions: writes and tenant-scoped reads.

- `triage_settings_update` stores what a team changed from the default triage setup of an agent and,
  when that changes what the detectors find, queues a recompute of the agent's trajectories.
- `review_sample_create` draws a review queue by one strategy (tracing.sampling) from a time window;
  `review_samples_daily` draws each agent's daily budget. A trajectory already drawn into an earlier
  sample of the same queue (workspace, agent, strategy) is not drawn again unless asked.
- `review_item_decide` records a reviewer's decision; `review_informativeness` reports, per strategy,
  the share of reviewed trajectories marked informative, with a 95% Wilson interval.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.db.models import (
    Case,
    CharField,
    Count,
    F,
    IntegerField,
    Q,
    QuerySet,
    Value,
    When,
    Window,
)
from django.db.models.functions import MD5, Cast, Concat, RowNumber
from django.utils import timezone

from agent_registry.models import Agent, ApiKey, User, Workspace
from tracing import exceptions, sampling, selectors, signals, triage_config
from tracing.models import (
    ReviewItem,
    ReviewItemStatus,
    ReviewSample,
    ReviewSampleSource,
    ReviewStrategy,
    Trajectory,
    TrajectoryStatus,
    TriageSettings,
)

logger = logging.getLogger("tracing.triage")

AgentIds = Collection[int] | None

RECOMPUTE_CHUNK = 500
MAX_SAMPLE_BUDGET = 500
# Signal-based sampling rotates over the best-scored trajectories of the window, at most this many.
SIGNAL_CANDIDATES_PER_ITEM = 50
MIN_SIGNAL_CANDIDATES = 1000
# Settings fields that change what the detectors find or how they score; the others only steer review.
_SIGNAL_FIELDS = ("language", "phrases", "weights", "thresholds", "limits", "handoff_tools")


# --- Triage settings ------------------------------------------------------------------------------------


def triage_settings_get(*, agent: Agent) -> TriageSettings:
    """The agent's settings; an unsaved default row when it has none yet."""
    found = TriageSettings.objects.filter(agent=agent).select_related("updated_by").first()
    return found if found is not None else TriageSettings(agent=agent)


def _review_problems(budget: Any, strategies: Any) -> list[dict[str, str]]:
    problems = []
    if isinstance(budget, bool) or not isinstance(budget, int) or not 0 <= budget <= MAX_SAMPLE_BUDGET:
        problems.append({"field": "review_budget_per_day", "message": f"a whole number from 0 to {MAX_SAMPLE_BUDGET}"})
    allowed = [value for value in ReviewStrategy.values if value != ReviewStrategy.STRATIFIED_AGENT]
    if not isinstance(strategies, list) or any(strategy not in allowed for strategy in strategies):
        problems.append({"field": "review_strategies", "message": f"strategies among {', '.join(allowed)}"})
    elif budget and not strategies:
        problems.append({"field": "review_strategies", "message": "a daily budget needs at least one strategy"})
    return problems


@dataclass(frozen=True)
class TriageSettingsSaved:
    settings: TriageSettings
    # Trajectories whose signals are being recomputed because of the change (0: nothing to recompute).
    recomputing: int


def triage_settings_update(
    *,
    agent: Agent,
    language: str = "en",
    phrases: Mapping[str, Any] | None = None,
    weights: Mapping[str, Any] | None = None,
    thresholds: Mapping[str, Any] | None = None,
    limits: Mapping[str, Any] | None = None,
    handoff_tools: Sequence[str] = (),
    review_budget_per_day: int = 0,
    review_strategies: Sequence[str] = (),
    updated_by: User | None = None,
) -> TriageSettingsSaved:
    """Replace the agent's triage settings (validated as a whole; raises TriageSettingsInvalid naming
    every bad field, having changed nothing). When the change affects detection or scoring, the agent's
    trajectories are recomputed by workers, in chunks, after the commit."""
    values: dict[str, Any] = {
        "language": language.strip() if isinstance(language, str) else language,
        "phrases": dict(phrases or {}),
        "weights": dict(weights or {}),
        "thresholds": dict(thresholds or {}),
        "limits": {name: value for name, value in (limits or {}).items() if value is not None},
        "handoff_tools": sorted({name.strip() for name in handoff_tools if isinstance(name, str) and name.strip()}),
        "review_budget_per_day": review_budget_per_day,
        "review_strategies": list(dict.fromkeys(review_strategies)),
    }
    problems = triage_config.settings_problems(
        language=values["language"],
        phrases=values["phrases"],
        weights=values["weights"],
        thresholds=values["thresholds"],
        limits=values["limits"],
        handoff_tools=values["handoff_tools"],
    )
    problems += _review_problems(values["review_budget_per_day"], values["review_strategies"])
    if problems:
        raise exceptions.TriageSettingsInvalid(
            "invalid triage settings: " + "; ".join(f"{p['field']}: {p['message']}" for p in problems[:5]),
            errors=problems,
        )
    with transaction.atomic():
        # Lock the row (or the agent, for a first save) so two editors' saves apply one after the other.
        Agent.objects.select_for_update().filter(pk=agent.pk).first()
        current = TriageSettings.objects.filter(agent=agent).first()
        before = {name: getattr(current, name) for name in _SIGNAL_FIELDS} if current is not None else None
        settings_row = current or TriageSettings(agent=agent)
        for name, value in values.items():
            setattr(settings_row, name, value)
        settings_row.updated_at = timezone.now()
        settings_row.updated_by = updated_by
        settings_row.save()
        defaults = {name: getattr(TriageSettings(agent=agent), name) for name in _SIGNAL_FIELDS}
        after = {name: values[name] for name in _SIGNAL_FIELDS}
        changed = after != (before if before is not None else defaults)
        recomputing = 0
        if changed:
            recomputing = Trajectory.objects.filter(agent=agent).count()
            if recomputing:
                _recompute_enqueue(agent.pk)
    return TriageSettingsSaved(settings=settings_row, recomputing=recomputing)


def _recompute_enqueue(agent_id: int) -> None:
    from tracing import tasks  # tasks import this module; import it here, as STYLE.md says

    transaction.on_commit(lambda: tasks.agent_signals_recompute.delay(agent_id))


def agent_signals_recompute_enqueue(*, agent_id: int, chunk_size: int = RECOMPUTE_CHUNK) -> int:
    """Queue `tracing.trajectory_signals_recompute` for every chunk of the agent's trajectories; returns
    how many chunks. Run by a worker, so that a save never lists a large agent's trajectories."""
    from tracing import tasks

    agent = Agent.objects.select_related("workspace").filter(pk=agent_id).first()
    if agent is None:
        return 0
    chunks = 0
    for chunk in selectors.trajectory_id_chunks(
        workspace_slug=agent.workspace.slug, agent_slug=agent.slug, size=chunk_size
    ):
        tasks.trajectory_signals_recompute.delay(chunk)
        chunks += 1
    logger.info("tracing.agent_signals_recompute_queued", extra={"agent_id": agent_id, "chunks": chunks})
    return chunks


# --- Drawing review samples -----------------------------------------------------------------------------


def _queue_lock(workspace_id: int, agent_id: int | None, strategy: str) -> None:
    """Serialize draws of one queue, so that two at once cannot both take the same trajectory."""
    key = hashlib.sha256(f"keel-review-queue:{workspace_id}:{agent_id}:{strategy}".encode()).digest()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [int.from_bytes(key[:8], "big", signed=True)])


def _random_rank(seed: str) -> MD5:
    return MD5(Concat(Value(seed), Cast("pk", output_field=CharField())))


def _score_bucket() -> Case:
    # The same buckets as tracing.sampling.score_bucket.
    return Case(
        When(triage_score__lte=0, then=Value(0)),
        When(triage_score__lt=0.25, then=Value(1)),
        When(triage_score__lt=0.5, then=Value(2)),
        When(triage_score__lt=0.75, then=Value(3)),
        default=Value(4),
        output_field=IntegerField(),
    )


def _candidates(found: QuerySet[Trajectory], strategy: str, budget: int, seed: str) -> list[sampling.Candidate]:
    """The window's trajectories that the strategy could pick, in the order it reads them; ordered and
    cut in SQL, so a busy window costs one indexed query, not a read of every row."""
    columns = ("pk", "agent_id", "triage_score", "signal_names", "step_count")
    if strategy == ReviewStrategy.SIGNAL:
        cap = max(MIN_SIGNAL_CANDIDATES, budget * SIGNAL_CANDIDATES_PER_ITEM)
        rows = found.filter(triage_score__gt=0).order_by("-triage_score", "pk").values_list(*columns)[:cap]
    elif strategy == ReviewStrategy.RANDOM:
        rows = found.annotate(rank=_random_rank(seed)).order_by("rank", "pk").values_list(*columns)[:budget]
    elif strategy == ReviewStrategy.LENGTH:
        rows = found.order_by("-step_count", "pk").values_list(*columns)[:budget]
    else:
        stratum = F("agent_id") if strategy == ReviewStrategy.STRATIFIED_AGENT else _score_bucket()
        rows = (
            found.annotate(rank=_random_rank(seed))
            .annotate(row=Window(RowNumber(), partition_by=[stratum], order_by=[F("rank").asc(), F("pk").asc()]))
            .filter(row__lte=budget)
            .order_by("rank", "pk")
            .values_list(*columns)
        )
    return [
        sampling.Candidate(pk, agent_id, score, tuple(names or ()), steps) for pk, agent_id, score, names, steps in rows
    ]


def _agent_weights(candidates: Sequence[sampling.Candidate]) -> dict[int, Mapping[str, float]]:
    """The signal weights that the triage settings of the candidates' agents set (agents that set none
    are left out): signal-based sampling rotates over the signals each agent weighs positively."""
    agent_ids = {candidate.agent_id for candidate in candidates if candidate.agent_id is not None}
    if not agent_ids:
        return {}
    rows = TriageSettings.objects.filter(agent_id__in=agent_ids).exclude(weights={}).values_list("agent_id", "weights")
    return {agent_id: weights for agent_id, weights in rows if isinstance(weights, dict)}


def review_sample_create(
    *,
    workspace: Workspace,
    strategy: str,
    window_start: datetime,
    window_end: datetime,
    budget: int,
    agent: Agent | None = None,
    allow_repeats: bool = False,
    created_by: User | None = None,
    created_via_key: ApiKey | None = None,
    source: str = ReviewSampleSource.MANUAL,
    seed: str | None = None,
) -> ReviewSample:
    """Draw a review queue: at most `budget` finished trajectories that started in [window_start,
    window_end), of `agent` (None: every agent of the workspace), picked by `strategy`.

    Precondition: `agent` belongs to `workspace`. Raises ReviewSampleInvalid, having stored nothing.
    A daily draw (`source="daily"`) that already exists for this day and queue raises IntegrityError.
    """
    problems = []
    if strategy not in ReviewStrategy.values:
        problems.append({"field": "strategy", "message": f"one of {', '.join(ReviewStrategy.values)}"})
    if strategy == ReviewStrategy.STRATIFIED_AGENT and agent is not None:
        problems.append({"field": "agent", "message": "a sample stratified by agent covers every agent: leave it out"})
    if isinstance(budget, bool) or not isinstance(budget, int) or not 1 <= budget <= MAX_SAMPLE_BUDGET:
        problems.append({"field": "budget", "message": f"a whole number from 1 to {MAX_SAMPLE_BUDGET}"})
    if window_end <= window_start:
        problems.append({"field": "window_end", "message": "must be after the window's start"})
    if agent is not None and agent.workspace_id != workspace.pk:
        problems.append({"field": "agent", "message": "not an agent of this workspace"})
    if problems:
        raise exceptions.ReviewSampleInvalid(
            "invalid sample: " + "; ".join(f"{p['field']}: {p['message']}" for p in problems), errors=problems
        )
    with transaction.atomic():
        _queue_lock(workspace.pk, agent.pk if agent is not None else None, strategy)
        sample = ReviewSample.objects.create(
            workspace=workspace,
            agent=agent,
            strategy=strategy,
            source=source,
            window_start=window_start,
            window_end=window_end,
            budget=budget,
            seed=seed or secrets.token_hex(8),
            allow_repeats=allow_repeats,
            created_by=created_by,
            created_via_key=created_via_key,
        )
        found = Trajectory.objects.filter(
            workspace=workspace, started_at__gte=window_start, started_at__lt=window_end
        ).exclude(status=TrajectoryStatus.RUNNING)
        if agent is not None:
            found = found.filter(agent=agent)
        if not allow_repeats:
            queue = ReviewItem.objects.filter(
                sample__workspace=workspace, sample__agent=agent, sample__strategy=strategy
            ).exclude(sample=sample)
            found = found.exclude(pk__in=queue.values("trajectory_id"))
        candidates = _candidates(found, strategy, budget, sample.seed)
        weights = _agent_weights(candidates) if strategy == ReviewStrategy.SIGNAL else {}
        chosen = sampling.sample_select(strategy, candidates, budget, weights=weights)
        ReviewItem.objects.bulk_create(
            ReviewItem(
                sample=sample,
                trajectory_id=candidate.trajectory_id,
                position=position,
                triage_score=candidate.triage_score,
                signal_names=list(candidate.signal_names),
            )
            for position, candidate in enumerate(chosen, start=1)
        )
    return sample


def review_samples_daily(*, now: datetime | None = None) -> list[ReviewSample]:
    """Draw each agent's daily review budget from yesterday's traffic (UTC), split evenly across its
    strategies. Idempotent: a day's draw of a queue exists once, whichever process runs it first."""
    now = now or timezone.now()
    day_end = datetime.combine(now.astimezone(UTC).date(), time.min, tzinfo=UTC)
    day_start = day_end - timedelta(days=1)
    created: list[ReviewSample] = []
    for settings_row in TriageSettings.objects.filter(review_budget_per_day__gt=0).select_related("agent__workspace"):
        strategies = [s for s in settings_row.review_strategies if s in ReviewStrategy.values]
        shares = sampling.allocate(
            dict.fromkeys(strategies, settings_row.review_budget_per_day),
            settings_row.review_budget_per_day,
        )
        for strategy in strategies:
            if not shares[strategy]:
                continue
            agent = settings_row.agent
            try:
                with transaction.atomic():
                    created.append(
                        review_sample_create(
                            workspace=agent.workspace,
                            agent=agent,
                            strategy=strategy,
                            window_start=day_start,
                            window_end=day_end,
                            budget=shares[strategy],
                            source=ReviewSampleSource.DAILY,
                            seed=f"daily:{agent.pk}:{strategy}:{day_start.date().isoformat()}",
                        )
                    )
            except IntegrityError:
                continue  # another process drew this day's sample of the queue first
    return created


# --- Decisions ------------------------------------------------------------------------------------------


def review_item_decide(
    *,
    item: ReviewItem,
    status: str,
    informative: bool | None = None,
    failure_mode: str = "",
    note: str = "",
    reviewer: User | None = None,
    reviewed_via_key: ApiKey | None = None,
) -> ReviewItem:
    """Record (or change) the decision about one item: reviewed (informative or not, with a failure
    mode from tracing.sampling.FAILURE_MODES or none) or skipped."""
    problems = []
    if status not in (ReviewItemStatus.REVIEWED, ReviewItemStatus.SKIPPED):
        problems.append({"field": "status", "message": "reviewed or skipped"})
    if status == ReviewItemStatus.REVIEWED and informative is None:
        problems.append({"field": "informative", "message": "say whether the trajectory was informative"})
    if failure_mode and failure_mode not in sampling.FAILURE_MODES:
        problems.append({"field": "failure_mode", "message": f"one of {', '.join(sampling.FAILURE_MODES)}"})
    if len(note) > 10_000:
        problems.append({"field": "note", "message": "at most 10,000 characters"})
    if problems:
        raise exceptions.ReviewDecisionInvalid(
            "invalid decision: " + "; ".join(f"{p['field']}: {p['message']}" for p in problems), errors=problems
        )
    skipped = status == ReviewItemStatus.SKIPPED
    with transaction.atomic():
        locked = ReviewItem.objects.select_for_update().get(pk=item.pk)
        locked.status = status
        locked.informative = None if skipped else informative
        locked.failure_mode = "" if skipped else failure_mode
        locked.note = note.strip()
        locked.reviewer = reviewer
        locked.reviewed_via_key = reviewed_via_key
        locked.reviewed_at = timezone.now()
        locked.save()
    return locked


# --- Reads ----------------------------------------------------------------------------------------------


def _samples(workspace: Workspace, agent_ids: AgentIds) -> QuerySet[ReviewSample]:
    found = ReviewSample.objects.filter(workspace=workspace)
    if agent_ids is not None:
        # A key limited to some agents sees the samples of those agents, never the workspace-wide ones.
        found = found.filter(agent_id__in=agent_ids)
    return found


def review_sample_list(*, workspace: Workspace, agent_ids: AgentIds = None, limit: int = 100) -> list[ReviewSample]:
    """Samples, newest first, each with `item_count`, `reviewed_count`, `skipped_count`, `informative_count`."""
    return list(
        _samples(workspace, agent_ids)
        .select_related("agent", "created_by")
        .annotate(
            item_count=Count("items"),
            reviewed_count=Count("items", filter=Q(items__status=ReviewItemStatus.REVIEWED)),
            skipped_count=Count("items", filter=Q(items__status=ReviewItemStatus.SKIPPED)),
            informative_count=Count("items", filter=Q(items__informative=True)),
        )
        .order_by("-created_at", "-pk")[:limit]
    )


def review_sample_get(*, workspace: Workspace, sample_id: int, agent_ids: AgentIds = None) -> ReviewSample:
    found = (
        _samples(workspace, agent_ids)
        .select_related("agent", "created_by")
        .annotate(
            item_count=Count("items"),
            reviewed_count=Count("items", filter=Q(items__status=ReviewItemStatus.REVIEWED)),
            skipped_count=Count("items", filter=Q(items__status=ReviewItemStatus.SKIPPED)),
            informative_count=Count("items", filter=Q(items__informative=True)),
        )
        .filter(pk=sample_id)
        .first()
    )
    if found is None:
        raise exceptions.ReviewSampleNotFound(f"no review sample {sample_id}")
    return found


def review_item_list(*, sample: ReviewSample) -> QuerySet[ReviewItem]:
    """The items of a sample (already scoped to the caller), in review order."""
    return sample.items.select_related("trajectory__agent", "reviewer").order_by("position")


def review_item_get(*, sample: ReviewSample, position: int) -> ReviewItem:
    found = sample.items.select_related("trajectory__agent", "reviewer").filter(position=position).first()
    if found is None:
        raise exceptions.ReviewItemNotFound(f"sample {sample.pk} has no item {position}")
    return found


def review_item_get_by_id(*, workspace: Workspace, item_id: int, agent_ids: AgentIds = None) -> ReviewItem:
    found = ReviewItem.objects.filter(pk=item_id, sample__workspace=workspace)
    if agent_ids is not None:
        found = found.filter(sample__agent_id__in=agent_ids)
    item = found.select_related("sample", "trajectory__agent", "reviewer").first()
    if item is None:
        raise exceptions.ReviewItemNotFound(f"no review item {item_id}")
    return item


def review_item_next(*, sample: ReviewSample, after: int = 0) -> ReviewItem | None:
    """The first pending item after position `after`, else the first pending one at all."""
    pending = sample.items.filter(status=ReviewItemStatus.PENDING).order_by("position")
    return pending.filter(position__gt=after).first() or pending.first()


@dataclass(frozen=True)
class AgentInformativeness:
    agent: Agent | None
    rows: list[sampling.Informativeness]


@dataclass(frozen=True)
class InformativenessReport:
    overall: list[sampling.Informativeness]
    by_agent: list[AgentInformativeness]
    comparison: sampling.Comparison

    @property
    def reviewed(self) -> int:
        return sum(row.reviewed for row in self.overall)


def review_informativeness(
    *, workspace: Workspace, agent_ids: AgentIds = None, agent: Agent | None = None, since: datetime | None = None
) -> InformativenessReport:
    """Per sampling strategy, how many reviewed trajectories were informative, overall and per agent of
    the trajectory (one grouped query). Skipped and pending items do not count."""
    items = ReviewItem.objects.filter(sample__workspace=workspace, status=ReviewItemStatus.REVIEWED)
    if agent_ids is not None:
        items = items.filter(trajectory__agent_id__in=agent_ids)
    if agent is not None:
        items = items.filter(trajectory__agent=agent)
    if since is not None:
        items = items.filter(reviewed_at__gte=since)
    rows = (
        items.values("sample__strategy", "trajectory__agent_id")
        .annotate(reviewed=Count("pk"), informative=Count("pk", filter=Q(informative=True)))
        .order_by()
    )
    totals: dict[str, list[int]] = {}
    per_agent: dict[int | None, dict[str, list[int]]] = {}
    for row in rows:
        strategy, agent_id = row["sample__strategy"], row["trajectory__agent_id"]
        for bucket in (totals, per_agent.setdefault(agent_id, {})):
            counts = bucket.setdefault(strategy, [0, 0])
            counts[0] += row["reviewed"]
            counts[1] += row["informative"]

    def report_rows(counts: Mapping[str, list[int]]) -> list[sampling.Informativeness]:
        return [
            sampling.informativeness(strategy, *counts[strategy])
            for strategy in sampling.STRATEGIES
            if strategy in counts
        ]

    overall = report_rows(totals)
    agents = {found.pk: found for found in Agent.objects.filter(pk__in=[key for key in per_agent if key is not None])}
    by_agent = sorted(
        (
            AgentInformativeness(agent=agents.get(key) if key is not None else None, rows=report_rows(counts))
            for key, counts in per_agent.items()
        ),
        key=lambda entry: entry.agent.name if entry.agent is not None else "~",
    )
    return InformativenessReport(overall=overall, by_agent=by_agent, comparison=sampling.comparison(overall))


def fired_signals(trajectory: Trajectory) -> list[str]:
    """The problem signals that fired on a trajectory, strongest first (for the reviewer's key order)."""
    strength: dict[str, float] = {}
    for instance in trajectory.signals or []:
        if isinstance(instance, dict) and instance.get("signal") in sampling.PROBLEM_SIGNALS:
            name = str(instance["signal"])
            strength[name] = max(strength.get(name, 0.0), float(instance.get("severity") or 0))
    return sorted(strength, key=lambda name: (-strength[name] * signals.DEFAULT_WEIGHTS.get(name, 0.0), name))


# --- Signal rates over time ---------------------------------------------------------------------------

RATE_BUCKETS = {"hour": timedelta(hours=1), "day": timedelta(days=1)}
NO_PROMPT_VERSION = "(no prompt version)"


@dataclass(frozen=True)
class RateSeries:
    """One prompt version's trajectories per bucket, and per signal how many of them had it."""

    label: str
    prompt_version_id: int | None
    totals: list[int]
    counts: dict[str, list[int]]

    def rates(self, signal: str) -> list[float | None]:
        matching = self.counts.get(signal) or [0] * len(self.totals)
        return [count / total if total else None for count, total in zip(matching, self.totals, strict=True)]


@dataclass(frozen=True)
class SignalRates:
    buckets: list[datetime]
    bucket: str
    series: list[RateSeries]
    signals: list[str]  # the signals that fired in the period, in the taxonomy's order


_RATES_SQL = """
WITH t AS (
    SELECT id, date_trunc(%s, started_at, 'UTC') AS bucket, signal_names
    FROM tracing_trajectory
    WHERE workspace_id = %s AND agent_id = %s AND started_at >= %s AND started_at < %s
)
SELECT t.bucket, pv.promptversion_id, s.name, GROUPING(s.name) AS is_total, COUNT(DISTINCT t.id)
FROM t
LEFT JOIN tracing_trajectory_prompt_versions AS pv ON pv.trajectory_id = t.id
LEFT JOIN LATERAL unnest(t.signal_names) AS s(name) ON TRUE
GROUP BY GROUPING SETS ((t.bucket, pv.promptversion_id, s.name), (t.bucket, pv.promptversion_id))
"""


def signal_rate_series(*, agent: Agent, since: datetime, until: datetime, bucket: str = "hour") -> SignalRates:
    """Each signal's rate (share of the agent's trajectories with it) per hour or day, one series per
    prompt version the trajectories used: computed in one grouped query (date_trunc, unnest(signal_names),
    GROUP BY GROUPING SETS for the totals), not a query per bucket."""
    from agent_registry.models import PromptVersion

    if bucket not in RATE_BUCKETS:
        raise ValueError(f"bucket must be one of {', '.join(RATE_BUCKETS)}")
    step = RATE_BUCKETS[bucket]
    first = since.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    if bucket == "day":
        first = first.replace(hour=0)
    buckets: list[datetime] = []
    moment = first
    while moment < until:
        buckets.append(moment)
        moment += step
    position = {moment: index for index, moment in enumerate(buckets)}
    with connection.cursor() as cursor:
        cursor.execute(_RATES_SQL, [bucket, agent.workspace_id, agent.pk, first, until])
        rows = cursor.fetchall()
    totals: dict[int | None, list[int]] = {}
    counts: dict[int | None, dict[str, list[int]]] = {}
    fired: set[str] = set()
    for moment, version_id, name, is_total, count in rows:
        index = position.get(moment.astimezone(UTC))
        if index is None:
            continue
        if is_total:
            totals.setdefault(version_id, [0] * len(buckets))[index] = count
        elif name is not None:
            counts.setdefault(version_id, {}).setdefault(name, [0] * len(buckets))[index] = count
            fired.add(name)
    labels = {
        version.pk: f"{version.prompt.name} v{version.version}"
        for version in PromptVersion.objects.filter(pk__in=[key for key in totals if key is not None]).select_related(
            "prompt"
        )
    }
    series = sorted(
        (
            RateSeries(
                label=labels.get(key, NO_PROMPT_VERSION) if key is not None else NO_PROMPT_VERSION,
                prompt_version_id=key,
                totals=values,
                counts=counts.get(key, {}),
            )
            for key, values in totals.items()
        ),
        key=lambda entry: (entry.prompt_version_id is None, entry.label),
    )
    return SignalRates(
        buckets=buckets,
        bucket=bucket,
        series=series,
        signals=[name for name in signals.SIGNAL_NAMES if name in fired],
    )
