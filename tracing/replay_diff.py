"""Where a counterfactual replay parts from its original. Pure module, no Django.

`replay_diff(original, replay, from_step=)` lines up the steps of two `TrajectoryView`s in two sections:

- the history: the original's steps before the model call the replay re-made (the first `llm_call` at
  or after `from_step`), against the replay's steps before its first model call, which are that same
  history as the replay sent it (with another system prompt, say);
- the replayed part: both trajectories from those model calls on.

In each section steps are paired by what they are (an assistant turn, a user or system message, a call
to tool X, ...) along difflib's longest matching blocks, so an extra tool call on one side shifts
nothing after it. A pair whose contents differ is "changed" and lists the fields that differ; an
unpaired step is "only_in_original" or "only_in_replay". An assistant turn counts as the same thing
whether it is an LLM call or, in the replay's history, a message. `first_difference` is the first pair
of the replayed part that is not the same: where the two runs part.

A replay from inside a sub-agent resumes the agent above it, whose first model call then sends that agent's
recorded conversation again: the messages (and tool calls read from them) it shows for the first time that
the original's history holds count as history, placed before the replay's first sub-agent, where the
original had them. What that call shows that the original's history does not (the sub-agent's new answer
as the parent received it) stays in the replayed part.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Any, Literal

from tracing.steps import Step, TrajectoryView

StepStatus = Literal["same", "changed", "only_in_original", "only_in_replay"]


# --- JSON values ------------------------------------------------------------------------------------


def json_parsed(value: Any) -> Any:
    """A value that may be JSON text (tool arguments, tool results) as the value it encodes."""
    if isinstance(value, str) and value.lstrip()[:1] in ("{", "["):
        try:
            return json.loads(value)
        except (ValueError, RecursionError):
            return value
    return value


def json_equal(left: Any, right: Any) -> bool:
    """Equality of JSON values: key order aside, 1 == 1.0, but true is not 1 and "1" is not 1."""
    if isinstance(left, bool) or isinstance(right, bool):
        return isinstance(left, bool) and isinstance(right, bool) and left == right
    if isinstance(left, int | float) and isinstance(right, int | float):
        return left == right
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(json_equal(left[key], right[key]) for key in left)
    if isinstance(left, list | tuple) and isinstance(right, list | tuple):
        return len(left) == len(right) and all(json_equal(a, b) for a, b in zip(left, right, strict=True))
    return type(left) is type(right) and bool(left == right)


# --- Result -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FieldChange:
    """One field of a step on each side; None on the side that lacks the step."""

    field: str
    original: Any
    replay: Any


@dataclass(frozen=True, slots=True)
class StepPair:
    status: StepStatus
    replayed: bool  # False in the history section
    original_index: int | None
    replay_index: int | None
    kind: str  # the original's step kind, or the replay's when only the replay has the step
    label: str  # "assistant", "user message", "tool lookup_trip", ...
    changes: tuple[FieldChange, ...]


@dataclass(frozen=True, slots=True)
class SideTotals:
    steps: int
    llm_calls: int
    tool_calls: int
    errors: int
    input_tokens: int
    output_tokens: int
    total_tokens: int
    cost_usd: float | None
    latency_ms: float


@dataclass(frozen=True, slots=True)
class TotalsPair:
    original: SideTotals
    replay: SideTotals


@dataclass(frozen=True, slots=True)
class ReplayDiff:
    """`totals` compare whole trajectories; `replayed_totals` only the replayed part, since the replay
    never re-ran the history and so never paid for it."""

    from_step: int
    original_start: int | None
    replay_start: int | None
    first_difference: int | None  # a position in `steps`
    steps: tuple[StepPair, ...]
    totals: TotalsPair
    replayed_totals: TotalsPair


# --- Comparing steps --------------------------------------------------------------------------------


def _is_assistant_turn(step: Step) -> bool:
    return step.kind == "llm_call" or (step.kind == "message" and step.role == "assistant")


def _key(step: Step) -> tuple[str, str]:
    if _is_assistant_turn(step):
        return ("assistant", "")
    if step.kind == "message":
        return ("message", step.role or "")
    if step.kind == "tool_call":
        return ("tool", step.tool_name or step.name)
    return (step.kind, step.name)


def _label(step: Step) -> str:
    kind, name = _key(step)
    if kind == "assistant":
        return "assistant"
    if kind == "message":
        return f"{name or 'unknown'} message"
    return f"{kind} {name}".strip()


def _tool_requests(message: dict[str, Any] | None) -> list[dict[str, Any]]:
    calls = message.get("tool_calls") if message else None
    if not isinstance(calls, list):
        return []
    requests = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            requests.append({"name": function.get("name"), "arguments": json_parsed(function.get("arguments"))})
    return requests


def _fields(step: Step, *, is_root: bool) -> dict[str, Any]:
    """What a step says, for comparison; times, ids, models and token counts are left to the totals."""
    if _is_assistant_turn(step):
        if step.kind == "message":
            return {"content": step.content}
        message = step.output_message
        return {
            "content": message.get("content") if message is not None else step.output,
            "tool_calls": _tool_requests(message),
            "error": step.error,
        }
    if step.kind == "message":
        return {"content": step.content}
    if step.kind == "tool_call":
        return {
            "arguments": json_parsed(step.tool_arguments),
            "result": json_parsed(step.tool_result),
            "error": step.error,
        }
    if is_root:
        # The root span sums up the whole run (its output is the final answer): compared through the rest.
        return {"name": step.name}
    return {"name": step.name, "input": step.input, "output": step.output, "error": step.error}


def _is_root(step: Step) -> bool:
    return step.depth == 0 and step.parent_span_id is None


def _pair(original: Step, replay: Step, *, replayed: bool) -> StepPair:
    left = _fields(original, is_root=_is_root(original))
    right = _fields(replay, is_root=_is_root(replay))
    changes: list[FieldChange] = []
    if _key(original) != _key(replay):
        changes.append(FieldChange("step", _label(original), _label(replay)))
    # Fields only one side has (an LLM call's tool requests against a history message) say nothing.
    for field in (name for name in left if name in right):
        if not json_equal(left[field], right[field]):
            changes.append(FieldChange(field, left[field], right[field]))
    return StepPair(
        status="changed" if changes else "same",
        replayed=replayed,
        original_index=original.index,
        replay_index=replay.index,
        kind=original.kind,
        label=_label(original),
        changes=tuple(changes),
    )


def _alone(step: Step, *, in_original: bool, replayed: bool) -> StepPair:
    fields = _fields(step, is_root=_is_root(step))
    return StepPair(
        status="only_in_original" if in_original else "only_in_replay",
        replayed=replayed,
        original_index=step.index if in_original else None,
        replay_index=None if in_original else step.index,
        kind=step.kind,
        label=_label(step),
        changes=tuple(
            FieldChange(field, value, None) if in_original else FieldChange(field, None, value)
            for field, value in fields.items()
        ),
    )


def _align(original: Sequence[Step], replay: Sequence[Step], *, replayed: bool) -> list[StepPair]:
    matcher = SequenceMatcher(a=[_key(s) for s in original], b=[_key(s) for s in replay], autojunk=False)
    pairs: list[StepPair] = []
    for tag, a_start, a_end, b_start, b_end in matcher.get_opcodes():
        left, right = original[a_start:a_end], replay[b_start:b_end]
        if tag == "equal":
            pairs.extend(_pair(a, b, replayed=replayed) for a, b in zip(left, right, strict=True))
            continue
        if tag == "replace":
            # A replaced block pairs up in order where both sides did the same kind of thing (tool A where
            # the other called tool B is a change); steps of different kinds (a tool call where the other
            # ran a guardrail) stand alone, as does what one side has beyond the other.
            for a, b in zip(left, right, strict=False):
                if _key(a)[0] == _key(b)[0]:
                    pairs.append(_pair(a, b, replayed=replayed))
                else:
                    pairs += [
                        _alone(a, in_original=True, replayed=replayed),
                        _alone(b, in_original=False, replayed=replayed),
                    ]
            left, right = left[len(right) :], right[len(left) :]
        pairs.extend(_alone(step, in_original=True, replayed=replayed) for step in left)
        pairs.extend(_alone(step, in_original=False, replayed=replayed) for step in right)
    return pairs


# --- Totals -----------------------------------------------------------------------------------------


def _view_totals(view: TrajectoryView) -> SideTotals:
    totals = view.totals
    return SideTotals(
        steps=totals.step_count,
        llm_calls=totals.llm_call_count,
        tool_calls=totals.tool_call_count,
        errors=totals.error_count,
        input_tokens=totals.input_tokens,
        output_tokens=totals.output_tokens,
        total_tokens=totals.total_tokens,
        cost_usd=totals.cost_usd,
        latency_ms=totals.duration_ns / 1e6,
    )


def _segment_totals(steps: Sequence[Step]) -> SideTotals:
    """Totals of a run of steps: tokens and cost of its model and tool calls, wall time from first to last."""
    input_tokens = output_tokens = total_tokens = 0
    costs: list[float] = []
    for step in steps:
        if step.kind == "llm_call" and step.usage is not None:
            input_tokens += step.usage.input_tokens or 0
            output_tokens += step.usage.output_tokens or 0
            total_tokens += (
                step.usage.total_tokens
                if step.usage.total_tokens is not None
                else (step.usage.input_tokens or 0) + (step.usage.output_tokens or 0)
            )
        if step.kind in ("llm_call", "tool_call") and step.cost_usd is not None:
            costs.append(step.cost_usd)
    start = min((step.start_time_ns for step in steps), default=0)
    end = max((step.end_time_ns for step in steps), default=0)
    return SideTotals(
        steps=len(steps),
        llm_calls=sum(1 for step in steps if step.kind == "llm_call"),
        tool_calls=sum(1 for step in steps if step.kind == "tool_call"),
        errors=sum(1 for step in steps if step.status == "error"),
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        total_tokens=total_tokens,
        cost_usd=sum(costs) if costs else None,
        latency_ms=max(0, end - start) / 1e6,
    )


# --- The diff ---------------------------------------------------------------------------------------


def _history_signature(step: Step) -> tuple[str, str, str]:
    """What a history step says, the same whether a model call's answer or a message repeats it."""
    kind, name = _key(step)
    if step.kind == "tool_call":
        said: Any = [json_parsed(step.tool_arguments), json_parsed(step.tool_result)]
    elif step.kind == "llm_call":
        said = step.output_message.get("content") if step.output_message is not None else step.output
    else:
        said = step.content
    return (kind, name, json.dumps(said, sort_keys=True, default=str))


