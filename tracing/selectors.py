"""Reads of tracing, always scoped to a workspace (and to the agents a key may see)."""

from __future__ import annotations

import base64
import binascii
import functools
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, TypeVar

import orjson
from django.core.exceptions import ValidationError
from django.db import connection
from django.db.models import Count, F, Field, Max, Min, OrderBy, Prefetch, Q, QuerySet, Sum

from agent_registry.models import PromptVersion, Workspace
from config.config_cache import NotifiedCache
from tracing import exceptions, otlp, pricing
from tracing.models import (
    UNPRICED_MODELS_KEPT,
    LangfuseExport,
    LangfuseMirror,
    ModelPriceOverride,
    Replay,
    Score,
    Span,
    Trajectory,
    TrajectoryStatus,
)
from tracing.records import RECORD_COLUMNS, spans_from_records
from tracing.replay_diff import ReplayDiff, replay_diff
from tracing.steps import TrajectoryView, trajectory_view_build, view_document_json

AgentIds = Collection[int] | None

# order parameter → (field, descending)
ORDERS: dict[str, tuple[str, bool]] = {
    "-started_at": ("started_at", True),
    "started_at": ("started_at", False),
    "-cost": ("cost_usd", True),
    "cost": ("cost_usd", False),
    "-latency": ("latency_ms", True),
    "latency": ("latency_ms", False),
    "-steps": ("step_count", True),
    "steps": ("step_count", False),
    "-tokens": ("total_tokens", True),
    "tokens": ("total_tokens", False),
    "-triage_score": ("triage_score", True),
    "triage_score": ("triage_score", False),
}


@dataclass(frozen=True)
class TrajectoryFilter:
    agent_id: int | None = None
    started_after: datetime | None = None
    started_before: datetime | None = None
    status: str | None = None
    tag: str | None = None
    session_id: str | None = None
    user_id: str | None = None
    prompt_name: str | None = None
    prompt_version: int | None = None
    score_name: str | None = None
    score_min: float | None = None
    score_max: float | None = None
    search: str | None = None
    signal: str | None = None


def _visible(workspace: Workspace, agent_ids: AgentIds) -> QuerySet[Trajectory]:
    trajectories = Trajectory.objects.filter(workspace=workspace)
    if agent_ids is not None:
        trajectories = trajectories.filter(agent_id__in=agent_ids)
    return trajectories


K = TypeVar("K")


def _cursor_encode(value: Any, key: int | str) -> str:
    """A page's cursor: the ordering value of its last row, as text (null for none), and the key that breaks ties."""
    return base64.urlsafe_b64encode(orjson.dumps([None if value is None else str(value), key])).decode().rstrip("=")


def _cursor_decode(cursor: str, key: Callable[[Any], K]) -> tuple[str | None, K]:
    """What `_cursor_encode` wrote, the key read by `key` (which raises ValueError or TypeError on one of
    the wrong kind); TrajectoryListInvalid for a cursor this API did not give out."""
    try:
        value, found = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        return None if value is None else str(value), key(found)
    except (ValueError, TypeError, binascii.Error, orjson.JSONDecodeError):
        raise exceptions.TrajectoryListInvalid("the cursor is not one this API gave out") from None


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError("not text")
    return value


@dataclass(frozen=True)
class TrajectoryPage:
    items: list[Trajectory]
    next_cursor: str | None


