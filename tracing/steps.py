"""A trace's spans as the ordered steps a person reads and triage detectors consume. Pure module, no Django.

`trajectory_view_build` takes the mapped spans of one trace, in any order and possibly incomplete, and
returns a `TrajectoryView`:

- the span tree, walked depth first with siblings in start-time order. A span whose parent has not
  arrived (or never will) hangs under the root span; a cycle in parent ids is cut at its earliest span,
  which then hangs under the root too. With no root span yet, those spans are the top level.
- the steps: one per span (`llm_call`, `tool_call`, `agent`, `retrieval`, `guardrail`, `event`, `span`),
  plus a `message` step for each message an LLM call is the first to show (the user's turns, the system
  prompt, a tool result no tool span recorded). An LLM call's answer lives in its `llm_call` step, with
  the span's first finish reason as `output_message["finish_reason"]` when the message has none.
  A tool result that arrives only as a message, with the assistant's call for it, becomes a
  `tool_call` step of its own, so agents instrumented only at the LLM client still read as calls.
  Messages that an agent span holds after the end of the conversation, which no LLM call read (the
  user's "forget it" after the final answer), come last, as steps of that span.
- the conversation: each LLM call repeats the history, so every distinct message is kept once, in
  order (a message repeated later in the dialogue, such as a second "yes", is a new message). Each
  call's answer is a new message, even when it says what an earlier one did (the same tool call again).
"""

from __future__ import annotations

import json
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields, is_dataclass
from functools import lru_cache
from typing import Any, Final, Literal, NamedTuple

import orjson

from tracing.otlp import Span, SpanStatus, SpanType, Usage

StepKind = Literal["message", "tool_call", "llm_call", "retrieval", "guardrail", "agent", "event", "span"]
TrajectoryStatus = Literal["ok", "error", "running"]

_STEP_KINDS: Final[dict[str, StepKind]] = {
    "generation": "llm_call",
    "tool": "tool_call",
    "agent": "agent",
    "retriever": "retrieval",
    "guardrail": "guardrail",
    "event": "event",
}
# The spans whose messages make the conversation; agent spans count only when no LLM span has any.
_MESSAGE_SOURCE_TYPES: Final = frozenset(("generation",))


