"""Trajectories as the dashboard shows them: steps as chat bubbles, formatted JSON and waterfall bars.

Pure presentation over `tracing.steps.TrajectoryView` (no database): the view builds these once per
request, so a 500-step trajectory costs one pass and the templates only print. Everything here returns
plain text; the templates escape it (span content is whatever an agent sent).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from tracing.replay_diff import ReplayDiff, StepPair
from tracing.steps import Step, TrajectoryView

KIND_LABELS: Final = {
    "message": "Message",
    "llm_call": "LLM call",
    "tool_call": "Tool call",
    "agent": "Agent",
    "retrieval": "Retrieval",
    "guardrail": "Guardrail",
    "event": "Event",
    "span": "Span",
}
ROLE_LABELS: Final = {"system": "System prompt", "user": "User", "assistant": "Assistant", "tool": "Tool result"}
# An LLM call repeats the whole history; past this many messages its input shows the start and the end,
# since the rest is already on the page as the steps before it.
INPUT_MESSAGES_SHOWN: Final = 12
INPUT_TAIL: Final = 8
# JSON longer than this folds into a <details>.
LONG_JSON_LINES: Final = 14
LONG_JSON_CHARACTERS: Final = 1200
SUMMARY_LENGTH: Final = 160


# --- Text and JSON ------------------------------------------------------------------------------------


def _parsed(value: Any) -> Any:
    if isinstance(value, str) and value.lstrip()[:1] in ("{", "["):
        try:
            return json.loads(value)
        except (ValueError, RecursionError):
            return value
    return value


def _dumps(value: Any, indent: int | None = 2) -> str:
    try:
        return json.dumps(value, indent=indent, ensure_ascii=False, default=str)
    except (TypeError, ValueError, RecursionError):
        return repr(value)


def content_text(content: Any) -> str:
    """A message's content as text: the text parts of a multi-part content joined, anything else as JSON."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                parts.append(_dumps(part, indent=None))
        return "\n".join(parts)
    return _dumps(content)


def one_line(text: str, length: int = SUMMARY_LENGTH) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= length else flat[: length - 1] + "…"


@dataclass(frozen=True, slots=True)
class JsonBlock:
    """A value for reading: pretty-printed JSON (or the text as sent), and whether it is long enough to fold."""

    text: str
    is_json: bool
    line_count: int
    is_long: bool
    summary: str


def json_block(value: Any) -> JsonBlock | None:
    if value is None or value == "":
        return None
    parsed = _parsed(value)
    is_json = not isinstance(parsed, str)
    text = _dumps(parsed) if is_json else str(parsed)
    line_count = text.count("\n") + 1
    return JsonBlock(
        text=text,
        is_json=is_json,
        line_count=line_count,
        is_long=line_count > LONG_JSON_LINES or len(text) > LONG_JSON_CHARACTERS,
        summary=one_line(_dumps(parsed, indent=None) if is_json else text, 90),
    )


# --- Messages -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolRequest:
    name: str
    call_id: str
    arguments: JsonBlock | None


@dataclass(frozen=True, slots=True)
class Bubble:
    """One chat message: who said it, what, and the tools it asked for."""

    role: str
    label: str
    text: str
    result: JsonBlock | None  # a tool message's content, formatted
    tool_requests: tuple[ToolRequest, ...]
    tool_call_id: str

    @property
    def is_system(self) -> bool:
        return self.role in ("system", "developer")


def _tool_requests(message: dict[str, Any]) -> tuple[ToolRequest, ...]:
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return ()
    requests = []
    for call in calls:
        if not isinstance(call, dict):
            continue
        function = call.get("function")
        if not isinstance(function, dict):
            function = call
        requests.append(
            ToolRequest(
                name=str(function.get("name") or "tool"),
                call_id=str(call.get("id") or ""),
                arguments=json_block(function.get("arguments")),
            )
        )
    return tuple(requests)


def bubble(message: dict[str, Any]) -> Bubble:
    role = str(message.get("role") or "unknown")
    text = content_text(message.get("content"))
    return Bubble(
        role=role,
        label=ROLE_LABELS.get(role, role.capitalize()),
        text=text,
        result=json_block(text) if role == "tool" else None,
        tool_requests=_tool_requests(message),
        tool_call_id=str(message.get("tool_call_id") or ""),
    )


def _bubble_summary(item: Bubble) -> str:
    if item.text:
        return one_line(item.text)
    if item.tool_requests:
        return "asks for " + ", ".join(request.name for request in item.tool_requests)
    return ""


