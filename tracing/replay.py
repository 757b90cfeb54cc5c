"""Counterfactual replay: re-run a recorded trajectory from one of its steps with another prompt version
and/or model, serving the tool calls from the recording.

`replay_create` validates a request and stores a pending `Replay`; a worker runs it with
`replay_execute`:

1. The history is what the original sent to the model at the first model call at or after `from_step`.
   With a prompt version given, its rendered system prompt replaces the recorded system message
   (rendered with the variables the original recorded under the metadata key `prompt_variables`).
2. A loop calls the model through litellm with the tool definitions the re-made call recorded (else every
   one the recording shows). A model name, the replay's or a recorded one (a resumed parent's too), that
   is the alias of one of the workspace's enabled model targets, or else its litellm model string, is
   called through that target, on its server with its key, as the gateway calls it: a workspace whose
   gateway serves the name its agents record (a target named "gpt-4o") replays on it. Each tool call the
   model makes is looked up in the recording by name and arguments (parsed JSON, key order aside): a match
   serves the recorded result; a call with no match is a divergence, where the replay stops or, under
   the "stub" policy, serves a stub and goes on. The loop ends when the model answers without tool
   calls, or after `max_steps` model calls.
3. From a model call inside a sub-agent (an agent span below another agent), the loop above re-runs only
   the sub-agent. Once it answers, the agent above it is resumed: its conversation as it sent it at its
   first model call after the sub-agent returned, with the sub-agent's recorded result replaced by the
   replay's answer in the message that carried it (the result of the tool call whose span holds the
   sub-agent, when it shows the recorded answer, or else the last message quoting it), goes on in the same
   loop, on that agent's recorded model and tools (the prompt version and model of the replay are the
   sub-agent's); `max_steps` counts every model call. An agent above that one is resumed in turn. When the
   agent above cannot be located (no model call after the sub-agent, or none that shows its answer), the
   replay finishes with the sub-agent's answer, and says why in its `error` and in the root span's
   `keel.replay.note`.
4. The run's spans (a root agent span, an agent span for each sub-agent around the call re-made, a
   generation per model call and a tool span per served call, marked `keel.replay.source` = recording |
   stub, under the agent that made them) are stored with `tracing.services.spans_write` as a new
   trajectory whose `replay_of` is the original.

Provider errors that may pass (rate limit, timeout, server error, refused connection) put the replay back
to pending and raise `ReplayProviderUnavailable`, which the task retries; any other provider error fails
the replay with the error recorded. Spans are written once, at the end, so a retried run never leaves half
a trajectory.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Final

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.db.models.functions import Greatest
from django.utils import timezone

from agent_registry import prompts
from agent_registry.models import ApiKey, PromptType, PromptVersion, User
from config import dispatch
from config.errors import KeelError
from config.redact import redact
from routing import demo_provider, providers
from routing.models import ModelTarget
from tracing import exceptions, otlp, selectors, services
from tracing.models import DivergencePolicy, Replay, ReplayStatus, Trajectory, TrajectoryStatus
from tracing.replay_diff import json_equal, json_parsed, replay_start_step
from tracing.steps import Step, ToolCall, TrajectoryView, trajectory_view_build

logger = logging.getLogger("tracing.replay")

MAX_STEPS_LIMIT: Final = 50
DEFAULT_MAX_STEPS: Final = 20
MAX_ATTEMPTS: Final = 5
# The task's limits; the lease outlasts the hard limit, so a replay is taken over only once its worker is gone.
SOFT_TIME_LIMIT_SECONDS: Final = 600
TIME_LIMIT_SECONDS: Final = 660
LEASE_SECONDS: Final = 900
REQUEUE_AFTER_SECONDS: Final = 120
MODEL_TIMEOUT_SECONDS: Final = 120
REPLAY_TAG: Final = "replay"
SOURCE_ATTRIBUTE: Final = "keel.replay.source"
NOTE_ATTRIBUTE: Final = "keel.replay.note"
VARIABLES_METADATA_KEY: Final = "prompt_variables"
GENERIC_STUB: Final[dict[str, Any]] = {
    "stub": True,
    "detail": "No recorded call matches this one; Keel's replay served a stub result.",
}
# Model parameters a prompt version's config may carry that a replay passes on to the model.
_MODEL_PARAMETERS: Final = (
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
)
_SYSTEM_ROLES: Final = ("system", "developer")


# --- The plan: what a replay sends first ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplayPlan:
    """What a replay sends first: the messages, model, tools and parameters; and what it serves tools from."""

    messages: tuple[dict[str, Any], ...]
    model: str
    tools: tuple[dict[str, Any], ...]
    parameters: dict[str, Any]
    recorded_calls: tuple[ToolCall, ...]
    steps_planned: int
    variables: dict[str, Any] = field(default_factory=dict)
    # What the agent told the model of each recorded call (tool call id → tool message content).
    tool_messages: dict[str, Any] = field(default_factory=dict)
    # The agents around the model call re-made, innermost first (the root's agent span last, if it is one).
    agents: tuple[Step, ...] = ()
    # From a call inside a sub-agent: the agents above it to resume, innermost first, as each one below answers.
    resumes: tuple[ParentResume, ...] = ()
    # Why the agent above the last one in `resumes` (or above the sub-agent) cannot be resumed; "" when it can.
    resume_note: str = ""


@dataclass(frozen=True, slots=True)
class ParentResume:
    """Where the agent above a sub-agent goes on once the sub-agent answers: its conversation as it sent it at
    its first model call after the sub-agent returned, whose message `carrier` holds the sub-agent's result."""

    sub_agent: Step
    resumed_at: Step  # the parent's model call
    messages: tuple[dict[str, Any], ...]
    carrier: int
    recorded_answer: str
    model: str
    tools: tuple[dict[str, Any], ...]