# Not frozen, as tracing.otlp.Span is not: setting each field through object.__setattr__ was a fifth of
# the assembly's time. Treat a step as read-only all the same.
@dataclass(slots=True)
class Step:
    """One step. Fields that do not apply to a kind are None.

    - message: `role`, `content` (and `tool_call_id` for a tool message)
    - llm_call: `model`, `input_messages`, `output_message`, `usage`, `cost_usd`
    - tool_call: `tool_name`, `tool_call_id`, `tool_arguments`, `tool_result`, `error`
    - agent, retrieval, guardrail, event, span: `input`, `output`
    """

    index: int
    span_id: str
    parent_span_id: str | None
    depth: int
    kind: StepKind
    name: str
    span_type: SpanType
    start_time_ns: int
    end_time_ns: int
    duration_ns: int
    status: SpanStatus
    error: str | None
    usage: Usage | None = None
    cost_usd: float | None = None
    role: str | None = None
    content: Any = None
    model: str | None = None
    input_messages: tuple[dict[str, Any], ...] | None = None
    output_message: dict[str, Any] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None
    tool_arguments: Any = None
    tool_result: Any = None
    input: Any = None
    output: Any = None
    agent_name: str | None = None


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call, recorded by a tool span (`source="span"`) or read from the messages (`"messages"`)."""

    name: str
    call_id: str | None
    arguments: Any
    result: Any
    error: str | None
    status: SpanStatus
    span_id: str
    step_index: int
    source: Literal["span", "messages"]


@dataclass(frozen=True, slots=True)
class PromptUse:
    name: str | None
    version: str | None


@dataclass(frozen=True, slots=True)
class Totals:
    input_tokens: int
    output_tokens: int
    total_tokens: int
    cache_read_tokens: int
    reasoning_tokens: int
    cost_usd: float | None
    duration_ns: int
    span_count: int
    step_count: int
    llm_call_count: int
    tool_call_count: int
    error_count: int
    # LLM calls whose cost nothing determined (`unpriced_calls`), and the models they named.
    unpriced_call_count: int = 0
    unpriced_models: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TrajectoryView:
    """A trace read as a trajectory.

    `status` is "error" when any span ended in error, else "running" while the root span (the one
    without a parent, which OpenTelemetry exports last) has not arrived, else "ok".
    Token and cost totals count each span's own figures, except where a descendant reports the same
    figure: an agent span that sums its LLM calls is not counted on top of them. An LLM call no price
    covers is counted in `totals.unpriced_call_count`, not as free: its step's `cost_usd` is None.
    """

    trace_id: str
    status: TrajectoryStatus
    root_span_id: str | None
    root_span_name: str | None
    start_time_ns: int
    end_time_ns: int
    steps: tuple[Step, ...]
    conversation: tuple[dict[str, Any], ...]
    tool_calls: tuple[ToolCall, ...]
    totals: Totals
    session_id: str | None
    user_id: str | None
    agent_name: str | None
    tags: tuple[str, ...]
    prompt_versions: tuple[PromptUse, ...]
    tool_definitions: tuple[dict[str, Any], ...]
    task_id: str | None
    reward: float | None
    # What the trajectory is called: the trace's own name when a span gives one (Langfuse's
    # `langfuse.trace.name`), else the root span's.
    name: str | None = None


# --- Tree ---------------------------------------------------------------------------------------------


def _sort_key(span: Span) -> tuple[int, str]:
    return (span.start_time_ns, span.span_id)


@dataclass(slots=True)
class _Tree:
    ordered: list[tuple[Span, int, str | None]]  # span, depth, effective parent id
    root: Span | None


def _tree(spans: Sequence[Span]) -> _Tree:
    by_id: dict[str, Span] = {}
    for span in spans:
        by_id.setdefault(span.span_id, span)
    parent_of: dict[str, str | None] = {}
    orphans: set[str] = set()
    roots: list[Span] = []
    for span_id, span in by_id.items():
        parent = span.parent_span_id
        if parent is None:
            parent_of[span_id] = None
            roots.append(span)
        elif parent in by_id and parent != span_id:
            parent_of[span_id] = parent
        else:
            parent_of[span_id] = None
            orphans.add(span_id)

    # Cut cycles: walk up from every span; a walk that meets itself cuts its earliest member loose.
    state: dict[str, int] = {}
    for start in by_id:
        path: list[str] = []
        current: str | None = start
        while current is not None and current not in state:
            state[current] = 1
            path.append(current)
            current = parent_of[current]
        if current is not None and state[current] == 1:
            cycle = path[path.index(current) :]
            cut = min(cycle, key=lambda span_id: _sort_key(by_id[span_id]))
            parent_of[cut] = None
            orphans.add(cut)
        for span_id in path:
            state[span_id] = 2

    root = min(roots, key=_sort_key) if roots else None
    children: dict[str | None, list[Span]] = {}
    for span_id, span in by_id.items():
        parent = parent_of[span_id]
        if parent is None and root is not None and span_id in orphans:
            parent = root.span_id
            parent_of[span_id] = parent
        children.setdefault(parent, []).append(span)
    for siblings in children.values():
        siblings.sort(key=_sort_key)

    ordered: list[tuple[Span, int, str | None]] = []
    stack: list[tuple[Span, int]] = [(span, 0) for span in reversed(children.get(None, []))]
    while stack:
        span, depth = stack.pop()
        ordered.append((span, depth, parent_of[span.span_id]))
        stack.extend((child, depth + 1) for child in reversed(children.get(span.span_id, [])))
    return _Tree(ordered=ordered, root=root)


# --- Conversation -------------------------------------------------------------------------------------


# For what orjson cannot write; built once, as json.dumps with options builds a new encoder on every call.
_SORTED_JSON: Final = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=str)


def sorted_json(value: Any) -> str:
    """Compact JSON with sorted keys, other types as their str(). orjson, and for what it refuses (keys
    other than text, integers past 64 bits, deep nesting) the standard library, which takes those but
    for keys of mixed types. Raises TypeError, ValueError or RecursionError when neither can."""
    try:
        return orjson.dumps(value, default=str, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:
        return _SORTED_JSON.encode(value)


def _canonical(value: Any) -> str:
    """A value as text that compares equal when the values do (key order aside)."""
    if isinstance(value, str):
        return value
    try:
        return sorted_json(value)
    except (TypeError, ValueError, RecursionError):
        # Keys of mixed types, or nesting past the interpreter's limit: equal only to itself.
        return f"<{type(value).__name__} {id(value)}>"


@lru_cache(maxsize=4096)
def _canonical_arguments(arguments: str) -> str:
    try:
        parsed = json.loads(arguments)
    except (ValueError, RecursionError):
        return arguments
    return _canonical(parsed)


def _call_parts(call: Any) -> tuple[str | None, str, str]:
    """(id, name, canonical arguments) of an OpenAI-style tool call."""
    if not isinstance(call, dict):
        return None, "", ""
    function = call.get("function")
    if not isinstance(function, dict):
        function = {}
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        arguments = _canonical(arguments)
    call_id = call.get("id")
    return (
        (call_id if isinstance(call_id, str) else None),
        str(function.get("name") or ""),
        _canonical_arguments(arguments),
    )


def _key_text(value: Any) -> str:
    return "" if value is None else _canonical(value)


def _message_key(message: dict[str, Any]) -> tuple[Any, ...]:
    # Ids of tool calls are left out: some conventions drop them on the way back into the history.
    calls = message.get("tool_calls")
    call_key = tuple(_call_parts(call)[1:] for call in calls) if isinstance(calls, list) else ()
    role = message.get("role")
    content = message.get("content")
    tool_call_id = message.get("tool_call_id")
    # Text, as nearly every role and content is, is its own key: spared the call (a history is keyed
    # message by message for every model call of a trajectory).
    return (
        role if type(role) is str else _key_text(role),
        content if type(content) is str else _key_text(content),
        tool_call_id if type(tool_call_id) is str else _key_text(tool_call_id),
        call_key,
    )


def _messages(value: Any) -> list[dict[str, Any]] | None:
    if isinstance(value, list) and value and all(isinstance(item, dict) and "role" in item for item in value):
        return value
    return None


class _Conversation:
    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self._keys: list[tuple[Any, ...]] = []
        self._positions: dict[tuple[Any, ...], list[int]] = {}
        # Where the history the last call read ends in the conversation: its answer, if already known,
        # is the message there.
        self._end = 0
        # The key of each message read so far, by the message object. Spans mapped in one request share
        # the objects of a history they repeat (`otlp.map_spans`): each call's history is keyed only for
        # what it adds. The entry holds the message, so its id is not another's while the entry lives.
        self._known: dict[int, tuple[dict[str, Any], tuple[Any, ...]]] = {}

    def _key(self, message: dict[str, Any]) -> tuple[Any, ...]:
        known = self._known.get(id(message))
        if known is not None:
            return known[1]
        key = _message_key(message)
        self._known[id(message)] = (message, key)
        return key

    def absorb(self, incoming: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Read a call's history: add what it shows for the first time; returns those messages.

        A start of the history found in the conversation in order is known, and what follows is new: a
        history repeated (or cut short) by the next call matches what is known, and a message said again
        later in the dialogue is new. The history is aligned with the end of the conversation when it
        can be, since each call normally continues it: a window of the last turns then lines up with
        the latest of turns that look the same (an agent asking for the same ride three times), not
        with the first. Otherwise the longest known start is taken (a side call that re-reads the
        dialogue, or the same call recorded twice).
        """
        positions_of = self._positions
        keys = [self._key(message) for message in incoming]
        pointer = 0
        known = 0
        for key in keys:
            positions = positions_of.get(key)
            if not positions:
                break
            at = bisect_left(positions, pointer)
            if at == len(positions):
                break
            pointer = positions[at] + 1
            known += 1
        size = len(self.messages)
        if pointer != size and known:
            known = self._aligned_with_end(keys, known)
        if known == len(keys):
            # The latest place of the last message: an embedding of the others before it always exists,
            # since the earliest one ends no later.
            self._end = positions_of[keys[-1]][-1] + 1 if keys else size
            return []
        new = list(incoming[known:])
        for message, key in zip(new, keys[known:], strict=True):
            self.add(message, key)
        self._end = len(self.messages)
        return new

    def _aligned_with_end(self, keys: list[tuple[Any, ...]], known: int) -> int:
        """The longest start of `keys`, up to `known`, that can end with the conversation's last message.

        `known` when there is none. The earliest places of a start found in order (the first `known`
        keys) tell whether the messages before its end fit before the last message.
        """
        last = len(self.messages) - 1
        last_key = self._keys[last]
        earliest: list[int] = []
        pointer = 0
        for key in keys[: known - 1]:
            at = self._positions[key][bisect_left(self._positions[key], pointer)]
            earliest.append(at)
            pointer = at + 1
        for length in range(known, 0, -1):
            if keys[length - 1] == last_key and (length == 1 or earliest[length - 2] < last):
                return length
        return known

    def answer(self, outgoing: Sequence[dict[str, Any]]) -> None:
        """Add a call's output: a new message, even one that says what an earlier one did.

        The exception is the message already right after the history this call read, when that history
        held nothing new: the same call recorded twice (a framework's span around the client library's),
        or a retry whose first answer the agent dropped.
        """
        for message in outgoing:
            key = self._key(message)
            if self._end < len(self.messages) and self._keys[self._end] == key:
                self._end += 1
                continue
            self.add(message, key)
            self._end = len(self.messages)

    def unread(self, incoming: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """What a span's message list shows after the end of the conversation, which no LLM call read.

        The list must reach that end, holding the conversation's last message (an agent span's input
        or output with the whole dialogue); what follows the last place it does is unread. A list that
        stops short (the user's words before the agent rewrote them into its prompt, a sub-agent's own
        task) tells nothing about what came after, and gives nothing.
        """
        if not self._keys:
            return []
        last_key = self._keys[-1]
        for offset in range(len(incoming) - 1, -1, -1):
            message = incoming[offset]
            # The role first: it rules out most messages without building their key.
            if _key_text(message.get("role")) == last_key[0] and self._key(message) == last_key:
                return list(incoming[offset + 1 :])
        return []

    def add(self, message: dict[str, Any], key: tuple[Any, ...] | None = None) -> None:
        if key is None:
            key = self._key(message)
        self._positions.setdefault(key, []).append(len(self.messages))
        self.messages.append(message)
        self._keys.append(key)


# --- Building -----------------------------------------------------------------------------------------


def _error_text(span: Span) -> str | None:
    if span.error_message:
        return span.error_message
    if span.error_type:
        return span.error_type
    if span.status == "error":
        return span.status_message or "error"
    return None


class _Builder:
    def __init__(self, tree: _Tree) -> None:
        self.tree = tree
        self.steps: list[Step] = []
        self.tool_calls: list[ToolCall] = []
        self.conversation = _Conversation()
        # Tool calls recorded by tool spans, by call id and by (name, arguments), to match tool messages.
        self.recorded_ids: set[str] = set()
        self.recorded_signatures: Counter[tuple[str, str]] = Counter()
        # The assistant's tool calls seen so far: id -> (name, arguments).
        self.requested: dict[str, tuple[str, Any]] = {}

    def _base(self, span: Span, depth: int, parent: str | None, kind: StepKind) -> Step:
        """The span's next step with the fields every kind has; the caller sets those of its kind. Given
        in order, not by name: a dataclass's __init__ runs as Python even when this module is compiled,
        and binding a step's twenty-odd keywords (from a dict of these merged with the kind's) took most
        of the time its construction did."""
        step = Step(
            len(self.steps),
            span.span_id,
            parent,
            depth,
            kind,
            span.name,
            span.span_type,
            span.start_time_ns,
            span.end_time_ns,
            span.end_time_ns - span.start_time_ns,
            span.status,
            _error_text(span),
        )
        step.agent_name = span.agent_name
        return step

    def build(self) -> None:
        has_llm_messages = any(
            span.span_type in _MESSAGE_SOURCE_TYPES and (_messages(span.input) or _messages(span.output))
            for span, _, _ in self.tree.ordered
        )
        # Spans other than LLM calls whose input or output is a message list, in reading order.
        carriers: list[tuple[Span, int, str | None, list[dict[str, Any]]]] = []
        for span, depth, parent in self.tree.ordered:
            kind = _STEP_KINDS.get(span.span_type, "span")
            if kind == "llm_call":
                self._llm_call(span, depth, parent)
            elif kind == "tool_call":
                self._tool_span(span, depth, parent)
            else:
                for messages in (_messages(span.input), _messages(span.output)):
                    if messages is None:
                        continue
                    if has_llm_messages:
                        carriers.append((span, depth, parent, messages))
                    else:
                        # Without LLM spans that carry messages, an agent span's messages are the dialogue.
                        self.conversation.absorb(messages)
                step = self._base(span, depth, parent, kind)
                step.input = span.input
                step.output = span.output
                step.usage = None if span.usage.is_empty else span.usage
                step.cost_usd = span.cost_usd
                self.steps.append(step)
        for span, depth, parent, messages in carriers:
            self._unread_messages(span, depth, parent, messages)

    def _unread_messages(self, span: Span, depth: int, parent: str | None, messages: list[dict[str, Any]]) -> None:
        """Messages an agent span holds past the last one an LLM call saw: the user's last word, after
        the final answer, that nothing answered. They come last, at the end of the span that shows them."""
        for message in self.conversation.unread(messages):
            self.conversation.add(message)
            self._new_input_message(span, depth, parent, message, at=span.end_time_ns)

    def _tool_span(self, span: Span, depth: int, parent: str | None) -> None:
        name = span.tool_name or span.name
        arguments = span.tool_arguments
        if span.tool_call_id:
            self.recorded_ids.add(span.tool_call_id)
        argument_text = _canonical(arguments)
        self.recorded_signatures[(name, _canonical_arguments(argument_text))] += 1
        step = self._base(span, depth, parent, "tool_call")
        step.tool_name = name
        step.tool_call_id = span.tool_call_id
        step.tool_arguments = arguments
        step.tool_result = span.tool_result
        step.input = span.input
        step.output = span.output
        step.cost_usd = span.cost_usd
        self.steps.append(step)
        self.tool_calls.append(
            ToolCall(
                name=name,
                call_id=span.tool_call_id,
                arguments=arguments,
                result=span.tool_result,
                error=step.error,
                status=span.status,
                span_id=span.span_id,
                step_index=step.index,
                source="span",
            )
        )

    def _llm_call(self, span: Span, depth: int, parent: str | None) -> None:
        inputs = _messages(span.input)
        outputs = _messages(span.output)
        for message in self.conversation.absorb(inputs or ()):
            self._new_input_message(span, depth, parent, message)
        output_message = outputs[0] if outputs else None
        if output_message is not None and span.finish_reasons and "finish_reason" not in output_message:
            output_message = {**output_message, "finish_reason": span.finish_reasons[0]}
        step = self._base(span, depth, parent, "llm_call")
        step.model = span.model
        step.input_messages = tuple(inputs) if inputs is not None else None
        step.output_message = output_message
        step.usage = span.usage
        step.cost_usd = span.cost_usd
        step.input = None if inputs is not None else span.input
        step.output = None if outputs is not None else span.output
        self.steps.append(step)
        self.conversation.answer(outputs or ())
        for message in outputs or ():
            self._remember_requests(message)

    def _remember_requests(self, message: dict[str, Any]) -> None:
        calls = message.get("tool_calls")
        if not isinstance(calls, list):
            return
        for call in calls:
            call_id, name, arguments = _call_parts(call)
            if call_id:
                function = call.get("function") if isinstance(call, dict) else None
                raw = function.get("arguments") if isinstance(function, dict) else arguments
                self.requested[call_id] = (name, raw)

    def _new_input_message(
        self, span: Span, depth: int, parent: str | None, message: dict[str, Any], *, at: int | None = None
    ) -> None:
        """A message step (or a tool call step) for a message first shown by `span`, at its start or `at`."""
        time_ns = span.start_time_ns if at is None else at
        role = message.get("role")
        if role == "assistant":
            self._remember_requests(message)
        if role == "tool":
            call_id = message.get("tool_call_id")
            requested = self.requested.get(call_id) if isinstance(call_id, str) else None
            if isinstance(call_id, str) and call_id in self.recorded_ids:
                return
            if requested is not None:
                name, arguments = requested
                text = _canonical(arguments)
                signature = (name, _canonical_arguments(text))
                if self.recorded_signatures[signature] > 0:
                    self.recorded_signatures[signature] -= 1
                    return
                self._tool_from_messages(span, depth, parent, name, call_id, arguments, message.get("content"), time_ns)
                return
        step = self._base(span, depth, parent, "message")
        _at_instant(step, time_ns)
        step.role = role if isinstance(role, str) else None
        step.content = message.get("content")
        step.tool_call_id = message.get("tool_call_id")
        self.steps.append(step)

    def _tool_from_messages(
        self,
        span: Span,
        depth: int,
        parent: str | None,
        name: str,
        call_id: Any,
        arguments: Any,
        result: Any,
        time_ns: int,
    ) -> None:
        step = self._base(span, depth, parent, "tool_call")
        _at_instant(step, time_ns)
        step.span_type = "tool"
        parsed_arguments = _parse(arguments)
        parsed_result = _parse(result)
        step.tool_name = name
        step.tool_call_id = call_id
        step.tool_arguments = parsed_arguments
        step.tool_result = parsed_result
        self.steps.append(step)
        self.tool_calls.append(
            ToolCall(
                name=name,
                call_id=call_id,
                arguments=parsed_arguments,
                result=parsed_result,
                error=None,
                status="unset",
                span_id=span.span_id,
                step_index=step.index,
                source="messages",
            )
        )


def _at_instant(step: Step, time_ns: int) -> None:
    """A step read from a span's messages: it happened at one time, and has no status or error of its own."""
    step.start_time_ns = step.end_time_ns = time_ns
    step.duration_ns = 0
    step.status = "unset"
    step.error = None


def _parse(value: Any) -> Any:
    if isinstance(value, str) and value[:1] in ("{", "["):
        try:
            return json.loads(value)
        except (ValueError, RecursionError):
            return value
    return value


def _own_figures(tree: _Tree) -> tuple[dict[str, Usage], dict[str, float]]:
    """Each span's usage and cost, left out where a descendant reports the same figure."""
    usage: dict[str, Usage] = {}
    cost: dict[str, float] = {}
    below_usage: set[str] = set()
    below_cost: set[str] = set()
    # The walk is depth first, so reversed it visits every child before its parent.
    for span, _, parent in reversed(tree.ordered):
        span_id = span.span_id
        if not span.usage.is_empty:
            if span_id not in below_usage:
                usage[span_id] = span.usage
            if parent is not None:
                below_usage.add(parent)
        if span_id in below_usage and parent is not None:
            below_usage.add(parent)
        if span.cost_usd is not None:
            if span_id not in below_cost:
                cost[span_id] = span.cost_usd
            if parent is not None:
                below_cost.add(parent)
        if span_id in below_cost and parent is not None:
            below_cost.add(parent)
    return usage, cost


class CostNode(NamedTuple):
    """What `unpriced_calls` reads of a span: its place in the tree, whether it is a billed LLM call, its cost.

    A named tuple, immutable and built in a fraction of the time a frozen dataclass takes (which sets each
    field through object.__setattr__): ingest makes one per span."""

    span_id: str
    parent_span_id: str | None
    is_model_call: bool
    has_cost: bool
    model: str | None


def model_call_billed(*, span_type: str, status: str, has_usage: bool) -> bool:
    """Whether a span is a model call someone pays for: a generation, unless it failed with no usage
    reported (a request the provider refused or never answered)."""
    return span_type == "generation" and (has_usage or status != "error")


def unpriced_calls(nodes: Iterable[CostNode]) -> tuple[int, tuple[str, ...]]:
    """How many LLM calls have no cost, and the models they named (sorted, each once).

    A call counts when something was billed for it: `model_call_billed` says which generation spans.

    An LLM call without a cost of its own is priced all the same when a span below it reports one (a
    wrapper around the priced call) or a span above it does (an agent that reports what its calls cost
    in all): the totals count that figure. Parents are followed as given; a cycle is walked once."""
    found = list(nodes)
    parent_of = {node.span_id: node.parent_span_id for node in found}
    children: dict[str, list[str]] = {}
    for node in found:
        if node.parent_span_id is not None:
            children.setdefault(node.parent_span_id, []).append(node.span_id)
    priced = [node.span_id for node in found if node.has_cost]
    above: set[str] = set()
    for span_id in priced:
        # Up: an ancestor of a priced span has its cost counted below it.
        current = parent_of.get(span_id)
        while current is not None and current in parent_of and current not in above:
            above.add(current)
            current = parent_of[current]
    within = set(priced)
    pending = list(priced)
    while pending:
        # Down: a descendant of a priced span is within that span's figure.
        for child in children.get(pending.pop(), ()):
            if child not in within:
                within.add(child)
                pending.append(child)
    covered = above | within
    unpriced = [node for node in found if node.is_model_call and node.span_id not in covered]
    return len(unpriced), tuple(sorted({node.model for node in unpriced if node.model}))


def _billed(span: Span) -> bool:
    return model_call_billed(span_type=span.span_type, status=span.status, has_usage=not span.usage.is_empty)


def _totals(tree: _Tree, steps: list[Step], tool_calls: list[ToolCall]) -> Totals:
    usage, cost = _own_figures(tree)
    unpriced_count = 0
    unpriced_models: tuple[str, ...] = ()
    # Only a billed call without a cost of its own can be unpriced: the tree is walked only for a trajectory
    # that has one. Ingest prices every call of a known model, so most have none.
    if any(span.cost_usd is None and _billed(span) for span, _, _ in tree.ordered):
        unpriced_count, unpriced_models = unpriced_calls(
            CostNode(span.span_id, parent, _billed(span), span.cost_usd is not None, span.model)
            for span, _, parent in tree.ordered
        )
    input_tokens = output_tokens = total_tokens = cache_read = reasoning = 0
    for figures in usage.values():
        input_tokens += figures.input_tokens or 0
        output_tokens += figures.output_tokens or 0
        total_tokens += (
            figures.total_tokens
            if figures.total_tokens is not None
            else (figures.input_tokens or 0) + (figures.output_tokens or 0)
        )
        cache_read += figures.cache_read_tokens or 0
        reasoning += figures.reasoning_tokens or 0
    spans = [span for span, _, _ in tree.ordered]
    start = min((span.start_time_ns for span in spans), default=0)
    end = max((span.end_time_ns for span in spans), default=0)
    return Totals(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        total_tokens=total_tokens,
        cache_read_tokens=cache_read,
        reasoning_tokens=reasoning,
        cost_usd=sum(cost.values()) if cost else None,
        duration_ns=end - start,
        span_count=len(spans),
        step_count=len(steps),
        llm_call_count=sum(1 for step in steps if step.kind == "llm_call"),
        tool_call_count=len(tool_calls),
        error_count=sum(1 for span in spans if span.status == "error"),
        unpriced_call_count=unpriced_count,
        unpriced_models=unpriced_models,
    )


def _first_value(spans: Iterable[Span], field: str) -> Any:
    for span in spans:
        value = getattr(span, field)
        if value is not None:
            return value
    return None


def trajectory_view_build(spans: Iterable[Span], *, trace_id: str | None = None) -> TrajectoryView:
    """Assemble the trajectory of one trace from its spans, in any order, possibly incomplete."""
    span_list = list(spans)
    tree = _tree(span_list)
    builder = _Builder(tree)
    builder.build()
    ordered_spans = [span for span, _, _ in tree.ordered]
    # Trace-level facts come from the root first, then from the other spans in reading order.
    reading = ([tree.root] if tree.root is not None else []) + ordered_spans

    prompt_versions: dict[tuple[str | None, str | None], None] = {}
    tags: dict[str, None] = {}
    definitions: dict[str, dict[str, Any]] = {}
    for span in ordered_spans:
        if span.prompt_name is not None or span.prompt_version is not None:
            prompt_versions.setdefault((span.prompt_name, span.prompt_version), None)
        for tag in span.tags:
            tags.setdefault(tag, None)
        for definition in span.tool_definitions:
            function = definition.get("function")
            name = function.get("name") if isinstance(function, dict) else None
            definitions.setdefault(str(name), definition)

    error_count = sum(1 for span in ordered_spans if span.status == "error")
    status: TrajectoryStatus = "error" if error_count else "running" if tree.root is None else "ok"
    totals = _totals(tree, builder.steps, builder.tool_calls)
    return TrajectoryView(
        trace_id=trace_id or (span_list[0].trace_id if span_list else ""),
        status=status,
        root_span_id=tree.root.span_id if tree.root is not None else None,
        root_span_name=tree.root.name if tree.root is not None else None,
        start_time_ns=min((span.start_time_ns for span in ordered_spans), default=0),
        end_time_ns=max((span.end_time_ns for span in ordered_spans), default=0),
        steps=tuple(builder.steps),
        conversation=tuple(builder.conversation.messages),
        tool_calls=tuple(builder.tool_calls),
        totals=totals,
        session_id=_first_value(reading, "session_id"),
        user_id=_first_value(reading, "user_id"),
        agent_name=_first_value(reading, "agent_name"),
        tags=tuple(tags),
        prompt_versions=tuple(PromptUse(name=name, version=version) for name, version in prompt_versions),
        tool_definitions=tuple(definitions.values()),
        task_id=_first_value(reading, "task_id"),
        reward=_first_value(reading, "reward"),
        name=_first_value(reading, "trace_name") or (tree.root.name if tree.root is not None else None),
    )


# --- As a document ---------------------------------------------------------------------------------

_STEP_FIELDS: Final = tuple(field.name for field in fields(Step))


def view_document_json(view: TrajectoryView, *, full_inputs: bool = False) -> bytes:
    """The view as the JSON object the trajectory detail API shows under its own keys: `step_details`,
    `conversation`, `tool_calls_detail`, `tool_definitions`. Keel stores it with long trajectories, and
    the API splices it into its answer as it is (tracing.api), without parsing it again.

    Each LLM call lists only the input messages it added to what the previous call saw (with
    `input_message_count` for its whole input) unless `full_inputs`: every call repeats the history,
    so full inputs grow with the square of the trajectory's length.
    """
    steps: list[Step | dict[str, Any]] = []
    previous: tuple[dict[str, Any], ...] = ()
    previous_output: dict[str, Any] | None = None
    for step in view.steps:
        inputs = step.input_messages
        if step.kind != "llm_call" or inputs is None:
            steps.append(step)
            continue
        shown = inputs
        if not full_inputs:
            known = len(previous)
            shown = inputs[known:] if inputs[:known] == previous else inputs
            # The previous call's answer opens this call's new input; it is shown with that call.
            if shown and previous_output is not None and shown[0] == previous_output:
                shown = shown[1:]
        # A shallow dict of the step's fields: orjson writes the nested values (messages, usage) itself.
        detail = {name: getattr(step, name) for name in _STEP_FIELDS}
        detail["input_messages"] = shown
        detail["input_message_count"] = len(inputs)
        steps.append(detail)
        previous, previous_output = inputs, step.output_message
    document = {
        "step_details": steps,
        "conversation": view.conversation,
        "tool_calls_detail": view.tool_calls,
        "tool_definitions": view.tool_definitions,
    }
    try:
        return orjson.dumps(document, default=str)
    except TypeError:
        # An integer past 64 bits, which orjson refuses: tool arguments and results read by the standard
        # library's JSON parser (`_parse`) keep them. The standard library writes any integer.
        return json.dumps(document, default=_json_fallback).encode()


def _json_fallback(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return {item.name: getattr(value, item.name) for item in fields(value)}
    return str(value)
