"""The gateway: one OpenAI chat request in, routed, executed, recorded, answered.

For `model: "agent/<slug>"` the agent's production prompt is applied, the router picks a tier from the
agent's requirements (derived configuration) and router settings, the semantic cache may answer, the tier
runs, and a `RoutingDecision` plus the request's spans are stored: every request, failed ones included,
becomes a trajectory. The HTTP view has them stored after the answer has left, by the process's
write-behind thread (config/write_behind.py); Keel's own callers have them stored before it returns.
Any other `model` names a model target alias, which is proxied as one recorded call.

Precondition for both entry points: the key has the `gateway` scope (the HTTP layer checks it).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import orjson

from agent_registry import prompts
from agent_registry import selectors as registry_selectors
from agent_registry.models import Agent, ApiKey, PromptType, PromptVersion
from config import dispatch, write_behind
from config.config_cache import config_free_transaction
from config.errors import KeelError, ValidationFailed
from routing import cache, guarding, hooks, providers, router, selectors, speculation, tiers
from routing.chat import ChatCompletionRequest, chunk_body, completion_body, usage_chunk_body
from routing.exceptions import PromptNotLabelled
from routing.models import (
    Handoff,
    ModelTarget,
    OutcomeStatus,
    RouterConfig,
    RoutingDecision,
    ShadowRun,
    TierChoice,
)
from routing.recording import TraceRecorder, trace_id_new
from tracing import otlp
from tracing import services as tracing_services

logger = logging.getLogger("routing.gateway")

AGENT_PREFIX = "agent/"
AGENT_SPEAKER_PREFIX = "agent:"  # a message's `name` that marks it as another agent's
REQUEST_TEXT_LIMIT = 4000
_TRIGGER_KINDS = {
    "keywords": "keywords",
    "intent": "intent",
    "amount_over": "amount_over",
    "low_confidence": "low_confidence",
    "signal": "signal",
}


class MissingPromptVariables(ValidationFailed):
    code = "missing_variables"


@dataclass(frozen=True, slots=True)
class Pin:
    """What a caller inside Keel (an eval run) fixes about a request instead of the agent's defaults.

    The prompt version replaces the production label's, the tier replaces the router's choice, the tags
    and metadata go on the trajectory. A pinned request never reads or fills the semantic cache, starts no
    shadow run and stores no routing decision: k samples are k model answers, and the router does not
    learn from traffic it did not route. Nor does it put anything in the queues people work from: a
    hand-off or an approval it would need is recorded on its trajectory only."""

    prompt_version: PromptVersion | None = None
    tier: str | None = None
    tags: tuple[str, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class GatewayAnswer:
    body: dict[str, Any]
    trace_id: str
    tier: str | None
    # What the request did, for callers inside Keel that evaluate it (eval runs).
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # every model-requested call, in order
    status: str = "ok"
    steps: int = 0
    cost_usd: float | None = None
    latency_ms: float = 0.0
    escalated: bool = False


@dataclass(slots=True)
class _Plan:
    """Everything decided before a tier runs."""

    api_key: ApiKey
    request: ChatCompletionRequest
    recorder: TraceRecorder
    conversation_id: str
    agent: Agent | None = None
    config: RouterConfig | None = None
    prompt_version: PromptVersion | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)
    decision: router.Decision | None = None
    embedding: list[float] | None = None
    request_text: str = ""
    context: tiers.TierContext | None = None
    cache_target: ModelTarget | None = None
    system_hash: str = ""
    cache_reason: str = ""
    enabled_tiers: tuple[str, ...] = ()
    client_messages: list[dict[str, Any]] = field(default_factory=list)  # the caller's, after the input layer
    system_prompt: str | None = None
    violations: list[dict[str, Any]] = field(default_factory=list)  # what the guardrails found, for the answer
    pseudonyms: dict[str, str] = field(default_factory=dict)  # the input's pseudonyms -> what they stand for
    pin: Pin | None = None
    record_behind: bool = False  # the record is written after the answer (config/write_behind.py)
    started: float = field(default_factory=time.perf_counter)
    speculation: speculation.Speculation | None = None  # the single call started before the router decided


# --- Planning ----------------------------------------------------------------------------------------


def _variables(request: ChatCompletionRequest, version: PromptVersion) -> dict[str, Any]:
    defaults = version.config.get("variables") if isinstance(version.config, dict) else None
    variables: dict[str, Any] = dict(defaults) if isinstance(defaults, dict) else {}
    metadata = request.metadata or {}
    if isinstance(metadata.get("prompt_variables"), dict):
        variables.update(metadata["prompt_variables"])
    variables.update(request.variables or {})
    return variables


def _system_messages(version: PromptVersion, variables: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The production prompt's system part, rendered. A chat prompt's turn templates are for the agent's
    own application; through the gateway the caller's messages are the turns."""
    template: Any = version.template
    if version.type == PromptType.CHAT:
        template = [item for item in version.template if item.get("role") in ("system", "developer")]
        if not template:
            return []
    try:
        rendered = prompts.template_render(template, variables)
    except prompts.MissingVariables as error:
        names = ", ".join(error.names)
        raise MissingPromptVariables(
            f"the production prompt {version.prompt.name} v{version.version} needs variables: {names}; send them "
            'as "variables" in the request body (the openai client\'s extra_body)',
            errors=[{"field": f"variables.{name}", "message": "required by the prompt"} for name in error.names],
        ) from None
    if isinstance(rendered, str):
        return [{"role": "system", "content": rendered}]
    return [dict(message) for message in rendered]