def _invalid(detail: str, field_name: str, *, code: str | None = None) -> exceptions.ReplayInvalid:
    return exceptions.ReplayInvalid(detail, code=code, errors=[{"field": field_name, "message": detail}])


def _recorded_variables(spans: Sequence[otlp.Span]) -> dict[str, Any]:
    """The prompt variables the original recorded (metadata `prompt_variables`: an object or its JSON)."""
    variables: dict[str, Any] = {}
    for span in sorted(spans, key=lambda span: (span.start_time_ns, span.span_id)):
        value = json_parsed(span.metadata.get(VARIABLES_METADATA_KEY))
        if isinstance(value, dict):
            variables.update(value)
    return variables


def _system_prompt(prompt_version: PromptVersion, variables: Mapping[str, Any]) -> str:
    name = f"{prompt_version.prompt.name} v{prompt_version.version}"
    template: str | list[dict[str, Any]] = prompt_version.template
    if prompt_version.type == PromptType.CHAT:
        template = [item for item in prompt_version.template if item.get("role") in _SYSTEM_ROLES]
        if not template:
            raise _invalid(f"prompt {name} has no system message to replace the recorded one", "prompt_version")
    try:
        rendered = prompts.template_render(template, variables)
    except prompts.MissingVariables as error:
        raise _invalid(
            f"prompt {name} needs variables the original did not record: {', '.join(error.names)}",
            "prompt_version",
            code="missing_variables",
        ) from None
    if isinstance(rendered, str):
        return rendered
    return "\n\n".join(str(message["content"]) for message in rendered)


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return json.dumps(value, ensure_ascii=False, default=str)


def _message_for_model(message: Mapping[str, Any]) -> dict[str, Any]:
    """A recorded message as a chat API takes it: tool arguments and tool results as text."""
    role = str(message.get("role") or "user")
    out: dict[str, Any] = {"role": role, "content": message.get("content")}
    if role == "tool":
        out["content"] = _as_text(message.get("content"))
        out["tool_call_id"] = message.get("tool_call_id")
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls:
        out["tool_calls"] = [
            {
                "id": call.get("id"),
                "type": "function",
                "function": {
                    "name": call["function"].get("name"),
                    "arguments": _as_text(call["function"].get("arguments")),
                },
            }
            for call in calls
            if isinstance(call, dict) and isinstance(call.get("function"), dict)
        ]
    if message.get("name"):
        out["name"] = message["name"]
    return out


def _with_system_prompt(messages: list[dict[str, Any]], system: str) -> list[dict[str, Any]]:
    for position, message in enumerate(messages):
        if message["role"] in _SYSTEM_ROLES:
            return [*messages[:position], {"role": message["role"], "content": system}, *messages[position + 1 :]]
    return [{"role": "system", "content": system}, *messages]


def _tool_messages(view: TrajectoryView) -> dict[str, Any]:
    """The tool results as the agent sent them to the model, by tool call id, from the recorded inputs."""
    sent: dict[str, Any] = {}
    for step in view.steps:
        for message in step.input_messages or ():
            if message.get("role") == "tool" and message.get("tool_call_id"):
                sent.setdefault(str(message["tool_call_id"]), message.get("content"))
    return sent


def _tool_definition(definition: Mapping[str, Any]) -> dict[str, Any]:
    # Some instrumentations record the bare function schema; chat APIs want it wrapped.
    if "function" not in definition and "name" in definition:
        return {"type": "function", "function": dict(definition)}
    return dict(definition)


_JSON_TYPES: Final = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"), (list, "array"))


def _definitions_from_calls(calls: Sequence[ToolCall]) -> tuple[dict[str, Any], ...]:
    """Definitions for the tools the recording shows being called, when the agent recorded none (the GenAI
    conventions make sending them opt-in): each tool's name, and the argument names and JSON types seen
    in its calls. Without them the model could call no tool, and no recorded result could be served."""
    seen: dict[str, dict[str, Any]] = {}
    for call in calls:
        properties = seen.setdefault(call.name, {})
        arguments = json_parsed(call.arguments)
        if isinstance(arguments, dict):
            for key, value in arguments.items():
                kind = next((name for kind, name in _JSON_TYPES if isinstance(value, kind)), "object")
                properties.setdefault(str(key), {"type": kind})
    return tuple(
        {
            "type": "function",
            "function": {
                "name": name,
                "description": "(no definition was recorded: built from the recorded calls)",
                "parameters": {"type": "object", "properties": properties},
            },
        }
        for name, properties in seen.items()
        if name
    )


def _recorded_call(spans: Sequence[otlp.Span], call: Step) -> tuple[str, tuple[dict[str, Any], ...]]:
    """The model a recorded model call asked for ("" if none) and the tools it was offered (none recorded: ()).
    The model the agent asked for, not the one that answered: a provider names its answer by a dated snapshot,
    or without the litellm prefix that routes the call ("qa-stub" for "openai/qa-stub")."""
    span = next((span for span in spans if span.span_id == call.span_id), None)
    if span is None:
        return call.model or "", ()
    return span.request_model or call.model or "", tuple(_tool_definition(item) for item in span.tool_definitions)


