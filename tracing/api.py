"""Tracing's REST API: JSON trajectory ingest, the trajectory list and detail, scores, sessions, prices.

OTLP ingest itself is `tracing.otlp_api.traces_ingest_api` (a plain Django view: raw bytes in).
"""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime
from decimal import Decimal
from typing import Annotated, Any, Literal

import orjson
from django.core.serializers.json import DjangoJSONEncoder
from django.http import HttpRequest, HttpResponse
from ninja import Body, Field, Query, Router, Schema, Status
from pydantic import PlainSerializer

from agent_registry import selectors as registry_selectors
from agent_registry.auth import key_auth, request_agent_ids, request_api_key, request_workspace
from agent_registry.models import Scope
from agent_registry.schemas import ErrorOut, error_responses
from tracing import replay, selectors, services, signals
from tracing.exceptions import TrajectoryListInvalid
from tracing.models import Replay, Score, Trajectory

router = Router(tags=["tracing"])

READ = key_auth(Scope.READ)
WRITE = key_auth(Scope.WRITE)
INGEST = key_auth(Scope.INGEST)
ERRORS = error_responses(503)


_USD_PLACES = Decimal("0.00000001")  # as the cost columns keep them


def _fixed_point(amount: Decimal | int) -> str:
    """An amount as a plain decimal string with the columns' eight places: Decimal's own str writes a zero
    cost as "0E-8", and a sum over no priced rows comes as the integer 0."""
    return format(Decimal(amount).quantize(_USD_PLACES), "f")


# US dollars as the API writes them: a decimal string with the column's eight places.
Usd = Annotated[Decimal, PlainSerializer(_fixed_point, return_type=str)]


class ScoreOut(Schema):
    id: int
    name: str
    data_type: str
    value: float | None
    string_value: str
    span_id: str
    source: str
    comment: str
    created_at: datetime


class TrajectoryOut(Schema):
    trace_id: str
    agent: str | None
    name: str
    status: str
    started_at: datetime
    ended_at: datetime
    latency_ms: float
    steps: int
    spans: int
    llm_calls: int
    tool_calls: int
    errors: int
    tokens: dict[str, int]
    cost: Usd | None = Field(
        description="USD of the priced model calls; null when none of them was priced (see unpriced_calls)"
    )
    unpriced_calls: int = Field(
        description="model calls with no cost: the span reported none and no price (litellm's or the workspace's) "
        "covered its model when it was stored; they are not in `cost`"
    )
    unpriced_models: list[str] = Field(description="the models those calls named")
    session_id: str
    user_id: str
    tags: list[str]
    input_preview: str
    output_preview: str
    scores: list[ScoreOut]
    signals: list[dict[str, Any]]
    triage_score: float
    replay_of: str | None


class TrajectoryPageOut(Schema):
    items: list[TrajectoryOut]
    next_cursor: str | None


class TrajectoryDetailOut(TrajectoryOut):
    prompt_versions: list[dict[str, Any]]
    step_details: list[dict[str, Any]]
    conversation: list[dict[str, Any]]
    tool_calls_detail: list[dict[str, Any]]
    tool_definitions: list[dict[str, Any]]
    metadata: dict[str, Any]
    task_id: str
    reward: float | None
    signal_errors: list[dict[str, str]] = Field(
        description="detectors that failed on this trajectory ({detector, message}); the other signals still ran"
    )


class TrajectoryListQuery(Schema):
    agent: str | None = None
    started_after: datetime | None = None
    started_before: datetime | None = None
    status: Literal["ok", "error", "running"] | None = None
    tag: str | None = None
    session_id: str | None = None
    user_id: str | None = None
    prompt: str | None = Field(None, description="prompt name, or name:version")
    score: str | None = Field(None, description="score name, optionally with a range: name>=0.5, name<=0.2")
    search: str | None = None
    signal: str | None = Field(None, description="only trajectories where this triage signal fired, e.g. loop")
    order: str = Field(
        "-started_at", description="started_at, cost, latency, steps, tokens, triage_score; '-' for descending"
    )
    limit: int = Field(50, ge=1, le=500)
    cursor: str | None = None


