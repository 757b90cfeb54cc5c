"""Triage's REST API: an agent's triage settings, review samples and decisions, informativeness per
sampling strategy, and a trajectory as OTLP/JSON with its signals as span events."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from django.http import HttpRequest
from django.utils import timezone
from ninja import Field, Query, Router, Schema, Status

from agent_registry import selectors as registry_selectors
from agent_registry.auth import key_auth, request_agent_ids, request_api_key, request_workspace
from agent_registry.models import Scope
from agent_registry.schemas import error_responses
from config.errors import PermissionDenied
from tracing import otlp_export, sampling, selectors, signals, triage, triage_config
from tracing.models import ReviewItem, ReviewSample, TriageSettings
from tracing.steps import trajectory_view_build

router = Router(tags=["triage"])

READ = key_auth(Scope.READ)
WRITE = key_auth(Scope.WRITE)
ERRORS = error_responses()


# --- Triage settings ------------------------------------------------------------------------------------


class PhraseListIn(Schema):
    mode: Literal["extend", "replace"]
    phrases: list[str] = Field(max_length=triage_config.MAX_PHRASES_PER_LIST)


class TriageSettingsIn(Schema):
    language: str = Field("en", min_length=1, max_length=16)
    phrases: dict[str, dict[str, PhraseListIn]] = Field(
        default_factory=dict,
        description='language -> list name -> {"mode": "extend" | "replace", "phrases": [...]}; '
        "list names are the fields of tracing.signals.PhraseLists (docs/triage.md)",
    )
    weights: dict[str, float] = Field(default_factory=dict, description="signal -> weight in [-1, 1]")
    thresholds: dict[str, float] = Field(default_factory=dict, description="see `adjustable_thresholds`")
    limits: dict[str, int | None] = Field(
        default_factory=dict, description="context_window_tokens, max_output_tokens, token_budget"
    )
    handoff_tools: list[str] = Field(default_factory=list, description="tools that hand over to a person")
    review_budget_per_day: int = Field(0, ge=0, le=triage.MAX_SAMPLE_BUDGET)
    review_strategies: list[str] = Field(default_factory=list)


class TriageSettingsOut(Schema):
    agent: str
    language: str
    phrases: dict[str, Any]
    weights: dict[str, float]
    thresholds: dict[str, float]
    limits: dict[str, int | None]
    handoff_tools: list[str]
    review_budget_per_day: int
    review_strategies: list[str]
    updated_at: datetime | None
    effective_weights: dict[str, float]
    effective_thresholds: dict[str, float]
    adjustable_thresholds: dict[str, str]
    recomputing: int = Field(0, description="trajectories whose signals are being recomputed after this change")


def _settings_out(settings_row: TriageSettings, recomputing: int = 0) -> dict[str, Any]:
    config = triage_config.signal_config_build(
        signals.DEFAULT_CONFIG, weights=settings_row.weights, thresholds=settings_row.thresholds
    )
    return {
        "agent": settings_row.agent.slug,
        "language": settings_row.language,
        "phrases": settings_row.phrases,
        "weights": settings_row.weights,
        "thresholds": settings_row.thresholds,
        "limits": settings_row.limits,
        "handoff_tools": settings_row.handoff_tools,
        "review_budget_per_day": settings_row.review_budget_per_day,
        "review_strategies": settings_row.review_strategies,
        "updated_at": settings_row.updated_at if settings_row.pk else None,
        "effective_weights": dict(config.weights),
        "effective_thresholds": {name: getattr(config.thresholds, name) for name in triage_config.EXPOSED_THRESHOLDS},
        "adjustable_thresholds": dict(triage_config.THRESHOLD_HELP),
        "recomputing": recomputing,
    }


@router.get("/agents/{slug}/triage-settings", auth=READ, response={200: TriageSettingsOut, **ERRORS})
def triage_settings_get_api(request: HttpRequest, slug: str) -> Any:
    """The agent's triage settings (what it changed from the defaults) and the effective weights and thresholds."""
    agent = registry_selectors.agent_get(
        workspace=request_workspace(request), slug=slug, agent_ids=request_agent_ids(request)
    )
    return _settings_out(triage.triage_settings_get(agent=agent))


@router.put("/agents/{slug}/triage-settings", auth=WRITE, response={200: TriageSettingsOut, **ERRORS})
def triage_settings_update_api(request: HttpRequest, slug: str, payload: TriageSettingsIn) -> Any:
    """Replace the agent's triage settings. A change to phrases, language, weights, thresholds, limits or
    hand-off tools recomputes the signals of the agent's trajectories in the background."""
    agent = registry_selectors.agent_get(
        workspace=request_workspace(request), slug=slug, agent_ids=request_agent_ids(request)
    )
    saved = triage.triage_settings_update(
        agent=agent,
        language=payload.language,
        phrases={
            code: {name: entry.dict() for name, entry in lists.items()} for code, lists in payload.phrases.items()
        },
        weights=payload.weights,
        thresholds=payload.thresholds,
        limits=payload.limits,
        handoff_tools=payload.handoff_tools,
        review_budget_per_day=payload.review_budget_per_day,
        review_strategies=payload.review_strategies,
    )
    return _settings_out(saved.settings, saved.recomputing)