def _answer_replaced(value: Any, old: str, new: str) -> tuple[Any, bool]:
    """`value` with the text `old` replaced by `new` wherever it stands: the whole text, a string inside a
    JSON value (or JSON text, written back as JSON), or a part of a longer text; and whether it stood anywhere."""
    if isinstance(value, str):
        if value == old:
            return new, True
        parsed = json_parsed(value)
        if parsed is not value:
            replaced, found = _answer_replaced(parsed, old, new)
            return (json.dumps(replaced, ensure_ascii=False), True) if found else (value, False)
        return (value.replace(old, new), True) if old in value else (value, False)
    if isinstance(value, list):
        items = [_answer_replaced(item, old, new) for item in value]
        return [item for item, _ in items], any(found for _, found in items)
    if isinstance(value, dict):
        entries = {key: _answer_replaced(item, old, new) for key, item in value.items()}
        return {key: item for key, (item, _) in entries.items()}, any(found for _, found in entries.values())
    return value, False


class _Nesting:
    """The agent spans of the original around its steps: which agent a step belongs to, what lies inside one."""

    def __init__(self, view: TrajectoryView) -> None:
        # Message steps, and tool calls read from messages, carry the span id of the model call that showed them.
        from_messages = {call.step_index for call in view.tool_calls if call.source == "messages"}
        self.by_span = {
            step.span_id: step for step in view.steps if step.kind != "message" and step.index not in from_messages
        }

    def agent_of(self, step: Step) -> Step | None:
        """The nearest agent span above `step`."""
        parent = step.parent_span_id
        seen: set[str] = set()
        while parent is not None and parent not in seen:
            seen.add(parent)
            above = self.by_span.get(parent)
            if above is None:
                return None
            if above.kind == "agent":
                return above
            parent = above.parent_span_id
        return None

    def agents_around(self, step: Step) -> tuple[Step, ...]:
        chain: list[Step] = []
        agent = self.agent_of(step)
        while agent is not None and agent not in chain:
            chain.append(agent)
            agent = self.agent_of(agent)
        return tuple(chain)

    def inside(self, step: Step, agent: Step) -> bool:
        current: Step | None = step
        while current is not None and current.span_id != agent.span_id:
            current = self.by_span.get(current.parent_span_id) if current.parent_span_id is not None else None
        return current is not None

    def owns(self, agent: Step | None, step: Step) -> bool:
        owner = self.agent_of(step)
        return (owner.span_id if owner is not None else None) == (agent.span_id if agent is not None else None)

    def tool_call_id_carrying(self, sub_agent: Step, parent: Step | None) -> str | None:
        """The id of the tool call whose span holds `sub_agent` below `parent`: the call that delegated to it."""
        current = self.by_span.get(sub_agent.parent_span_id) if sub_agent.parent_span_id is not None else None
        while current is not None and (parent is None or current.span_id != parent.span_id):
            if current.kind == "tool_call" and current.tool_call_id:
                return current.tool_call_id
            current = self.by_span.get(current.parent_span_id) if current.parent_span_id is not None else None
        return None


def _parent_resume(
    *,
    view: TrajectoryView,
    spans: Sequence[otlp.Span],
    nesting: _Nesting,
    call: Step,
    default_tools: tuple[dict[str, Any], ...],
) -> tuple[ParentResume | None, str]:
    """How the agent above the sub-agent that makes model call `call` goes on once the sub-agent answers;
    (None, "") when the call belongs to no sub-agent, (None, why) when the agent above cannot be resumed."""
    sub_agent = nesting.agent_of(call)
    if sub_agent is None or sub_agent.parent_span_id is None:
        return None, ""
    parent = nesting.agent_of(sub_agent)
    name = sub_agent.agent_name or sub_agent.name
    inside = [step for step in view.steps if nesting.inside(step, sub_agent)]
    answers = [
        step.output_message.get("content")
        for step in inside
        if step.kind == "llm_call" and step.output_message is not None and nesting.owns(sub_agent, step)
    ]
    recorded_answer = answers[-1] if answers else None
    if not isinstance(recorded_answer, str) or not recorded_answer:
        return None, f"the parent agent was not resumed: sub-agent {name} recorded no final answer to replace"
    after = max(step.index for step in inside)
    following = next(
        (
            step
            for step in view.steps[after + 1 :]
            if step.kind == "llm_call" and nesting.owns(parent, step) and not nesting.inside(step, sub_agent)
        ),
        None,
    )
    if following is None or following.input_messages is None:
        return None, f"the parent agent was not resumed: it made no recorded model call after sub-agent {name} answered"
    messages = [_message_for_model(message) for message in following.input_messages]
    call_id = nesting.tool_call_id_carrying(sub_agent, parent)
    carrying = [
        position
        for position in reversed(range(len(messages)))
        if messages[position]["role"] not in _SYSTEM_ROLES
        and _answer_replaced(messages[position].get("content"), recorded_answer, "")[1]
    ]
    # The result of the call that delegated, when it shows the answer; else the last message that quotes it.
    carrier = next(
        (position for position in carrying if messages[position].get("tool_call_id") == call_id),
        carrying[0] if carrying else None,
    )
    if carrier is None:
        return None, (
            f"the parent agent was not resumed: sub-agent {name}'s answer is not in the parent's next model call "
            f"(step {following.index})"
        )
    model, tools = _recorded_call(spans, following)
    if not model:
        return None, f"the parent agent was not resumed: its model call at step {following.index} recorded no model"
    return (
        ParentResume(
            sub_agent=sub_agent,
            resumed_at=following,
            messages=tuple(messages),
            carrier=carrier,
            recorded_answer=recorded_answer,
            model=model,
            tools=tools or default_tools,
        ),
        "",
    )


