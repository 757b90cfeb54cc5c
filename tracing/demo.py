"""The demo workspace's trajectories: a week of traffic of the two demo agents (agent_registry.demo).

The agents are instrumented as a team would instrument them: the OpenTelemetry SDK with the GenAI
semantic conventions (an `invoke_agent` root span, a `chat` span per model call carrying the messages,
an `execute_tool` span per tool call) and Langfuse's prompt attributes naming the prompt version each
call used. The spans are recorded in memory on a simulated clock, encoded as OTLP/protobuf, and
ingested through Keel's own path: `ingest_otlp_accept` with a demo ingest key, which stores them
before it returns.

Seeding is idempotent: randomness is seeded per trajectory, trace ids are derived from fixed keys,
and only the trajectories whose trace ids are not stored yet are recorded; scores are added once.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final, TypeVar

from django.utils import timezone
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource as PbResource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan
from opentelemetry.proto.trace.v1.trace_pb2 import Status as PbStatus
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import SpanKind, Status, StatusCode

from agent_registry import prompts
from agent_registry import selectors as registry_selectors
from agent_registry import services as registry_services
from agent_registry.models import Agent, ApiKey, PromptType, PromptVersion, User, Workspace
from tracing import alerts, sampling, selectors, services, triage
from tracing.models import (
    DivergencePolicy,
    Replay,
    ReviewItem,
    ReviewSample,
    ScoreDataType,
    ScoreSource,
    Trajectory,
    TrajectoryStatus,
    TriageSettings,
)

DEMO_KEY_NAME: Final = "Demo trace ingest"
STORE: Final = "Northwind Outfitters"
COMPANY: Final = "Ridely"
PROTOBUF: Final = "application/x-protobuf"
_MS: Final = 1_000_000
T = TypeVar("T")

# --- Tools the agents declare (sent with every model call, so a replay can offer the same tools) ------


def _tool(name: str, description: str, properties: Mapping[str, Any], required: Sequence[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": dict(properties), "required": list(required)},
        },
    }


SHOPPING_TOOLS: Final = (
    _tool(
        "search_catalog",
        "Search the product catalog",
        {"query": {"type": "string"}, "max_price": {"type": "number"}, "category": {"type": "string"}},
        ["query"],
    ),
    _tool("get_reviews", "Review summary of a product", {"product_id": {"type": "string"}}, ["product_id"]),
    _tool(
        "lookup_purchase_history",
        "The shopper's past orders in a category, as product IDs",
        {"category": {"type": "string"}},
        ["category"],
    ),
)
RIDE_TOOLS: Final = (
    _tool("lookup_trip", "Trip record by trip ID", {"trip_id": {"type": "string"}}, ["trip_id"]),
    _tool("lookup_recent_trips", "The rider's trips of the last days", {"days": {"type": "integer"}}, ["days"]),
    _tool("lookup_payment", "Charges and refunds of a trip", {"trip_id": {"type": "string"}}, ["trip_id"]),
    _tool("search_policy", "Refund and cancellation policy", {"topic": {"type": "string"}}, ["topic"]),
    _tool(
        "issue_refund",
        "Refund a trip; autonomous under $20 with a clear cancellation record",
        {"trip_id": {"type": "string"}, "amount_usd": {"type": "number"}, "reason": {"type": "string"}},
        ["trip_id", "amount_usd", "reason"],
    ),
    _tool(
        "escalate_to_human",
        "Hand the case to a support agent",
        {"reason": {"type": "string"}, "priority": {"type": "string", "enum": ["normal", "urgent"]}},
        ["reason", "priority"],
    ),
    _tool(
        "ask_agent",
        "Ask a specialist sub-agent a question; its answer comes back as the result",
        {"agent": {"type": "string", "enum": ["refund-policy-checker"]}, "request": {"type": "string"}},
        ["agent", "request"],
    ),
)


@dataclass(frozen=True)
class AgentSpec:
    slug: str
    model: str
    prompt_name: str
    variables: dict[str, str]
    tools: tuple[dict[str, Any], ...]
    # Rough latency of one model call, in milliseconds.
    model_ms: tuple[int, int]


SHOPPING: Final = AgentSpec(
    slug="shopping-assistant",
    model="gpt-4o-mini",
    prompt_name="shopping-assistant/system",
    variables={"store": STORE},
    tools=SHOPPING_TOOLS,
    model_ms=(280, 900),
)
# The ride agent's refund-policy sub-agent runs on Ridely's own model, served by vLLM: litellm has no price
# for it and the demo workspace sets none, so its calls show as unpriced, not free.
POLICY_MODEL: Final = "ridely/policy-llama-3.1-8b"
RIDE: Final = AgentSpec(
    slug="ride-support",
    model="gpt-4o",
    prompt_name="ride-support/system",
    variables={"company": COMPANY},
    tools=RIDE_TOOLS,
    model_ms=(700, 2600),
)


class Dice:
    """Reproducible choices for the demo: SHA-256 of a seed and a counter, so the same seed plays the same week
    in every process (no cryptographic purpose; `random` would do, but this needs no seeding rules)."""

    def __init__(self, seed: object) -> None:
        self._seed = str(seed).encode()
        self._counter = 0

    def getrandbits(self, bits: int) -> int:
        self._counter += 1
        digest = hashlib.sha256(self._seed + b"/" + str(self._counter).encode()).digest()
        return int.from_bytes(digest, "big") >> (256 - bits)

    def random(self) -> float:
        return self.getrandbits(53) / (1 << 53)

    def randint(self, low: int, high: int) -> int:
        return low + self.getrandbits(64) % (high - low + 1)

    def uniform(self, low: float, high: float) -> float:
        return low + (high - low) * self.random()

    def choice(self, options: Sequence[T]) -> T:
        return options[self.randint(0, len(options) - 1)]


# --- Recording spans with the OpenTelemetry SDK ----------------------------------------------------


class _DemoIds(IdGenerator):
    """Trace ids from a fixed key and span ids from a generator seeded by it: the same demo, run after run."""

    def __init__(self) -> None:
        self.trace_id = 1
        self.random = Dice(0)

    def begin(self, key: str) -> None:
        self.trace_id = trace_id_of(key)
        self.random = Dice(f"keel-demo-spans/{key}")

    def generate_trace_id(self) -> int:
        return self.trace_id

    def generate_span_id(self) -> int:
        while True:
            value = self.random.getrandbits(64)
            if value:
                return value


def trace_id_of(key: str) -> int:
    """The demo trajectory `key`'s trace id, as the SDK's integer."""
    return int(hashlib.sha256(f"keel-demo/{key}".encode()).hexdigest()[:32], 16) or 1


def trace_hex(key: str) -> str:
    return format(trace_id_of(key), "032x")


class Recorder:
    """An SDK tracer provider of one service that keeps its finished spans in memory."""

    def __init__(self, service_name: str) -> None:
        self.ids = _DemoIds()
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider(
            resource=Resource.create(
                {"service.name": service_name, "service.version": "2.4.1", "deployment.environment": "production"}
            ),
            id_generator=self.ids,
        )
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("keel.demo", "1.0.0")

    def spans(self) -> tuple[ReadableSpan, ...]:
        return tuple(self.exporter.get_finished_spans())

    def shutdown(self) -> None:
        self.provider.shutdown()


def _any_value(value: Any) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, str):
        return AnyValue(string_value=value)
    if isinstance(value, Sequence):
        return AnyValue(array_value=ArrayValue(values=[_any_value(item) for item in value]))
    return AnyValue(string_value=str(value))


def _key_values(attributes: Mapping[str, Any] | None) -> list[KeyValue]:
    return [KeyValue(key=key, value=_any_value(value)) for key, value in (attributes or {}).items()]


_KINDS: Final = {
    SpanKind.INTERNAL: PbSpan.SPAN_KIND_INTERNAL,
    SpanKind.SERVER: PbSpan.SPAN_KIND_SERVER,
    SpanKind.CLIENT: PbSpan.SPAN_KIND_CLIENT,
    SpanKind.PRODUCER: PbSpan.SPAN_KIND_PRODUCER,
    SpanKind.CONSUMER: PbSpan.SPAN_KIND_CONSUMER,
}


def _pb_span(span: ReadableSpan) -> PbSpan:
    context = span.get_span_context()
    assert context is not None
    status_code = {
        StatusCode.UNSET: PbStatus.STATUS_CODE_UNSET,
        StatusCode.OK: PbStatus.STATUS_CODE_OK,
        StatusCode.ERROR: PbStatus.STATUS_CODE_ERROR,
    }[span.status.status_code]
    return PbSpan(
        trace_id=context.trace_id.to_bytes(16, "big"),
        span_id=context.span_id.to_bytes(8, "big"),
        parent_span_id=span.parent.span_id.to_bytes(8, "big") if span.parent is not None else b"",
        name=span.name,
        kind=_KINDS[span.kind],
        start_time_unix_nano=span.start_time or 0,
        end_time_unix_nano=span.end_time or 0,
        attributes=_key_values(span.attributes),
        events=[
            PbSpan.Event(name=event.name, time_unix_nano=event.timestamp, attributes=_key_values(event.attributes))
            for event in span.events
        ],
        status=PbStatus(code=status_code, message=span.status.description or ""),
    )


def otlp_encode(spans: Sequence[ReadableSpan]) -> bytes:
    """An OTLP/HTTP protobuf export request of the spans, grouped by resource and scope as exporters do."""
    request = ExportTraceServiceRequest()
    by_resource: dict[int, tuple[Resource, dict[tuple[str, str], list[ReadableSpan]]]] = {}
    for span in spans:
        _, scopes = by_resource.setdefault(id(span.resource), (span.resource, {}))
        scope = span.instrumentation_scope
        scopes.setdefault((scope.name if scope else "", (scope.version or "") if scope else ""), []).append(span)
    for resource, scopes in by_resource.values():
        resource_spans = ResourceSpans(resource=PbResource(attributes=_key_values(resource.attributes)))
        for (name, version), members in scopes.items():
            resource_spans.scope_spans.append(
                ScopeSpans(scope=InstrumentationScope(name=name, version=version), spans=[_pb_span(s) for s in members])
            )
        request.resource_spans.append(resource_spans)
    body: bytes = request.SerializeToString()
    return body


# --- Agents at work ----------------------------------------------------------------------------------


def _tokens(text: str) -> int:
    return max(1, len(text) // 4)


@dataclass
class Dialogue:
    """A session: the messages so far, which every model call sends again, as chat agents do."""

    agent: AgentSpec
    session_id: str
    user_id: str
    system_prompt: str
    prompt_version: int
    messages: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.messages:
            self.messages.append({"role": "system", "content": self.system_prompt})


def _tool_attributes(name: str, call_id: str, arguments_text: str, result_text: str) -> dict[str, Any]:
    """The GenAI attributes of a tool's execution span."""
    return {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": name,
        "gen_ai.tool.call.id": call_id,
        "gen_ai.tool.call.arguments": arguments_text,
        "gen_ai.tool.call.result": result_text,
    }