class ScoreIn(Schema):
    name: str = Field(min_length=1, max_length=200)
    data_type: Literal["numeric", "boolean", "categorical", "correction"] = "numeric"
    value: float | bool | None = None
    string_value: str = Field("", max_length=100_000)
    span_id: str = Field("", max_length=16)
    comment: str = Field("", max_length=10_000)


class IngestOut(Schema):
    accepted_spans: int
    trace_ids: list[str]


class SessionOut(Schema):
    session_id: str
    trajectory_count: int
    started_at: datetime
    ended_at: datetime
    total_tokens: int
    cost_usd: Usd | None = Field(description="the sum of its trajectories' costs; null when nothing was priced")
    error_count: int
    user_id: str
    unpriced_calls: int = Field(description="model calls of its trajectories with no cost, not in `cost_usd`")
    unpriced_models: list[str] = Field(description="the models those calls named (at most 20)")


class SessionDetailOut(Schema):
    session_id: str
    trajectories: list[TrajectoryOut]


class ModelPriceIn(Schema):
    model: str = Field(min_length=1, max_length=300)
    input_usd_per_million: Decimal = Field(ge=0, max_digits=12, decimal_places=6)
    output_usd_per_million: Decimal = Field(ge=0, max_digits=12, decimal_places=6)
    cache_read_usd_per_million: Decimal | None = Field(None, ge=0, max_digits=12, decimal_places=6)


class ModelPriceOut(Schema):
    model: str
    input_usd_per_million: Decimal
    output_usd_per_million: Decimal
    cache_read_usd_per_million: Decimal | None


def _score_out(score: Score) -> dict[str, Any]:
    return {
        "id": score.pk,
        "name": score.name,
        "data_type": score.data_type,
        "value": score.value,
        "string_value": score.string_value,
        "span_id": score.span_id,
        "source": score.source,
        "comment": score.comment,
        "created_at": score.created_at,
    }


def _trajectory_out(trajectory: Trajectory) -> dict[str, Any]:
    return {
        "trace_id": trajectory.trace_id,
        "agent": trajectory.agent.slug if trajectory.agent else None,
        "name": trajectory.name,
        "status": trajectory.status,
        "started_at": trajectory.started_at,
        "ended_at": trajectory.ended_at,
        "latency_ms": trajectory.latency_ms,
        "steps": trajectory.step_count,
        "spans": trajectory.span_count,
        "llm_calls": trajectory.llm_call_count,
        "tool_calls": trajectory.tool_call_count,
        "errors": trajectory.error_count,
        "tokens": {
            "input": trajectory.input_tokens,
            "output": trajectory.output_tokens,
            "total": trajectory.total_tokens,
        },
        "cost": trajectory.cost_usd,
        "unpriced_calls": trajectory.unpriced_call_count,
        "unpriced_models": trajectory.unpriced_models,
        "session_id": trajectory.session_id,
        "user_id": trajectory.user_id,
        "tags": trajectory.tags,
        "input_preview": trajectory.input_preview,
        "output_preview": trajectory.output_preview,
        "scores": [_score_out(score) for score in trajectory.scores.all()],
        "signals": trajectory.signals,
        "triage_score": trajectory.triage_score,
        "replay_of": trajectory.replay_of.trace_id if trajectory.replay_of else None,
    }


_LIST_ENCODER = DjangoJSONEncoder()  # how Ninja renders the list's times


def _head_value(value: Any) -> Any:
    """Times and amounts in the detail as the list writes them."""
    if isinstance(value, Decimal):
        return _fixed_point(value)
    if isinstance(value, datetime):
        return _LIST_ENCODER.default(value)
    return str(value)


def _detail_head(trajectory: Trajectory) -> dict[str, Any]:
    """The detail's fields besides the steps, conversation, tool calls and tool definitions."""
    return {
        **_trajectory_out(trajectory),
        "prompt_versions": selectors.trajectory_prompt_versions(trajectory=trajectory),
        "metadata": trajectory.metadata,
        "task_id": trajectory.task_id,
        "reward": trajectory.reward,
        "signal_errors": trajectory.signal_errors,
    }