def trajectory_list(
    *,
    workspace: Workspace,
    filters: TrajectoryFilter,
    agent_ids: AgentIds = None,
    order: str = "-started_at",
    limit: int = 50,
    cursor: str | None = None,
) -> TrajectoryPage:
    """A page of trajectories, newest first unless `order` says otherwise; `next_cursor` continues it."""
    if order not in ORDERS:
        raise exceptions.TrajectoryListInvalid(f"order must be one of {', '.join(ORDERS)}")
    field, descending = ORDERS[order]
    found = _visible(workspace, agent_ids).select_related("agent")
    if filters.agent_id is not None:
        found = found.filter(agent_id=filters.agent_id)
    if filters.started_after is not None:
        found = found.filter(started_at__gte=filters.started_after)
    if filters.started_before is not None:
        found = found.filter(started_at__lt=filters.started_before)
    if filters.status:
        found = found.filter(status=filters.status)
    if filters.tag:
        found = found.filter(tags__contains=[filters.tag])
    if filters.session_id:
        found = found.filter(session_id=filters.session_id)
    if filters.user_id:
        found = found.filter(user_id=filters.user_id)
    if filters.prompt_name:
        versions = Q(prompt_versions__prompt__name=filters.prompt_name)
        if filters.prompt_version is not None:
            versions &= Q(prompt_versions__version=filters.prompt_version)
        found = found.filter(pk__in=Trajectory.objects.filter(versions).values("pk"))
    if filters.score_name:
        scores = Score.objects.filter(workspace=workspace, name=filters.score_name)
        if filters.score_min is not None:
            scores = scores.filter(value__gte=filters.score_min)
        if filters.score_max is not None:
            scores = scores.filter(value__lte=filters.score_max)
        found = found.filter(pk__in=scores.values("trajectory_id"))
    if filters.signal:
        found = found.filter(signal_names__contains=[filters.signal])
    if filters.search:
        found = found.filter(
            Q(name__icontains=filters.search)
            | Q(input_preview__icontains=filters.search)
            | Q(output_preview__icontains=filters.search)
            | Q(trace_id=filters.search.lower())
        )
    ordered_by = Trajectory._meta.get_field(field)
    assert isinstance(ordered_by, Field)  # ORDERS names columns, not relations
    if cursor:
        raw_value, pk = _cursor_decode(cursor, int)
        next_key = Q(**{"pk__lt" if descending else "pk__gt": pk})
        if raw_value is None:
            # Rows without a value (a cost nothing priced) come last either way: past one, only more of them.
            if not ordered_by.null:
                raise exceptions.TrajectoryListInvalid("the cursor is not one this API gave out")
            found = found.filter(Q(**{f"{field}__isnull": True}) & next_key)
        else:
            try:
                # A cursor is opaque but comes back from the client: a value that is not of the ordering
                # field's type would fail in the query (a float or integer one as a 500).
                value = ordered_by.to_python(raw_value)
            except ValidationError:
                raise exceptions.TrajectoryListInvalid("the cursor is not one this API gave out") from None
            after = Q(**{f"{field}__lt" if descending else f"{field}__gt": value}) | (Q(**{field: value}) & next_key)
            if ordered_by.null:
                after |= Q(**{f"{field}__isnull": True})
            found = found.filter(after)
    # Nulls last in both directions: an unknown cost is neither the cheapest nor the most expensive. Only for
    # a column that can be null: PostgreSQL does not read NOT NULL into an ordering, so `DESC NULLS LAST` on
    # started_at would sort every matching row instead of walking the `-started_at` index.
    ordering: tuple[OrderBy | str, str]
    if ordered_by.null:
        ordering = (F(field).desc(nulls_last=True), "-pk") if descending else (F(field).asc(nulls_last=True), "pk")
    else:
        ordering = (f"-{field}", "-pk") if descending else (field, "pk")
    items = list(
        found.order_by(*ordering).prefetch_related(Prefetch("scores", queryset=Score.objects.order_by("created_at")))[
            : limit + 1
        ]
    )
    next_cursor = None
    if len(items) > limit:
        items = items[:limit]
        last = items[-1]
        next_cursor = _cursor_encode(getattr(last, field), last.pk)
    return TrajectoryPage(items=items, next_cursor=next_cursor)


def trajectory_get(*, workspace: Workspace, trace_id: str, agent_ids: AgentIds = None) -> Trajectory:
    trajectory = (
        _visible(workspace, agent_ids).select_related("agent", "replay_of").filter(trace_id=trace_id.lower()).first()
    )
    if trajectory is None:
        raise exceptions.TrajectoryNotFound(f"no trajectory with trace id {trace_id!r}")
    return trajectory