def _rules(requirements_rules: Sequence[Mapping[str, Any]], config: RouterConfig | None) -> tuple[router.Rule, ...]:
    rules = [
        router.Rule(
            name=f"requirements: {rule['trigger']} {rule['value']}",
            kind=_TRIGGER_KINDS.get(str(rule["trigger"]), str(rule["trigger"])),
            value=str(rule["value"]),
            to_tier=str(rule["to_tier"]),
            reason=str(rule.get("reason") or ""),
        )
        for rule in requirements_rules
    ]
    for rule in (config.rules if config else None) or []:
        if isinstance(rule, Mapping):
            rules.append(
                router.Rule(
                    name=str(rule.get("name") or rule.get("kind")),
                    kind=str(rule.get("kind")),
                    value=str(rule.get("value", "")),
                    to_tier=str(rule.get("to_tier")),
                    reason=str(rule.get("reason") or ""),
                )
            )
    return tuple(rules)


def _policy(agent: Agent, config: RouterConfig | None) -> tuple[router.Policy, dict[str, dict[str, Any]]]:
    """The router's policy from the requirements' derived configuration and the router settings."""
    derived = registry_selectors.derived_configuration(agent=agent)
    answers = registry_selectors.requirements_of(agent=agent) if derived is not None else None
    budgets: dict[str, dict[str, Any]] = {}
    if derived is None or answers is None or not derived.router.value.get("tiers"):
        tiers_enabled: tuple[str, ...] = (TierChoice.SINGLE_CALL.value,)
        mode, default, signal, escalation = "single_level", TierChoice.SINGLE_CALL.value, "rules", []
        cost_ceiling, latency_budget, single_cost = None, None, None
    else:
        value = derived.router.value
        tiers_enabled = tuple(value["tiers"])
        mode, default, signal = value["mode"], value["default_tier"], value["signal"]
        escalation = value["escalation_rules"]
        budgets = {budget["tier"]: budget for budget in derived.tier_budgets.value}
        cost_ceiling = float(answers.constraints.cost.per_request_ceiling_usd)
        latency_budget = float(answers.constraints.latency.hard_ceiling_ms)
        single = answers.constraints.cost.single_call_cost_usd
        single_cost = None if single is None else float(single)
    policy = router.Policy(
        mode=mode,
        tiers=tiers_enabled,
        default_tier=default,
        signal=signal,
        rules=_rules(escalation, config),
        intents={str(k): tuple(v) for k, v in ((config.intents if config else None) or {}).items()},
        profiles=router.default_profiles(tiers_enabled, single_cost, latency_budget),
        cost_weight=config.cost_weight if config else 0.3,
        latency_weight=config.latency_weight if config else 0.2,
        risk_weight=config.risk_weight if config else 0.1,
        neighbours=config.neighbours if config else 20,
        min_neighbours=config.min_neighbours if config else 8,
        cost_ceiling_usd=cost_ceiling,
        latency_budget_ms=latency_budget,
    )
    return policy, budgets