def _score_filter(raw: str | None) -> tuple[str | None, float | None, float | None]:
    if not raw:
        return None, None, None
    for operator in (">=", "<="):
        if operator in raw:
            name, _, number = raw.partition(operator)
            try:
                bound = float(number)
            except ValueError:
                raise TrajectoryListInvalid(f"score filter {raw!r}: {number!r} is not a number") from None
            return (name.strip(), bound, None) if operator == ">=" else (name.strip(), None, bound)
    return raw.strip(), None, None


@router.post("/ingest/trajectories", auth=INGEST, response={202: IngestOut, **ERRORS})
def trajectories_ingest_api(request: HttpRequest, payload: Body[dict[str, Any] | list[Any]]) -> Any:
    """Plain JSON ingest: one trajectory (OpenAI-style messages with tool calls and results), a list, or
    `{"trajectories": [...]}`; stored before the answer, processed by a worker within seconds."""
    accepted, trace_ids = services.ingest_trajectories_accept(api_key=request_api_key(request), payload=payload)
    return Status(202, {"accepted_spans": accepted.accepted_spans, "trace_ids": trace_ids})


@router.get("/trajectories", auth=READ, response={200: TrajectoryPageOut, **ERRORS})
def trajectory_list_api(request: HttpRequest, query: Query[TrajectoryListQuery]) -> Any:
    workspace = request_workspace(request)
    agent_ids = request_agent_ids(request)
    agent_id = None
    if query.agent:
        agent_id = registry_selectors.agent_get(workspace=workspace, slug=query.agent, agent_ids=agent_ids).pk
    prompt_name, prompt_version = None, None
    if query.prompt:
        # A prompt name may itself hold ':' (agent_registry allows it): only a number after the last
        # one is a version; otherwise the whole value is the name.
        name, _, version = query.prompt.rpartition(":")
        if name and version.isdigit():
            prompt_name, prompt_version = name, int(version)
        else:
            prompt_name = query.prompt
    score_name, score_min, score_max = _score_filter(query.score)
    if query.signal and query.signal not in signals.SIGNAL_NAMES:
        # A misspelt signal ("loops") would otherwise answer an empty list, as if nothing had fired.
        raise TrajectoryListInvalid(f"signal must be one of {', '.join(signals.SIGNAL_NAMES)}")
    page = selectors.trajectory_list(
        workspace=workspace,
        agent_ids=agent_ids,
        filters=selectors.TrajectoryFilter(
            agent_id=agent_id,
            started_after=query.started_after,
            started_before=query.started_before,
            status=query.status,
            tag=query.tag,
            session_id=query.session_id,
            user_id=query.user_id,
            prompt_name=prompt_name,
            prompt_version=prompt_version,
            score_name=score_name,
            score_min=score_min,
            score_max=score_max,
            search=query.search,
            signal=query.signal,
        ),
        order=query.order,
        limit=query.limit,
        cursor=query.cursor,
    )
    return {"items": [_trajectory_out(t) for t in page.items], "next_cursor": page.next_cursor}


@router.get("/trajectories/{trace_id}", auth=READ, response={200: TrajectoryDetailOut, **ERRORS})
def trajectory_get_api(request: HttpRequest, trace_id: str, include_inputs: bool = False) -> Any:
    """One trajectory with all its steps (messages, LLM calls, tool calls as a tree), conversation and scores.

    Each LLM call lists only the input messages it added; `include_inputs=true` gives every call's full
    input (large for long trajectories).
    """
    trajectory = selectors.trajectory_get(
        workspace=request_workspace(request), trace_id=trace_id, agent_ids=request_agent_ids(request)
    )
    document = selectors.trajectory_view_document(trajectory=trajectory, full=include_inputs)
    head = _detail_head(trajectory)
    # Serialized here with orjson: the schema above documents the shape, and validating a body of
    # thousands of nested messages through pydantic again would cost more than building it.
    try:
        head_json = orjson.dumps(head, default=_head_value, option=orjson.OPT_PASSTHROUGH_DATETIME)
    except TypeError:
        # An integer past 64 bits, which orjson refuses: a float as large (2e19) in the metadata comes
        # back from PostgreSQL's jsonb as an integer. The standard library writes any integer.
        head_json = json.dumps(head, default=_head_value).encode()
    # Both are JSON objects with keys of their own: the document's members join the head's as they are,
    # so a long trajectory's stored steps are never parsed and written again.
    return HttpResponse(head_json[:-1] + b"," + document[1:], content_type="application/json")