# --- Steps --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StepView:
    step: Step
    kind_label: str
    title: str
    summary: str
    offset_ms: float
    duration_ms: float
    input_tokens: int | None
    output_tokens: int | None
    cost_usd: float | None
    is_error: bool
    has_children: bool
    message: Bubble | None = None
    input_messages: tuple[Bubble, ...] = ()
    input_count: int = 0
    input_hidden: int = 0
    input_hidden_after: int = 0
    output: Bubble | None = None
    arguments: JsonBlock | None = None
    result: JsonBlock | None = None
    input_value: JsonBlock | None = None
    output_value: JsonBlock | None = None

    @property
    def index(self) -> int:
        return self.step.index

    @property
    def has_usage(self) -> bool:
        return self.input_tokens is not None or self.output_tokens is not None


def _llm_input(messages: Sequence[dict[str, Any]]) -> tuple[tuple[Bubble, ...], int, int]:
    """The messages an LLM call's input shows, how many it leaves out, and after which shown one."""
    if len(messages) <= INPUT_MESSAGES_SHOWN:
        return tuple(bubble(message) for message in messages), 0, 0
    head = [messages[0]] if messages[0].get("role") in ("system", "developer") else []
    tail = list(messages[-INPUT_TAIL:])
    hidden = len(messages) - len(head) - len(tail)
    return tuple(bubble(message) for message in [*head, *tail]), hidden, len(head)


def step_view(step: Step, *, trace_start_ns: int, has_children: bool) -> StepView:
    usage = step.usage
    base: dict[str, Any] = {
        "step": step,
        "kind_label": KIND_LABELS.get(step.kind, step.kind),
        "offset_ms": max(0, step.start_time_ns - trace_start_ns) / 1e6,
        "duration_ms": max(0, step.duration_ns) / 1e6,
        "input_tokens": usage.input_tokens if usage is not None else None,
        "output_tokens": usage.output_tokens if usage is not None else None,
        "cost_usd": step.cost_usd,
        "is_error": step.status == "error" or bool(step.error),
        "has_children": has_children,
    }
    if step.kind == "message":
        message = bubble({"role": step.role, "content": step.content, "tool_call_id": step.tool_call_id})
        return StepView(**base, title=message.label, summary=_bubble_summary(message), message=message)
    if step.kind == "llm_call":
        shown, hidden, hidden_after = _llm_input(step.input_messages or ())
        output = bubble(step.output_message) if step.output_message is not None else None
        return StepView(
            **base,
            title=step.model or step.name,
            summary=_bubble_summary(output) if output is not None else one_line(content_text(step.output)),
            input_messages=shown,
            input_count=len(step.input_messages or ()),
            input_hidden=hidden,
            input_hidden_after=hidden_after,
            output=output,
            input_value=json_block(step.input) if step.input_messages is None else None,
            output_value=json_block(step.output) if step.output_message is None else None,
        )
    if step.kind == "tool_call":
        arguments = json_block(step.tool_arguments)
        return StepView(
            **base,
            title=step.tool_name or step.name,
            summary=arguments.summary if arguments is not None else "",
            arguments=arguments,
            result=json_block(step.tool_result),
        )
    output_value = json_block(step.output)
    title = step.agent_name if step.kind == "agent" and step.agent_name and step.depth > 0 else step.name
    return StepView(
        **base,
        title=title,
        summary=output_value.summary if output_value is not None and step.kind != "agent" else "",
        input_value=json_block(step.input),
        output_value=output_value,
    )


def step_views(view: TrajectoryView) -> list[StepView]:
    steps = view.steps
    return [
        step_view(
            step,
            trace_start_ns=view.start_time_ns,
            has_children=index + 1 < len(steps) and steps[index + 1].depth > step.depth,
        )
        for index, step in enumerate(steps)
    ]


# --- Waterfall ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Bar:
    """One span of the waterfall, placed in percent of the trace's duration."""

    step: StepView
    left: float
    width: float


def waterfall(view: TrajectoryView, steps: Sequence[StepView]) -> list[Bar]:
    """A bar per span (messages are read from spans, they have no timing of their own)."""
    total = max(view.end_time_ns - view.start_time_ns, 1)
    bars = []
    for item in steps:
        if item.step.kind == "message":
            continue
        left = (item.step.start_time_ns - view.start_time_ns) / total * 100
        width = max(item.step.duration_ns, 0) / total * 100
        left = min(max(left, 0.0), 100.0)
        bars.append(Bar(step=item, left=round(left, 3), width=round(max(min(width, 100.0 - left), 0.25), 3)))
    return bars


def first_step_of_span(steps: Sequence[StepView]) -> dict[str, int]:
    """span id → the first step it made, to link a score of a span to its step."""
    found: dict[str, int] = {}
    for item in steps:
        found.setdefault(item.step.span_id, item.step.index)
    return found


# --- Sessions -----------------------------------------------------------------------------------------


def _message_key(message: dict[str, Any]) -> tuple[str, str, str]:
    return (str(message.get("role")), content_text(message.get("content")), str(message.get("tool_call_id") or ""))