def _parent_resumes(
    *, view: TrajectoryView, spans: Sequence[otlp.Span], start: Step, tools: tuple[dict[str, Any], ...]
) -> tuple[tuple[Step, ...], tuple[ParentResume, ...], str]:
    """The agents around the call at `start`, the agents above it to resume (innermost first), and why the next
    one up cannot be resumed ("" when there is none)."""
    nesting = _Nesting(view)
    resumes: list[ParentResume] = []
    call = start
    while True:
        resume, note = _parent_resume(view=view, spans=spans, nesting=nesting, call=call, default_tools=tools)
        if resume is None:
            return nesting.agents_around(start), tuple(resumes), note
        resumes.append(resume)
        # The parent may itself be a sub-agent: the agent above it takes over once it answers in turn.
        call = resume.resumed_at


def replay_plan(
    *,
    view: TrajectoryView,
    spans: Sequence[otlp.Span],
    from_step: int,
    prompt_version: PromptVersion | None,
    model: str,
    max_steps: int,
) -> ReplayPlan:
    """What a replay of the original (`view`, built from `spans`) from `from_step` sends first.

    Raises ReplayInvalid when the step does not exist, no model call follows it, the call recorded no
    messages, no model is known, or the prompt version cannot be rendered from the recorded variables.
    """
    if not 0 <= from_step < len(view.steps):
        raise _invalid(
            f"the trajectory has no step {from_step} (it has steps 0 to {len(view.steps) - 1})",
            "from_step",
            code="replay_step_not_found",
        )
    start = replay_start_step(view, from_step)
    if start is None:
        raise _invalid(f"no model call at or after step {from_step}: nothing to re-run", "from_step")
    step = view.steps[start]
    if step.input_messages is None:
        raise _invalid(f"the model call at step {start} recorded no input messages to replay", "from_step")
    messages = [_message_for_model(message) for message in step.input_messages]
    parameters: dict[str, Any] = {}
    variables = _recorded_variables(spans)
    if prompt_version is not None:
        messages = _with_system_prompt(messages, _system_prompt(prompt_version, variables))
        config = prompt_version.config if isinstance(prompt_version.config, dict) else {}
        parameters = {name: config[name] for name in _MODEL_PARAMETERS if name in config}
    asked, offered = _recorded_call(spans, step)
    chosen_model = model.strip() or asked
    if not chosen_model:
        raise _invalid(f"the model call at step {start} recorded no model; name one", "model")
    remaining_calls = sum(1 for later in view.steps[start:] if later.kind == "llm_call")
    every_tool = tuple(_tool_definition(definition) for definition in view.tool_definitions) or (
        _definitions_from_calls(view.tool_calls)
    )
    agents, resumes, resume_note = _parent_resumes(view=view, spans=spans, start=step, tools=every_tool)
    return ReplayPlan(
        messages=tuple(messages),
        model=chosen_model,
        # The tools the call re-made was offered, when it recorded them: a sub-agent has tools of its own, and
        # offered its parent's (among them the one that delegates to it) it could do what it never could.
        tools=offered or every_tool,
        parameters=parameters,
        recorded_calls=view.tool_calls,
        steps_planned=max(1, min(max_steps, remaining_calls)),
        variables=variables,
        tool_messages=_tool_messages(view),
        agents=agents,
        resumes=resumes,
        resume_note=resume_note,
    )


def _original_read(trajectory: Trajectory) -> tuple[TrajectoryView, list[otlp.Span]]:
    spans = selectors.trajectory_spans(trajectory=trajectory)
    return trajectory_view_build(spans, trace_id=trajectory.trace_id), spans


# --- Creating ---------------------------------------------------------------------------------------


def replay_create(
    *,
    original: Trajectory,
    from_step: int,
    prompt_version: PromptVersion | None = None,
    model: str = "",
    divergence_policy: str = DivergencePolicy.STOP,
    stub_result: Any = None,
    max_steps: int = DEFAULT_MAX_STEPS,
    created_by: User | None = None,
    created_via_key: ApiKey | None = None,
) -> Replay:
    """Validate a replay of `original` and queue it; a worker runs it once the transaction commits.

    Preconditions: `original` came from a workspace-scoped selector, so the caller may see it.
    Raises ReplayInvalid (unknown step, no model call to re-make, no model, a prompt version of another
    workspace or one the recorded variables cannot fill, a bad policy or limit) or ReplayConflict (the
    original is still running), having stored nothing.
    """
    from tracing import tasks  # tasks import this module; import it here, as STYLE.md says

    if divergence_policy not in DivergencePolicy.values:
        raise _invalid(f"divergence must be one of {', '.join(DivergencePolicy.values)}", "divergence")
    if stub_result is not None and divergence_policy != DivergencePolicy.STUB:
        raise _invalid('stub_result is served only under the divergence policy "stub"', "stub_result")
    if not 1 <= max_steps <= MAX_STEPS_LIMIT:
        raise _invalid(f"max_steps must be between 1 and {MAX_STEPS_LIMIT}", "max_steps")
    if len(model) > 300:
        raise _invalid("model names are at most 300 characters", "model")
    if prompt_version is not None and prompt_version.prompt.workspace_id != original.workspace_id:
        raise _invalid("the prompt version belongs to another workspace", "prompt_version")
    if original.status == TrajectoryStatus.RUNNING:
        raise exceptions.ReplayConflict(
            f"trajectory {original.trace_id} is still running; replay it once its root span has arrived"
        )
    view, spans = _original_read(original)
    plan = replay_plan(
        view=view,
        spans=spans,
        from_step=from_step,
        prompt_version=prompt_version,
        model=model,
        max_steps=max_steps,
    )
    with transaction.atomic():
        replay = Replay.objects.create(
            workspace_id=original.workspace_id,
            original=original,
            from_step=from_step,
            prompt_version=prompt_version,
            model=model.strip(),
            divergence_policy=divergence_policy,
            stub_result=stub_result,
            max_steps=max_steps,
            steps_planned=plan.steps_planned,
            trace_id=uuid.uuid4().hex,
            created_by=created_by,
            created_via_key=created_via_key,
        )
        dispatch.task_send_on_commit(tasks.replay_execute, replay.pk)
    return replay