# --- Review samples -------------------------------------------------------------------------------------


class ReviewSampleIn(Schema):
    strategy: Literal["signal", "random", "length", "stratified_agent", "stratified_score"]
    budget: int = Field(20, ge=1, le=triage.MAX_SAMPLE_BUDGET)
    agent: str | None = Field(None, description="an agent's slug; none: every agent of the workspace")
    window_start: datetime | None = Field(None, description="default: `hours` before window_end")
    window_end: datetime | None = Field(None, description="default: now")
    hours: int = Field(24, ge=1, le=24 * 90)
    allow_repeats: bool = Field(False, description="draw trajectories this queue already drew")


class ReviewItemOut(Schema):
    id: int
    position: int
    trace_id: str
    agent: str | None
    status: Literal["pending", "reviewed", "skipped"]
    triage_score: float
    signal_names: list[str]
    informative: bool | None
    failure_mode: str
    note: str
    reviewed_at: datetime | None


class ReviewSampleOut(Schema):
    id: int
    strategy: str
    source: str
    agent: str | None
    window_start: datetime
    window_end: datetime
    budget: int
    allow_repeats: bool
    created_at: datetime
    item_count: int
    reviewed_count: int
    skipped_count: int
    informative_count: int


class ReviewSampleDetailOut(ReviewSampleOut):
    items: list[ReviewItemOut]


class ReviewDecisionIn(Schema):
    status: Literal["reviewed", "skipped"] = "reviewed"
    informative: bool | None = None
    failure_mode: str = Field("", max_length=40, description="one of GET /review/failure-modes, or empty")
    note: str = Field("", max_length=10_000)


class FailureModeOut(Schema):
    value: str
    label: str
    source: Literal["framework", "signal", "other"]


class InformativenessOut(Schema):
    strategy: str
    label: str
    reviewed: int
    informative: int
    share: float | None
    ci_low: float = Field(description="95% Wilson interval, lower bound")
    ci_high: float


class AgentInformativenessOut(Schema):
    agent: str | None
    strategies: list[InformativenessOut]


class ComparisonOut(Schema):
    signal: InformativenessOut
    random: InformativenessOut
    lift: float | None = Field(description="signal share / random share (the paper: 0.82 / 0.54 = 1.52)")
    verdict: Literal["needs_reviews", "signal_better", "random_better", "undecided"]


class InformativenessReportOut(Schema):
    overall: list[InformativenessOut]
    by_agent: list[AgentInformativenessOut]
    signal_vs_random: ComparisonOut


def _item_out(item: ReviewItem) -> dict[str, Any]:
    return {
        "id": item.pk,
        "position": item.position,
        "trace_id": item.trajectory.trace_id,
        "agent": item.trajectory.agent.slug if item.trajectory.agent else None,
        "status": item.status,
        "triage_score": item.triage_score,
        "signal_names": item.signal_names,
        "informative": item.informative,
        "failure_mode": item.failure_mode,
        "note": item.note,
        "reviewed_at": item.reviewed_at,
    }


def _sample_out(sample: ReviewSample) -> dict[str, Any]:
    return {
        "id": sample.pk,
        "strategy": sample.strategy,
        "source": sample.source,
        "agent": sample.agent.slug if sample.agent else None,
        "window_start": sample.window_start,
        "window_end": sample.window_end,
        "budget": sample.budget,
        "allow_repeats": sample.allow_repeats,
        "created_at": sample.created_at,
        "item_count": getattr(sample, "item_count", 0),
        "reviewed_count": getattr(sample, "reviewed_count", 0),
        "skipped_count": getattr(sample, "skipped_count", 0),
        "informative_count": getattr(sample, "informative_count", 0),
    }


def _informativeness_out(row: sampling.Informativeness) -> dict[str, Any]:
    return {
        "strategy": row.strategy,
        "label": row.label,
        "reviewed": row.reviewed,
        "informative": row.informative,
        "share": row.share,
        "ci_low": row.low,
        "ci_high": row.high,
    }


def _utc(moment: datetime) -> datetime:
    # A time without an offset is UTC, as everywhere in Keel; comparing it with one that has an offset
    # (the default window end, now) would raise.
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


@router.get("/review/samples", auth=READ, response={200: list[ReviewSampleOut], **ERRORS})
def review_sample_list_api(request: HttpRequest) -> Any:
    samples = triage.review_sample_list(workspace=request_workspace(request), agent_ids=request_agent_ids(request))
    return [_sample_out(sample) for sample in samples]


