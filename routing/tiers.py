"""The four tiers the gateway routes between, cheapest first.

- **single_call**: the agent's production prompt + the request, one model call.
- **chain**: the agent's declared steps (`ChainStep`), in order; each step sees the request and the
  earlier steps' outputs, and a step with an output schema must answer JSON the schema accepts.
- **agentic**: a tool-use loop with the request's tools and the agent's registered tools, under the
  step limit and time budget the requirements derive. Keel runs tools that have an endpoint; any other
  call goes back to the client (the standard OpenAI flow) and the conversation continues in this tier
  when the client sends the results. Every call passes the action boundary (routing/hooks.py) first.
- **human**: a hand-off record for the dashboard's queue, and the agent's configured answer.

Each tier returns a `TierResult` and records its spans on the request's `TraceRecorder`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from agent_registry import prompts
from agent_registry.models import Agent, PromptType, PromptVersion
from config import crypto
from config.errors import Conflict, ValidationFailed
from config.redact import redact, redact_value
from routing import guarding, hooks, providers
from routing.models import AgentTool, ChainStep, Handoff, ModelTarget, RouterConfig, TierChoice
from routing.recording import TraceRecorder
from tracing import outbound

logger = logging.getLogger("routing.tiers")

MAX_TOOL_RESULT_CHARS = 20_000


class TierUnavailable(Conflict):
    """The tier has nothing to run with (no model target, no chain steps)."""

    code = "tier_not_configured"


class ChainStepMissingVariables(ValidationFailed):
    """A chain step's prompt version needs variables that neither the request nor the version supplies."""

    code = "missing_variables"


@dataclass(slots=True)
class TierContext:
    """What every tier needs about the request it serves."""

    agent: Agent
    config: RouterConfig | None
    recorder: TraceRecorder
    conversation_id: str
    end_user: str | None
    variables: Mapping[str, Any]
    tools: Sequence[Mapping[str, Any]]  # the request's tool definitions (OpenAI format)
    parameters: Mapping[str, Any]  # temperature, max_tokens, tool_choice, response_format...
    time_budget_ms: int | None
    max_steps: int | None
    routing_reason: str = ""
    pseudonyms: dict[str, str] = field(default_factory=dict)  # the input's pseudonyms -> what they stand for
    # A request Keel makes itself (an eval run): nothing it does may wait on a person, so a hand-off and an
    # approval are recorded on the trajectory only, never put in the queues people work from.
    rehearsal: bool = False
    # The agent's chain steps, read once per request (chain_steps): the cache's scope and the chain itself
    # see the same steps.
    steps_read: list[ChainStep] | None = None
    # The single call already under way (a speculative one, routing/speculation.py) and its budget hold: the
    # single-call tier takes that call's answer rather than calling again.
    started: providers.Started | None = None
    started_hold: Any = None


@dataclass(slots=True)
class TierResult:
    message: dict[str, Any]
    finish_reason: str
    completions: list[providers.Completion] = field(default_factory=list)
    status: str = "ok"
    error_type: str | None = None
    error_message: str | None = None
    handoff: Handoff | None = None
    pending_approval_id: int | None = None
    steps: int = 0

    @property
    def cost_usd(self) -> Any:
        costs = [c.cost_usd for c in self.completions if c.cost_usd is not None]
        return sum(costs) if costs else None

    @property
    def input_tokens(self) -> int:
        return sum(c.input_tokens or 0 for c in self.completions)

    @property
    def output_tokens(self) -> int:
        return sum(c.output_tokens or 0 for c in self.completions)


def target_for_tier(*, agent: Agent, config: RouterConfig | None, tier: str) -> ModelTarget:
    """The model target that serves a tier for this agent: the router configuration's choice, else the
    workspace's enabled target assigned to that tier, else (for the agentic tier) the single-call one."""
    chosen = None
    if config is not None:
        chosen = config.agentic_target if tier == TierChoice.AGENTIC else config.single_call_target
    if chosen is None or not chosen.enabled:
        candidates = ModelTarget.objects.filter(workspace_id=agent.workspace_id, enabled=True)
        chosen = candidates.filter(tier=tier).order_by("alias").first()
        if chosen is None and tier == TierChoice.AGENTIC:
            return target_for_tier(agent=agent, config=config, tier=TierChoice.SINGLE_CALL)
        if chosen is None:
            chosen = candidates.filter(tier="").order_by("alias").first()
    if chosen is None:
        raise TierUnavailable(
            f"agent {agent.slug!r} has no model target for the {tier} tier: add one (API /api/v1/model-targets "
            "or the dashboard) and assign it in the agent's router settings"
        )
    return chosen


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return "" if content is None else str(content)