# --- Running ----------------------------------------------------------------------------------------


class _ModelCallFailed(Exception):
    """The provider refused for good (bad request, authentication, unknown model, ...)."""


class _LeaseLost(Exception):
    """Another worker took the replay over (this one outlived its lease); stop without writing."""


@dataclass(frozen=True, slots=True)
class _Answer:
    content: str | None
    tool_calls: list[dict[str, Any]]
    usage: otlp.Usage
    model: str | None


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) else None


def _answer(response: Any, turn: int) -> _Answer:
    message = response.choices[0].message
    calls = []
    for position, call in enumerate(getattr(message, "tool_calls", None) or ()):
        arguments = call.function.arguments
        calls.append(
            {
                # Providers that give no ids still need one to pair the tool result with the call.
                "id": str(call.id or f"call_{turn}_{position}"),
                "type": "function",
                "function": {"name": str(call.function.name), "arguments": _as_text(arguments)},
            }
        )
    usage = getattr(response, "usage", None)
    content = getattr(message, "content", None)
    model = getattr(response, "model", None)
    return _Answer(
        content=content if isinstance(content, str) else None,
        tool_calls=calls,
        usage=otlp.Usage(
            input_tokens=_int_or_none(getattr(usage, "prompt_tokens", None)),
            output_tokens=_int_or_none(getattr(usage, "completion_tokens", None)),
            total_tokens=_int_or_none(getattr(usage, "total_tokens", None)),
        ),
        model=model if isinstance(model, str) and model else None,
    )


def _model_arguments(*, workspace_id: int, model: str) -> dict[str, Any]:
    """How litellm reaches `model`: through the workspace's enabled model target of that alias (or else of
    that litellm model string), with its server and key, as the gateway calls it; otherwise the name as
    litellm reads it, with the worker's own provider settings."""
    targets = ModelTarget.objects.filter(workspace_id=workspace_id, enabled=True)
    target = targets.filter(alias=model).first() or targets.filter(model=model).order_by("alias").first()
    arguments = (
        providers.call_arguments(target) if target is not None else {"model": model, "timeout": MODEL_TIMEOUT_SECONDS}
    )
    if str(arguments["model"]).startswith(f"{demo_provider.PROVIDER}/") and settings.KEEL_DEMO_PROVIDER:
        demo_provider.register()
    return arguments


def _error_text(error: Exception, arguments: Mapping[str, Any]) -> str:
    # The replay's error is shown to everyone in the workspace, and a careless server quotes the key it
    # was sent (a model target's, say) or the Authorization header.
    key = arguments.get("api_key")
    return redact(str(error), *([str(key)] if key else []))


def _model_call(
    *,
    tools: Sequence[dict[str, Any]],
    parameters: Mapping[str, Any],
    arguments: Mapping[str, Any],
    messages: Sequence[dict[str, Any]],
    turn: int,
) -> _Answer:
    # litellm takes seconds to import; only workers that run replays pay for it.
    import litellm
    from litellm.exceptions import (
        APIConnectionError,
        InternalServerError,
        RateLimitError,
        ServiceUnavailableError,
        Timeout,
    )
    from openai import OpenAIError

    try:
        response = litellm.completion(
            **arguments,
            messages=list(messages),
            tools=list(tools) or None,
            num_retries=0,  # the task retries, with backoff, and records each attempt
            # With tools, litellm 1.106 otherwise imports its proxy's MCP gateway, which needs the
            # `mcp` package that only litellm[proxy] installs; Keel never sends MCP tools.
            _skip_mcp_handler=True,
            **parameters,
        )
    except (RateLimitError, Timeout, ServiceUnavailableError, InternalServerError, APIConnectionError) as error:
        # A server error or a refused connection is an outage too, as the gateway counts them (routing).
        raise exceptions.ReplayProviderUnavailable(_error_text(error, arguments)) from error
    except OpenAIError as error:  # litellm's exceptions all derive from openai's
        raise _ModelCallFailed(_error_text(error, arguments)) from error
    return _answer(response, turn)


class _Recording:
    """The original's tool calls, to serve the model's calls from. A call made again with the same
    arguments gets the next recorded one, and the last one once all are served."""

    def __init__(self, calls: Sequence[ToolCall]) -> None:
        self.calls = list(calls)
        self.served: set[int] = set()

    def match(self, name: str, arguments: Any) -> ToolCall | None:
        wanted = json_parsed(arguments)
        found = [
            position
            for position, call in enumerate(self.calls)
            if call.name == name and json_equal(json_parsed(call.arguments), wanted)
        ]
        if not found:
            return None
        fresh = [position for position in found if position not in self.served]
        chosen = fresh[0] if fresh else found[-1]
        self.served.add(chosen)
        return self.calls[chosen]


def _span_id(trace_id: str, *parts: object) -> str:
    return hashlib.sha256("\x1f".join([trace_id, *map(str, parts)]).encode()).hexdigest()[:16]


def _span(**fields: Any) -> otlp.Span:
    return otlp.span_build(**{"scope_name": "keel.replay", **fields})