class Turn:
    """One trajectory: an agent run over a dialogue, span by span on a simulated clock."""

    def __init__(self, recorder: Recorder, dialogue: Dialogue, dice: Dice, started_at: datetime) -> None:
        self.recorder = recorder
        self.tracer = recorder.tracer
        self.dialogue = dialogue
        self.random = dice
        self.clock = int(started_at.timestamp() * 1e9)
        # What the user says next in the same session, and what the follow-up scenario needs to know.
        self.next_turn: tuple[str, str] | None = None

    def _pause(self, low: int = 2, high: int = 25) -> None:
        self.clock += self.random.randint(low, high) * _MS

    @contextmanager
    def _span(
        self, name: str, attributes: Mapping[str, Any], took_ms: int = 0, kind: SpanKind = SpanKind.INTERNAL
    ) -> Iterator[trace.Span]:
        self._pause()
        span = self.tracer.start_span(name, kind=kind, attributes=dict(attributes), start_time=self.clock)
        with trace.use_span(span, end_on_exit=False):
            yield span
        self.clock += took_ms * _MS
        span.end(end_time=self.clock)

    @contextmanager
    def agent_run(self, *, tags: Sequence[str], name: str | None = None) -> Iterator[trace.Span]:
        """The root span of the turn."""
        dialogue = self.dialogue
        attributes = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": dialogue.agent.slug,
            "gen_ai.conversation.id": dialogue.session_id,
            "user.id": dialogue.user_id,
            "langfuse.trace.tags": list(tags),
            "keel.metadata.prompt_variables": json.dumps(dialogue.agent.variables),
        }
        with self._span(
            name or f"invoke_agent {dialogue.agent.slug}", attributes, took_ms=4, kind=SpanKind.SERVER
        ) as span:
            yield span

    @contextmanager
    def sub_agent(self, name: str) -> Iterator[trace.Span]:
        attributes = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": name}
        with self._span(f"invoke_agent {name}", attributes, took_ms=3) as span:
            yield span

    def user(self, text: str) -> None:
        self.dialogue.messages.append({"role": "user", "content": text})

    def _chat(
        self,
        output: dict[str, Any],
        messages: list[dict[str, Any]] | None = None,
        *,
        model: str | None = None,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> None:
        """A model call: the agent's model and tools, or for a sub-agent (`messages`) its `model` and `tools`."""
        agent = self.dialogue.agent
        model = model or agent.model
        tools = agent.tools if tools is None else tools
        sent = list(self.dialogue.messages if messages is None else messages)
        prompt_tokens = sum(_tokens(json.dumps(message)) for message in sent) + 180 * len(tools)
        completion_tokens = _tokens(json.dumps(output)) + self.random.randint(0, 12)
        took = self.random.randint(*agent.model_ms) + completion_tokens * 6
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.system": "openai" if model == agent.model else "vllm",
            "gen_ai.request.model": model,
            "gen_ai.response.model": model,
            "gen_ai.request.temperature": 0.2,
            "gen_ai.usage.input_tokens": prompt_tokens,
            "gen_ai.usage.output_tokens": completion_tokens,
            "gen_ai.input.messages": json.dumps(sent),
            "gen_ai.output.messages": json.dumps([output]),
            "gen_ai.tool.definitions": json.dumps(list(tools)),
            "gen_ai.response.finish_reasons": ["tool_calls" if output.get("tool_calls") else "stop"],
        }
        if messages is None:
            attributes["langfuse.observation.prompt.name"] = agent.prompt_name
            attributes["langfuse.observation.prompt.version"] = self.dialogue.prompt_version
        with self._span(f"chat {model}", attributes, took_ms=took, kind=SpanKind.CLIENT):
            pass

    def _tool_request(self, name: str, arguments_text: str, said: str | None = None) -> tuple[str, dict[str, Any]]:
        """A new tool call id, and the assistant message that asks for tool `name` with it."""
        call_id = f"call_{self.random.getrandbits(48):012x}"
        function = {"name": name, "arguments": arguments_text}
        return call_id, {
            "role": "assistant",
            "content": said,
            "tool_calls": [{"id": call_id, "type": "function", "function": function}],
        }

    def tool(
        self,
        name: str,
        arguments: Mapping[str, Any],
        result: Any,
        *,
        took_ms: int | None = None,
        error: str | None = None,
        said: str | None = None,
    ) -> None:
        """The model asks for a tool (optionally saying something first), the agent runs it, the result goes back."""
        arguments_text = json.dumps(dict(arguments))
        call_id, request = self._tool_request(name, arguments_text, said)
        self._chat(request)
        self.dialogue.messages.append(request)
        result_text = result if isinstance(result, str) else json.dumps(result)
        attributes = _tool_attributes(name, call_id, arguments_text, result_text)
        with self._span(f"execute_tool {name}", attributes, took_ms=took_ms or self.random.randint(40, 380)) as span:
            if error is not None:
                span.set_attribute("error.type", error.split(":", 1)[0])
                span.set_status(Status(StatusCode.ERROR, error))
        self.dialogue.messages.append({"role": "tool", "tool_call_id": call_id, "content": result_text})

    def answer(self, text: str) -> None:
        message = {"role": "assistant", "content": text}
        self._chat(message)
        self.dialogue.messages.append(message)

    def delegate(
        self,
        name: str,
        system: str,
        request: str,
        tool: str,
        arguments: Mapping[str, Any],
        result: Any,
        verdict: str,
        *,
        model: str | None = None,
    ) -> None:
        """The agent asks a sub-agent (`ask_agent`): the sub-agent, with a conversation, a model (`model`) and a
        tool of its own, calls that tool once and answers; its answer is the result the agent reads next."""
        ask_arguments = json.dumps({"agent": name, "request": request})
        ask_id, ask = self._tool_request("ask_agent", ask_arguments)
        self._chat(ask)
        self.dialogue.messages.append(ask)
        handed = _tool_attributes("ask_agent", ask_id, ask_arguments, verdict)
        own_tools = [item for item in self.dialogue.agent.tools if item["function"]["name"] == tool]
        with self._span("execute_tool ask_agent", handed, took_ms=2), self.sub_agent(name):
            messages: list[dict[str, Any]] = [
                {"role": "system", "content": system},
                {"role": "user", "content": request},
            ]
            arguments_text = json.dumps(dict(arguments))
            call_id, call = self._tool_request(tool, arguments_text)
            self._chat(call, messages, model=model, tools=own_tools)
            result_text = json.dumps(result)
            attributes = _tool_attributes(tool, call_id, arguments_text, result_text)
            with self._span(f"execute_tool {tool}", attributes, took_ms=self.random.randint(60, 200)):
                pass
            messages += [call, {"role": "tool", "tool_call_id": call_id, "content": result_text}]
            self._chat({"role": "assistant", "content": verdict}, messages, model=model, tools=own_tools)
        self.dialogue.messages.append({"role": "tool", "tool_call_id": ask_id, "content": verdict})

    def guardrail(self, name: str, checked: Any, decision: Mapping[str, Any]) -> None:
        attributes = {
            "keel.span.type": "guardrail",
            "keel.input": json.dumps(checked),
            "keel.output": json.dumps(dict(decision)),
        }
        with self._span(f"guardrail {name}", attributes, took_ms=self.random.randint(1, 6)):
            pass