@router.get("/trajectories/{trace_id}/scores", auth=READ, response={200: list[ScoreOut], **ERRORS})
def trajectory_score_list_api(request: HttpRequest, trace_id: str) -> Any:
    trajectory = selectors.trajectory_get(
        workspace=request_workspace(request), trace_id=trace_id, agent_ids=request_agent_ids(request)
    )
    return [_score_out(score) for score in trajectory.scores.order_by("created_at")]


@router.post("/trajectories/{trace_id}/scores", auth=WRITE, response={201: ScoreOut, **ERRORS})
def score_create_api(request: HttpRequest, trace_id: str, payload: ScoreIn) -> Any:
    trajectory = selectors.trajectory_get(
        workspace=request_workspace(request), trace_id=trace_id, agent_ids=request_agent_ids(request)
    )
    score = services.score_create(
        trajectory=trajectory,
        name=payload.name,
        data_type=payload.data_type,
        value=payload.value,
        string_value=payload.string_value,
        # OpenTelemetry ids are hex, case-insensitive; spans are stored with lower-case ids.
        span_id=payload.span_id.strip().lower(),
        comment=payload.comment,
        created_via_key=request_api_key(request),
    )
    return Status(201, _score_out(score))


@router.get("/sessions", auth=READ, response={200: list[SessionOut], **ERRORS})
def session_list_api(request: HttpRequest, response: HttpResponse, limit: int = 50, cursor: str = "") -> Any:
    """The most recently active sessions. The list stays a plain array; when more follow, the answer's
    `X-Next-Cursor` header (and a `Link` header, rel="next") gives the next page's `cursor`."""
    page = selectors.session_list(
        workspace=request_workspace(request),
        agent_ids=request_agent_ids(request),
        limit=min(max(limit, 1), 500),
        cursor=cursor or None,
    )
    if page.next_cursor:
        following = request.GET.copy()
        following["cursor"] = page.next_cursor
        response["X-Next-Cursor"] = page.next_cursor
        response["Link"] = f'<{request.path}?{following.urlencode()}>; rel="next"'
    return [dataclasses.asdict(session) for session in page.items]


@router.get("/sessions/{path:session_id}", auth=READ, response={200: SessionDetailOut, **ERRORS})
def session_get_api(request: HttpRequest, session_id: str) -> Any:
    trajectories = selectors.session_trajectories(
        workspace=request_workspace(request), session_id=session_id, agent_ids=request_agent_ids(request)
    )
    return {"session_id": session_id, "trajectories": [_trajectory_out(t) for t in trajectories]}


@router.get("/model-prices", auth=READ, response={200: list[ModelPriceOut], **ERRORS})
def model_price_list_api(request: HttpRequest) -> Any:
    return [
        {
            "model": price.model,
            "input_usd_per_million": price.input_usd_per_million,
            "output_usd_per_million": price.output_usd_per_million,
            "cache_read_usd_per_million": price.cache_read_usd_per_million,
        }
        for price in selectors.model_price_list(workspace=request_workspace(request))
    ]


@router.delete("/model-prices/{path:model}", auth=WRITE, response={204: None, **ERRORS})
def model_price_delete_api(request: HttpRequest, model: str) -> Any:
    """Remove the workspace's price for a model; litellm's price map prices its new spans again."""
    services.model_price_delete(
        workspace=request_workspace(request), model=model, deleted_via_key=request_api_key(request)
    )
    return Status(204, None)