@dataclass(slots=True)
class _Run:
    """A replay under way: the spans so far, and the first divergence.

    `model_arguments`, `tools`, `parameters`, `prompted` and `agent_span_id` are those of the agent whose
    loop runs: the one the replay starts in, then each agent above it that is resumed."""

    replay: Replay
    plan: ReplayPlan
    view: TrajectoryView
    root_span_id: str
    model_arguments: dict[str, Any]
    tools: tuple[dict[str, Any], ...] = ()
    parameters: dict[str, Any] = field(default_factory=dict)
    prompted: bool = True  # whether the replay's prompt version is the running agent's
    agent_span_id: str = ""
    spans: list[otlp.Span] = field(default_factory=list)
    divergence: tuple[str, str, Any] | None = None  # (span id of the model call, tool name, arguments)
    stopped: bool = False
    answer: str | None = None
    turns: int = 0
    # Each agent loop that ran, by the span it ran under: (start, end, first user message, answer).
    loops: dict[str, tuple[int, int, dict[str, Any] | None, str | None]] = field(default_factory=dict)
    note: str = ""


def _replay_update(replay: Replay, **values: Any) -> None:
    """Write to a replay this worker still holds; raises _LeaseLost when another worker took it over."""
    updated = Replay.objects.filter(pk=replay.pk, status=ReplayStatus.RUNNING, attempts=replay.attempts).update(
        **values
    )
    if not updated:
        raise _LeaseLost


def _generation(
    run: _Run, *, messages: Sequence[dict[str, Any]], assistant: dict[str, Any], answer: _Answer, start: int, end: int
) -> str:
    replay = run.replay
    span_id = _span_id(replay.trace_id, "generation", run.turns)
    prompt_version = replay.prompt_version if run.prompted else None
    # The litellm model string called (a model target's, when the replay named one), which prices the call.
    model = str(run.model_arguments["model"])
    run.spans.append(
        _span(
            trace_id=replay.trace_id,
            span_id=span_id,
            parent_span_id=run.agent_span_id,
            name=f"chat {model}",
            span_type="generation",
            start_time_ns=start,
            end_time_ns=end,
            request_model=model,
            response_model=answer.model,
            input=list(messages),
            output=[assistant],
            usage=answer.usage,
            tool_definitions=run.tools,
            prompt_name=prompt_version.prompt.name if prompt_version is not None else None,
            prompt_version=str(prompt_version.version) if prompt_version is not None else None,
            attributes={"keel.replay.id": replay.pk},
        )
    )
    return span_id


def _tool(run: _Run, call: dict[str, Any], position: int, recording: _Recording, asked_by: str) -> str | None:
    """Serve one tool call and return its result as the tool message's text; at a divergence under the
    "stop" policy, mark the run stopped and return None."""
    replay = run.replay
    name = call["function"]["name"]
    arguments = json_parsed(call["function"]["arguments"])
    recorded = recording.match(name, arguments)
    if recorded is None and run.divergence is None:
        run.divergence = (asked_by, name, arguments)
    if recorded is None and replay.divergence_policy == DivergencePolicy.STOP:
        run.stopped = True
        return None
    attributes: dict[str, Any] = {"keel.replay.id": replay.pk}
    if recorded is not None:
        result, status, error = recorded.result, recorded.status, recorded.error
        attributes |= {SOURCE_ATTRIBUTE: "recording", "keel.replay.recorded_span_id": recorded.span_id}
        served = result
        if served is None and error is not None:
            # A tool that failed recorded no result, but the agent told the model something: what it
            # sent, when the recording shows it, else the error itself; never an empty answer.
            served = run.plan.tool_messages.get(recorded.call_id or "", error)
    else:
        result = replay.stub_result if replay.stub_result is not None else GENERIC_STUB
        status, error = "ok", None
        attributes[SOURCE_ATTRIBUTE] = "stub"
        served = result
    now = time.time_ns()
    run.spans.append(
        _span(
            trace_id=replay.trace_id,
            span_id=_span_id(replay.trace_id, "tool", run.turns, position),
            parent_span_id=run.agent_span_id,
            name=f"execute_tool {name}",
            span_type="tool",
            start_time_ns=now,
            end_time_ns=now,
            status="error" if status == "error" else "ok",
            status_message=error or "",
            tool_name=name,
            tool_call_id=call["id"],
            tool_arguments=arguments,
            tool_result=result,
            input=arguments,
            output=result,
            error_message=error,
            attributes=attributes,
        )
    )
    return _as_text(served)


def _agent_loop(run: _Run, messages: list[dict[str, Any]], recording: _Recording) -> None:
    """One agent's loop, from `messages`, until it answers, stops at a divergence, or max_steps runs out."""
    replay = run.replay
    started = time.time_ns()
    run.answer = None
    while run.turns < replay.max_steps:
        start = time.time_ns()
        answer = _model_call(
            tools=run.tools,
            parameters=run.parameters,
            arguments=run.model_arguments,
            messages=messages,
            turn=run.turns,
        )
        end = time.time_ns()
        assistant: dict[str, Any] = {"role": "assistant", "content": answer.content}
        if answer.tool_calls:
            assistant["tool_calls"] = answer.tool_calls
        asked_by = _generation(run, messages=messages, assistant=assistant, answer=answer, start=start, end=end)
        run.turns += 1
        # A model that asked for tools will be called again: the plan is never behind what is certain.
        certain = min(run.turns + 1, replay.max_steps) if answer.tool_calls else run.turns
        _replay_update(replay, steps_done=run.turns, steps_planned=Greatest(F("steps_planned"), certain))
        messages.append(assistant)
        if not answer.tool_calls:
            run.answer = answer.content
            break
        for position, call in enumerate(answer.tool_calls):
            result = _tool(run, call, position, recording, asked_by)
            if result is None:
                break
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
        if run.stopped:
            break
    first_user = next((message for message in messages if message.get("role") == "user"), None)
    run.loops[run.agent_span_id] = (started, time.time_ns(), first_user, run.answer)