def trace_spans(*, workspace_id: int, trace_ids: Collection[str]) -> dict[str, list[otlp.Span]]:
    """The stored spans of these traces, rebuilt as normalized spans, by trace id (one query)."""
    found: dict[str, list[otlp.Span]] = {trace_id: [] for trace_id in trace_ids}
    if not found:
        return found
    rows = Span.objects.filter(workspace_id=workspace_id, trace_id__in=list(found)).values_list(*RECORD_COLUMNS, "data")
    records = ((dict(zip(RECORD_COLUMNS, columns, strict=True)), orjson.loads(data)) for *columns, data in rows)
    for span in spans_from_records(records):
        found[span.trace_id].append(span)
    return found


def trajectory_spans(*, trajectory: Trajectory) -> list[otlp.Span]:
    return trace_spans(workspace_id=trajectory.workspace_id, trace_ids=[trajectory.trace_id])[trajectory.trace_id]


# Ingest reads this for each batch with tool results, once per agent. Through the ORM the call took 1.0-2.6 ms
# of the web's CPU per batch of 500 spans (in process), of which the SQL was 0.26 ms; as one statement,
# 0.3-1.3 ms (bench/RESULTS.md, 2026-11-30).
_TOOL_RESULT_SHAPE_COUNTS = (
    "SELECT tool_name, shape_key, shape, count FROM tracing_toolresultshape "
    "WHERE agent_id = %s AND count >= %s ORDER BY tool_name, count DESC, shape_key"
)


def tool_result_shape_counts(*, agent_id: int, min_count: int) -> dict[str, dict[str, tuple[dict[str, str], int]]]:
    """The agent's tool result shapes seen at least `min_count` times: tool -> shape key -> (shape, count).

    `agent_id` comes from a row already scoped to its workspace (a trajectory's agent)."""
    found: dict[str, dict[str, tuple[dict[str, str], int]]] = {}
    with connection.cursor() as cursor:
        cursor.execute(_TOOL_RESULT_SHAPE_COUNTS, [agent_id, min_count])
        rows = cursor.fetchall()
    for tool_name, shape_key, shape, count in rows:
        # Django reads jsonb as its text (its JSONField parses it); so does a raw cursor.
        found.setdefault(tool_name, {})[shape_key] = (orjson.loads(shape), count)
    return found


def trajectory_view(*, trajectory: Trajectory) -> TrajectoryView:
    """The trajectory's steps, conversation and totals, assembled from its stored spans."""
    return trajectory_view_build(trajectory_spans(trajectory=trajectory), trace_id=trajectory.trace_id)


def trajectory_view_document(*, trajectory: Trajectory, full: bool = False) -> bytes:
    """The trajectory's steps as the API shows them, as JSON (tracing.steps.view_document_json): stored
    with a long trajectory when its spans were written, else (a short one, or every call's full input
    asked for) built from the spans."""
    if trajectory.view_document and not full:
        return trajectory.view_document.encode()
    return view_document_json(trajectory_view(trajectory=trajectory), full_inputs=full)


def trajectory_prompt_versions(*, trajectory: Trajectory) -> list[dict[str, Any]]:
    return [
        {"prompt": name, "version": version, "id": pk}
        for pk, name, version in trajectory.prompt_versions.values_list("pk", "prompt__name", "version")
    ]


@dataclass(frozen=True)
class SessionSummary:
    session_id: str
    trajectory_count: int
    started_at: datetime
    ended_at: datetime
    total_tokens: int
    # The sum of its turns' known costs; None when no price covered any of their model calls.
    cost_usd: Any
    error_count: int
    user_id: str
    unpriced_calls: int = 0
    # The models of those calls, sorted, each once (at most UNPRICED_MODELS_KEPT, as a trajectory keeps).
    unpriced_models: tuple[str, ...] = ()