# --- What the week looked like ----------------------------------------------------------------------

CITIES: Final = ("Lisbon", "Porto", "Austin", "Denver", "Leeds", "Lyon", "Utrecht", "Valencia")
STREETS: Final = ("Rua Augusta", "Congress Ave", "Market St", "Boar Lane", "Rue de la République", "Oudegracht")


def _trip_id(rng: Dice) -> str:
    return f"T-{rng.randint(10000, 99999)}"


def _trip(rng: Dice, trip_id: str, status: str = "completed", fare: float | None = None) -> dict[str, Any]:
    city = rng.choice(CITIES)
    return {
        "trip_id": trip_id,
        "status": status,
        "city": city,
        "pickup": f"{rng.choice(STREETS)} {rng.randint(1, 240)}",
        "fare_usd": fare if fare is not None else round(rng.uniform(7, 38), 2),
        "driver": f"D-{rng.randint(100, 999)}",
        "date": f"2025-0{rng.randint(3, 9)}-{rng.randint(10, 28)}",
    }


REFUND_POLICY: Final = {
    "section": "4.2 Refunds",
    "text": "A trip cancelled by the driver, or charged twice, is refunded in full. Refunds up to $20 may be "
    "issued without review when the cancellation record is clear; larger amounts go to a support agent.",
}

DOUBLE_CHARGE_ASKS: Final = (
    "I was charged twice for my ride this morning, trip {trip}.",
    "Hi, my card shows two charges for trip {trip}. Can you fix that?",
    "You billed me twice for {trip}!! I only took one ride.",
    "There's a duplicate charge on my account for the ride {trip}.",
)
FOLLOW_UPS: Final = (
    (
        "When will I see the money back?",
        "Refunds reach your card within 3 to 5 business days; you will get an email the moment it is processed.",
    ),
    ("Thanks! Will it go back to the same card?", "Yes, the refund goes back to the card you paid with."),
    ("ok great, thanks", "You're welcome! Anything else I can help with?"),
)