def _system_guarded(agent: Agent, version: PromptVersion, system: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The system prompt with the guardrails' addendum at its end: the prompt version's canary, so that a
    leak of the prompt is certain to show, and what spotlighted (marked untrusted) data means."""
    addendum = hooks.guard().system_addendum(
        agent=agent, prompt_name=version.prompt.name, prompt_version=version.version
    )
    if addendum is None or not system or not isinstance(system[-1].get("content"), str):
        return system
    last = dict(system[-1])
    last["content"] = f"{last['content']}\n\n{addendum}"
    return [*system[:-1], last]


def _input_guarded(plan: _Plan, agent: Agent, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The input layer on the caller's messages. What is new in this turn (the messages after the last
    assistant message) is checked and recorded: user messages on the input layer (other agents' messages
    as data from outside), tool results on the tool layer. Earlier turns passed when they were new, but
    the caller sends them again as it has them (with the answers' pseudonyms restored), so they are
    redacted again, silently. Blocked user input ends the request; redacted input reaches the model
    redacted."""
    last_answer = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
    tool_names = {
        call.get("id"): (call.get("function") or {}).get("name")
        for call in (messages[last_answer].get("tool_calls") or [] if last_answer >= 0 else [])
        if isinstance(call, Mapping)
    }
    guarded = [dict(message) for message in messages]
    for index, message in enumerate(guarded):
        content, role = message.get("content"), message.get("role")
        history = index <= last_answer
        if role not in ("user", "tool", "assistant") or not isinstance(content, str) or not content:
            continue
        if role == "assistant" and not history:
            continue
        if role == "tool":
            message["content"] = guarding.tool_result_guarded(
                plan.recorder,
                agent=agent,
                tool=str(tool_names.get(message.get("tool_call_id")) or message.get("name") or "a tool"),
                content=content,
                pseudonyms=plan.pseudonyms,
                history=history,
            )
            continue
        # Another agent's message (multi-agent systems name the speaker "agent:<name>") is data from
        # outside: it gets the indirect-injection checks as well as the direct ones.
        speaker = str(message.get("name") or "")
        from_agent = role == "user" and speaker.startswith(AGENT_SPEAKER_PREFIX)
        verdict = guarding.content_guard(
            plan.recorder,
            agent=agent,
            layer="input",
            source="agent" if from_agent else "user",
            content=content,
            label=f"message from {speaker}" if from_agent else "user message",
            history=history,
        )
        plan.pseudonyms.update(verdict.pseudonyms)
        message["content"] = verdict.content
        if history:
            continue
        plan.violations += [{"layer": "input", **item} for item in verdict.violations]
        if verdict.stops:
            raise guarding.GuardrailBlocked(
                f"the request was blocked by the agent's input guardrails ({guarding.reason_of(verdict)})",
                errors=[{"field": "messages", "message": str(item.get("evidence"))} for item in verdict.violations],
            )
    plan.client_messages = guarded
    return guarded


def _output_guarded(plan: _Plan, result: tiers.TierResult, *, sent: bool = False) -> None:
    """The output layer on the answer's text, before it leaves (and before it is cached). For an answer
    already `sent` (a live stream) the checks only record: the message stays as it went out."""
    agent, content = plan.agent, result.message.get("content")
    if agent is None or not isinstance(content, str) or not content:
        return
    verdict = guarding.content_guard(
        plan.recorder,
        agent=agent,
        layer="output",
        source="model",
        content=content,
        label="answer",
        system_prompt=plan.system_prompt,
        prompt_name=plan.prompt_version.prompt.name if plan.prompt_version else None,
        prompt_version=plan.prompt_version.version if plan.prompt_version else None,
    )
    plan.violations += [{"layer": "output", **item} for item in verdict.violations]
    if verdict.stops:
        result.status, result.error_type, result.error_message = "error", "output_blocked", guarding.reason_of(verdict)
    if not sent:
        result.message, finish_reason = guarding.answer_guarded(result.message, verdict)
        result.finish_reason = finish_reason or result.finish_reason


def _plan_agent(plan: _Plan, context: selectors.GatewayAgent) -> None:
    request = plan.request
    plan.agent = agent = context.agent
    plan.config = context.config
    pin = plan.pin
    if pin is not None and pin.prompt_version is not None:
        plan.prompt_version = pin.prompt_version
    elif context.unlabelled_prompt is not None:
        raise PromptNotLabelled(
            f"agent {agent.slug!r} is not served: no version of its prompt {context.unlabelled_prompt!r} is "
            "labelled production; label the version to serve"
        )
    else:
        plan.prompt_version = context.production_version
    client_messages = _input_guarded(plan, agent, request.messages_json())
    variables: dict[str, Any] = {}
    if plan.prompt_version is not None:
        variables = _variables(request, plan.prompt_version)
        system = _system_guarded(agent, plan.prompt_version, _system_messages(plan.prompt_version, variables))
        plan.system_prompt = "\n".join(str(m.get("content")) for m in system) or None
        plan.messages = system + client_messages
        plan.recorder.prompt_name = plan.prompt_version.prompt.name
        plan.recorder.prompt_version = str(plan.prompt_version.version)
    else:
        plan.messages = client_messages

    policy, budgets = _policy(agent, plan.config)
    plan.enabled_tiers = policy.tiers
    has_tools = cache.request_uses_tools(messages=client_messages, tools=request.tools)
    last_role = client_messages[-1].get("role")
    conversation_tier = (
        selectors.conversation_tier(agent=agent, conversation_id=plan.conversation_id) if last_role == "tool" else None
    )
    router_request = router.Request(
        messages=client_messages,
        has_tools=has_tools,
        conversation_tier=conversation_tier,
        offers_tools=bool(request.tools),
    )
    plan.request_text = router.request_text(client_messages)[:REQUEST_TEXT_LIMIT]
    if _speculates(plan, policy, router_request):
        plan.speculation = speculation.speculation_start(
            recorder=plan.recorder,
            agent=agent,
            config=plan.config,
            messages=plan.messages,
            request_parameters=request.parameters(),
            tools=request.tools_json(),
        )
    started = time.perf_counter()
    pinned_tier = pin.tier if pin is not None else None
    needs_embedding = pinned_tier is None and (
        policy.mode != "single_level" or (plan.config is not None and plan.config.cache_enabled)
    )
    if needs_embedding:
        embedding = cache.request_embed(
            text=plan.request_text, target=plan.config.embedding_target if plan.config else None
        )
        plan.embedding = embedding.vector
    neighbours: list[router.Neighbour] = []
    if plan.embedding is not None and policy.mode != "single_level" and conversation_tier is None:
        neighbours = selectors.routing_neighbours(agent=agent, embedding=plan.embedding, limit=policy.neighbours)
    routed = time.perf_counter()
    plan.decision = router.route(router_request, policy, neighbours)
    if pinned_tier is not None:
        plan.decision = router.Decision(
            tier=pinned_tier,
            method="pinned",
            rule="",
            reason=f"pinned to {pinned_tier} by the caller (an eval run)",
            features=plan.decision.features,
            estimates={},
        )
    plan.decision.features["router_us"] = int((time.perf_counter() - routed) * 1_000_000)
    plan.decision.features["lookup_us"] = int((routed - started) * 1_000_000)
    single_call = plan.decision.tier == TierChoice.SINGLE_CALL
    if plan.speculation is not None:
        plan.decision.features["speculative"] = single_call
    taken = plan.speculation if single_call else None
    budget = budgets.get(plan.decision.tier, {})
    plan.context = tiers.TierContext(
        agent=agent,
        config=plan.config,
        recorder=plan.recorder,
        conversation_id=plan.conversation_id,
        end_user=request.user,
        variables=variables,
        tools=request.tools_json(),
        parameters=request.parameters(),
        time_budget_ms=budget.get("time_budget_ms"),
        max_steps=budget.get("max_steps"),
        routing_reason=plan.decision.reason,
        pseudonyms=plan.pseudonyms,
        rehearsal=plan.pin is not None,
        started=taken.started if taken else None,
        started_hold=taken.hold if taken else None,
    )
    _decision_span(plan)


def _speculates(plan: _Plan, policy: router.Policy, request: router.Request) -> bool:
    """Whether to start the single call before the router decides (routing/speculation.py): the agent asks
    for it, and the learned estimate will decide a request that looks simple enough for the single call."""
    config = plan.config
    if config is None or not config.speculative_single_call or config.cache_enabled:
        return False
    if plan.pin is not None or plan.request.stream or request.conversation_tier is not None:
        return False
    if policy.mode == router.SINGLE_LEVEL_MODE or TierChoice.SINGLE_CALL not in policy.tiers:
        return False
    # Without neighbours the router says what rules, the conversation and the request's difficulty decide:
    # a cold start is the case the neighbours will decide, and its tier is the one the request looks like.
    provisional = router.route(request, policy, [])
    return provisional.method == router.METHOD_COLD_START and provisional.tier == TierChoice.SINGLE_CALL


def _speculation_unused(plan: _Plan, *, recorded: bool = True) -> None:
    """Account for a speculative single call the chosen tier did not take (a no-op when it took it)."""
    if plan.speculation is not None:
        tier = plan.decision.tier if plan.decision is not None else ""
        cost = speculation.speculation_unused(plan.speculation, recorder=plan.recorder if recorded else None, tier=tier)
        plan.speculation = None
        if plan.decision is not None and cost is not None:
            plan.decision.features["speculative_cost_usd"] = float(cost)


# --- Recording ---------------------------------------------------------------------------------------


def _decision_span(plan: _Plan) -> None:
    decision = plan.decision
    assert decision is not None
    plan.recorder.span(
        name=f"router: {decision.tier}",
        span_type="other",
        start_ns=plan.recorder.started_ns,
        end_ns=plan.recorder.started_ns + int(decision.features.get("router_us", 0)) * 1000,
        output={"tier": decision.tier, "method": decision.method, "rule": decision.rule, "reason": decision.reason},
        metadata={"features": decision.features, "estimates": decision.estimates_json()},
    )


def _record(
    plan: _Plan,
    *,
    output: Any,
    status: str,
    result: tiers.TierResult | None,
    error: KeelError | None = None,
    cache_hit: bool = False,
    after: Sequence[Callable[[RoutingDecision | None], None]] = (),
) -> None:
    """Close the request's trace and store it with its decision, then run each of `after` with the decision
    row: once the answer has gone out when the plan says so (`record_behind`), else before returning. Each
    is a step of its own for the write-behind thread, retried alone if the database goes away. A failed
    request's `error` carries the trace id out (`trace_id` in its extra), as an answer does."""
    if error is not None:
        error.extra.setdefault("trace_id", plan.recorder.trace_id)
    decision = plan.decision
    tags = ["gateway"]
    metadata: dict[str, Any] = {"model": plan.request.model}
    if plan.pin is not None:
        tags.extend(plan.pin.tags)
        metadata |= dict(plan.pin.metadata)
    if decision is not None:
        tags.append(f"tier:{decision.tier}")
        metadata |= {"tier": decision.tier, "routing_method": decision.method, "routing_reason": decision.reason}
    if cache_hit:
        tags.append("cache_hit")
        metadata["cache_hit"] = True
    if plan.cache_reason:
        metadata["cache"] = plan.cache_reason
    error_type = result.error_type if result else None
    error_message = result.error_message if result else None
    if error is not None:
        error_type, error_message = error.code, error.detail
    spans = plan.recorder.finish(
        name=plan.request.model,
        input_messages=plan.client_messages or plan.request.messages_json(),
        output=output,
        status="ok" if status == "ok" else "error",
        error_type=error_type,
        error_message=error_message,
        tags=tags,
        metadata=metadata,
    )
    latency_ms = int((time.perf_counter() - plan.started) * 1000)
    stored: list[RoutingDecision | None] = []

    def store() -> None:
        stored.append(_store(plan, spans, ok=status == "ok", result=result, cache_hit=cache_hit, latency_ms=latency_ms))

    def with_row(then: Callable[[RoutingDecision | None], None]) -> Callable[[], None]:
        return lambda: then(stored[0])

    steps = [store, *map(with_row, after)]
    if plan.record_behind:
        write_behind.writer.submit(*steps)
    else:
        for step in steps:
            step()


def _store(
    plan: _Plan,
    spans: list[otlp.Span],
    *,
    ok: bool,
    result: tiers.TierResult | None,
    cache_hit: bool,
    latency_ms: int,
) -> RoutingDecision | None:
    """Store the decision and the request's spans in one transaction; returns the decision."""
    decision = plan.decision
    # The decision and the spans write no config: span ingest's kept reads serve inside (config/config_cache.py).
    with config_free_transaction():
        row = None
        if plan.agent is not None and decision is not None and plan.pin is None:
            cost = result.cost_usd if result else None
            # An unused speculative call was paid to serve this request too: the router learns from its cost.
            unused = decision.features.get("speculative_cost_usd")
            if unused is not None:
                cost = (cost or 0) + Decimal(str(unused))
            row = RoutingDecision.objects.create(
                workspace_id=plan.agent.workspace_id,
                agent=plan.agent,
                trace_id=plan.recorder.trace_id,
                conversation_id=plan.conversation_id,
                request_text=plan.request_text,
                embedding=plan.embedding,
                features=decision.features,
                estimates=decision.estimates_json(),
                tier=decision.tier,
                method=decision.method,
                rule=decision.rule[:200],
                reason=decision.reason,
                decision_us=int(decision.features.get("router_us", 0)),
                cache_hit=cache_hit,
                status=OutcomeStatus.OK if ok else OutcomeStatus.ERROR,
                latency_ms=latency_ms,
                cost_usd=None if cost is None else Decimal(str(cost)),
            )
            if result is not None and result.handoff is not None:
                Handoff.objects.filter(pk=result.handoff.pk).update(decision=row)
        tracing_services.ingest_spans_accept(api_key=plan.api_key, spans=spans)
    return row


def _shadow_maybe(plan: _Plan, row: RoutingDecision | None, result: tiers.TierResult) -> None:
    """Send a sampled share of requests through another automated tier too, off the caller's path."""
    from routing import tasks

    config, context = plan.config, plan.context
    if row is None or config is None or context is None or config.shadow_rate <= 0 or row.cache_hit:
        return
    if row.tier == TierChoice.HUMAN or random.random() >= config.shadow_rate:  # noqa: S311 - sampling, not security
        return
    others = [tier for tier in plan.enabled_tiers if tier not in (TierChoice.HUMAN, row.tier)]
    if not others:
        return
    # The tier nearest to the chosen one in cost says most about whether the choice was right.
    order = [tier.value for tier in TierChoice]
    shadow_tier = min(others, key=lambda tier: abs(order.index(tier) - order.index(row.tier)))
    shadow = ShadowRun.objects.create(
        decision=row,
        tier=shadow_tier,
        request={
            "messages": plan.messages,
            "tools": list(context.tools),
            "parameters": dict(context.parameters),
            "variables": dict(context.variables),
            "time_budget_ms": context.time_budget_ms,
            "max_steps": context.max_steps,
        },
        primary_answer=result.message,
    )
    dispatch.task_send_on_commit(tasks.shadow_run_execute, shadow.pk)


# --- Executing ---------------------------------------------------------------------------------------


def _answer(plan: _Plan, result: tiers.TierResult, *, cache_hit: bool = False) -> dict[str, Any]:
    decision = plan.decision
    return completion_body(
        completion_id=f"chatcmpl-{plan.recorder.trace_id}",
        model=plan.request.model,
        # The caller gets its own values back; the trajectory keeps the pseudonyms the model saw.
        message=guarding.pseudonyms_restored(result.message, plan.pseudonyms),
        finish_reason=result.finish_reason,
        input_tokens=result.input_tokens,
        output_tokens=result.output_tokens,
        keel={
            "trace_id": plan.recorder.trace_id,
            "tier": decision.tier if decision else None,
            "routing_reason": decision.reason if decision else None,
            "cache_hit": cache_hit,
            **({"guardrails": plan.violations} if plan.violations else {}),
            **({"handoff_id": result.handoff.pk} if result.handoff else {}),
            # A gated tool call waits for a person; the same call goes through once it is approved.
            **(
                {"approval": {"id": result.pending_approval_id, "status": "pending"}}
                if result.pending_approval_id
                else {}
            ),
            **({"error": {"type": result.error_type, "message": result.error_message}} if result.error_type else {}),
        },
    )


def _cache_check(plan: _Plan) -> tiers.TierResult | None:
    """Answer from the semantic cache when the request may be cached and a similar one was."""
    decision, config, agent = plan.decision, plan.config, plan.agent
    if plan.pin is not None:
        plan.cache_reason = "not cached: a pinned request (an eval run) asks the model every time"
        return None
    assert decision is not None
    assert agent is not None
    eligible, reason = cache.cache_eligibility(
        config=config,
        tier=decision.tier,
        has_tools=bool(decision.features.get("has_tools")),
        end_user=plan.request.user,
    )
    plan.cache_reason = reason
    if (
        not eligible
        or config is None
        or plan.embedding is None
        or decision.tier
        not in (
            TierChoice.SINGLE_CALL,
            TierChoice.CHAIN,
        )
    ):
        return None
    plan.cache_target = tiers.target_for_tier(agent=agent, config=config, tier=TierChoice.SINGLE_CALL)
    system = "\n".join(str(m.get("content")) for m in plan.messages if m.get("role") in ("system", "developer"))
    scope = f"{decision.tier}\n{system}"
    if decision.tier == TierChoice.CHAIN:
        assert plan.context is not None
        scope += f"\n{tiers.chain_fingerprint(tiers.chain_steps(plan.context))}"
    plan.system_hash = cache.system_hash(scope)
    started = time.time_ns()
    found = cache.cache_lookup(
        agent=agent,
        model_target=plan.cache_target,
        prompt_version=plan.prompt_version,
        system_prompt_hash=plan.system_hash,
        embedding=plan.embedding,
        threshold=config.cache_threshold,
        request_text=plan.request_text,
    )
    if found is None:
        plan.recorder.span(name="cache lookup: miss", span_type="retriever", start_ns=started)
        return None
    entry, similarity = found
    cache.cache_hit_record(
        entry=entry, trace_id=plan.recorder.trace_id, request_text=plan.request_text, similarity=similarity
    )
    plan.cache_reason = (
        f"answered from the cache (similarity {similarity:.3f} to the request of trace {entry.trace_id})"
    )
    plan.recorder.span(
        name="cache lookup: hit",
        span_type="retriever",
        start_ns=started,
        output=entry.response.get("message"),
        metadata={"cache_entry": entry.pk, "similarity": round(similarity, 4), "original_trace_id": entry.trace_id},
    )
    return tiers.TierResult(
        message=dict(entry.response.get("message") or {"role": "assistant", "content": ""}), finish_reason="stop"
    )


def _cache_store_maybe(plan: _Plan, result: tiers.TierResult) -> None:
    if plan.cache_target is None or plan.agent is None or plan.config is None or plan.embedding is None:
        return
    if result.status != "ok" or result.message.get("tool_calls") or result.finish_reason != "stop":
        return
    cache.cache_store(
        agent=plan.agent,
        model_target=plan.cache_target,
        prompt_version=plan.prompt_version,
        system_prompt_hash=plan.system_hash,
        request_text=plan.request_text,
        embedding=plan.embedding,
        response={
            "message": result.message,
            "input_tokens": result.input_tokens,
            "output_tokens": result.output_tokens,
        },
        trace_id=plan.recorder.trace_id,
        ttl_seconds=plan.config.cache_ttl_seconds,
    )


def _plan(
    *,
    api_key: ApiKey,
    request: ChatCompletionRequest,
    conversation_id: str,
    pin: Pin | None = None,
    record_behind: bool = False,
) -> tuple[_Plan, ModelTarget | None]:
    conversation_id = conversation_id or (request.metadata or {}).get("conversation_id") or ""
    model = request.model
    agent_slug = model[len(AGENT_PREFIX) :] if model.startswith(AGENT_PREFIX) else None
    context = selectors.gateway_agent_context(api_key=api_key, slug=agent_slug) if agent_slug else None
    agent = context.agent if context else None
    target = None if agent else selectors.gateway_target_get(api_key=api_key, alias=model)
    plan = _Plan(
        api_key=api_key,
        request=request,
        recorder=TraceRecorder(
            trace_id=trace_id_new(),
            agent_name=agent.slug if agent else None,
            session_id=str(conversation_id) or None,
            user_id=request.user,
            payer=hooks.Payer(
                workspace_id=api_key.workspace_id,
                agent_id=agent.pk if agent else None,
                api_key_id=api_key.pk,
                end_user=request.user or "",
            ),
        ),
        conversation_id=str(conversation_id)[:200],
        pin=pin,
        record_behind=record_behind,
    )
    if context is not None:
        try:
            _plan_agent(plan, context)
        except (guarding.GuardrailBlocked, PromptNotLabelled) as error:
            _record(plan, output=None, status="error", result=None, error=error)
            raise
        except BaseException:
            _speculation_unused(plan, recorded=False)  # the request is not recorded: only the budgets count it
            raise
    else:
        plan.messages = request.messages_json()
    return plan, target


def _proxy(plan: _Plan, target: ModelTarget) -> tiers.TierResult:
    parameters = plan.request.parameters()
    if plan.request.tools:
        parameters["tools"] = plan.request.tools_json()
    completion = tiers.model_call(plan.recorder, target, plan.messages, parameters, tools=plan.request.tools_json())
    return tiers.single_result(completion)


def _execute(plan: _Plan, target: ModelTarget | None) -> tuple[dict[str, Any], tiers.TierResult]:
    """Run a planned request to the end, record it, and return the answer's body and the tier's result."""
    result: tiers.TierResult | None = None
    cache_hit = False
    try:
        try:
            if target is not None:
                result = _proxy(plan, target)
            else:
                assert plan.decision is not None
                assert plan.context is not None
                result = _cache_check(plan)
                cache_hit = result is not None
                if result is None:
                    result = tiers.TIERS[plan.decision.tier](plan.context, plan.messages)
                    _output_guarded(plan, result)
        finally:
            _speculation_unused(plan)
    except KeelError as error:
        _record(plan, output=None, status="error", result=result, error=error)
        raise
    _settle(plan, result, cache_hit=cache_hit)
    return _answer(plan, result, cache_hit=cache_hit), result


def _settle(plan: _Plan, result: tiers.TierResult, *, cache_hit: bool = False) -> None:
    """After an answer: record the request, keep the answer in the cache, and maybe shadow it."""
    after: list[Callable[[RoutingDecision | None], None]] = []
    if not cache_hit:
        after.append(lambda row: _cache_store_maybe(plan, result))  # only a finished, successful answer
    after.append(lambda row: _shadow_maybe(plan, row, result))
    _record(plan, output=[result.message], status=result.status, result=result, cache_hit=cache_hit, after=after)


def _tool_calls(result: tiers.TierResult) -> list[dict[str, Any]]:
    """Every tool call the model asked for while serving the request (Keel-side and the caller's), in order."""
    calls: list[dict[str, Any]] = []
    for completion in result.completions:
        for call in completion.message.get("tool_calls") or ():
            function = call.get("function") or {}
            calls.append({"id": call.get("id"), "name": function.get("name"), "arguments": function.get("arguments")})
    return calls


def chat_completion(
    *,
    api_key: ApiKey,
    request: ChatCompletionRequest,
    conversation_id: str = "",
    pin: Pin | None = None,
    record_behind: bool = False,
) -> GatewayAnswer:
    """Serve one non-streamed chat request. Raises KeelError subclasses (404 unknown model, 422 missing
    prompt variables, 409 tier not configured, 502 provider failed) after recording the failure.

    The request's record is stored before this returns, unless `record_behind`: then the process's
    write-behind thread stores it after the caller has its answer (the HTTP view's choice)."""
    with hooks.request_scope():
        plan, target = _plan(
            api_key=api_key, request=request, conversation_id=conversation_id, pin=pin, record_behind=record_behind
        )
        body, result = _execute(plan, target)
    cost = result.cost_usd
    return GatewayAnswer(
        body=body,
        trace_id=plan.recorder.trace_id,
        tier=body["keel"]["tier"],
        tool_calls=_tool_calls(result),
        status=result.status,
        steps=result.steps,
        cost_usd=None if cost is None else float(cost),
        latency_ms=(time.perf_counter() - plan.started) * 1000,
        escalated=result.handoff is not None or body["keel"]["tier"] == TierChoice.HUMAN,
    )


# --- Streaming ---------------------------------------------------------------------------------------


def _sse(data: Any) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


def _stream_whole(body: dict[str, Any], *, usage: bool) -> Iterator[bytes]:
    """A finished answer as a stream: the role, the content, the finish reason (with Keel's extension), then
    the usage if the client asked for it."""
    completion_id, model = body["id"], body["model"]
    choice = body["choices"][0]
    message = choice["message"]
    yield _sse(chunk_body(completion_id=completion_id, model=model, delta={"role": "assistant"}, finish_reason=None))
    if message.get("content"):
        yield _sse(
            chunk_body(
                completion_id=completion_id, model=model, delta={"content": message["content"]}, finish_reason=None
            )
        )
    if message.get("tool_calls"):
        calls = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
        yield _sse(
            chunk_body(completion_id=completion_id, model=model, delta={"tool_calls": calls}, finish_reason=None)
        )
    last = chunk_body(completion_id=completion_id, model=model, delta={}, finish_reason=choice["finish_reason"])
    last["keel"] = body["keel"]
    yield _sse(last)
    if usage:
        yield _sse(usage_chunk_body(completion_id=completion_id, model=model, usage=body["usage"]))
    yield b"data: [DONE]\n\n"


def chat_completion_stream(
    *, api_key: ApiKey, request: ChatCompletionRequest, conversation_id: str = "", record_behind: bool = False
) -> tuple[str, Iterator[bytes]]:
    """Serve a streamed chat request as server-sent events; returns the trace id and the event stream.

    The single-call tier and plain proxying stream from the provider as it answers; other tiers, and
    cache hits, run to the end and are then sent as a stream. Errors before the first event raise like
    `chat_completion`; a provider that cuts the stream ends it with an error event, and the request is
    recorded either way.
    """
    with hooks.request_scope():
        plan, target = _plan(
            api_key=api_key, request=request, conversation_id=conversation_id, record_behind=record_behind
        )
    decision = plan.decision
    usage = request.usage_streamed
    # An answer that an output check may block or redact is sent once it has passed, as a whole.
    streams_live = target is not None or (
        decision is not None
        and decision.tier == TierChoice.SINGLE_CALL
        and plan.agent is not None
        and not hooks.guard().output_checked(agent=plan.agent)
    )
    if streams_live and decision is not None:
        cached = _cache_check(plan)
        if cached is not None:
            _record(plan, output=[cached.message], status="ok", result=cached, cache_hit=True)
            return plan.recorder.trace_id, _stream_whole(_answer(plan, cached, cache_hit=True), usage=usage)
    if not streams_live:
        with hooks.request_scope():
            body = _execute(plan, None)[0]
        return plan.recorder.trace_id, _stream_whole(body, usage=usage)
    live_target = target or tiers.target_for_tier(agent=plan.agent, config=plan.config, tier=TierChoice.SINGLE_CALL)  # type: ignore[arg-type]
    parameters = plan.request.parameters()
    if plan.request.tools:
        parameters["tools"] = plan.request.tools_json()
    state = providers.StreamState()
    try:
        hold = tiers.spend_reserve(plan.recorder, live_target, plan.messages, parameters)
    except KeelError as error:
        _record(plan, output=None, status="error", result=None, error=error)
        raise
    started = time.time_ns()
    try:
        chunks = providers.completion_stream(
            target=live_target, messages=plan.messages, parameters=parameters, state=state
        )
        first = next(chunks, None)
    except providers.ProviderFailed as error:
        hooks.guard().spend_settle(hold, cost_usd=0, tokens=0)
        plan.recorder.failed_generation(error, model=live_target.model, messages=plan.messages, start_ns=started)
        _record(plan, output=None, status="error", result=None, error=error)
        raise
    return plan.recorder.trace_id, _stream_live(plan, live_target, first, chunks, state, hold)


def _stream_live(
    plan: _Plan,
    target: ModelTarget,
    first: dict[str, Any] | None,
    chunks: Generator[dict[str, Any]],
    state: providers.StreamState,
    hold: Any,
) -> Iterator[bytes]:
    completion_id = f"chatcmpl-{plan.recorder.trace_id}"
    left = False
    try:
        usage = None
        chunk = first
        while chunk is not None:
            # Keel asks every provider for usage, which some put on a chunk of their own (litellm: one empty
            # delta) and some on the last of the answer; the client gets it, if it asked, as OpenAI sends it.
            usage = chunk.pop("usage", None) or usage
            chunk["choices"] = [c for c in chunk.get("choices") or () if c.get("delta") or c.get("finish_reason")]
            if chunk["choices"]:
                chunk["id"], chunk["model"] = completion_id, plan.request.model
                yield _sse(chunk)
            chunk = next(chunks, None)
        if usage and plan.request.usage_streamed:
            yield _sse(usage_chunk_body(completion_id=completion_id, model=plan.request.model, usage=usage))
        if state.error:
            yield _sse(
                {
                    "error": {
                        "message": f"the model provider cut the stream: {state.error}",
                        "type": "provider_error",
                        "code": "stream_interrupted",
                    }
                }
            )
        yield b"data: [DONE]\n\n"
    except GeneratorExit:
        # The client went away (the server closes the stream): stop the provider's answer too, which would
        # otherwise run on, and be paid for, until its connection is collected.
        left = not state.finish_reason
        chunks.close()
        raise
    finally:
        completion = state.completion()
        tiers.spend_settle(hold, completion)
        plan.recorder.generation(completion, messages=plan.messages, tools=plan.request.tools_json())
        result = tiers.single_result(completion)
        # The answer has gone out: the output checks can only record what they find (the policy chose this).
        with hooks.request_scope():
            _output_guarded(plan, result, sent=True)
        if state.error:
            result.status, result.error_type, result.error_message = "error", "stream_interrupted", state.error
        elif left:
            # A part of an answer: neither cached nor an outcome the router may learn from as a success.
            result.status, result.error_type = "error", "client_disconnected"
            result.error_message = "the client closed the stream before the answer was complete"
        _settle(plan, result)