def _resent_history(original_history: Sequence[Step], replay_rest: Sequence[Step]) -> tuple[list[Step], list[Step]]:
    """The replay's replayed steps split in two: those a model call shows that re-send the original's history
    (a resumed parent's conversation), and the rest."""
    call_spans = {step.span_id for step in replay_rest if step.kind == "llm_call"}
    available = Counter(_history_signature(step) for step in original_history)
    resent: list[Step] = []
    rest: list[Step] = []
    for step in replay_rest:
        signature = _history_signature(step)
        if step.kind != "llm_call" and step.span_id in call_spans and available[signature] > 0:
            available[signature] -= 1
            resent.append(step)
        else:
            rest.append(step)
    return resent, rest


def replay_start_step(view: TrajectoryView, from_step: int) -> int | None:
    """The step of the model call a replay from `from_step` re-makes: the first LLM call at or after it."""
    return next((step.index for step in view.steps[max(from_step, 0) :] if step.kind == "llm_call"), None)


def replay_diff(original: TrajectoryView, replay: TrajectoryView, *, from_step: int) -> ReplayDiff:
    """Align a replay with its original and say where they part."""
    original_start = replay_start_step(original, from_step)
    replay_start = replay_start_step(replay, 0)
    original_split = len(original.steps) if original_start is None else original_start
    replay_split = len(replay.steps) if replay_start is None else replay_start
    original_history = original.steps[:original_split]
    resent, replay_rest = _resent_history(original_history, replay.steps[replay_split:])
    replay_history = list(replay.steps[:replay_split])
    # The parent's history came before it handed over: before the replay's first sub-agent.
    handover = next(
        (at for at, step in enumerate(replay_history) if step.kind == "agent" and not _is_root(step)),
        len(replay_history),
    )
    replay_history[handover:handover] = resent
    history = _align(original_history, replay_history, replayed=False)
    replayed = _align(original.steps[original_split:], replay_rest, replayed=True)
    steps = (*history, *replayed)
    first_difference = next(
        (position for position, pair in enumerate(steps) if pair.replayed and pair.status != "same"), None
    )
    return ReplayDiff(
        from_step=from_step,
        original_start=original_start,
        replay_start=replay_start,
        first_difference=first_difference,
        steps=steps,
        totals=TotalsPair(original=_view_totals(original), replay=_view_totals(replay)),
        replayed_totals=TotalsPair(
            original=_segment_totals(original.steps[original_split:]),
            replay=_segment_totals(replay_rest),
        ),
    )