def ride_double_charge(turn: Turn, *, follow_up: bool = False) -> None:
    rng = turn.random
    trip_id = _trip_id(rng)
    trip = _trip(rng, trip_id, fare=round(rng.uniform(8, 19), 2))
    fare = trip["fare_usd"]
    with turn.agent_run(tags=["refund", "double-charge"]):
        turn.user(rng.choice(DOUBLE_CHARGE_ASKS).format(trip=trip_id))
        turn.tool("lookup_trip", {"trip_id": trip_id}, trip)
        charges = [
            {"charge_id": f"ch_{rng.getrandbits(32):08x}", "amount_usd": fare, "status": "captured"},
            {"charge_id": f"ch_{rng.getrandbits(32):08x}", "amount_usd": fare, "status": "captured"},
        ]
        turn.tool("lookup_payment", {"trip_id": trip_id}, {"trip_id": trip_id, "charges": charges, "refunds": []})
        turn.tool("search_policy", {"topic": "duplicate charge"}, REFUND_POLICY)
        turn.guardrail(
            "action_boundary", {"tool": "issue_refund", "amount_usd": fare}, {"decision": "allow", "limit_usd": 20}
        )
        refund = {"refund_id": f"re_{rng.getrandbits(32):08x}", "amount_usd": fare, "status": "pending"}
        turn.tool("issue_refund", {"trip_id": trip_id, "amount_usd": fare, "reason": "duplicate charge"}, refund)
        turn.answer(
            f"Sorry about that! You were charged ${fare:.2f} twice for trip {trip_id}. I've refunded the duplicate "
            f"charge of ${fare:.2f}; it will be back on your card within 3 to 5 business days."
        )
    if follow_up:
        question, reply = rng.choice(FOLLOW_UPS)
        turn.next_turn = (question, reply)


def ride_follow_up(turn: Turn, question: str, reply: str) -> None:
    with turn.agent_run(tags=["refund", "follow-up"]):
        turn.user(question)
        turn.answer(reply)


def ride_cancellation_fee(turn: Turn) -> None:
    rng = turn.random
    trip_id = _trip_id(rng)
    trip = _trip(rng, trip_id, status="cancelled_by_driver", fare=0.0)
    with turn.agent_run(tags=["refund", "cancellation"]):
        turn.user(
            rng.choice(
                (
                    f"My driver cancelled on me but I still got a $5 cancellation fee ({trip_id}).",
                    f"Why was I charged a cancellation fee? The driver cancelled! Trip {trip_id}",
                )
            )
        )
        turn.tool("lookup_trip", {"trip_id": trip_id}, {**trip, "cancelled_by": "driver", "cancellation_fee_usd": 5.0})
        turn.tool("search_policy", {"topic": "cancellation fee"}, REFUND_POLICY)
        turn.guardrail(
            "action_boundary", {"tool": "issue_refund", "amount_usd": 5.0}, {"decision": "allow", "limit_usd": 20}
        )
        turn.tool(
            "issue_refund",
            {"trip_id": trip_id, "amount_usd": 5.0, "reason": "driver cancelled"},
            {"refund_id": f"re_{rng.getrandbits(32):08x}", "amount_usd": 5.0, "status": "pending"},
        )
        turn.answer(
            "You're right: the driver cancelled, so the fee should not have been charged. I've refunded the $5.00 "
            "cancellation fee; you'll see it within a few days."
        )


def ride_over_limit(turn: Turn) -> None:
    rng = turn.random
    trip_id = _trip_id(rng)
    fare = round(rng.uniform(46, 92), 2)
    trip = _trip(rng, trip_id, fare=fare)
    with turn.agent_run(tags=["refund", "escalated"]):
        turn.user(f"The airport ride {trip_id} cost ${fare:.2f}, the app quoted me $31. I want the difference back.")
        turn.tool("lookup_trip", {"trip_id": trip_id}, {**trip, "quoted_usd": 31.0, "route_deviation_km": 14.2})
        turn.tool("search_policy", {"topic": "fare dispute"}, REFUND_POLICY)
        difference = round(fare - 31.0, 2)
        turn.guardrail(
            "action_boundary",
            {"tool": "issue_refund", "amount_usd": difference},
            {"decision": "needs_human", "limit_usd": 20, "reason": "amount above the autonomy limit"},
        )
        turn.tool(
            "escalate_to_human",
            {"reason": f"fare dispute of ${difference:.2f} above the $20 limit", "priority": "normal"},
            {"ticket": f"SUP-{rng.randint(20000, 29999)}", "queue": "fare-disputes", "eta_hours": 4},
        )
        turn.answer(
            f"The trip took a 14 km detour, so a fare adjustment of ${difference:.2f} looks fair, but amounts over $20 "
            "need a colleague's review. I've opened a case for you; a support agent will get back within 4 hours."
        )


def ride_timeout(turn: Turn) -> None:
    rng = turn.random
    trip_id = _trip_id(rng)
    with turn.agent_run(tags=["refund", "tool-error"]):
        turn.user(f"I paid for trip {trip_id} twice, please refund one of them.")
        turn.tool("lookup_trip", {"trip_id": trip_id}, _trip(rng, trip_id))
        turn.tool(
            "lookup_payment",
            {"trip_id": trip_id},
            {"error": "timeout", "detail": "payments-service did not answer within 10 s"},
            took_ms=10_000,
            error="TimeoutError: payments-service did not answer within 10 s",
        )
        turn.answer(
            "I'm sorry, I can't reach our payments system right now, so I can't check the charges on this trip. "
            "Please try again in a few minutes."
        )


def ride_safety(turn: Turn) -> None:
    rng = turn.random
    trip_id = _trip_id(rng)
    text = rng.choice(
        (
            f"My driver on {trip_id} was texting the whole time and ran two red lights. I felt really unsafe.",
            f"The driver of my last ride ({trip_id}) shouted at me and I felt threatened. I want to report this.",
        )
    )
    with turn.agent_run(tags=["safety", "escalated"]):
        turn.user(text)
        turn.guardrail(
            "input_safety",
            {"text": text},
            {"decision": "escalate", "matched": ["unsafe" if "unsafe" in text else "threatened"], "route": "human"},
        )
        turn.tool(
            "escalate_to_human",
            {"reason": "rider reports a safety incident", "priority": "urgent"},
            {"ticket": f"SAFE-{rng.randint(1000, 9999)}", "queue": "safety", "eta_minutes": 10},
            said="I'm very sorry this happened. I'm connecting you with our safety team right away.",
        )
        turn.answer(
            "I'm very sorry this happened, and thank you for telling us. I've passed your report to our safety team "
            "as urgent; a specialist will contact you within 10 minutes. If you are in danger now, please call 112."
        )


def ride_misunderstood(turn: Turn) -> None:
    """First turn of a session where the bot answers a question the rider did not ask."""
    rng = turn.random
    trip_id = _trip_id(rng)
    with turn.agent_run(tags=["lost-item"]):
        turn.user(f"I think I left my phone in the car after trip {trip_id}, what can I do?")
        turn.tool("lookup_trip", {"trip_id": trip_id}, _trip(rng, trip_id))
        turn.answer(
            f"I see trip {trip_id} was completed normally and charged correctly, so it isn't eligible for a refund. "
            "Is there anything else I can help with?"
        )
    turn.next_turn = (
        "No, I don't want a refund!! I LEFT MY PHONE in the car. How do I get it back?",
        "",
    )


def ride_lost_item(turn: Turn, question: str, _reply: str) -> None:
    rng = turn.random
    with turn.agent_run(tags=["lost-item", "rephrased"]):
        turn.user(question)
        turn.tool(
            "escalate_to_human",
            {"reason": "lost item: phone left in the car", "priority": "normal"},
            {"ticket": f"LOST-{rng.randint(1000, 9999)}", "queue": "lost-and-found", "driver_notified": True},
            said="Sorry, I misunderstood you.",
        )
        turn.answer(
            "Sorry for the misunderstanding! I've notified your driver and opened a lost-item case. The driver will "
            "contact you through the app to arrange the return; you can follow the case under Help → Lost items."
        )