@router.put("/model-prices", auth=WRITE, response={200: ModelPriceOut, **ERRORS})
def model_price_set_api(request: HttpRequest, payload: ModelPriceIn) -> Any:
    """Set the workspace's price for a model (USD per million tokens); it wins over litellm's price map."""
    price = services.model_price_set(
        workspace=request_workspace(request),
        model=payload.model,
        input_usd_per_million=payload.input_usd_per_million,
        output_usd_per_million=payload.output_usd_per_million,
        cache_read_usd_per_million=payload.cache_read_usd_per_million,
        set_via_key=request_api_key(request),
    )
    return {
        "model": price.model,
        "input_usd_per_million": price.input_usd_per_million,
        "output_usd_per_million": price.output_usd_per_million,
        "cache_read_usd_per_million": price.cache_read_usd_per_million,
    }


# --- Replays ----------------------------------------------------------------------------------------

REPLAY_ERRORS: dict[int, type[Schema]] = {**ERRORS, 409: ErrorOut}


# The numbers are strict: JSON `true` or "3" for a step is a mistake to report, not step 1 or 3.
class ReplayPromptVersionIn(Schema):
    name: str = Field(min_length=1, max_length=200)
    version: int = Field(ge=1, strict=True)


class ReplayIn(Schema):
    from_step: int = Field(
        ge=0,
        strict=True,
        description="a step index of the original; the replay re-makes the first model call at or after it",
    )
    prompt_version: ReplayPromptVersionIn | None = Field(
        None, description="its rendered system prompt replaces the recorded one; null keeps the recorded prompt"
    )
    model: str | None = Field(
        None,
        min_length=1,
        max_length=300,
        description="a model target's alias, or a litellm model string; null: the recorded model",
    )
    divergence: Literal["stop", "stub"] = Field(
        "stop", description="at a tool call with no recorded match: stop there, or serve a stub result and go on"
    )
    stub_result: Any = Field(None, description='the result served at a divergence under "stub"; null: a generic stub')
    max_steps: int = Field(
        replay.DEFAULT_MAX_STEPS, ge=1, le=replay.MAX_STEPS_LIMIT, strict=True, description="model calls at most"
    )


class ReplayProgressOut(Schema):
    steps_done: int
    steps_planned: int


class ReplayDivergenceOut(Schema):
    step: int | None
    tool_name: str
    arguments: Any


class ReplayPromptVersionOut(Schema):
    name: str
    version: int


class ReplayOut(Schema):
    id: int
    status: Literal["pending", "running", "done", "stopped_divergence", "failed"]
    original_trace_id: str
    replay_trace_id: str | None
    from_step: int
    prompt_version: ReplayPromptVersionOut | None
    model: str
    divergence_policy: Literal["stop", "stub"]
    stub_result: Any
    max_steps: int
    progress: ReplayProgressOut
    divergence: ReplayDivergenceOut | None
    error: str
    attempts: int
    created_at: datetime
    claimed_at: datetime | None
    finished_at: datetime | None


class ReplayFieldChangeOut(Schema):
    field: str
    original: Any
    replay: Any


class ReplayStepPairOut(Schema):
    status: Literal["same", "changed", "only_in_original", "only_in_replay"]
    replayed: bool
    original_index: int | None
    replay_index: int | None
    kind: str
    label: str
    changes: list[ReplayFieldChangeOut]


class ReplaySideTotalsOut(Schema):
    steps: int
    llm_calls: int
    tool_calls: int
    errors: int
    input_tokens: int
    output_tokens: int
    total_tokens: int
    cost_usd: float | None
    latency_ms: float


class ReplayTotalsOut(Schema):
    original: ReplaySideTotalsOut
    replay: ReplaySideTotalsOut


class ReplayDiffOut(Schema):
    replay_id: int
    original_trace_id: str
    replay_trace_id: str
    from_step: int
    original_start: int | None
    replay_start: int | None
    first_difference: int | None = Field(description="the position in `steps` where the replayed part first differs")
    steps: list[ReplayStepPairOut]
    totals: ReplayTotalsOut
    replayed_totals: ReplayTotalsOut