@dataclass(frozen=True)
class SessionPage:
    items: list[SessionSummary]
    next_cursor: str | None


def session_list(
    *, workspace: Workspace, agent_ids: AgentIds = None, limit: int = 50, cursor: str | None = None
) -> SessionPage:
    """Sessions, the most recently active first (by their last trajectory's end, then id), a page at a time:
    `cursor` is a page's `next_cursor`. Raises TrajectoryListInvalid for a cursor this never gave out."""
    rows = (
        _visible(workspace, agent_ids)
        .exclude(session_id="")
        .values("session_id")
        .annotate(
            trajectory_count=Count("pk"),
            first=Min("started_at"),
            last=Max("ended_at"),
            tokens=Sum("total_tokens"),
            cost=Sum("cost_usd"),
            unpriced=Sum("unpriced_call_count"),
            errors=Sum("error_count"),
            user=Max("user_id"),
        )
    )
    if cursor:
        last, session_id = _session_cursor_decode(cursor)
        rows = rows.filter(Q(last__lt=last) | Q(last=last, session_id__lt=session_id))
    found = list(rows.order_by("-last", "-session_id")[: limit + 1])
    unpriced_models = _sessions_unpriced_models(
        workspace, agent_ids, [row["session_id"] for row in found[:limit] if row["unpriced"]]
    )
    items = [
        SessionSummary(
            session_id=row["session_id"],
            trajectory_count=row["trajectory_count"],
            started_at=row["first"],
            ended_at=row["last"],
            total_tokens=row["tokens"] or 0,
            cost_usd=_summed_cost(row["cost"], row["unpriced"] or 0),
            error_count=row["errors"] or 0,
            user_id=row["user"] or "",
            unpriced_calls=row["unpriced"] or 0,
            unpriced_models=unpriced_models.get(row["session_id"], ()),
        )
        for row in found[:limit]
    ]
    more = len(found) > limit
    return SessionPage(items, _cursor_encode(items[-1].ended_at.isoformat(), items[-1].session_id) if more else None)


def _sessions_unpriced_models(
    workspace: Workspace, agent_ids: AgentIds, session_ids: Sequence[str]
) -> dict[str, tuple[str, ...]]:
    """The models of the sessions' unpriced calls, per session: one read of the trajectories that have any."""
    if not session_ids:
        return {}
    models: dict[str, set[str]] = {}
    rows = (
        _visible(workspace, agent_ids)
        .filter(session_id__in=session_ids, unpriced_call_count__gt=0)
        .values_list("session_id", "unpriced_models")
    )
    for session_id, names in rows:
        models.setdefault(session_id, set()).update(names)
    return {session_id: tuple(sorted(names)[:UNPRICED_MODELS_KEPT]) for session_id, names in models.items()}


def _summed_cost(cost: Decimal | None, unpriced_calls: int) -> Decimal | None:
    """A sum of trajectories' costs (SUM leaves out the unknown ones): None when all were unknown, else the
    sum of the known ones, 0 for no model calls at all."""
    if cost is None and unpriced_calls:
        return None
    return cost or Decimal(0)


def _session_cursor_decode(cursor: str) -> tuple[datetime, str]:
    moment, session_id = _cursor_decode(cursor, _text)
    try:
        last = datetime.fromisoformat(moment) if moment is not None else None
    except ValueError:
        last = None
    if last is None or last.tzinfo is None:
        raise exceptions.TrajectoryListInvalid("the cursor is not one this API gave out")
    return last, session_id


def session_trajectories(*, workspace: Workspace, session_id: str, agent_ids: AgentIds = None) -> QuerySet[Trajectory]:
    found = _visible(workspace, agent_ids).filter(session_id=session_id).select_related("agent").order_by("started_at")
    if not found.exists():
        raise exceptions.SessionNotFound(f"no session {session_id!r}")
    return found


def model_price_list(*, workspace: Workspace) -> QuerySet[ModelPriceOverride]:
    return ModelPriceOverride.objects.filter(workspace=workspace).order_by("model")