def ride_overcharged_week(turn: Turn) -> None:
    """The long one: six trips checked one by one, a sub-agent for the policy, three refunds, one escalation."""
    rng = turn.random
    trips = [_trip_id(rng) for _ in range(6)]
    with turn.agent_run(tags=["refund", "multi-trip", "escalated"]):
        turn.user(
            "I think you've been overcharging me all week. Can you check all my rides since Monday? I commute "
            "every day and the prices feel off."
        )
        listing = [{"trip_id": trip_id, "date": f"2025-06-{9 + index:02d}"} for index, trip_id in enumerate(trips)]
        turn.tool("lookup_recent_trips", {"days": 7}, {"trips": listing})
        overcharged: list[tuple[str, float]] = []
        for index, trip_id in enumerate(trips):
            fare = round(rng.uniform(11, 16), 2)
            trip = _trip(rng, trip_id, fare=fare)
            turn.tool("lookup_trip", {"trip_id": trip_id}, {**trip, "quoted_usd": 12.5})
            charged = fare + (4.0 if index in (1, 3, 4) else 0.0)
            turn.tool(
                "lookup_payment",
                {"trip_id": trip_id},
                {"trip_id": trip_id, "charges": [{"amount_usd": round(charged, 2), "status": "captured"}]},
            )
            if index in (1, 3, 4):
                overcharged.append((trip_id, 4.0))
        turn.delegate(
            "refund-policy-checker",
            "You check refund eligibility against Ridely's policy. Answer with the eligible trips and amounts.",
            "Rider overcharged by a $4.00 surge fee on trips "
            + ", ".join(trip for trip, _ in overcharged)
            + " although surge pricing was off. Eligible?",
            "search_policy",
            {"topic": "surge fee charged in error"},
            {"section": "4.5 Pricing errors", "text": "Fees charged in error are refunded in full."},
            "All three trips are eligible: a surge fee charged in error is refunded in full ($4.00 each).",
            model=POLICY_MODEL,
        )
        for trip_id, amount in overcharged:
            turn.guardrail(
                "action_boundary",
                {"tool": "issue_refund", "amount_usd": amount},
                {"decision": "allow", "limit_usd": 20},
            )
            turn.tool(
                "issue_refund",
                {"trip_id": trip_id, "amount_usd": amount, "reason": "surge fee charged in error"},
                {"refund_id": f"re_{rng.getrandbits(32):08x}", "amount_usd": amount, "status": "pending"},
            )
        turn.tool(
            "escalate_to_human",
            {"reason": "repeated surge fees charged in error: pricing bug?", "priority": "normal"},
            {"ticket": f"SUP-{rng.randint(20000, 29999)}", "queue": "pricing", "eta_hours": 24},
        )
        turn.answer(
            "I checked your six rides since Monday. Three of them ("
            + ", ".join(trip for trip, _ in overcharged)
            + ") included a $4.00 surge fee although surge pricing was off; I've refunded $12.00 in total. I've also "
            "asked our pricing team to look into why it happened."
        )


PRODUCTS: Final = {
    "running shoes": [
        ("P-1184", "Strideline Stability 4", 89.0, 4.6),
        ("P-2290", "Cloudfoot Arch Support", 74.5, 4.4),
        ("P-3307", "TrailMaster Flat-Feet Edition", 96.0, 4.3),
        ("P-4410", "Pacer Neutral 2", 59.99, 4.0),
    ],
    "rain jacket": [
        ("P-5120", "Drizzle Shell Packable", 64.0, 4.5),
        ("P-5121", "StormGuard 3L", 139.0, 4.7),
        ("P-5188", "City Trench Waterproof", 98.0, 4.2),
    ],
    "headphones": [
        ("P-7001", "Quietude ANC 700", 179.0, 4.6),
        ("P-7040", "BassLine Wireless", 49.0, 3.9),
        ("P-7102", "StudioFlat Monitor", 99.0, 4.5),
    ],
    "backpack": [
        ("P-8003", "Commuter 24L Roll-top", 79.0, 4.6),
        ("P-8015", "Laptop Daypack Slim", 45.0, 4.3),
        ("P-8090", "Trekker 40L", 129.0, 4.8),
    ],
    "coffee grinder": [
        ("P-9310", "BurrPro Manual", 39.0, 4.4),
        ("P-9322", "Conical Burr Electric 40", 129.0, 4.7),
        ("P-9350", "Blade Grinder Mini", 19.99, 3.6),
    ],
}
QUERIES: Final = (
    ("running shoes", "running shoes for flat feet under $100", 100.0),
    ("rain jacket", "a light rain jacket for city cycling", 120.0),
    ("headphones", "noise cancelling headphones for the office, not too pricey", 200.0),
    ("backpack", "a backpack that fits a 16 inch laptop for commuting", 100.0),
    ("coffee grinder", "good coffee grinder for pour over", 150.0),
)


def _results(category: str, max_price: float) -> list[dict[str, Any]]:
    return [
        {"product_id": pid, "title": title, "price_usd": price, "rating": rating}
        for pid, title, price, rating in PRODUCTS[category]
        if price <= max_price
    ]


def _recommend(results: Sequence[Mapping[str, Any]]) -> str:
    lines = [f"- **{item['title']}** (${item['price_usd']:.2f}, rated {item['rating']})" for item in results[:3]]
    return "Here are the best matches from our catalog:\n" + "\n".join(lines)


def shop_search(turn: Turn, *, with_reviews: bool = False, follow_up: bool = False) -> None:
    rng = turn.random
    category, query, max_price = rng.choice(QUERIES)
    results = _results(category, max_price)
    with turn.agent_run(tags=["search"] + (["reviews"] if with_reviews else [])):
        turn.user(query)
        turn.tool(
            "search_catalog", {"query": query, "max_price": max_price, "category": category}, {"results": results}
        )
        if with_reviews and results:
            best = max(results, key=lambda item: item["rating"])
            turn.tool(
                "get_reviews",
                {"product_id": best["product_id"]},
                {
                    "product_id": best["product_id"],
                    "summary": "Comfortable, true to size; a few say it runs warm.",
                    "count": rng.randint(80, 2400),
                },
            )
        turn.answer(_recommend(results))
    if follow_up:
        turn.next_turn = ("anything cheaper?", category)


def shop_cheaper(turn: Turn, question: str, category: str) -> None:
    cheap = sorted(_results(category, 10_000.0), key=lambda item: item["price_usd"])[:2]
    with turn.agent_run(tags=["search", "follow-up"]):
        turn.user(question)
        turn.tool(
            "search_catalog",
            {"query": f"{category} budget", "max_price": cheap[-1]["price_usd"], "category": category},
            {"results": cheap},
        )
        turn.answer(_recommend(cheap))


