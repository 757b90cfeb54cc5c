"""A stored trajectory read as trajectory metrics see it: `verifiers.TrajectoryFacts`, and the `EvalOutput`
(final answer, tool calls, facts) an eval scores.

Where each fact comes from:
- model calls are the trajectory's generation steps; steps are model calls plus tool calls;
- actions are its tool calls in order, "errored" when the tool's span errored. Two kinds of guardrail
  span change them: the gateway's action boundary ("action boundary: <tool>", a call refused before
  it ran) adds the refused call as "blocked" or "pending_approval"; a tool result the content guard
  blocked ("guardrail tool: result of <tool> block") marks that call "blocked";
- approvals are the approval events recorded under the trace: a call that ran on an approval is
  approved, a call refused because a person had rejected it is "rejected", and a call that asked for
  approval carries its request's decision so far;
- escalated when the gateway routed the trace to the human tier (its "tier:human" tag) or a hand-off
  was opened for it; signals are the trajectory's triage signal names.

Reads: the trace's spans, its approval events and whether it has a hand-off; one query each.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from evals.dataset_items import content_text
from evals.verifiers import ActionRecord, EvalOutput, ToolCall, TrajectoryFacts
from guardrails.models import ApprovalEvent, ApprovalEventKind, ApprovalStatus
from routing.models import Handoff
from tracing import selectors as tracing_selectors
from tracing import steps as tracing_steps
from tracing.models import Trajectory
from tracing.otlp import Span

HUMAN_TIER_TAG = "tier:human"
TIER_TAG_PREFIX = "tier:"
ACTION_BOUNDARY_PREFIX = "action boundary: "
TOOL_RESULT_GUARD_PREFIX = "guardrail tool: result of "
# A guard's verdicts that stop what they check (routing.hooks.ContentVerdict.stops).
STOPPING_VERDICTS = frozenset(("block", "require_approval"))
# The actions an approval event can be about: a call that ran on an approval, or one refused while waiting.
USED_ON = frozenset(("executed", "errored", "blocked"))
ASKED_ON = frozenset(("pending_approval", "blocked"))


@dataclass(slots=True)
class _Action:
    """An action being assembled; frozen into an ActionRecord at the end."""

    name: str
    arguments: dict[str, Any]
    status: str
    error: str | None = None
    approved: bool | None = None
    ran: bool = True  # it reached the tool, so it had a result for the content guard to check


def _arguments(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError:
            return {}
    return dict(value) if isinstance(value, Mapping) else {}


def _requested_arguments(message: Mapping[str, Any] | None, tool: str) -> dict[str, Any]:
    """The arguments the model gave `tool` in its last message: a refused call has no tool span to hold them."""
    calls = message.get("tool_calls") if message else None
    for call in calls if isinstance(calls, list) else ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and function.get("name") == tool:
            return _arguments(function.get("arguments"))
    return {}


def _result_guard_tool(name: str) -> str | None:
    """The tool a content-guard span checked the result of: "guardrail tool: result of <tool> <verdict>"."""
    if not name.startswith(TOOL_RESULT_GUARD_PREFIX):
        return None
    tool, _, _ = name.removeprefix(TOOL_RESULT_GUARD_PREFIX).rpartition(" ")
    return tool or None


@dataclass(frozen=True, slots=True)
class _Read:
    view: tracing_steps.TrajectoryView
    facts: TrajectoryFacts


def _read(trajectory: Trajectory) -> _Read:
    spans = tracing_selectors.trajectory_spans(trajectory=trajectory)
    view = tracing_steps.trajectory_view_build(spans, trace_id=trajectory.trace_id)
    by_span: dict[str, Span] = {span.span_id: span for span in spans}
    tool_calls = {call.step_index: call for call in view.tool_calls}

    actions: list[_Action] = []
    guardrail_actions: list[str] = []
    blocked_results: dict[str, int] = {}  # tool -> results its content guard blocked
    model_calls = 0
    last_output: Mapping[str, Any] | None = None
    for step in view.steps:
        if step.kind == "llm_call":
            model_calls += 1
            last_output = step.output_message
        elif step.kind == "tool_call" and step.index in tool_calls:
            call = tool_calls[step.index]
            errored = call.status == "error"
            actions.append(
                _Action(call.name, _arguments(call.arguments), "errored" if errored else "executed", call.error)
            )
        elif step.kind == "guardrail":
            span = by_span.get(step.span_id)
            metadata = span.metadata if span is not None else {}
            if step.name.startswith(ACTION_BOUNDARY_PREFIX):
                tool = str(metadata.get("tool") or step.name.removeprefix(ACTION_BOUNDARY_PREFIX))
                waiting = metadata.get("verdict") == "require_approval"
                guardrail_actions.append("require_approval" if waiting else "block")
                actions.append(
                    _Action(
                        tool,
                        _requested_arguments(last_output, tool),
                        "pending_approval" if waiting else "blocked",
                        str(metadata.get("reason") or step.error or "") or None,
                        ran=False,
                    )
                )
                continue
            verdict = step.output.get("verdict") if isinstance(step.output, dict) else None
            if isinstance(verdict, str):
                guardrail_actions.append(verdict)
            checked = _result_guard_tool(step.name)
            if checked is not None and verdict in STOPPING_VERDICTS:
                blocked_results[checked] = blocked_results.get(checked, 0) + 1

    _mark_blocked_results(actions, blocked_results)
    _apply_approvals(actions, trajectory)

    tier = next((tag.removeprefix(TIER_TAG_PREFIX) for tag in trajectory.tags if tag.startswith(TIER_TAG_PREFIX)), None)
    escalated = HUMAN_TIER_TAG in trajectory.tags or (
        Handoff.objects.filter(workspace_id=trajectory.workspace_id, trace_id=trajectory.trace_id).exists()
    )
    facts = TrajectoryFacts(
        trace_id=trajectory.trace_id,
        status=trajectory.status,
        steps=model_calls + len(view.tool_calls),
        model_calls=model_calls,
        # Null when its model calls went unpriced; 0 both when it was free and when it made no priced call at
        # all (no span reports a cost): the spans tell which.
        cost_usd=float(trajectory.cost_usd)
        if trajectory.cost_usd is not None and view.totals.cost_usd is not None
        else None,
        latency_ms=trajectory.latency_ms,
        input_tokens=trajectory.input_tokens,
        output_tokens=trajectory.output_tokens,
        tier=tier,
        escalated=escalated,
        actions=tuple(
            ActionRecord(action.name, action.arguments, action.status, action.approved, action.error)
            for action in actions
        ),
        guardrail_actions=tuple(guardrail_actions),
        signals=tuple(trajectory.signal_names),
    )
    return _Read(view=view, facts=facts)


def _mark_blocked_results(actions: list[_Action], blocked_results: Mapping[str, int]) -> None:
    """Mark the calls whose results the content guard blocked. A client's tool result is guarded before
    the model call that shows it, a Keel-side one after its tool span, and earlier turns sent again are
    not guarded at all, so the blocked results are the latest calls of the tool, counted from the end."""
    for tool, count in blocked_results.items():
        ran = [action for action in actions if action.name == tool and action.ran]
        for action in ran[-count:]:
            action.status = "blocked"
            action.error = action.error or "the guardrails withheld its result"


def _apply_approvals(actions: list[_Action], trajectory: Trajectory) -> None:
    events = (
        ApprovalEvent.objects.filter(
            approval__workspace_id=trajectory.workspace_id,
            trace_id=trajectory.trace_id,
            kind__in=[ApprovalEventKind.USED, ApprovalEventKind.REFUSED, ApprovalEventKind.REQUESTED],
        )
        .select_related("approval")
        .order_by("created_at", "pk")
    )
    claimed: set[int] = set()
    for event in events:
        approval = event.approval
        wanted: frozenset[str] = USED_ON if event.kind == ApprovalEventKind.USED else ASKED_ON
        candidates = [
            (position, action)
            for position, action in enumerate(actions)
            if position not in claimed and action.name == approval.tool and action.status in wanted
        ]
        # The call with the approved arguments; a pseudonymised argument may differ, so fall back to the name.
        match = next(
            ((p, a) for p, a in candidates if a.arguments == approval.arguments), candidates[0] if candidates else None
        )
        if match is None:
            continue
        position, action = match
        claimed.add(position)
        if event.kind == ApprovalEventKind.USED:
            action.approved = True
        elif event.kind == ApprovalEventKind.REFUSED or approval.status == ApprovalStatus.REJECTED:
            action.status, action.approved = "rejected", False
        elif approval.status in (ApprovalStatus.APPROVED, ApprovalStatus.USED):
            action.approved = True


def trajectory_facts(*, trajectory: Trajectory) -> TrajectoryFacts:
    """What the stored trajectory did, for trajectory metrics. `trajectory` is already scoped to the caller."""
    return _read(trajectory).facts


def eval_output_from_trajectory(*, trajectory: Trajectory) -> EvalOutput:
    """The trajectory as an eval output: its final answer's text (the last model answer with text, else
    the stored output preview), its tool calls in order, and its facts."""
    return eval_output_and_view(trajectory=trajectory)[0]


def eval_output_and_view(*, trajectory: Trajectory) -> tuple[EvalOutput, tracing_steps.TrajectoryView]:
    """`eval_output_from_trajectory` and the view it read, for a caller that needs both (one read of spans)."""
    read = _read(trajectory)
    text: str | None = None
    for step in reversed(read.view.steps):
        if step.kind == "llm_call" and step.output_message is not None:
            text = content_text(step.output_message.get("content"))
            if text:
                break
    tool_calls = tuple(ToolCall(call.name, _arguments(call.arguments)) for call in read.view.tool_calls)
    output = EvalOutput(text=text or trajectory.output_preview, tool_calls=tool_calls, trajectory=read.facts)
    return output, read.view