# --- Replays ----------------------------------------------------------------------------------------


def replay_get(*, workspace: Workspace, replay_id: int, agent_ids: AgentIds = None) -> Replay:
    found = Replay.objects.filter(workspace=workspace, pk=replay_id)
    if agent_ids is not None:
        found = found.filter(original__agent_id__in=agent_ids)
    replay = found.select_related("original", "replay_trajectory", "prompt_version__prompt").first()
    if replay is None:
        raise exceptions.ReplayNotFound(f"no replay {replay_id}")
    return replay


def replay_list(*, trajectory: Trajectory) -> QuerySet[Replay]:
    """The replays of a trajectory (already scoped to the caller), newest first."""
    return (
        Replay.objects.filter(workspace_id=trajectory.workspace_id, original=trajectory)
        .select_related("original", "replay_trajectory", "prompt_version__prompt")
        .order_by("-created_at", "-pk")
    )


def replay_diff_get(*, replay: Replay) -> ReplayDiff:
    """Where a finished replay parts from its original (tracing.replay_diff)."""
    if replay.replay_trajectory is None:
        raise exceptions.ReplayConflict(f"replay {replay.pk} has no trajectory to compare yet (it is {replay.status})")
    return replay_diff(
        trajectory_view(trajectory=replay.original),
        trajectory_view(trajectory=replay.replay_trajectory),
        from_step=replay.from_step,
    )


# --- The dashboard -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrajectoryStats:
    """How a workspace's agents did over a period: the home page's "recent trajectories" card."""

    trajectory_count: int
    error_count: int
    total_tokens: int
    cost_usd: Decimal | None  # of the priced calls; None when there were calls and none was priced
    unpriced_calls: int = 0

    @property
    def error_rate(self) -> float | None:
        return self.error_count / self.trajectory_count if self.trajectory_count else None


def trajectory_stats(*, workspace: Workspace, since: datetime, agent_ids: AgentIds = None) -> TrajectoryStats:
    """Trajectories that started at or after `since`: how many, how many ended in error, tokens, and cost (of
    the priced model calls, with the count of the others)."""
    row = (
        _visible(workspace, agent_ids)
        .filter(started_at__gte=since)
        .aggregate(
            count=Count("pk"),
            errors=Count("pk", filter=Q(status=TrajectoryStatus.ERROR)),
            tokens=Sum("total_tokens"),
            cost=Sum("cost_usd"),
            unpriced=Sum("unpriced_call_count"),
        )
    )
    return TrajectoryStats(
        trajectory_count=row["count"],
        error_count=row["errors"],
        total_tokens=row["tokens"] or 0,
        cost_usd=_summed_cost(row["cost"], row["unpriced"] or 0),
        unpriced_calls=row["unpriced"] or 0,
    )


def trajectory_views(*, trajectories: Collection[Trajectory]) -> dict[int, TrajectoryView]:
    """The views of several trajectories (already scoped to the caller) from one read per workspace."""
    views: dict[int, TrajectoryView] = {}
    for workspace_id in {trajectory.workspace_id for trajectory in trajectories}:
        mine = [trajectory for trajectory in trajectories if trajectory.workspace_id == workspace_id]
        spans = trace_spans(workspace_id=workspace_id, trace_ids=[trajectory.trace_id for trajectory in mine])
        for trajectory in mine:
            views[trajectory.pk] = trajectory_view_build(spans[trajectory.trace_id], trace_id=trajectory.trace_id)
    return views


def trajectory_score_list(*, trajectory: Trajectory) -> QuerySet[Score]:
    """A trajectory's scores (of the whole and of its steps), oldest first, with who gave them."""
    return trajectory.scores.select_related("created_by", "created_via_key").order_by("created_at", "pk")


def trajectory_prompt_version_list(*, trajectory: Trajectory) -> QuerySet[PromptVersion]:
    """The prompt versions a trajectory's spans named, with their prompts."""
    return trajectory.prompt_versions.select_related("prompt").order_by("prompt__name", "version")