def shop_nothing_found(turn: Turn) -> None:
    query = turn.random.choice(("a waterproof e-reader under $30", "titanium camping stove under $15"))
    with turn.agent_run(tags=["search", "no-results"]):
        turn.user(query)
        turn.tool("search_catalog", {"query": query, "max_price": 30}, {"results": []})
        turn.answer(
            "I couldn't find anything that matches in our catalog. Would you like to raise the budget a little, "
            "or look at splash-proof models instead?"
        )


def shop_history(turn: Turn) -> None:
    with turn.agent_run(tags=["search", "purchase-history"]):
        turn.user("I need new running shoes, same kind as the ones I bought last year")
        turn.tool(
            "lookup_purchase_history",
            {"category": "running shoes"},
            {"orders": [{"product_id": "P-1184", "title": "Strideline Stability 3", "ordered": "2024-05-02"}]},
        )
        results = _results("running shoes", 100.0)
        turn.tool(
            "search_catalog", {"query": "Strideline Stability", "category": "running shoes"}, {"results": results[:1]}
        )
        turn.answer(
            "You bought the Strideline Stability 3 last May. Its successor, the **Strideline Stability 4** ($89.00, "
            "rated 4.6), keeps the same fit and arch support."
        )


def shop_loop(turn: Turn) -> None:
    """The model keeps asking for the same search."""
    arguments = {"query": "gift for a 10 year old who likes space", "max_price": 40}
    with turn.agent_run(tags=["search", "loop"]):
        turn.user("gift ideas for a 10 year old who likes space, under $40")
        for _ in range(5):
            turn.tool("search_catalog", arguments, {"results": [], "note": "no exact match; try a category"})
        turn.answer("I'm sorry, I couldn't find a space-themed gift under $40 right now.")


# --- The plan of the week ----------------------------------------------------------------------------


Options = tuple[tuple[str, bool], ...]
NO_OPTIONS: Final[Options] = ()


@dataclass(frozen=True)
class Session:
    key: str
    agent: AgentSpec
    scenario: str
    hours_ago: float
    options: Options = ()


_SCENARIOS: Final[dict[str, Callable[..., None]]] = {
    "double_charge": ride_double_charge,
    "cancellation_fee": ride_cancellation_fee,
    "over_limit": ride_over_limit,
    "timeout": ride_timeout,
    "safety": ride_safety,
    "misunderstood": ride_misunderstood,
    "overcharged_week": ride_overcharged_week,
    "search": shop_search,
    "nothing_found": shop_nothing_found,
    "history": shop_history,
    "loop": shop_loop,
}
_FOLLOW_UPS: Final[dict[str, Callable[..., None]]] = {
    "double_charge": ride_follow_up,
    "misunderstood": ride_lost_item,
    "search": shop_cheaper,
}


def _times(count: int, scenario: str, options: Options = NO_OPTIONS) -> list[tuple[str, Options]]:
    return [(scenario, options)] * count


def week_plan() -> list[Session]:
    """The sessions of the demo week, newest first; fixed, so every run plans the same week."""
    rng = Dice("keel-demo-week")
    ride = [
        *_times(5, "double_charge", (("follow_up", True),)),
        *_times(7, "double_charge"),
        *_times(4, "cancellation_fee"),
        *_times(3, "over_limit"),
        *_times(2, "timeout"),
        *_times(2, "safety"),
        *_times(2, "misunderstood"),
        *_times(1, "overcharged_week"),
    ]
    shopping = [
        *_times(12, "search"),
        *_times(5, "search", (("with_reviews", True),)),
        *_times(4, "search", (("follow_up", True),)),
        *_times(2, "nothing_found"),
        *_times(2, "history"),
        *_times(1, "loop"),
    ]
    sessions: list[Session] = []
    for agent, entries in ((RIDE, ride), (SHOPPING, shopping)):
        for number, (scenario, options) in enumerate(entries, start=1):
            # A third of the traffic in the last day, the rest spread over the week.
            hours = rng.uniform(0.2, 23.5) if number % 3 == 0 else rng.uniform(1, 167)
            sessions.append(Session(f"{agent.slug}/{number:02d}", agent, scenario, round(hours, 3), options))
    sessions.sort(key=lambda session: session.hours_ago)
    return sessions


def _system_prompts(workspace: Workspace, agent: AgentSpec) -> dict[int, str]:
    """The system message each version of the agent's prompt renders to, as the agent would send it. A
    version someone published since the demo was seeded, with variables the demo does not fill, is left
    out: seeding again must not fail on it."""
    prompt = registry_selectors.prompt_get(workspace=workspace, name=agent.prompt_name)
    rendered: dict[int, str] = {}
    for version in registry_selectors.prompt_version_list(prompt=prompt):
        template = version.template
        if version.type == PromptType.CHAT and isinstance(template, list):
            template = [item for item in template if item.get("role") == "system"]
        try:
            text = prompts.template_render(template, agent.variables)
        except prompts.MissingVariables:
            continue
        rendered[version.version] = (
            text if isinstance(text, str) else "\n\n".join(str(message["content"]) for message in text)
        )
    return rendered


def _prompt_version(agent: AgentSpec, hours_ago: float, versions: Mapping[int, str]) -> int:
    # v2 went to production three days ago; older traffic ran on v1.
    newest = max(versions)
    return newest if hours_ago < 72 or newest == 1 else newest - 1


@dataclass(frozen=True)
class ScoreSeed:
    """A reviewer's judgement of a demo turn; `span_name` and `span_number` pick a step instead of the whole turn."""

    name: str
    data_type: str
    value: float | bool | None = None
    string_value: str = ""
    comment: str = ""
    span_name: str = ""
    span_number: int = 1


def _scores(session: Session, turn_number: int) -> list[ScoreSeed]:
    """What the demo's reviewer said about a turn: a few scores of each kind, not one on every turn."""
    chance = Dice(f"keel-demo-scores/{session.key}/{turn_number}").random()
    boolean, numeric = ScoreDataType.BOOLEAN, ScoreDataType.NUMERIC
    categorical, correction = ScoreDataType.CATEGORICAL, ScoreDataType.CORRECTION
    if session.scenario == "misunderstood" and turn_number == 1:
        return [
            ScoreSeed("resolved", boolean, value=False, comment="Answered a refund question nobody asked."),
            ScoreSeed(
                "corrected_output",
                correction,
                string_value="Sorry you left your phone behind! I've notified your driver and opened a lost-item "
                "case; the driver will contact you through the app to arrange the return.",
            ),
        ]
    if session.scenario == "misunderstood":
        return [ScoreSeed("resolved", boolean, value=True)]
    if session.scenario == "timeout":
        return [ScoreSeed("resolved", boolean, value=False, comment="Payments timed out; the rider had to come back.")]
    if session.scenario in ("safety", "over_limit"):
        return [ScoreSeed("escalation", categorical, string_value="correct")]
    if session.scenario == "overcharged_week":
        return [ScoreSeed("resolved", boolean, value=True), ScoreSeed("helpfulness", numeric, value=5)]
    if session.scenario == "loop":
        return [
            ScoreSeed("helpfulness", numeric, value=1, comment="Searched the same thing five times."),
            ScoreSeed(
                "redundant_call",
                boolean,
                value=True,
                comment="Same arguments as the call before.",
                span_name="execute_tool search_catalog",
                span_number=2,
            ),
        ]
    if session.scenario == "double_charge" and turn_number == 1 and chance < 0.5:
        return [ScoreSeed("resolved", boolean, value=True)]
    if session.scenario == "search" and turn_number == 1 and chance < 0.4:
        return [ScoreSeed("helpfulness", numeric, value=3 + round(chance * 5))]
    return []