@router.post("/review/samples", auth=WRITE, response={201: ReviewSampleDetailOut, **ERRORS})
def review_sample_create_api(request: HttpRequest, payload: ReviewSampleIn) -> Any:
    """Draw a review queue from a time window by one strategy. A key limited to some agents must name one."""
    workspace = request_workspace(request)
    agent_ids = request_agent_ids(request)
    agent = None
    if payload.agent:
        agent = registry_selectors.agent_get(workspace=workspace, slug=payload.agent, agent_ids=agent_ids)
    elif agent_ids is not None:
        raise PermissionDenied("this key is limited to some agents: name one in `agent`")
    window_end = _utc(payload.window_end) if payload.window_end is not None else timezone.now()
    window_start = _utc(payload.window_start) if payload.window_start is not None else None
    window_start = window_start or window_end - timedelta(hours=payload.hours)
    sample = triage.review_sample_create(
        workspace=workspace,
        agent=agent,
        strategy=payload.strategy,
        window_start=window_start,
        window_end=window_end,
        budget=payload.budget,
        allow_repeats=payload.allow_repeats,
        created_via_key=request_api_key(request),
    )
    found = triage.review_sample_get(workspace=workspace, sample_id=sample.pk, agent_ids=agent_ids)
    items = [_item_out(item) for item in triage.review_item_list(sample=found)]
    return Status(201, {**_sample_out(found), "items": items})


@router.get("/review/samples/{sample_id}", auth=READ, response={200: ReviewSampleDetailOut, **ERRORS})
def review_sample_get_api(request: HttpRequest, sample_id: int) -> Any:
    sample = triage.review_sample_get(
        workspace=request_workspace(request), sample_id=sample_id, agent_ids=request_agent_ids(request)
    )
    return {**_sample_out(sample), "items": [_item_out(item) for item in triage.review_item_list(sample=sample)]}


@router.put("/review/items/{item_id}", auth=WRITE, response={200: ReviewItemOut, **ERRORS})
def review_item_decide_api(request: HttpRequest, item_id: int, payload: ReviewDecisionIn) -> Any:
    """Record a decision about one item of a sample: informative or not, a failure mode, a note; or skip it."""
    item = triage.review_item_get_by_id(
        workspace=request_workspace(request), item_id=item_id, agent_ids=request_agent_ids(request)
    )
    decided = triage.review_item_decide(
        item=item,
        status=payload.status,
        informative=payload.informative,
        failure_mode=payload.failure_mode,
        note=payload.note,
        reviewed_via_key=request_api_key(request),
    )
    decided.trajectory = item.trajectory
    return _item_out(decided)


@router.get("/review/failure-modes", auth=READ, response={200: list[FailureModeOut], **ERRORS})
def review_failure_mode_list_api(request: HttpRequest) -> Any:
    """The failure modes a reviewer picks from: the framework's taxonomy, then Keel's problem signals."""
    return [
        {
            "value": value,
            "label": label,
            "source": "framework"
            if value in sampling.FRAMEWORK_FAILURE_MODES
            else "signal"
            if value in sampling.SIGNAL_FAILURE_MODES
            else "other",
        }
        for value, label in sampling.FAILURE_MODES.items()
    ]


class InformativenessQuery(Schema):
    agent: str | None = None
    since: datetime | None = Field(None, description="only decisions made at or after this time")


@router.get("/review/informativeness", auth=READ, response={200: InformativenessReportOut, **ERRORS})
def review_informativeness_api(request: HttpRequest, query: Query[InformativenessQuery]) -> Any:
    """Per sampling strategy, the share of reviewed trajectories marked informative, with a 95% Wilson
    interval, overall and per agent; and signal-based against random sampling (the Signals paper's
    measurement, on this workspace's reviews)."""
    workspace = request_workspace(request)
    agent_ids = request_agent_ids(request)
    agent = (
        registry_selectors.agent_get(workspace=workspace, slug=query.agent, agent_ids=agent_ids)
        if query.agent
        else None
    )
    since = _utc(query.since) if query.since is not None else None
    report = triage.review_informativeness(workspace=workspace, agent_ids=agent_ids, agent=agent, since=since)
    comparison = report.comparison
    return {
        "overall": [_informativeness_out(row) for row in report.overall],
        "by_agent": [
            {
                "agent": entry.agent.slug if entry.agent else None,
                "strategies": [_informativeness_out(row) for row in entry.rows],
            }
            for entry in report.by_agent
        ],
        "signal_vs_random": {
            "signal": _informativeness_out(comparison.signal),
            "random": _informativeness_out(comparison.random),
            "lift": comparison.lift,
            "verdict": comparison.verdict,
        },
    }


# --- OTLP export ----------------------------------------------------------------------------------------


@router.get("/trajectories/{trace_id}/otlp", auth=READ, response={200: dict[str, Any], **ERRORS})
def trajectory_otlp_api(request: HttpRequest, trace_id: str) -> Any:
    """The trajectory as an OTLP/JSON export request (POST it to any OTLP/HTTP endpoint): its spans, and
    its triage signals as events `signal.<name>` on the root span (docs/triage.md)."""
    trajectory = selectors.trajectory_get(
        workspace=request_workspace(request), trace_id=trace_id, agent_ids=request_agent_ids(request)
    )
    spans = selectors.trajectory_spans(trajectory=trajectory)
    view = trajectory_view_build(spans, trace_id=trajectory.trace_id)
    return otlp_export.trajectory_otlp_json(
        spans,
        view.steps,
        signals=trajectory.signals,
        signal_names=trajectory.signal_names,
        triage_score=trajectory.triage_score,
    )