def score_name_list(*, workspace: Workspace, agent_ids: AgentIds = None) -> list[str]:
    """The names scores in the workspace carry, for a filter to offer."""
    scores = Score.objects.filter(workspace=workspace)
    if agent_ids is not None:
        scores = scores.filter(trajectory__agent_id__in=agent_ids)
    return list(scores.order_by("name").values_list("name", flat=True).distinct())


@dataclass(frozen=True)
class LangfuseMirrorStatus:
    mirror: LangfuseMirror
    pending: int
    failed: int


def langfuse_mirror_status(*, workspace: Workspace) -> LangfuseMirrorStatus:
    mirror = LangfuseMirror.objects.filter(workspace=workspace).first()
    if mirror is None:
        raise exceptions.LangfuseMirrorNotFound("this workspace does not mirror to Langfuse")
    counts = LangfuseExport.objects.filter(workspace=workspace).aggregate(
        pending=Count("pk", filter=Q(status__in=["pending", "sending"])),
        failed=Count("pk", filter=Q(status="failed")),
    )
    return LangfuseMirrorStatus(mirror=mirror, pending=counts["pending"], failed=counts["failed"])


def replay_of_trajectory(*, trajectory: Trajectory) -> Replay | None:
    """The replay that produced `trajectory` (already scoped to the caller), if it is a replay's."""
    return (
        Replay.objects.filter(workspace_id=trajectory.workspace_id, replay_trajectory=trajectory)
        .select_related("original", "replay_trajectory", "prompt_version__prompt")
        .order_by("-pk")
        .first()
    )


class ScopeNotFound(LookupError):
    """A workspace or agent slug that names nothing."""


def trajectory_id_chunks(*, workspace_slug: str | None, agent_slug: str | None, size: int) -> Iterator[list[int]]:
    """Trajectory ids in chunks of `size`, oldest first, for bulk work such as recomputing signals."""
    from agent_registry.models import Agent

    found = Trajectory.objects.all()
    if workspace_slug:
        workspace = Workspace.objects.filter(slug=workspace_slug).first()
        if workspace is None:
            raise ScopeNotFound(f"no workspace {workspace_slug!r}")
        found = found.filter(workspace=workspace)
        if agent_slug:
            agent = Agent.objects.filter(workspace=workspace, slug=agent_slug).first()
            if agent is None:
                raise ScopeNotFound(f"no agent {agent_slug!r} in {workspace_slug!r}")
            found = found.filter(agent=agent)
    return _id_chunks(found, size)


def _id_chunks(found: QuerySet[Trajectory], size: int) -> Iterator[list[int]]:
    last = 0
    while True:
        ids = list(found.filter(pk__gt=last).order_by("pk").values_list("pk", flat=True)[:size])
        if not ids:
            return
        yield ids
        last = ids[-1]


def model_price_overrides(*, workspace_id: int) -> dict[str, pricing.ModelPrice]:
    """The workspace's own model prices, by model name, in the form tracing.pricing reads them."""
    return {
        row.model: pricing.ModelPrice.per_million(
            row.input_usd_per_million, row.output_usd_per_million, row.cache_read_usd_per_million
        )
        for row in ModelPriceOverride.objects.filter(workspace_id=workspace_id)
    }


# Read for every batch of spans (in the transaction that stores them: config_free_transaction) and for
# every model call the gateway prices; kept per process until a price changes (config/config_cache.py).
_price_overrides: NotifiedCache[int, dict[str, pricing.ModelPrice]] = NotifiedCache(size=1024, in_transactions=True)


def model_price_overrides_kept(*, workspace_id: int) -> dict[str, pricing.ModelPrice]:
    """`model_price_overrides`, kept per process; shared by every caller: read it, do not change it."""
    return _price_overrides.get(workspace_id, functools.partial(model_price_overrides, workspace_id=workspace_id))