@dataclass(frozen=True, slots=True)
class SessionTurn:
    """A trajectory of a session, with the part of its conversation that earlier turns did not show."""

    messages: tuple[Bubble, ...]
    earlier: int  # messages of the conversation that earlier turns already showed


def session_turns(views: Sequence[TrajectoryView]) -> list[SessionTurn]:
    """Each turn of an agent usually resends the dialogue so far; show each message once, where it is new."""
    shown: list[tuple[str, str, str]] = []
    turns = []
    for view in views:
        keys = [_message_key(message) for message in view.conversation]
        common = 0
        while common < min(len(keys), len(shown)) and keys[common] == shown[common]:
            common += 1
        turns.append(
            SessionTurn(messages=tuple(bubble(message) for message in view.conversation[common:]), earlier=common)
        )
        shown = keys
    return turns


# --- Replays ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChangeView:
    field: str
    original: JsonBlock | None
    replay: JsonBlock | None


@dataclass(frozen=True, slots=True)
class DiffRow:
    """A pair of aligned steps of a replay diff, each side as the step-through view shows it."""

    pair: StepPair
    position: int
    original: StepView | None
    replay: StepView | None
    changes: tuple[ChangeView, ...]
    is_first_difference: bool


def diff_rows(diff: ReplayDiff, original: TrajectoryView, replay: TrajectoryView) -> list[DiffRow]:
    def side(view: TrajectoryView, index: int | None) -> StepView | None:
        if index is None or not 0 <= index < len(view.steps):
            return None
        return step_view(view.steps[index], trace_start_ns=view.start_time_ns, has_children=False)

    return [
        DiffRow(
            pair=pair,
            position=position,
            original=side(original, pair.original_index),
            replay=side(replay, pair.replay_index),
            changes=tuple(
                ChangeView(change.field, json_block(change.original), json_block(change.replay))
                for change in pair.changes
                if pair.status == "changed"
            ),
            is_first_difference=position == diff.first_difference,
        )
        for position, pair in enumerate(diff.steps)
    ]


# --- Triage signals -----------------------------------------------------------------------------------

_LEVEL_RANK: Final = {"info": 0, "warning": 1, "error": 2}


@dataclass(frozen=True, slots=True)
class SignalView:
    """One signal instance as the side panel shows it: what fired, how badly, why, and its evidence."""

    signal: str
    kind: str
    category: str
    level: str
    severity: float
    why: str
    snippets: tuple[str, ...]
    steps: tuple[int, ...]

    @property
    def label(self) -> str:
        return self.signal.replace("_", " ")

    @property
    def kind_label(self) -> str:
        return self.kind.replace("_", " ")


def signal_views(instances: Any, step_count: int) -> list[SignalView]:
    """The stored instances (tracing.services.signal_report_json), worst first; step links only to steps
    that exist (a recompute may have left an index behind)."""
    found = []
    for instance in instances if isinstance(instances, list) else []:
        if not isinstance(instance, dict):
            continue
        level = str(instance.get("level") or "info")
        found.append(
            SignalView(
                signal=str(instance.get("signal") or ""),
                kind=str(instance.get("kind") or ""),
                category=str(instance.get("category") or ""),
                level=level if level in _LEVEL_RANK else "info",
                severity=float(instance.get("severity") or 0),
                why=str(instance.get("why") or ""),
                snippets=tuple(str(snippet) for snippet in instance.get("snippets") or ()),
                steps=tuple(
                    index for index in instance.get("steps") or () if isinstance(index, int) and 0 <= index < step_count
                ),
            )
        )
    return sorted(found, key=lambda view: (-_LEVEL_RANK[view.level], -view.severity, view.signal))


@dataclass(frozen=True, slots=True)
class SignalBadge:
    signal: str
    level: str
    count: int

    @property
    def label(self) -> str:
        return self.signal.replace("_", " ")


def signal_badges(instances: Any) -> list[SignalBadge]:
    """One badge per signal of a trajectory, coloured by its worst instance's level, worst first."""
    levels: dict[str, str] = {}
    counts: dict[str, int] = {}
    for instance in instances if isinstance(instances, list) else []:
        if not isinstance(instance, dict) or not instance.get("signal"):
            continue
        name = str(instance["signal"])
        level = str(instance.get("level") or "info")
        level = level if level in _LEVEL_RANK else "info"
        counts[name] = counts.get(name, 0) + 1
        if _LEVEL_RANK[level] >= _LEVEL_RANK.get(levels.get(name, "info"), 0):
            levels[name] = level
    return sorted(
        (SignalBadge(name, levels[name], counts[name]) for name in counts),
        key=lambda badge: (-_LEVEL_RANK[badge.level], badge.signal),
    )