def _agent_span_id(run: _Run, level: int) -> str:
    """The replay's span for the agent of loop `level` (0: the one the replay starts in): the root for the
    original's root agent, else a span of its own that stands for the original's agent span."""
    agents = run.plan.agents
    if level >= len(agents) or agents[level].parent_span_id is None:
        return run.root_span_id
    return _span_id(run.replay.trace_id, "agent", agents[level].span_id)


def _replay_loop(run: _Run) -> None:
    """The loop of the agent the replay starts in; then, from a sub-agent, that of each agent above it, from its
    recorded conversation with the sub-agent's recorded result replaced by the replay's answer."""
    replay, plan = run.replay, run.plan
    recording = _Recording(plan.recorded_calls)
    run.tools, run.parameters, run.prompted = plan.tools, plan.parameters, True
    run.agent_span_id = _agent_span_id(run, 0)
    _agent_loop(run, [dict(message) for message in plan.messages], recording)
    for level, resume in enumerate(plan.resumes, start=1):
        if run.stopped:
            return
        name = resume.sub_agent.agent_name or resume.sub_agent.name
        if run.answer is None:
            run.note = (
                f"the parent agent was not resumed: the replay reached max_steps ({replay.max_steps}) "
                f"before sub-agent {name} answered"
                if run.turns >= replay.max_steps
                else f"the parent agent was not resumed: sub-agent {name} answered with no text"
            )
            return
        messages = [dict(message) for message in resume.messages]
        carrier = messages[resume.carrier]
        carrier["content"], _ = _answer_replaced(carrier.get("content"), resume.recorded_answer, run.answer)
        # The agent above runs as recorded: its own model and tools; the prompt version was the sub-agent's.
        run.model_arguments = _model_arguments(workspace_id=replay.workspace_id, model=resume.model)
        run.tools, run.parameters, run.prompted = resume.tools, {}, False
        run.agent_span_id = _agent_span_id(run, level)
        _agent_loop(run, messages, recording)
    if plan.resume_note and not run.stopped:
        run.note = plan.resume_note


def _agent_spans(run: _Run) -> list[otlp.Span]:
    """A span for each agent around the replayed call other than the root, inner ones below outer ones, over
    the loop that ran under it and the agents inside it."""
    replay, original = run.replay, run.replay.original
    spans: list[otlp.Span] = []
    inner: tuple[int, int] | None = None
    for level, agent in enumerate(run.plan.agents):
        span_id = _agent_span_id(run, level)
        if span_id == run.root_span_id:
            break
        loop = run.loops.get(span_id)
        times = [*(loop[:2] if loop is not None else ()), *(inner or ())]
        if not times:
            continue
        inner = (min(times), max(times))
        spans.append(
            _span(
                trace_id=replay.trace_id,
                span_id=span_id,
                parent_span_id=_agent_span_id(run, level + 1),
                name=agent.name,
                span_type="agent",
                start_time_ns=inner[0],
                end_time_ns=max(inner[1], inner[0] + 1),
                # A name the spans give an agent makes one when none matches: only the original's agent is named.
                agent_name=agent.agent_name if original.agent is not None else None,
                # What the agent was asked, as recorded; its answer, where the recording has one to compare.
                input=agent.input,
                output=loop[3] if loop is not None and agent.output is not None else None,
                attributes={"keel.replay.id": replay.pk, "keel.replay.recorded_span_id": agent.span_id},
            )
        )
    return spans


def _root_span(run: _Run, start: int, end: int) -> otlp.Span:
    replay, view, original = run.replay, run.view, run.replay.original
    outermost = run.loops.get(run.agent_span_id)
    first_user = outermost[2] if outermost is not None and outermost[2] is not None else None
    if first_user is None:
        first_user = next((m for m in run.plan.messages if m.get("role") == "user"), None)
    return _span(
        trace_id=replay.trace_id,
        span_id=run.root_span_id,
        parent_span_id=None,
        name=view.root_span_name or original.name or "replay",
        span_type="agent",
        start_time_ns=start,
        end_time_ns=max(end, start + 1),
        session_id=view.session_id,
        user_id=view.user_id,
        # The slug finds the original's agent when the spans are written, and creates none.
        agent_name=original.agent.slug if original.agent is not None else None,
        task_id=view.task_id,
        input=[first_user] if first_user is not None else None,
        output=run.answer,
        tags=tuple(dict.fromkeys((*view.tags, REPLAY_TAG))),
        metadata={
            "replay_of": original.trace_id,
            "replay_from_step": replay.from_step,
            # Kept, so that a replay of this replay can render prompt versions with them too.
            **({VARIABLES_METADATA_KEY: run.plan.variables} if run.plan.variables else {}),
        },
        attributes={
            "keel.replay.id": replay.pk,
            "keel.replay.of": original.trace_id,
            **({NOTE_ATTRIBUTE: run.note} if run.note else {}),
        },
    )