@dataclass
class _RecordedTurn:
    session: Session
    number: int
    trace_id: str


def _record(
    recorders: Mapping[str, Recorder], sessions: Sequence[Session], prompts_by_agent: Mapping[str, Mapping[int, str]]
) -> list[_RecordedTurn]:
    """Play the week on the simulated clock; every turn is recorded (the caller keeps the new ones)."""
    turns: list[_RecordedTurn] = []
    now = timezone.now()
    for session in sessions:
        recorder = recorders[session.agent.slug]
        versions = prompts_by_agent[session.agent.slug]
        rng = Dice(f"keel-demo/{session.key}")
        version = _prompt_version(session.agent, session.hours_ago, versions)
        dialogue = Dialogue(
            agent=session.agent,
            session_id=f"sess-{hashlib.sha256(session.key.encode()).hexdigest()[:10]}",
            user_id=f"{'rider' if session.agent is RIDE else 'shopper'}-{rng.randint(1000, 9999)}",
            system_prompt=versions[version],
            prompt_version=version,
        )
        started_at = now - timedelta(hours=session.hours_ago)
        key = f"{session.key}/1"
        recorder.ids.begin(key)
        turn = Turn(recorder, dialogue, Dice(key), started_at)
        _SCENARIOS[session.scenario](turn, **dict(session.options))
        turns.append(_RecordedTurn(session, 1, trace_hex(key)))
        if turn.next_turn is not None:
            key = f"{session.key}/2"
            recorder.ids.begin(key)
            # The user reads the answer and writes again a minute or a few later.
            second = Turn(recorder, dialogue, Dice(key), started_at)
            second.clock = turn.clock + rng.randint(40, 300) * 1000 * _MS
            _FOLLOW_UPS[session.scenario](second, *turn.next_turn)
            turns.append(_RecordedTurn(session, 2, trace_hex(key)))
    return turns


def _ingest_key(workspace: Workspace, agents: Sequence[Agent], owner: User | None) -> ApiKey:
    existing = (
        registry_selectors.apikey_list(workspace=workspace)
        .filter(name=DEMO_KEY_NAME, revoked_at__isnull=True)
        .order_by("pk")
        .first()
    )
    if existing is not None:
        return existing
    api_key, _ = registry_services.apikey_create(
        workspace=workspace, name=DEMO_KEY_NAME, scopes=["ingest"], agents=agents, created_by=owner
    )
    return api_key


def _span_ids(spans: Sequence[ReadableSpan], trace_id: str, name: str) -> list[str]:
    found = []
    for span in sorted(spans, key=lambda span: span.start_time or 0):
        context = span.get_span_context()
        if context is not None and format(context.trace_id, "032x") == trace_id and span.name == name:
            found.append(format(context.span_id, "016x"))
    return found


def demo_traces_seed(workspace: Workspace) -> int:
    """Record and ingest the demo week's trajectories that are not stored yet, then the reviewer's scores.

    Precondition: the demo agents and their prompts exist (agent_registry.demo.demo_seed makes them).
    Returns how many trajectories were added.
    """
    agents = [registry_selectors.agent_get(workspace=workspace, slug=spec.slug) for spec in (SHOPPING, RIDE)]
    owner = registry_selectors.workspace_owner(workspace=workspace)
    prompts_by_agent = {spec.slug: _system_prompts(workspace, spec) for spec in (SHOPPING, RIDE)}
    recorders = {spec.slug: Recorder(spec.slug) for spec in (SHOPPING, RIDE)}
    try:
        turns = _record(recorders, week_plan(), prompts_by_agent)
        spans = [span for recorder in recorders.values() for span in recorder.spans()]
    finally:
        for recorder in recorders.values():
            recorder.shutdown()
    stored = set(
        Trajectory.objects.filter(workspace=workspace, trace_id__in=[turn.trace_id for turn in turns]).values_list(
            "trace_id", flat=True
        )
    )
    fresh = [
        span
        for span in spans
        if (context := span.get_span_context()) is not None and format(context.trace_id, "032x") not in stored
    ]
    if fresh:
        accepted = services.ingest_otlp_accept(
            api_key=_ingest_key(workspace, agents, owner),
            body=otlp_encode(fresh),
            content_type=PROTOBUF,
            content_encoding="",
        )
        if accepted.batch_id is not None:  # kept as a batch when writing in the request failed: as a worker would
            services.span_batch_process(batch_id=accepted.batch_id)

    for turn in turns:
        seeds = _scores(turn.session, turn.number)
        if not seeds:
            continue
        trajectory = Trajectory.objects.filter(workspace=workspace, trace_id=turn.trace_id).first()
        if trajectory is None:
            continue
        given = set(trajectory.scores.filter(source=ScoreSource.HUMAN).values_list("name", flat=True))
        for seed in seeds:
            if seed.name in given:
                continue
            span_id = ""
            if seed.span_name:
                candidates = _span_ids(spans, turn.trace_id, seed.span_name)
                span_id = candidates[min(seed.span_number, len(candidates)) - 1] if candidates else ""
            services.score_create(
                trajectory=trajectory,
                name=seed.name,
                data_type=seed.data_type,
                value=seed.value,
                string_value=seed.string_value,
                comment=seed.comment,
                span_id=span_id,
                source=ScoreSource.HUMAN,
                created_by=owner,
            )
    return len({turn.trace_id for turn in turns} - stored)


# --- Triage: settings, review queues with decisions, alert rules and an alert ------------------------------

DEMO_SAMPLE_SIZE: Final = 8
DEMO_REVIEWED_PER_SAMPLE: Final = 6
DEMO_RULES: Final = (
    # agent, name, signal, threshold, window (minutes), minimum, severity, cooldown (minutes)
    ("ride-support", "Error rate this week", "error_status", 0.05, 7 * 24 * 60, 10, "page", 24 * 60),
    ("ride-support", "Misalignment rate", "misalignment", 0.10, 60, 20, "info", 60),
    ("shopping-assistant", "Loop rate this week", "loop", 0.02, 7 * 24 * 60, 20, "warning", 24 * 60),
)


def _demo_decision(item: ReviewItem) -> dict[str, Any]:
    """What the demo's reviewer decides: informative where a problem signal (other than the shopping
    agent's tight latency ceiling) fired or the run failed; now and then something a signal missed."""
    trajectory = item.trajectory
    fired = [name for name in sampling.FAILURE_MODES if name in set(item.signal_names) & sampling.PROBLEM_SIGNALS]
    telling = [name for name in fired if name != "exhaustion"]
    if trajectory.status == TrajectoryStatus.ERROR:
        return {"informative": True, "failure_mode": "failure", "note": "A tool failed and the rider was left waiting."}
    if telling:
        return {"informative": True, "failure_mode": telling[0], "note": ""}
    if fired:
        return {
            "informative": False,
            "failure_mode": "",
            "note": "Only the latency ceiling fired; the answer was fine.",
        }
    if Dice(f"keel-demo-review/{trajectory.trace_id}").random() < 0.2:
        return {"informative": True, "failure_mode": "other", "note": "Recommended an item the shopper already owns."}
    return {"informative": False, "failure_mode": "", "note": ""}