def model_parameters(request_parameters: Mapping[str, Any], *, with_tools: bool) -> dict[str, Any]:
    """The request's parameters that a model call passes on (those about tools only with tools)."""
    parameters = {key: value for key, value in request_parameters.items() if value is not None}
    if not with_tools:
        parameters.pop("tool_choice", None)
        parameters.pop("parallel_tool_calls", None)
    return parameters


def parameters_with_tools(request_parameters: Mapping[str, Any], tools: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What a model call offering `tools` passes with the messages (the single call's, each agentic step's)."""
    parameters = model_parameters(request_parameters, with_tools=bool(tools))
    if tools:
        parameters["tools"] = list(tools)
    return parameters


def model_call(
    recorder: TraceRecorder,
    target: ModelTarget,
    messages: Sequence[Mapping[str, Any]],
    parameters: Mapping[str, Any],
    *,
    tools: Sequence[Mapping[str, Any]] = (),
    parent: str | None = None,
    name: str = "chat",
    started: providers.Started | None = None,
    started_hold: Any = None,
    metadata: Mapping[str, Any] | None = None,
) -> providers.Completion:
    """One model call, recorded as a generation span; a failed one is recorded before ProviderFailed
    goes on to the caller. With `started`, the call's first attempt is already under way, and
    `started_hold` is what it reserved against the budgets."""
    hold = started_hold if started is not None else spend_reserve(recorder, target, messages, parameters)
    started_ns = time.time_ns()
    try:
        completion = providers.completion(target=target, messages=messages, parameters=parameters, started=started)
    except providers.ProviderFailed as error:
        hooks.guard().spend_settle(hold, cost_usd=0, tokens=0)
        recorder.failed_generation(error, model=target.model, messages=messages, start_ns=started_ns)
        raise
    spend_settle(hold, completion)
    recorder.generation(completion, messages=messages, tools=tools, parent=parent, name=name, metadata=metadata)
    return completion


def spend_reserve(
    recorder: TraceRecorder, target: ModelTarget, messages: Sequence[Mapping[str, Any]], parameters: Mapping[str, Any]
) -> Any:
    """Hold a model call against the request's budgets (the guardrails' Guard); raises 429 over a limit."""
    if recorder.payer is None:
        return None
    max_tokens = parameters.get("max_completion_tokens") or parameters.get("max_tokens")
    return hooks.guard().spend_reserve(
        recorder.payer, target=target, messages=messages, max_tokens=max_tokens if isinstance(max_tokens, int) else None
    )


def spend_settle(hold: Any, completion: providers.Completion) -> None:
    tokens = None
    if completion.input_tokens is not None or completion.output_tokens is not None:
        tokens = (completion.input_tokens or 0) + (completion.output_tokens or 0)
    hooks.guard().spend_settle(hold, cost_usd=completion.cost_usd, tokens=tokens)


def single_result(completion: providers.Completion) -> TierResult:
    return TierResult(
        message=completion.message, finish_reason=completion.finish_reason, completions=[completion], steps=1
    )


# --- single call -------------------------------------------------------------------------------------


def single_call(context: TierContext, messages: Sequence[Mapping[str, Any]]) -> TierResult:
    target = target_for_tier(agent=context.agent, config=context.config, tier=TierChoice.SINGLE_CALL)
    parameters = parameters_with_tools(context.parameters, context.tools)
    completion = model_call(
        context.recorder,
        target,
        messages,
        parameters,
        tools=context.tools,
        started=context.started,
        started_hold=context.started_hold,
        metadata={"speculative": "used"} if context.started is not None else None,
    )
    return single_result(completion)


# --- chain -------------------------------------------------------------------------------------------


def _step_system(step: ChainStep, variables: Mapping[str, Any]) -> str:
    if step.prompt_version is None:
        return step.instructions
    version: PromptVersion = step.prompt_version
    template: Any = version.template
    if version.type == PromptType.CHAT:
        template = [item for item in version.template if item.get("role") in ("system", "developer")]
    # The step's version has its own defaults; the request's variables (with the production prompt's
    # defaults) win over them, as they do over the production prompt's.
    defaults = version.config.get("variables") if isinstance(version.config, dict) else None
    try:
        rendered = prompts.template_render(template, {**(defaults if isinstance(defaults, dict) else {}), **variables})
    except prompts.MissingVariables as error:
        raise ChainStepMissingVariables(
            f"chain step {step.name} ({version.prompt.name} v{version.version}) needs variables: "
            f'{", ".join(error.names)}; send them as "variables" in the request body (the openai client\'s '
            "extra_body) or give the version defaults",
            errors=[
                {"field": f"variables.{name}", "message": f"required by chain step {step.name}"} for name in error.names
            ],
        ) from None
    if isinstance(rendered, str):
        return rendered
    return "\n\n".join(_text(message.get("content")) for message in rendered)


def _schema_errors(text: str, schema: Mapping[str, Any]) -> str | None:
    import jsonschema

    try:
        value = json.loads(text)
    except ValueError as error:
        return f"the step must answer JSON: {error}"
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError as error:
        return f"the answer does not match the step's output schema: {error.message}"
    return None


def chain_steps(context: TierContext) -> list[ChainStep]:
    """The agent's chain steps in order, read on the request's first call."""
    if context.steps_read is None:
        context.steps_read = list(
            ChainStep.objects.filter(agent=context.agent)
            .select_related("prompt_version__prompt", "model_target")
            .order_by("position")
        )
    return context.steps_read


def chain_fingerprint(steps: Sequence[ChainStep]) -> str:
    """What a chain answer depends on beyond the production prompt and the request: the agent's steps (as
    chain_steps read them). Part of the semantic cache's scope for the chain tier, so a changed chain is
    not answered from what the old one said."""
    return json.dumps(
        [
            [step.name, step.prompt_version_id, step.instructions, step.model_target_id, step.output_schema]
            for step in steps
        ],
        sort_keys=True,
        default=str,
    )


def chain(context: TierContext, messages: Sequence[Mapping[str, Any]]) -> TierResult:
    steps = chain_steps(context)
    if not steps:
        raise TierUnavailable(f"agent {context.agent.slug!r} has no chain steps: declare them in its router settings")
    # Every step's prompt is rendered before the first runs: a step that cannot run fails the request
    # before any model is paid for.
    systems = [_step_system(step, context.variables) for step in steps]
    conversation = [dict(message) for message in messages if message.get("role") not in ("system", "developer")]
    leading_system = [dict(message) for message in messages if message.get("role") in ("system", "developer")]
    outputs: list[tuple[str, str]] = []
    result = TierResult(message={"role": "assistant", "content": ""}, finish_reason="stop")
    for step, step_system in zip(steps, systems, strict=True):
        target = step.model_target
        if target is None or not target.enabled:
            # A disabled target is never called (as for the router's own targets): the agent's single call serves.
            target = target_for_tier(agent=context.agent, config=context.config, tier=TierChoice.SINGLE_CALL)
        system = step_system or (_text(leading_system[0].get("content")) if leading_system else "")
        step_messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        step_messages += conversation
        if outputs:
            earlier = "\n\n".join(f"Output of step {name}:\n{text}" for name, text in outputs)
            step_messages.append({"role": "user", "content": f"{earlier}\n\nNow do step {step.name}."})
        parameters = model_parameters(context.parameters, with_tools=False)
        if step.output_schema:
            parameters["response_format"] = {"type": "json_object"}
        step_span = context.recorder.span(
            name=f"chain step {step.position}: {step.name}", span_type="chain", start_ns=time.time_ns()
        )
        completion = model_call(context.recorder, target, step_messages, parameters, parent=step_span, name=step.name)
        result.completions.append(completion)
        result.steps += 1
        problem = _schema_errors(completion.text, step.output_schema) if step.output_schema else None
        if problem:
            result.status, result.error_type, result.error_message = "error", "output_schema", f"{step.name}: {problem}"
            result.message = {"role": "assistant", "content": f"Step {step.name} failed: {problem}"}
            result.finish_reason = "stop"
            return result
        outputs.append((step.name, completion.text))
        result.message, result.finish_reason = completion.message, completion.finish_reason
    return result


# --- agentic -----------------------------------------------------------------------------------------


def _tool_definition(tool: AgentTool) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": tool.parameters or {}},
    }


def _arguments(call: Mapping[str, Any]) -> Any:
    text = (call.get("function") or {}).get("arguments") or "{}"
    try:
        return json.loads(text)
    except ValueError:
        return text


def _endpoint_call(
    tool: AgentTool, arguments: Any, context: TierContext, *, deadline: float | None = None
) -> tuple[Any, str | None]:
    """Call a registered tool endpoint, for at most its timeout and never past the loop's `deadline`
    (time.monotonic()); returns (result, error)."""
    headers = {"Content-Type": "application/json"}
    secret = crypto.decrypt(tool.endpoint_secret_encrypted) if tool.endpoint_secret_encrypted else ""
    if secret:
        headers["Authorization"] = f"Bearer {secret}"
    body = {
        "tool": tool.name,
        "arguments": arguments,
        "conversation_id": context.conversation_id,
        "trace_id": context.recorder.trace_id,
    }
    timeout = tool.timeout_seconds
    if deadline is not None:
        # A slow endpoint must not hold the request past its time budget: the loop stops at the deadline.
        timeout = max(0.001, min(timeout, deadline - time.monotonic()))
    try:
        # Checked at each connection as well as when saved (tracing/outbound.py): a name that resolves to a
        # forbidden address now is refused, whatever it resolved to then.
        with outbound.checked_client(timeout=timeout) as client:
            response = client.post(tool.endpoint_url, json=body, headers=headers)
    except (httpx.HTTPError, outbound.AddressRefused) as error:
        text = redact(f"{type(error).__name__}: {error}", secret)
        return {"error": text}, f"tool endpoint unreachable: {text}"
    try:
        result: Any = response.json()
    except ValueError:
        result = response.text[:MAX_TOOL_RESULT_CHARS]
    # The result goes to the model, the trajectory and the client: an endpoint that quotes the secret it
    # was sent (in an error, say) must not hand it on.
    result = redact_value(result, secret)
    if response.status_code >= 400:
        return {"error": result, "status_code": response.status_code}, f"tool endpoint answered {response.status_code}"
    return result, None


def _budget_stop(context: TierContext, result: TierResult, kind: str, detail: str) -> TierResult:
    result.status, result.error_type, result.error_message = "error", kind, detail
    result.message = {
        "role": "assistant",
        "content": f"I could not finish this request: {detail}. A person can pick it up from here.",
    }
    result.finish_reason = "length"
    return result


def _time_budget_stop(context: TierContext, result: TierResult) -> TierResult:
    # Worded so that the trajectory's exhaustion signal reads it as a timeout, not as a token budget.
    return _budget_stop(context, result, "time_budget", f"time limit reached ({context.time_budget_ms} ms budget)")


def agentic(context: TierContext, messages: Sequence[Mapping[str, Any]]) -> TierResult:
    target = target_for_tier(agent=context.agent, config=context.config, tier=TierChoice.AGENTIC)
    registered = {tool.name: tool for tool in AgentTool.objects.filter(agent=context.agent)}
    client_tools = {str((tool.get("function") or {}).get("name")): tool for tool in context.tools}
    definitions = list(context.tools) + [
        _tool_definition(t) for name, t in registered.items() if name not in client_tools
    ]
    max_steps = context.max_steps or 10
    deadline = None if context.time_budget_ms is None else time.monotonic() + context.time_budget_ms / 1000
    conversation = [dict(message) for message in messages]
    result = TierResult(message={"role": "assistant", "content": ""}, finish_reason="stop")
    parameters = parameters_with_tools(context.parameters, definitions)
    while True:
        if result.steps >= max_steps:
            return _budget_stop(context, result, "max_steps", f"max steps reached ({max_steps} model calls)")
        if deadline is not None and time.monotonic() > deadline:
            return _time_budget_stop(context, result)
        completion = model_call(
            context.recorder, target, conversation, parameters, tools=definitions, name=f"step {result.steps + 1}"
        )
        result.completions.append(completion)
        result.steps += 1
        result.message, result.finish_reason = completion.message, completion.finish_reason
        calls = completion.tool_calls
        if not calls:
            return result
        names = [str((call.get("function") or {}).get("name")) for call in calls]
        runs_on_keel = all(name in registered and registered[name].endpoint_url for name in names)
        verdicts = [
            hooks.tool_call_check(
                hooks.ToolCall(
                    agent_id=context.agent.pk,
                    workspace_id=context.agent.workspace_id,
                    name=name,
                    arguments=_arguments(call),
                    conversation_id=context.conversation_id,
                    trace_id=context.recorder.trace_id,
                    runs_on="keel" if runs_on_keel else "client",
                    rehearsal=context.rehearsal,
                )
            )
            for name, call in zip(names, calls, strict=True)
        ]
        refused = [(name, verdict) for name, verdict in zip(names, verdicts, strict=True) if not verdict.allowed]
        if refused:
            name, verdict = refused[0]
            context.recorder.span(
                name=f"action boundary: {name}",
                span_type="guardrail",
                start_ns=time.time_ns(),
                status="error",
                status_message=verdict.reason,
                metadata={
                    "tool": name,
                    "verdict": "require_approval" if verdict.pending_approval_id else "blocked",
                    "reason": verdict.reason,
                    "approval_id": verdict.pending_approval_id,
                },
            )
            result.pending_approval_id = verdict.pending_approval_id
            kind = "approval_required" if verdict.pending_approval_id else "action_blocked"
            result.status, result.error_type, result.error_message = "error", kind, verdict.reason
            result.message = {"role": "assistant", "content": f"I can't do that: {verdict.reason}"}
            result.finish_reason = "stop"
            return result
        if not runs_on_keel:
            # The client runs these; it sends the results back and the conversation continues here.
            return result
        if deadline is not None and time.monotonic() > deadline:
            return _time_budget_stop(context, result)
        conversation.append(completion.message)
        for call, name in zip(calls, names, strict=True):
            arguments = _arguments(call)
            tool_started = time.time_ns()
            # The agent's own endpoint acts on the real values; the model and the trace keep the pseudonyms.
            real_arguments = guarding.pseudonyms_restored(arguments, context.pseudonyms)
            tool_result, failure = _endpoint_call(registered[name], real_arguments, context, deadline=deadline)
            context.recorder.span(
                name=f"tool {name}",
                span_type="tool",
                start_ns=tool_started,
                tool_name=name,
                tool_call_id=call.get("id"),
                tool_arguments=arguments,
                tool_result=tool_result,
                status="error" if failure else "ok",
                status_message=failure or "",
                error_type="tool_error" if failure else None,
                error_message=failure,
            )
            text = tool_result if isinstance(tool_result, str) else json.dumps(tool_result, default=str)
            text = guarding.tool_result_guarded(
                context.recorder,
                agent=context.agent,
                tool=name,
                content=text[:MAX_TOOL_RESULT_CHARS],
                pseudonyms=context.pseudonyms,
            )
            conversation.append({"role": "tool", "tool_call_id": call.get("id"), "content": text})


# --- human -------------------------------------------------------------------------------------------


def human(context: TierContext, messages: Sequence[Mapping[str, Any]]) -> TierResult:
    answer = (context.config.human_message if context.config else "") or (
        "I've passed this to a member of our team, who will get back to you shortly."
    )
    reason = context.routing_reason or "routed to a person"
    handoff = None
    if not context.rehearsal:
        handoff = Handoff.objects.create(
            workspace_id=context.agent.workspace_id,
            agent=context.agent,
            trace_id=context.recorder.trace_id,
            conversation_id=context.conversation_id,
            end_user=context.end_user or "",
            reason=reason,
            messages=[dict(message) for message in messages],
        )
    context.recorder.span(
        name="hand-off to a person",
        span_type="event",
        start_ns=time.time_ns(),
        metadata={"handoff_id": handoff.pk if handoff else None, "reason": reason, "rehearsal": context.rehearsal},
        output=answer,
    )
    return TierResult(message={"role": "assistant", "content": answer}, finish_reason="stop", handoff=handoff)


TIERS = {
    TierChoice.SINGLE_CALL.value: single_call,
    TierChoice.CHAIN.value: chain,
    TierChoice.AGENTIC.value: agentic,
    TierChoice.HUMAN.value: human,
}