def _replay_out(found: Replay) -> dict[str, Any]:
    version = found.prompt_version
    diverged = bool(found.divergence_tool_name)
    return {
        "id": found.pk,
        "status": found.status,
        "original_trace_id": found.original.trace_id,
        "replay_trace_id": found.replay_trajectory.trace_id if found.replay_trajectory else None,
        "from_step": found.from_step,
        "prompt_version": {"name": version.prompt.name, "version": version.version} if version else None,
        "model": found.model,
        "divergence_policy": found.divergence_policy,
        "stub_result": found.stub_result,
        "max_steps": found.max_steps,
        "progress": {"steps_done": found.steps_done, "steps_planned": found.steps_planned},
        "divergence": (
            {
                "step": found.divergence_step,
                "tool_name": found.divergence_tool_name,
                "arguments": found.divergence_arguments,
            }
            if diverged
            else None
        ),
        "error": found.error,
        "attempts": found.attempts,
        "created_at": found.created_at,
        "claimed_at": found.claimed_at,
        "finished_at": found.finished_at,
    }


@router.post("/trajectories/{trace_id}/replays", auth=WRITE, response={202: ReplayOut, **REPLAY_ERRORS})
def replay_create_api(request: HttpRequest, trace_id: str, payload: ReplayIn) -> Any:
    """Re-run a finished trajectory from one of its steps with another prompt version and/or model. Tool
    calls are served from the recording; a worker runs it: poll `GET /api/v1/replays/{id}`."""
    workspace = request_workspace(request)
    agent_ids = request_agent_ids(request)
    original = selectors.trajectory_get(workspace=workspace, trace_id=trace_id, agent_ids=agent_ids)
    prompt_version = None
    if payload.prompt_version is not None:
        prompt_version = registry_selectors.prompt_version_resolve(
            workspace=workspace,
            name=payload.prompt_version.name,
            version=payload.prompt_version.version,
            agent_ids=agent_ids,
        )
    created = replay.replay_create(
        original=original,
        from_step=payload.from_step,
        prompt_version=prompt_version,
        model=payload.model or "",
        divergence_policy=payload.divergence,
        stub_result=payload.stub_result,
        max_steps=payload.max_steps,
        created_via_key=request_api_key(request),
    )
    return Status(202, _replay_out(created))


@router.get("/trajectories/{trace_id}/replays", auth=READ, response={200: list[ReplayOut], **ERRORS})
def replay_list_api(request: HttpRequest, trace_id: str) -> Any:
    original = selectors.trajectory_get(
        workspace=request_workspace(request), trace_id=trace_id, agent_ids=request_agent_ids(request)
    )
    return [_replay_out(found) for found in selectors.replay_list(trajectory=original)]


@router.get("/replays/{replay_id}", auth=READ, response={200: ReplayOut, **ERRORS})
def replay_get_api(request: HttpRequest, replay_id: int) -> Any:
    """A replay's status, progress (model calls done / planned), divergence and new trace id."""
    found = selectors.replay_get(
        workspace=request_workspace(request), replay_id=replay_id, agent_ids=request_agent_ids(request)
    )
    return _replay_out(found)


@router.get("/replays/{replay_id}/diff", auth=READ, response={200: ReplayDiffOut, **REPLAY_ERRORS})
def replay_diff_api(request: HttpRequest, replay_id: int) -> Any:
    """Where a finished replay parts from its original: the steps side by side, and the totals."""
    found = selectors.replay_get(
        workspace=request_workspace(request), replay_id=replay_id, agent_ids=request_agent_ids(request)
    )
    diff = selectors.replay_diff_get(replay=found)
    return {
        "replay_id": found.pk,
        "original_trace_id": found.original.trace_id,
        "replay_trace_id": found.replay_trajectory.trace_id if found.replay_trajectory else "",
        **dataclasses.asdict(diff),
    }