def demo_triage_seed(workspace: Workspace) -> None:
    """Triage settings for ride-support, a review queue per sampling strategy with most items decided (through
    the review services), alert rules, and the alerts that evaluating them over the demo week fires.

    Idempotent: settings, queues and rules are made once; rules are evaluated only until they first fire.
    Precondition: demo_traces_seed ran.
    """
    owner = registry_selectors.workspace_owner(workspace=workspace)
    ride = registry_selectors.agent_get(workspace=workspace, slug=RIDE.slug)
    if not TriageSettings.objects.filter(agent=ride).exists():
        triage.triage_settings_update(
            agent=ride,
            language="en",
            phrases={
                "en": {
                    "negative": {"mode": "extend", "phrases": ["this is a joke", "unbelievable"]},
                    "correction": {"mode": "extend", "phrases": ["that's not my question"]},
                }
            },
            weights={"misalignment": 0.7, "disengagement": 0.6},
            handoff_tools=["escalate_to_human"],
            review_budget_per_day=10,
            review_strategies=["signal", "random"],
            updated_by=owner,
        )
        # Workers would recompute in the background; the demo has none running yet, so do it here.
        ids = list(Trajectory.objects.filter(agent=ride).values_list("pk", flat=True))
        services.trajectory_signals_recompute(trajectory_ids=ids)

    now = timezone.now()
    for strategy in sampling.STRATEGIES:
        seed = f"demo:{strategy}"
        if ReviewSample.objects.filter(workspace=workspace, seed=seed).exists():
            continue
        sample = triage.review_sample_create(
            workspace=workspace,
            strategy=strategy,
            window_start=now - timedelta(days=8),
            window_end=now,
            budget=DEMO_SAMPLE_SIZE,
            created_by=owner,
            seed=seed,
        )
        for item in triage.review_item_list(sample=sample)[:DEMO_REVIEWED_PER_SAMPLE]:
            triage.review_item_decide(item=item, status="reviewed", reviewer=owner, **_demo_decision(item))

    for slug, name, signal, threshold, window, minimum, severity, cooldown in DEMO_RULES:
        agent = registry_selectors.agent_get(workspace=workspace, slug=slug)
        if alerts.alert_rule_list(workspace=workspace, agent=agent).filter(name=name).exists():
            # Evaluated once, when made: a later seed must not fire on traffic the demo added since.
            continue
        rule = alerts.alert_rule_create(
            agent=agent,
            fields=alerts.RuleFields(
                name=name,
                signal=signal,
                threshold=threshold,
                window_minutes=window,
                min_trajectories=minimum,
                severity=severity,
                cooldown_minutes=cooldown,
            ),
            created_by=owner,
        )
        alerts.alert_rule_evaluate(rule=rule, now=now)


# --- Replays ----------------------------------------------------------------------------------------

# What the demo's replays re-run: a double charge refunded through issue_refund (demo_traces_seed's
# earliest such conversation), on the demo's strong model target (routing.demo's demo-strong, served by
# Keel's fake demo provider: no network); and the week of overcharges, from its refund-policy sub-agent's
# answer. There the ride agent is resumed on the model it recorded, gpt-4o, which routing.demo's target of
# that name serves offline (replay calls a recorded model through the workspace's target of that alias).
REPLAY_TAG_PICKED: Final = "double-charge"
SUB_AGENT_TAG_PICKED: Final = "multi-trip"
REPLAY_MODEL: Final = "demo-strong"


def _first_recording(workspace: Workspace, tag: str) -> Trajectory | None:
    return (
        Trajectory.objects.filter(
            workspace=workspace, agent__slug=RIDE.slug, tags__contains=[tag], replay_of__isnull=True
        )
        .order_by("started_at", "pk")
        .first()
    )


def demo_replays_seed(workspace: Workspace) -> int:
    """Counterfactual replays, run as a worker runs them (tracing.replay). Of one refund conversation: its
    last answer again on the strong model with the ride-support prompt's v1 (done, a new trajectory to
    compare), and the step before the refund on the strong model, which calls `issue_refund` with arguments
    the recording never saw: one replay stops there, one is served a stub and goes on. Of the week of
    overcharges: the refund-policy sub-agent's answer on the strong model instead of the self-hosted one;
    the ride agent then goes on from the recording with the new answer, on its own recorded model (done, its
    final answer changed). Returns how many were made; none once the workspace has replays.

    Precondition: demo_traces_seed and routing.demo.demo_routing_seed ran (the model targets)."""
    from tracing import replay  # replay builds on the gateway's providers; demo_seed imports routing later

    if Replay.objects.filter(workspace=workspace).exists():
        return 0
    owner = registry_selectors.workspace_owner(workspace=workspace)
    original = _first_recording(workspace, REPLAY_TAG_PICKED)
    if original is None:
        return 0
    view = selectors.trajectory_views(trajectories=[original])[original.pk]
    calls = [step.index for step in view.steps if step.kind == "llm_call"]
    refund = next((call.step_index for call in view.tool_calls if call.name == "issue_refund"), None)
    if not calls or refund is None:
        return 0
    before_refund = max(index for index in calls if index < refund)
    first_version = (
        PromptVersion.objects.filter(prompt__agent__workspace=workspace, prompt__name=RIDE.prompt_name, version=1)
        .select_related("prompt")
        .first()
    )
    made = [
        replay.replay_create(
            original=original, from_step=calls[-1], model=REPLAY_MODEL, prompt_version=first_version, created_by=owner
        ),
        replay.replay_create(original=original, from_step=before_refund, model=REPLAY_MODEL, created_by=owner),
        replay.replay_create(
            original=original,
            from_step=before_refund,
            model=REPLAY_MODEL,
            divergence_policy=DivergencePolicy.STUB,
            stub_result={"refunded": True, "amount_usd": 12.5, "note": "stub served by the replay"},
            created_by=owner,
        ),
    ]
    delegating = _first_recording(workspace, SUB_AGENT_TAG_PICKED)
    if delegating is not None:
        steps = selectors.trajectory_views(trajectories=[delegating])[delegating.pk].steps
        # The sub-agent's last model call: its answer, from the policy it looked up.
        verdict = [step.index for step in steps if step.kind == "llm_call" and step.model == POLICY_MODEL][-1:]
        made += [
            replay.replay_create(original=delegating, from_step=index, model=REPLAY_MODEL, created_by=owner)
            for index in verdict
        ]
    # A worker would run them; the demo has none running yet, so run them here.
    for run in made:
        replay.replay_execute(replay_id=run.pk)
    return len(made)