def _replay_store(run: _Run, start: int) -> None:
    replay = run.replay
    spans = [_root_span(run, start, time.time_ns()), *_agent_spans(run), *run.spans]
    divergence_step = None
    if run.divergence is not None:
        asked_by = run.divergence[0]
        view = trajectory_view_build(spans, trace_id=replay.trace_id)
        divergence_step = next(
            step.index for step in view.steps if step.kind == "llm_call" and step.span_id == asked_by
        )
    with transaction.atomic():
        # Lock the row, so a worker that took the replay over cannot finish it at the same time.
        held = (
            Replay.objects.select_for_update()
            .filter(pk=replay.pk, status=ReplayStatus.RUNNING, attempts=replay.attempts)
            .values_list("pk", flat=True)
            .first()
        )
        if held is None:
            raise _LeaseLost
        services.spans_write(workspace=replay.workspace, api_key=None, spans=spans)
        trajectory = Trajectory.objects.get(workspace_id=replay.workspace_id, trace_id=replay.trace_id)
        Trajectory.objects.filter(pk=trajectory.pk).update(
            replay_of=replay.original,
            replay_from_step=replay.from_step,
            agent_id=replay.original.agent_id,
        )
        _replay_update(
            replay,
            status=ReplayStatus.STOPPED_DIVERGENCE if run.stopped else ReplayStatus.DONE,
            replay_trajectory=trajectory,
            steps_done=run.turns,
            steps_planned=run.turns,
            divergence_step=divergence_step,
            divergence_tool_name=run.divergence[1] if run.divergence is not None else "",
            divergence_arguments=run.divergence[2] if run.divergence is not None else None,
            # A finished replay's error holds what it could not do: why the agent above was not resumed.
            error=run.note[:4000],
            finished_at=timezone.now(),
        )


def _replay_claim(replay_id: int) -> Replay | None:
    now = timezone.now()
    lease = now - timedelta(seconds=LEASE_SECONDS)
    claimed = Replay.objects.filter(
        Q(status=ReplayStatus.PENDING) | Q(status=ReplayStatus.RUNNING, claimed_at__lt=lease), pk=replay_id
    ).update(status=ReplayStatus.RUNNING, claimed_at=now, attempts=F("attempts") + 1, steps_done=0)
    if not claimed:
        return None
    return Replay.objects.select_related(
        "workspace", "original", "original__agent", "prompt_version", "prompt_version__prompt"
    ).get(pk=replay_id)


def _replay_fail(replay: Replay, error: str) -> None:
    logger.warning("tracing.replay_failed", extra={"replay_id": replay.pk, "error": error})
    try:
        _replay_update(replay, status=ReplayStatus.FAILED, error=error[:4000], finished_at=timezone.now())
    except _LeaseLost:
        logger.info("tracing.replay_lease_lost", extra={"replay_id": replay.pk})


def replay_execute(*, replay_id: int) -> Replay | None:
    """Run one replay; returns it finished (done, stopped at a divergence, or failed), or None when
    there was nothing to do.

    Idempotent: a replay that is finished, or claimed by a live worker, is skipped. Raises
    ReplayProviderUnavailable after putting the replay back to pending when the provider may recover
    (the task retries); on the last attempt the replay fails instead.
    """
    replay = _replay_claim(replay_id)
    if replay is None:
        return None
    if replay.attempts > MAX_ATTEMPTS:
        _replay_fail(replay, f"gave up after {MAX_ATTEMPTS} attempts")
        return Replay.objects.get(pk=replay_id)
    try:
        view, spans = _original_read(replay.original)
        plan = replay_plan(
            view=view,
            spans=spans,
            from_step=replay.from_step,
            prompt_version=replay.prompt_version,
            model=replay.model,
            max_steps=replay.max_steps,
        )
        run = _Run(
            replay=replay,
            plan=plan,
            view=view,
            root_span_id=_span_id(replay.trace_id, "root"),
            model_arguments=_model_arguments(workspace_id=replay.workspace_id, model=plan.model),
        )
        started = time.time_ns()
        _replay_loop(run)
        _replay_store(run, started)
    except _LeaseLost:
        logger.info("tracing.replay_lease_lost", extra={"replay_id": replay_id})
        return None
    except exceptions.ReplayProviderUnavailable as error:
        if replay.attempts >= MAX_ATTEMPTS:
            _replay_fail(replay, f"the provider stayed unavailable after {replay.attempts} attempts: {error.detail}")
            return Replay.objects.get(pk=replay_id)
        logger.info("tracing.replay_retry", extra={"replay_id": replay_id, "error": error.detail})
        Replay.objects.filter(pk=replay_id, status=ReplayStatus.RUNNING, attempts=replay.attempts).update(
            status=ReplayStatus.PENDING, steps_done=0, error=f"retrying: {error.detail}"[:4000]
        )
        raise
    except (_ModelCallFailed, KeelError) as error:
        _replay_fail(replay, str(error))
    except Exception as error:  # the task's outer edge: record the failure, then let the worker log it
        _replay_fail(replay, f"internal error: {type(error).__name__}: {error}")
        raise
    return Replay.objects.get(pk=replay_id)


def replay_sweep() -> list[int]:
    """Ids of replays to hand to a worker again: pending ones whose message may be lost, and running
    ones whose worker's lease ran out. Replays tried too often are failed."""
    now = timezone.now()
    lease = now - timedelta(seconds=LEASE_SECONDS)
    Replay.objects.filter(status=ReplayStatus.RUNNING, claimed_at__lt=lease, attempts__gte=MAX_ATTEMPTS).update(
        status=ReplayStatus.FAILED, error="gave up after repeated attempts", finished_at=now
    )
    stale = now - timedelta(seconds=REQUEUE_AFTER_SECONDS)
    return list(
        Replay.objects.filter(
            Q(status=ReplayStatus.PENDING, created_at__lt=stale) | Q(status=ReplayStatus.RUNNING, claimed_at__lt=lease)
        )
        .order_by("created_at")
        .values_list("pk", flat=True)[:1000]
    )
