"""The plain JSON trajectory format, for agents without OpenTelemetry. Pure module, no Django.

A trajectory is OpenAI-style messages with tool calls and tool results, plus optional reward and
metadata. It becomes the same spans an instrumented agent would send: an `agent` root span (its input
is every message, its output the last answer), one `generation` span per assistant message (its input
is the conversation so far), and one `tool` span per tool result. Ids are derived from the trajectory,
so posting the same trajectory twice stores it once.

    {
      "trace_id": "optional 32 hex chars; derived from the content when absent",
      "name": "refund request", "agent": "ride-support", "session_id": "...", "user_id": "...",
      "started_at": "2026-11-22T10:00:00Z" or 1763805600.0, "model": "gpt-4o",
      "tags": ["demo"], "metadata": {"channel": "app"}, "task_id": "...", "reward": 1.0,
      "tools": [{"type": "function", "function": {"name": "lookup_trip", "parameters": {...}}}],
      "messages": [
        {"role": "system", "content": "..."},
        {"role": "user", "content": "I was charged twice"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
          "function": {"name": "lookup_trip", "arguments": "{\\"trip_id\\": \\"T1\\"}"}}],
         "usage": {"input_tokens": 120, "output_tokens": 18}, "duration_ms": 850},
        {"role": "tool", "tool_call_id": "c1", "content": "{\\"status\\": \\"cancelled\\"}", "duration_ms": 40},
        {"role": "assistant", "content": "Refunded.", "finish_reason": "stop", "error": "optional error text"}
      ]
    }
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tracing.otlp import LAST_STORABLE_TIME_NS, MAX_TOKEN_COUNT, Span, Usage

MAX_MESSAGES = 5000


class TrajectoryJsonError(ValueError):
    """The document is not a valid trajectory; `errors` names each field."""

    def __init__(self, message: str, errors: list[dict[str, str]]) -> None:
        super().__init__(message)
        self.errors = errors


class _Function(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1, max_length=300)
    arguments: Any = "{}"


class _ToolCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str | None = Field(default=None, max_length=300)
    type: str = "function"
    function: _Function


class _Usage(BaseModel):
    # Bounded as the OTLP mapper bounds them: a count past 2^31-1 is no real count, and a few of them
    # would overflow the trajectory's totals in the worker.
    model_config = ConfigDict(extra="allow")
    input_tokens: int | None = Field(default=None, ge=0, le=MAX_TOKEN_COUNT)
    output_tokens: int | None = Field(default=None, ge=0, le=MAX_TOKEN_COUNT)
    prompt_tokens: int | None = Field(default=None, ge=0, le=MAX_TOKEN_COUNT)
    completion_tokens: int | None = Field(default=None, ge=0, le=MAX_TOKEN_COUNT)
    total_tokens: int | None = Field(default=None, ge=0, le=MAX_TOKEN_COUNT)


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Any = None
    name: str | None = None
    tool_calls: list[_ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    usage: _Usage | None = None
    model: str | None = None
    duration_ms: float | None = Field(default=None, ge=0, le=7 * 24 * 3600 * 1000)
    error: str | None = None


class TrajectoryDocument(BaseModel):
    model_config = ConfigDict(extra="forbid")

    trace_id: str | None = Field(default=None, pattern=r"^[0-9a-fA-F]{32}$")
    name: str = Field(default="trajectory", max_length=500)
    agent: str | None = Field(default=None, max_length=200)
    session_id: str | None = Field(default=None, max_length=500)
    user_id: str | None = Field(default=None, max_length=500)
    started_at: datetime | float | None = None
    model: str | None = Field(default=None, max_length=300)
    tags: list[str] = Field(default_factory=list, max_length=50)
    metadata: dict[str, Any] = Field(default_factory=dict)
    task_id: str | None = Field(default=None, max_length=500)
    # Not NaN or infinite: a reward is summed and compared, and JSON has no spelling for either.
    reward: float | None = Field(default=None, allow_inf_nan=False)
    tools: list[dict[str, Any]] = Field(default_factory=list, max_length=500)
    messages: list[_Message] = Field(min_length=1, max_length=MAX_MESSAGES)

    @field_validator("trace_id")
    @classmethod
    def _not_zero(cls, value: str | None) -> str | None:
        if value is not None and int(value, 16) == 0:
            raise ValueError("trace_id must not be all zeros")
        return value.lower() if value else value

    # Span times are nanoseconds since 1970 in a signed 64-bit column: a trajectory must start after 1970
    # and end (with its messages' durations) before April 2262, or its batch would fail in the worker.
    @field_validator("started_at")
    @classmethod
    def _storable_start(cls, value: datetime | float | None) -> datetime | float | None:
        if value is None:
            return value
        seconds = (
            (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp() if isinstance(value, datetime) else value
        )
        if not (math.isfinite(seconds) and 0 <= seconds * 1e9 <= LAST_STORABLE_TIME_NS):
            raise ValueError("must be between 1970-01-01 and 2262-04-11")
        return value

    @model_validator(mode="after")
    def _storable_end(self) -> TrajectoryDocument:
        if self.started_at is not None:
            end = _start_ns(self) + sum(_duration_ns(message) for message in self.messages)
            if end > LAST_STORABLE_TIME_NS:
                raise ValueError("the trajectory must end before 2262-04-11 (started_at plus the durations)")
        return self


def _errors(error: ValidationError, prefix: str) -> list[dict[str, str]]:
    return [
        {"field": ".".join([prefix, *(str(part) for part in item["loc"])]).strip("."), "message": item["msg"]}
        for item in error.errors()
    ]


def documents_parse(payload: Any) -> list[TrajectoryDocument]:
    """One trajectory, a list of them, or {"trajectories": [...]}; every problem is named."""
    items: list[Any]
    prefix_of: str
    if isinstance(payload, Mapping) and "trajectories" in payload:
        items, prefix_of = list(payload["trajectories"] or []), "trajectories"
    elif isinstance(payload, list):
        items, prefix_of = payload, ""
    else:
        items, prefix_of = [payload], ""
    if not items:
        raise TrajectoryJsonError("no trajectories in the body", [{"field": "trajectories", "message": "empty"}])
    documents: list[TrajectoryDocument] = []
    errors: list[dict[str, str]] = []
    for index, item in enumerate(items):
        prefix = f"{prefix_of}.{index}" if len(items) > 1 or prefix_of else ""
        try:
            documents.append(TrajectoryDocument.model_validate(item))
        except ValidationError as error:
            errors.extend(_errors(error, prefix))
    if errors:
        summary = "; ".join(f"{e['field']}: {e['message']}" for e in errors[:5])
        raise TrajectoryJsonError(f"invalid trajectory: {summary}", errors)
    return documents


def _digest(*parts: str, size: int) -> str:
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[: size * 2]


def document_trace_id(document: TrajectoryDocument) -> str:
    """The given trace id, or one derived from the content, so a re-post of the same trajectory matches."""
    if document.trace_id:
        return document.trace_id
    content = json.dumps(document.model_dump(mode="json", exclude={"trace_id"}), sort_keys=True, default=str)
    return _digest("trace", content, size=16)


def _start_ns(document: TrajectoryDocument) -> int:
    # The ingest service fills in the time of receipt when the client gave none.
    started = document.started_at
    if started is None:
        return 0
    if isinstance(started, datetime):
        aware = started if started.tzinfo else started.replace(tzinfo=UTC)
        return int(aware.timestamp() * 1e9)
    return int(started * 1e9)


def _duration_ns(message: _Message) -> int:
    return int((message.duration_ms if message.duration_ms is not None else 1.0) * 1e6)


def _message_dict(message: _Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.name:
        out["name"] = message.name
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": call.type,
                "function": {"name": call.function.name, "arguments": call.function.arguments},
            }
            for call in message.tool_calls
        ]
    if message.tool_call_id:
        out["tool_call_id"] = message.tool_call_id
    return out


def _parsed(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _span(
    *,
    trace_id: str,
    span_id: str,
    parent: str | None,
    name: str,
    span_type: Any,
    start: int,
    end: int,
    document: TrajectoryDocument,
    error: str | None = None,
    **fields: Any,
) -> Span:
    values: dict[str, Any] = {
        "trace_id": trace_id,
        "span_id": span_id,
        "parent_span_id": parent,
        "name": name,
        "kind": "internal",
        "start_time_ns": start,
        "end_time_ns": end,
        "status": "error" if error else "ok",
        "status_message": error or "",
        "span_type": span_type,
        "session_id": document.session_id,
        "user_id": document.user_id,
        "agent_name": document.agent,
        "service_name": None,
        "trace_name": document.name,
        "request_model": None,
        "response_model": None,
        "input": None,
        "output": None,
        "tool_name": None,
        "tool_call_id": None,
        "tool_arguments": None,
        "tool_result": None,
        "tool_definitions": (),
        "usage": Usage(),
        "cost_usd": None,
        "prompt_name": None,
        "prompt_version": None,
        "task_id": document.task_id,
        "reward": None,
        "tags": (),
        "metadata": {},
        "error_type": "error" if error else None,
        "error_message": error,
        "events": (),
        "resource_attributes": {},
        "scope_name": "keel.trajectory_json",
        "scope_version": "1",
        "attributes": {},
        "truncated_attributes": {},
    }
    values.update(fields)
    return Span(**values)


def _finish_reasons(message: _Message) -> tuple[str, ...]:
    reason = (message.model_extra or {}).get("finish_reason")
    return (reason,) if isinstance(reason, str) and reason else ()


def _total_tokens(usage: _Usage | None, input_tokens: int | None, output_tokens: int | None) -> int | None:
    # As the OTLP mapper does: a total left out is the sum of the two counts, when both are known.
    if usage is not None and usage.total_tokens is not None:
        return usage.total_tokens
    if input_tokens is not None and output_tokens is not None:
        return input_tokens + output_tokens
    return None


def document_spans(document: TrajectoryDocument) -> list[Span]:
    """The spans of one trajectory: a root agent span, a generation per assistant turn, a tool span per result."""
    trace_id = document_trace_id(document)
    root_id = _digest(trace_id, "root", size=8)
    clock = _start_ns(document)
    start = clock
    spans: list[Span] = []
    history: list[dict[str, Any]] = []
    calls: dict[str, tuple[str, Any]] = {}  # tool call id → (tool name, arguments)
    for index, message in enumerate(document.messages):
        duration = _duration_ns(message)
        as_dict = _message_dict(message)
        span_id = _digest(trace_id, "step", str(index), size=8)
        if message.role == "assistant":
            usage = message.usage
            input_tokens = (
                (usage.input_tokens if usage.input_tokens is not None else usage.prompt_tokens) if usage else None
            )
            output_tokens = (
                (usage.output_tokens if usage.output_tokens is not None else usage.completion_tokens) if usage else None
            )
            model = message.model or document.model
            spans.append(
                _span(
                    trace_id=trace_id,
                    span_id=span_id,
                    parent=root_id,
                    name=f"chat {model}" if model else "chat",
                    span_type="generation",
                    start=clock,
                    end=clock + duration,
                    document=document,
                    error=message.error,
                    request_model=model,
                    response_model=model,
                    input=list(history),
                    output=[as_dict],
                    usage=Usage(
                        input_tokens=input_tokens,
                        output_tokens=output_tokens,
                        total_tokens=_total_tokens(usage, input_tokens, output_tokens),
                    ),
                    tool_definitions=tuple(document.tools),
                    finish_reasons=_finish_reasons(message),
                )
            )
            for call in message.tool_calls:
                if call.id:
                    calls[call.id] = (call.function.name, call.function.arguments)
        elif message.role == "tool":
            tool_name, arguments = calls.get(message.tool_call_id or "", (message.name or "tool", None))
            parsed_arguments, parsed_result = _parsed(arguments), _parsed(message.content)
            spans.append(
                _span(
                    trace_id=trace_id,
                    span_id=span_id,
                    parent=root_id,
                    name=f"execute_tool {tool_name}",
                    span_type="tool",
                    start=clock,
                    end=clock + duration,
                    document=document,
                    error=message.error,
                    tool_name=tool_name,
                    tool_call_id=message.tool_call_id,
                    tool_arguments=parsed_arguments,
                    tool_result=parsed_result,
                    input=parsed_arguments,
                    output=parsed_result,
                )
            )
        history.append(as_dict)
        clock += duration
    last_assistant = next((m for m in reversed(document.messages) if m.role == "assistant"), None)
    spans.append(
        _span(
            trace_id=trace_id,
            span_id=root_id,
            parent=None,
            name=document.name,
            span_type="agent",
            start=start,
            end=max(clock, start + 1),
            document=document,
            # The whole dialogue, as an agent span's input carries it: messages after the last assistant
            # turn (the user's "forget it") are in no generation's input, and reach the trajectory from here.
            input=history,
            output=last_assistant.content if last_assistant else None,
            tags=tuple(document.tags),
            metadata=dict(document.metadata),
            reward=document.reward,
            tool_definitions=tuple(document.tools),
        )
    )
    return spans
