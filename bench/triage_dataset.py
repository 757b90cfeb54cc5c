"""A labelled set of agent trajectories for measuring the triage signals (`tracing.signals`).

Written by the team, not produced by the detectors: every trajectory comes from a recipe that says
what happens in it (the user corrects the agent, a tool fails and the agent reports it, a call
repeats, ...), and the labels are what the recipe put there, per the signal definitions in the
`tracing.signals` docstring. Nothing here imports or runs a detector.

Five agent scenarios (ride support with refunds and escalations, a shopping assistant, a coding agent
with file and terminal tools, a travel-booking agent, a data-analysis agent with SQL tools) share the
recipes; each scenario supplies its tools, tasks and wording. Randomness (phrasings, ids, amounts,
error shapes) comes from one seeded `random.Random`, so the set is the same on every run.

Each trajectory is built as OpenTelemetry GenAI spans (an `invoke_agent` root, `chat` spans whose
`gen_ai.input.messages` repeat the history, `execute_tool` spans), encoded as an OTLP
`ExportTraceServiceRequest` protobuf and read back through `tracing.otlp.decode_request`,
`tracing.otlp.map_spans` and `tracing.steps.trajectory_view_build`: the detectors see what ingest sees.

Labels per trajectory: `signals`, the signals truly present, and `problematic`, whether a reviewer
should look at it. Successful, politely corrected-nothing, correctly escalated and noisy-but-fine
trajectories are not problematic, and neither is a run that ends on the agent's clarifying question (traced
one request per trace, the user's answer opens the session's next trajectory); hard negatives (a user who
asks for a person up front, a recovered rate limit, a handled "not found", an error hint the agent rightly
follows) carry their true signals but are not problematic either.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from tracing import otlp
from tracing.signals import SIGNAL_NAMES, SignalConfig, tool_result_shape
from tracing.steps import TrajectoryView, trajectory_view_build

DEFAULT_SEED = 20260401
MODEL = "gpt-4o-2024-08-06"
START_NS = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z


class SeededRandom(random.Random):
    """The one source of variety in the set: seeded, so every run builds the same trajectories."""


# --- Labelled trajectories ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LabelledTrajectory:
    trajectory_id: str
    scenario: str
    recipe: str
    view: TrajectoryView
    config: SignalConfig
    signals: frozenset[str]
    problematic: bool


@dataclass(frozen=True)
class ToolStep:
    name: str
    arguments: dict[str, Any]
    result: Any
    error: str | None = None  # the tool span ends in error with this message


# --- Building spans -------------------------------------------------------------------------------------


def _any_value(value: Any) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, (list, tuple)):
        return AnyValue(array_value=ArrayValue(values=[_any_value(item) for item in value]))
    return AnyValue(string_value=str(value))


def _attributes(values: dict[str, Any]) -> list[KeyValue]:
    return [KeyValue(key=key, value=_any_value(value)) for key, value in values.items() if value is not None]


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "text", "content": text}


class TraceBuilder:
    """One agent run as OTLP spans: user turns, assistant answers, tool calls, LLM errors."""

    def __init__(self, scenario: Scenario, number: int) -> None:
        self.scenario = scenario
        digest = hashlib.sha256(f"{scenario.name}-{number}".encode()).digest()
        self.trace_id = digest[:16]
        self.root_id = digest[16:24]
        self.number = number
        self.clock = START_NS + number * 3_600_000_000_000
        self.start = self.clock
        self.history: list[dict[str, Any]] = []
        self.spans: list[Span] = []
        self.span_counter = 0
        self.call_counter = 0

    def _span_id(self) -> bytes:
        self.span_counter += 1
        return hashlib.sha256(self.trace_id + self.span_counter.to_bytes(4, "big")).digest()[:8]

    def _add(self, name: str, attributes: dict[str, Any], duration_ms: int, *, error: str | None = None) -> None:
        start = self.clock
        self.clock += duration_ms * 1_000_000
        span = Span(
            trace_id=self.trace_id,
            span_id=self._span_id(),
            parent_span_id=self.root_id,
            name=name,
            kind=Span.SpanKind.SPAN_KIND_INTERNAL if "tool" in name else Span.SpanKind.SPAN_KIND_CLIENT,
            start_time_unix_nano=start,
            end_time_unix_nano=self.clock,
            attributes=_attributes(attributes),
        )
        if error is not None:
            span.status.CopyFrom(Status(code=Status.StatusCode.STATUS_CODE_ERROR, message=error))
        self.spans.append(span)
        self.clock += 5_000_000

    def _chat(
        self,
        output: dict[str, Any] | None,
        *,
        finish: str = "stop",
        output_tokens: int | None = None,
        input_tokens: int | None = None,
        error: str | None = None,
        error_type: str | None = None,
    ) -> None:
        history_text = json.dumps(self.history)
        output_text = json.dumps(output) if output is not None else ""
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "openai",
            "gen_ai.request.model": MODEL,
            "gen_ai.system_instructions": self.scenario.system,
            "gen_ai.input.messages": history_text,
            "gen_ai.output.messages": json.dumps([output]) if output is not None else None,
            "gen_ai.response.finish_reasons": [finish],
            "gen_ai.usage.input_tokens": input_tokens if input_tokens is not None else 400 + len(history_text) // 4,
            "gen_ai.usage.output_tokens": output_tokens if output_tokens is not None else 8 + len(output_text) // 4,
            "error.type": error_type,
        }
        self._add(f"chat {MODEL}", attributes, 700 + len(output_text), error=error)
        if output is not None:
            self.history.append(output)

    def user(self, text: str) -> None:
        self.history.append({"role": "user", "parts": [_text_part(text)]})

    def say(self, text: str, *, finish: str = "stop", output_tokens: int | None = None) -> None:
        message = {"role": "assistant", "parts": [_text_part(text)], "finish_reason": finish}
        self._chat(message, finish=finish, output_tokens=output_tokens)

    def llm_error(self, message: str, error_type: str, *, input_tokens: int | None = None) -> None:
        self._chat(None, error=message, error_type=error_type, input_tokens=input_tokens)

    def call(self, step: ToolStep, *, narration: str | None = None) -> None:
        self.call_counter += 1
        call_id = f"call_{self.number:04d}_{self.call_counter:03d}"
        parts: list[dict[str, Any]] = [_text_part(narration)] if narration else []
        parts.append({"type": "tool_call", "id": call_id, "name": step.name, "arguments": step.arguments})
        self._chat({"role": "assistant", "parts": parts, "finish_reason": "tool_calls"}, finish="tool_calls")
        result = step.result if isinstance(step.result, str) else json.dumps(step.result)
        attributes = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": step.name,
            "gen_ai.tool.call.id": call_id,
            "gen_ai.tool.call.arguments": json.dumps(step.arguments),
            "gen_ai.tool.call.result": result if step.error is None or step.result is not None else None,
            "error.type": "ToolError" if step.error else None,
        }
        self._add(f"execute_tool {step.name}", attributes, 40 + len(result) // 200, error=step.error)
        response = step.result if step.error is None else {"error": step.error}
        self.history.append(
            {"role": "tool", "parts": [{"type": "tool_call_response", "id": call_id, "response": response}]}
        )

    def calls(self, steps: Sequence[ToolStep]) -> None:
        for step in steps:
            self.call(step)

    def request(self, *, termination: dict[str, Any] | None = None, root_error: str | None = None) -> bytes:
        root_attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": self.scenario.agent,
            "gen_ai.conversation.id": f"{self.scenario.name}-session-{self.number}",
            "keel.tool.definitions": json.dumps(self.scenario.tools),
            "keel.output": json.dumps(termination) if termination is not None else None,
        }
        root = Span(
            trace_id=self.trace_id,
            span_id=self.root_id,
            name=f"invoke_agent {self.scenario.agent}",
            kind=Span.SpanKind.SPAN_KIND_SERVER,
            start_time_unix_nano=self.start,
            end_time_unix_nano=self.clock,
            attributes=_attributes(root_attributes),
        )
        if root_error is not None:
            root.status.CopyFrom(Status(code=Status.StatusCode.STATUS_CODE_ERROR, message=root_error))
        request = ExportTraceServiceRequest(
            resource_spans=[
                ResourceSpans(
                    resource=Resource(attributes=_attributes({"service.name": self.scenario.agent})),
                    scope_spans=[
                        ScopeSpans(
                            scope=InstrumentationScope(name="keel.bench", version="1"),
                            spans=[*self.spans, root],
                        )
                    ],
                )
            ]
        )
        body: bytes = request.SerializeToString()
        return body

    def view(self, *, termination: dict[str, Any] | None = None, root_error: str | None = None) -> TrajectoryView:
        body = self.request(termination=termination, root_error=root_error)
        decoded = otlp.decode_request(body, otlp.CONTENT_TYPE_PROTOBUF, None)
        return trajectory_view_build(otlp.map_spans(decoded.spans))


# --- Scenario content -----------------------------------------------------------------------------------


def _tool(name: str, description: str, properties: dict[str, Any], required: Sequence[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": list(required),
                "additionalProperties": False,
            },
        },
    }


STRING = {"type": "string"}
INTEGER = {"type": "integer"}
NUMBER = {"type": "number"}


@dataclass(frozen=True)
class Task:
    """One job a user brings to the agent, with everything the recipes need to tell its story."""

    request: str
    rephrase: str  # the same request in other words, as a user repeats it when misunderstood
    plan: tuple[ToolStep, ...]
    answer: str
    wrong_plan: tuple[ToolStep, ...]
    wrong_answer: str
    correction: str
    drift_answer: str  # an answer about something else
    question: str  # a clarifying question the agent may ask mid-task
    question_reply: str  # the user's answer to it
    followup: str  # a new, related request
    followup_question: str  # the same follow-up as the user may ask it, as a question
    followup_plan: tuple[ToolStep, ...]
    followup_answer: str
    explore: tuple[ToolStep, ...]  # legitimate calls of plan[0]'s tool with different arguments
    cascade_argument: str  # an argument of plan[1] that a cascading error would fill in


@dataclass(frozen=True)
class Escalation:
    request: str
    lookup: ToolStep
    handoff: ToolStep
    announcement: str


@dataclass(frozen=True)
class Scenario:
    name: str
    agent: str
    system: str
    tools: list[dict[str, Any]]
    tasks: tuple[Callable[[random.Random], Task], ...]
    escalation: Callable[[random.Random], Escalation]
    human_first: Callable[[random.Random], Escalation]
    noisy: Callable[[random.Random], tuple[str, ToolStep, str]]
    polling: Callable[[random.Random], tuple[str, tuple[ToolStep, ...], str]]
    unknown_tools: tuple[str, ...]
    config: SignalConfig = field(default_factory=SignalConfig)


def _pick(rng: random.Random, options: Sequence[str]) -> str:
    return options[rng.randrange(len(options))]


def _id(rng: random.Random, prefix: str, digits: int = 6) -> str:
    return f"{prefix}{rng.randrange(10 ** (digits - 1), 10**digits)}"


_FIRST_NAMES = ("Maya", "Jon", "Priya", "Luis", "Ana", "Kenji", "Fatima", "Oskar", "Lea", "Tom")
_LAST_NAMES = ("Okafor", "Lindqvist", "Sharma", "Garcia", "Novak", "Tanaka", "Haddad", "Berg", "Moreau", "Reyes")
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


def _name(rng: random.Random) -> str:
    return f"{_pick(rng, _FIRST_NAMES)} {_pick(rng, _LAST_NAMES)}"


# Ride support -------------------------------------------------------------------------------------------

_PLACES = ("the airport", "Union Station", "Mission Bay", "the convention center", "Oak Street", "Pier 39")
_ITEMS = ("backpack", "phone", "umbrella", "laptop bag", "wallet", "scarf", "headphones")

RIDE_TOOLS = [
    _tool("get_rides", "List the user's recent rides.", {"user_id": STRING, "limit": INTEGER}, ["user_id"]),
    _tool("get_ride", "Details of one ride.", {"ride_id": STRING}, ["ride_id"]),
    _tool(
        "issue_refund",
        "Refund part or all of a ride fare.",
        {"ride_id": STRING, "amount": NUMBER, "reason": STRING},
        ["ride_id", "amount", "reason"],
    ),
    _tool(
        "contact_driver",
        "Send the driver of a ride a message.",
        {"ride_id": STRING, "message": STRING},
        ["ride_id", "message"],
    ),
    _tool("get_refund_status", "Status of a refund.", {"refund_id": STRING}, ["refund_id"]),
    _tool(
        "transfer_to_human",
        "Hand the conversation to a human agent.",
        {"reason": STRING, "priority": {"type": "string", "enum": ["normal", "urgent"]}},
        ["reason"],
    ),
]


def _ride(rng: random.Random, place: str, day: str) -> dict[str, Any]:
    fare = round(rng.uniform(14, 70), 2)
    return {
        "ride_id": _id(rng, "R-"),
        "date": day,
        "pickup": "Home",
        "dropoff": place,
        "fare": fare,
        "driver": _pick(rng, _FIRST_NAMES),
        "status": "completed",
    }


def _ride_refund_task(rng: random.Random) -> Task:
    user_id = _id(rng, "U", 5)
    place, other_place, third = rng.sample(_PLACES, 3)
    ride = _ride(rng, place, "yesterday")
    other = _ride(rng, other_place, "yesterday")
    quote = round(ride["fare"] * rng.uniform(0.55, 0.8), 2)
    difference = round(ride["fare"] - quote, 2)
    refund_id = _id(rng, "RF-")
    rides = {"rides": [ride, other]}
    plan = (
        ToolStep("get_rides", {"user_id": user_id, "limit": 5}, rides),
        ToolStep("get_ride", {"ride_id": ride["ride_id"]}, ride),
        ToolStep(
            "issue_refund",
            {"ride_id": ride["ride_id"], "amount": difference, "reason": "fare_discrepancy"},
            {"refund_id": refund_id, "status": "processed", "amount": difference},
        ),
    )
    wrong_refund = _id(rng, "RF-")
    later = _ride(rng, third, "last week")
    return Task(
        request=_pick(
            rng,
            (
                f"I was charged ${ride['fare']} for my ride to {place} yesterday but the app quoted ${quote}. "
                "Can I get a refund for the difference?",
                f"My ride to {place} yesterday cost ${ride['fare']} even though the quote was ${quote}. "
                "Please refund the difference.",
            ),
        ),
        rephrase=f"Can you refund the difference on my ride to {place} yesterday? Quoted ${quote}, charged "
        f"${ride['fare']}.",
        plan=plan,
        answer=f"I've refunded ${difference} for your ride to {place} yesterday, the difference between the "
        f"${quote} quote and the ${ride['fare']} charge. Refund {refund_id} will reach your card in 3-5 days.",
        wrong_plan=(
            plan[0],
            ToolStep(
                "issue_refund",
                {"ride_id": other["ride_id"], "amount": other["fare"], "reason": "customer_request"},
                {"refund_id": wrong_refund, "status": "processed", "amount": other["fare"]},
            ),
        ),
        wrong_answer=f"Done: I refunded the full ${other['fare']} for your trip to {other_place} yesterday "
        f"(refund {wrong_refund}).",
        correction=_pick(
            rng,
            (
                f"No, I meant the ride to {place}, not the one to {other_place}.",
                f"That's not what I asked. The overcharge was on the ride to {place}.",
            ),
        ),
        drift_answer="Ride Pass members save 15% on every trip and get free cancellations; you can subscribe "
        "from the account menu under Ride Pass whenever you like.",
        question=f"I can see two trips to {place} yesterday, one at 8:10 and one at 18:45. Which one was overcharged?",
        question_reply="The evening one, at 18:45.",
        followup=f"Also, could you check the fare for my ride to {third} last week?",
        followup_question=f"Was my ride to {third} last week charged correctly, or was that one overcharged too?",
        followup_plan=(ToolStep("get_ride", {"ride_id": later["ride_id"]}, later),),
        followup_answer=f"Your ride to {third} last week cost ${later['fare']}, which matches its quote, so "
        "there is nothing to refund there.",
        explore=tuple(
            ToolStep("get_rides", {"user_id": user_id, "limit": limit}, {"rides": [ride, other][: 1 + limit % 2]})
            for limit in (5, 10, 20, 50)
        ),
        cascade_argument="ride_id",
    )


def _ride_lost_item_task(rng: random.Random) -> Task:
    user_id = _id(rng, "U", 5)
    place, other_place, third = rng.sample(_PLACES, 3)
    item = _pick(rng, _ITEMS)
    ride = _ride(rng, place, "this morning")
    other = _ride(rng, other_place, "this morning")
    message_id = _id(rng, "M-")
    plan = (
        ToolStep("get_rides", {"user_id": user_id, "limit": 3}, {"rides": [ride, other]}),
        ToolStep(
            "contact_driver",
            {"ride_id": ride["ride_id"], "message": f"Your rider left a {item} in the car. Please reply."},
            {"message_id": message_id, "delivered": True},
        ),
    )
    return Task(
        request=_pick(
            rng,
            (
                f"I left my {item} in the car after my ride to {place} this morning. Can you help me get it back?",
                f"My {item} is still in the car from this morning's ride to {place}. How do I get it back?",
            ),
        ),
        rephrase=f"I need my {item} back, I left it in the car on the ride to {place} this morning.",
        plan=plan,
        answer=f"I've messaged {ride['driver']}, the driver of your ride to {place} this morning, about the "
        f"{item}. They usually reply within an hour and you can arrange the return in the app.",
        wrong_plan=(
            plan[0],
            ToolStep(
                "contact_driver",
                {"ride_id": other["ride_id"], "message": f"Your rider left a {item} in the car. Please reply."},
                {"message_id": _id(rng, "M-"), "delivered": True},
            ),
        ),
        wrong_answer=f"I've contacted {other['driver']}, who drove you to {other_place} this morning.",
        correction=_pick(
            rng,
            (
                f"No, I meant the ride to {place}, I was never near {other_place} today.",
                f"Wrong one. The {item} was in the car to {place}.",
            ),
        ),
        drift_answer="You can rate your drivers and add a tip for up to 30 days after a trip from the trips "
        "screen, and tips go entirely to the driver.",
        question=f"I can see two rides this morning. Was the {item} in the car to {place} or to {other_place}?",
        question_reply=f"The one to {place}.",
        followup=f"What about my ride to {third} yesterday, can you tell me the fare?",
        followup_question=f"And how much did my ride to {third} yesterday cost?",
        followup_plan=(ToolStep("get_ride", {"ride_id": ride["ride_id"]}, {**ride, "dropoff": third}),),
        followup_answer=f"Your ride to {third} yesterday cost ${ride['fare']}.",
        explore=tuple(
            ToolStep("get_rides", {"user_id": user_id, "limit": limit}, {"rides": [ride, other][: 1 + limit % 2]})
            for limit in (3, 6, 12, 24)
        ),
        cascade_argument="ride_id",
    )


def _ride_escalation(rng: random.Random) -> Escalation:
    place = _pick(rng, _PLACES)
    ride = _ride(rng, place, "on Saturday")
    ride["fare"] = round(rng.uniform(160, 420), 2)
    return Escalation(
        request=f"My ride to {place} on Saturday was charged ${ride['fare']} because the driver took a huge "
        "detour. I'd like the whole fare refunded.",
        lookup=ToolStep("get_ride", {"ride_id": ride["ride_id"]}, ride),
        handoff=ToolStep(
            "transfer_to_human",
            {"reason": f"full refund of ${ride['fare']} above the $100 limit", "priority": "normal"},
            {"ticket_id": _id(rng, "T-"), "queue": "refunds", "status": "queued"},
        ),
        announcement=f"Refunds over $100 need a person to approve them, so I've escalated your ${ride['fare']} "
        "refund to our refunds team. A human agent will contact you within 24 hours.",
    )


def _ride_human_first(rng: random.Random) -> Escalation:
    place = _pick(rng, _PLACES)
    ride = _ride(rng, place, "this morning")
    return Escalation(
        request=_pick(
            rng,
            (
                f"I was in a minor accident during my ride to {place} this morning. I want to talk to a real "
                "person about it.",
                f"There was a crash on my trip to {place} today, nobody is hurt. Please connect me with a human.",
            ),
        ),
        lookup=ToolStep("get_ride", {"ride_id": ride["ride_id"]}, ride),
        handoff=ToolStep(
            "transfer_to_human",
            {"reason": "safety incident during ride", "priority": "urgent"},
            {"ticket_id": _id(rng, "T-"), "queue": "safety", "status": "queued"},
        ),
        announcement="I'm sorry to hear that and glad nobody is hurt. I'm transferring you to our safety team "
        "now; a human agent will join this chat in a few minutes.",
    )


def _ride_noisy(rng: random.Random) -> tuple[str, ToolStep, str]:
    user_id = _id(rng, "U", 5)
    rides = [_ride(rng, _pick(rng, _PLACES), f"2025-12-{day:02d}") for day in range(1, 29)]
    for ride in rides:
        ride.update({"error_margin_minutes": round(rng.uniform(0, 4), 1), "errors": [], "surge_error": None})
    total = round(sum(ride["fare"] for ride in rides), 2)
    return (
        "How much did I spend on rides in December?",
        ToolStep(
            "get_rides",
            {"user_id": user_id, "limit": 50},
            {"rides": rides, "error_rate": 0.0, "warnings": [], "pagination": {"next": None, "errors": 0}},
        ),
        f"You took {len(rides)} rides in December and spent ${total} in total.",
    )


def _ride_polling(rng: random.Random) -> tuple[str, tuple[ToolStep, ...], str]:
    refund_id = _id(rng, "RF-")
    states = (("pending", 0), ("processing", 40), ("processing", 80), ("completed", 100))
    steps = tuple(
        ToolStep("get_refund_status", {"refund_id": refund_id}, {"refund_id": refund_id, "state": state, "progress": p})
        for state, p in states
    )
    return (
        f"Has my refund {refund_id} gone through yet? I'll wait while you check.",
        steps,
        f"Refund {refund_id} has now completed; the money is on its way back to your card.",
    )


RIDE = Scenario(
    name="ride_support",
    agent="ride-support",
    system="You are RideCo's support agent. Refunds above $100 and safety incidents go to a human.",
    tools=RIDE_TOOLS,
    tasks=(_ride_refund_task, _ride_lost_item_task),
    escalation=_ride_escalation,
    human_first=_ride_human_first,
    noisy=_ride_noisy,
    polling=_ride_polling,
    unknown_tools=("refund_ride_instantly", "lookup_driver_phone", "cancel_all_rides"),
)


# Shopping assistant -------------------------------------------------------------------------------------

_COLORS = ("black", "navy", "white", "red", "grey", "green")
_BRANDS = ("Stride", "Northpeak", "Velo", "Kinetic", "Arcline")

SHOP_TOOLS = [
    _tool(
        "search_products",
        "Search the catalogue.",
        {"query": STRING, "max_price": NUMBER, "size": STRING},
        ["query"],
    ),
    _tool("get_product", "Details and stock of one product.", {"product_id": STRING}, ["product_id"]),
    _tool(
        "add_to_cart",
        "Add a product to the cart.",
        {"product_id": STRING, "quantity": INTEGER, "size": STRING},
        ["product_id", "quantity"],
    ),
    _tool("get_order", "An order and its items.", {"order_id": STRING}, ["order_id"]),
    _tool("track_shipment", "Where a parcel is.", {"tracking_id": STRING}, ["tracking_id"]),
    _tool("get_payment_status", "Status of a payment.", {"payment_id": STRING}, ["payment_id"]),
    _tool("create_support_ticket", "Open a ticket for the support team.", {"summary": STRING}, ["summary"]),
]


def _product(rng: random.Random, kind: str, color: str, size: str, price_cap: float) -> dict[str, Any]:
    return {
        "product_id": _id(rng, "P"),
        "name": f"{_pick(rng, _BRANDS)} {kind}",
        "color": color,
        "size": size,
        "price": round(rng.uniform(price_cap * 0.6, price_cap * 0.95), 2),
        "in_stock": True,
    }


def _shop_buy_task(rng: random.Random) -> Task:
    kind = _pick(rng, ("running shoes", "rain jacket", "hiking boots", "wool sweater"))
    color, other_color = rng.sample(_COLORS, 2)
    size = _pick(rng, ("8", "9", "10", "11", "M", "L"))
    cap = float(rng.choice((80, 120, 150, 200)))
    product = _product(rng, kind, color, size, cap)
    other = _product(rng, kind, other_color, size, cap)
    plan = (
        ToolStep(
            "search_products",
            {"query": f"{color} {kind}", "max_price": cap, "size": size},
            {"results": [product, other], "total": 2},
        ),
        ToolStep("get_product", {"product_id": product["product_id"]}, product),
        ToolStep(
            "add_to_cart",
            {"product_id": product["product_id"], "quantity": 1, "size": size},
            {"cart_id": _id(rng, "C"), "items": 1, "subtotal": product["price"]},
        ),
    )
    extra = _product(rng, "socks", color, size, 20.0)
    return Task(
        request=_pick(
            rng,
            (
                f"I'm looking for {color} {kind} in size {size} under ${cap:.0f}.",
                f"Can you find me {color} {kind}, size {size}, for less than ${cap:.0f}?",
            ),
        ),
        rephrase=f"I want {color} {kind}, size {size}, under ${cap:.0f} please.",
        plan=plan,
        answer=f"I found the {product['name']} in {color}, size {size}, for ${product['price']} and added the "
        f"{kind} to your cart.",
        wrong_plan=(
            ToolStep(
                "search_products",
                {"query": f"{other_color} {kind}", "max_price": cap, "size": size},
                {"results": [other], "total": 1},
            ),
            ToolStep(
                "add_to_cart",
                {"product_id": other["product_id"], "quantity": 1, "size": size},
                {"cart_id": _id(rng, "C"), "items": 1, "subtotal": other["price"]},
            ),
        ),
        wrong_answer=f"I added the {other['name']} in {other_color} to your cart for ${other['price']}.",
        correction=_pick(
            rng,
            (
                f"No, I meant {color}, not {other_color}.",
                f"That's wrong, I asked for {color} ones.",
            ),
        ),
        drift_answer="Our loyalty programme gives you points on every purchase, and members get early access to "
        "seasonal sales plus free returns within 60 days.",
        question=f"There are two {color} options in size {size}: a lighter one and a more cushioned one. Which "
        "would you prefer?",
        question_reply="The cushioned one.",
        followup=f"Also, can you find matching {color} socks in size {size}?",
        followup_question=f"Do you have matching {color} socks in size {size} as well?",
        followup_plan=(
            ToolStep("search_products", {"query": f"{color} socks", "size": size}, {"results": [extra], "total": 1}),
        ),
        followup_answer=f"The {extra['name']} in {color}, size {size}, cost ${extra['price']}; I can add them "
        "to your cart as well.",
        explore=tuple(
            ToolStep(
                "search_products",
                {"query": query, "max_price": cap, "size": size},
                {"results": [product] if index % 2 else [], "total": index % 2},
            )
            for index, query in enumerate(
                (f"{color} {kind}", f"{kind} {color}", f"{kind}", f"{color} {kind} sale"), start=1
            )
        ),
        cascade_argument="product_id",
    )


def _shop_tracking_task(rng: random.Random) -> Task:
    order_id = _id(rng, "O-")
    other_order = _id(rng, "O-")
    tracking = _id(rng, "TRK", 8)
    day = _pick(rng, _DAYS)
    city = _pick(rng, ("Reno", "Fresno", "Denver", "Omaha"))
    order = {"order_id": order_id, "status": "shipped", "tracking_id": tracking, "items": 2, "total": 84.5}
    plan = (
        ToolStep("get_order", {"order_id": order_id}, order),
        ToolStep(
            "track_shipment",
            {"tracking_id": tracking},
            {"tracking_id": tracking, "location": city, "eta": day, "status": "in_transit"},
        ),
    )
    return Task(
        request=_pick(
            rng,
            (
                f"Where is my order {order_id}? It was supposed to arrive already.",
                f"My order {order_id} still hasn't arrived. Can you track it?",
            ),
        ),
        rephrase=f"I'm asking where order {order_id} is, it should have arrived already.",
        plan=plan,
        answer=f"Your order {order_id} has shipped and the parcel is in transit in {city}; it should arrive by {day}.",
        wrong_plan=(
            ToolStep(
                "get_order", {"order_id": other_order}, {"order_id": other_order, "status": "delivered", "items": 1}
            ),
        ),
        wrong_answer=f"Order {other_order} was delivered last week.",
        correction=f"I said order {order_id}, not {other_order}.",
        drift_answer="You can change your newsletter preferences from the profile page, and new subscribers get a "
        "welcome discount code.",
        question=f"Order {order_id} was split into two parcels. Would you like me to track both?",
        question_reply="Yes please, both of them.",
        followup=f"What about the return label for order {other_order}?",
        followup_question=f"Has the return label for order {other_order} been sent yet?",
        followup_plan=(
            ToolStep(
                "get_order",
                {"order_id": other_order},
                {"order_id": other_order, "status": "delivered", "return_label": "sent"},
            ),
        ),
        followup_answer=f"The return label for order {other_order} was emailed to you; print it and drop the "
        "parcel at any post office.",
        explore=tuple(
            ToolStep("get_order", {"order_id": _id(rng, "O-")}, {"order_id": None, "found": False}) for _ in range(4)
        ),
        cascade_argument="tracking_id",
    )


def _shop_escalation(rng: random.Random) -> Escalation:
    order_id = _id(rng, "O-")
    total = round(rng.uniform(600, 1800), 2)
    return Escalation(
        request=f"The TV from order {order_id} arrived with a cracked screen. It cost ${total}.",
        lookup=ToolStep(
            "get_order", {"order_id": order_id}, {"order_id": order_id, "status": "delivered", "total": total}
        ),
        handoff=ToolStep(
            "create_support_ticket",
            {"summary": f"Damaged TV, order {order_id}, ${total}; claim above $500 needs review"},
            {"ticket_id": _id(rng, "T-"), "status": "open"},
        ),
        announcement=f"Damage claims above $500 are handled by our claims team, so I've escalated this to them "
        f"with your order {order_id}. A specialist will email you within one business day.",
    )


def _shop_human_first(rng: random.Random) -> Escalation:
    payment_id = _id(rng, "PAY-")
    return Escalation(
        request=_pick(
            rng,
            (
                "I need to speak to a manager about a charge on my card that I don't recognise.",
                "Please get me a real person, there's a charge from your store I never made.",
            ),
        ),
        lookup=ToolStep(
            "get_payment_status", {"payment_id": payment_id}, {"payment_id": payment_id, "state": "settled"}
        ),
        handoff=ToolStep(
            "create_support_ticket",
            {"summary": "Customer disputes an unrecognised card charge"},
            {"ticket_id": _id(rng, "T-"), "status": "open"},
        ),
        announcement="Of course. I've escalated this to our payments team; a member of our team will call you "
        "back today about the charge.",
    )


def _shop_noisy(rng: random.Random) -> tuple[str, ToolStep, str]:
    color = _pick(rng, _COLORS)
    results = [
        {
            **_product(rng, "t-shirt", color, _pick(rng, ("S", "M", "L")), 40.0),
            "reviews": {"count": rng.randrange(0, 900), "error_reports": 0},
            "description": "Organic cotton. No errors in sizing reported. " * 3,
        }
        for _ in range(60)
    ]
    cheapest = min(results, key=lambda item: item["price"])
    return (
        f"What's the cheapest {color} t-shirt you have?",
        ToolStep(
            "search_products",
            {"query": f"{color} t-shirt"},
            {"results": results, "total": len(results), "errors": [], "error": None, "facets_error_rate": 0.0},
        ),
        f"The cheapest {color} t-shirt is the {cheapest['name']} at ${cheapest['price']}.",
    )


def _shop_polling(rng: random.Random) -> tuple[str, tuple[ToolStep, ...], str]:
    payment_id = _id(rng, "PAY-")
    states = (("authorizing", 10), ("authorizing", 50), ("capturing", 90), ("settled", 100))
    steps = tuple(
        ToolStep(
            "get_payment_status", {"payment_id": payment_id}, {"payment_id": payment_id, "state": s, "progress": p}
        )
        for s, p in states
    )
    return (
        f"Did my payment {payment_id} go through? I'll wait.",
        steps,
        f"Payment {payment_id} has settled, so your order is confirmed.",
    )


SHOP = Scenario(
    name="shopping",
    agent="shopping-assistant",
    system="You are a shopping assistant for an outdoor clothing store. Damage claims above $500 go to the "
    "claims team.",
    tools=SHOP_TOOLS,
    tasks=(_shop_buy_task, _shop_tracking_task),
    escalation=_shop_escalation,
    human_first=_shop_human_first,
    noisy=_shop_noisy,
    polling=_shop_polling,
    unknown_tools=("checkout_now", "apply_employee_discount", "get_warehouse_stock"),
)


# Coding agent -------------------------------------------------------------------------------------------

CODE_TOOLS = [
    _tool("read_file", "Read a file of the repository.", {"path": STRING}, ["path"]),
    _tool("write_file", "Write a file of the repository.", {"path": STRING, "content": STRING}, ["path", "content"]),
    _tool("run_tests", "Run the test suite or one test file.", {"path": STRING}, ["path"]),
    _tool(
        "run_command",
        "Run a shell command in the repository.",
        {"command": STRING, "timeout_s": INTEGER},
        ["command"],
    ),
    _tool("get_job_status", "Status of a background CI job.", {"job_id": STRING}, ["job_id"]),
    _tool("request_human_review", "Ask a maintainer to review or approve.", {"summary": STRING}, ["summary"]),
]

_MODULES = ("parser", "billing", "scheduler", "exporter", "auth", "cache")


def _code_fix_task(rng: random.Random) -> Task:
    module, other = rng.sample(_MODULES, 2)
    function = _pick(rng, ("parse_header", "total_due", "next_run", "to_csv", "verify_token", "evict"))
    path = f"src/{module}.py"
    test_path = f"tests/test_{module}.py"
    key = _pick(rng, ("'currency'", "'timezone'", "'delimiter'", "'issuer'"))
    source = f"def {function}(record):\n    value = record[{key}]\n    return value\n"
    fixed = f"def {function}(record):\n    value = record.get({key}, DEFAULT)\n    return value\n"
    plan = (
        ToolStep("read_file", {"path": path}, {"path": path, "content": source, "lines": 3}),
        ToolStep("write_file", {"path": path, "content": fixed}, {"path": path, "bytes_written": len(fixed)}),
        ToolStep("run_tests", {"path": test_path}, {"passed": 14, "failed": 0, "failures": [], "duration_s": 1.8}),
    )
    return Task(
        request=_pick(
            rng,
            (
                f"test_{function} in {test_path} fails with a KeyError {key}. Please fix {function} in {path}.",
                f"Please fix the KeyError {key} that {function} in {path} raises; test_{function} fails.",
            ),
        ),
        rephrase=f"Fix {function} in {path} so the KeyError {key} goes away and test_{function} passes.",
        plan=plan,
        answer=f"I fixed {function} in {path}: it now falls back to a default when the record has no {key} "
        f"key, so the KeyError is gone and the 14 tests in {test_path} pass, including test_{function}.",
        wrong_plan=(
            ToolStep(
                "read_file", {"path": f"src/{other}.py"}, {"path": f"src/{other}.py", "content": "...", "lines": 1}
            ),
            ToolStep(
                "write_file",
                {"path": f"src/{other}.py", "content": "# refactored\n"},
                {"path": f"src/{other}.py", "bytes_written": 13},
            ),
        ),
        wrong_answer=f"I refactored src/{other}.py to simplify its imports.",
        correction=f"That's not what I asked, the failing function is {function} in {path}.",
        drift_answer="I reorganised the README sections and added badges for the licence, the Python versions "
        "and the documentation site, which makes the landing page clearer.",
        question=f"Should {function} raise a clearer error instead of using a default when {key} is missing?",
        question_reply="Use a default.",
        followup=f"Now add a test for the default value in {test_path}.",
        followup_question=f"Could you also add a test for the default value in {test_path}?",
        followup_plan=(
            ToolStep(
                "write_file",
                {"path": test_path, "content": f"def test_{function}_default():\n    ...\n"},
                {"path": test_path, "bytes_written": 40},
            ),
        ),
        followup_answer=f"I added test_{function}_default to {test_path}, covering the default value.",
        explore=tuple(
            ToolStep("read_file", {"path": candidate}, {"path": candidate, "content": "# ...", "lines": 1})
            for candidate in (path, f"src/{module}_utils.py", f"src/{other}.py", "src/__init__.py")
        ),
        cascade_argument="path",
    )


def _code_feature_task(rng: random.Random) -> Task:
    module = _pick(rng, _MODULES)
    path = f"src/{module}_cli.py"
    flag = _pick(rng, ("--verbose", "--dry-run", "--limit", "--output"))
    plan = (
        ToolStep("read_file", {"path": path}, {"path": path, "content": "import argparse\n...", "lines": 40}),
        ToolStep(
            "write_file",
            {"path": path, "content": f"import argparse\n# adds {flag}\n..."},
            {"path": path, "bytes_written": 1200},
        ),
        ToolStep(
            "run_command",
            {"command": f"python -m {module}_cli {flag} --help"},
            {"exit_code": 0, "stdout": f"usage: {module}_cli [{flag}]", "stderr": ""},
        ),
    )
    return Task(
        request=_pick(
            rng,
            (
                f"Add a {flag} option to the {module} command line in {path}.",
                f"Please give the {module} CLI ({path}) a {flag} option.",
            ),
        ),
        rephrase=f"The {module} command line in {path} needs a {flag} option, can you add it?",
        plan=plan,
        answer=f"I added the {flag} option to the {module} command line in {path}; `{module}_cli --help` now "
        f"lists {flag}.",
        wrong_plan=(
            ToolStep("read_file", {"path": "setup.cfg"}, {"path": "setup.cfg", "content": "[metadata]", "lines": 20}),
        ),
        wrong_answer="I bumped the package version in setup.cfg.",
        correction=f"No, I meant the {flag} option in {path}.",
        drift_answer="I updated the changelog and the contributor guide with the release process, including the "
        "tagging steps and the signing key rotation.",
        question=f"Should {flag} be available on every subcommand, or only on the export subcommand?",
        question_reply="Every subcommand.",
        followup=f"Also document {flag} in the README.",
        followup_question=f"Can you document {flag} in the README too?",
        followup_plan=(
            ToolStep("write_file", {"path": "README.md", "content": f"... {flag} ..."}, {"path": "README.md"}),
        ),
        followup_answer=f"The README now documents {flag} with an example.",
        explore=tuple(
            ToolStep("run_command", {"command": command}, {"exit_code": 0, "stdout": "...", "stderr": ""})
            for command in (f"grep -rn argparse src/{module}*", "ls src", f"git log -3 -- {path}", "python --version")
        ),
        cascade_argument="path",
    )


def _code_escalation(rng: random.Random) -> Escalation:
    service = _pick(rng, ("payments-api", "search-indexer", "auth-gateway"))
    return Escalation(
        request=f"Deploy the current main of {service} to production.",
        lookup=ToolStep(
            "run_command",
            {"command": f"git log -1 --oneline origin/main -- {service}"},
            {"exit_code": 0, "stdout": f"{rng.randrange(16**7):07x} Bump {service} dependencies", "stderr": ""},
        ),
        handoff=ToolStep(
            "request_human_review",
            {"summary": f"Production deploy of {service} requested; needs maintainer approval"},
            {"review_id": _id(rng, "REV-"), "status": "requested"},
        ),
        announcement=f"Production deploys need a maintainer's approval, so I've requested a review for the "
        f"{service} deploy; a human reviewer will approve it or get back to you.",
    )


def _code_human_first(rng: random.Random) -> Escalation:
    service = _pick(rng, ("payments-api", "search-indexer", "auth-gateway"))
    return Escalation(
        request=f"{service} is down in production. Get me a human on the platform team, now.",
        lookup=ToolStep(
            "run_command",
            {"command": f"kubectl get pods -l app={service}"},
            {"exit_code": 0, "stdout": f"{service}-7d9f 0/1 CrashLoopBackOff", "stderr": ""},
        ),
        handoff=ToolStep(
            "request_human_review",
            {"summary": f"{service} outage, user asks for the platform on-call"},
            {"review_id": _id(rng, "REV-"), "status": "paged"},
        ),
        announcement=f"I've paged the platform team's on-call engineer about {service}; a human agent from the "
        "team will join shortly.",
    )


def _code_noisy(rng: random.Random) -> tuple[str, ToolStep, str]:
    lines = []
    for number in range(400):
        level = "INFO" if number % 7 else "DEBUG"
        lines.append(f"2026-01-0{1 + number % 9} 10:{number % 60:02d} {level} worker-{number % 4} batch {number} ok")
    lines.insert(120, "2026-01-03 10:21 INFO lint: no errors found (0 errors, 2 warnings)")
    lines.insert(300, "2026-01-07 10:44 INFO metrics error_rate=0.01 p99=180ms")
    lines.append("Build finished: 0 errors, 3 warnings")
    return (
        "Did last night's build log show any problems?",
        ToolStep(
            "run_command",
            {"command": "cat logs/nightly-build.log"},
            {"exit_code": 0, "stdout": "\n".join(lines), "stderr": ""},
        ),
        "Last night's build finished cleanly: the log shows 0 errors and 3 warnings, and the error rate metric "
        "stayed at 0.01.",
    )


def _code_polling(rng: random.Random) -> tuple[str, tuple[ToolStep, ...], str]:
    job_id = _id(rng, "JOB-")
    states = (("queued", 0), ("running", 35), ("running", 70), ("succeeded", 100))
    steps = tuple(
        ToolStep("get_job_status", {"job_id": job_id}, {"job_id": job_id, "state": s, "progress": p}) for s, p in states
    )
    return (
        f"Wait for CI job {job_id} to finish and tell me the result.",
        steps,
        f"CI job {job_id} succeeded; every check passed.",
    )


CODE = Scenario(
    name="coding",
    agent="coding-agent",
    system="You are a coding agent working in the user's repository. Production deploys need a maintainer.",
    tools=CODE_TOOLS,
    tasks=(_code_fix_task, _code_feature_task),
    escalation=_code_escalation,
    human_first=_code_human_first,
    noisy=_code_noisy,
    polling=_code_polling,
    unknown_tools=("git_push_force", "open_pull_request", "run_linter"),
)


# Travel booking -----------------------------------------------------------------------------------------

_CITIES = ("Lisbon", "Chicago", "Tokyo", "Nairobi", "Toronto", "Madrid", "Seoul", "Denver")

TRAVEL_TOOLS = [
    _tool(
        "search_flights",
        "Search flights.",
        {"origin": STRING, "destination": STRING, "date": STRING, "cabin": STRING},
        ["origin", "destination", "date"],
    ),
    _tool(
        "book_flight",
        "Book a flight for a passenger.",
        {"flight_id": STRING, "passenger_name": STRING, "seat": STRING},
        ["flight_id", "passenger_name"],
    ),
    _tool(
        "search_hotels",
        "Search hotels.",
        {"city": STRING, "check_in": STRING, "nights": INTEGER, "max_price": NUMBER},
        ["city", "check_in", "nights"],
    ),
    _tool(
        "book_hotel",
        "Book a hotel room.",
        {"hotel_id": STRING, "check_in": STRING, "nights": INTEGER},
        ["hotel_id", "check_in", "nights"],
    ),
    _tool("get_booking_status", "Status of a booking.", {"booking_id": STRING}, ["booking_id"]),
    _tool("transfer_to_human", "Hand over to a human travel agent.", {"reason": STRING}, ["reason"]),
]


def _date(rng: random.Random) -> str:
    return f"2026-{rng.randrange(2, 12):02d}-{rng.randrange(1, 28):02d}"


def _travel_flight_task(rng: random.Random) -> Task:
    origin, destination, other = rng.sample(_CITIES, 3)
    date = _date(rng)
    passenger = _name(rng)
    flight: dict[str, Any] = {
        "flight_id": _id(rng, "FL"),
        "departure": f"{date}T0{rng.randrange(6, 10)}:15",
        "price": rng.randrange(180, 900),
        "stops": 0,
    }
    booking_id = _id(rng, "BK")
    plan = (
        ToolStep(
            "search_flights",
            {"origin": origin, "destination": destination, "date": date, "cabin": "economy"},
            {"flights": [flight], "count": 1},
        ),
        ToolStep(
            "book_flight",
            {"flight_id": flight["flight_id"], "passenger_name": passenger},
            {"booking_id": booking_id, "status": "confirmed", "seat": "14C"},
        ),
    )
    wrong = {**flight, "flight_id": _id(rng, "FL")}
    return Task(
        request=_pick(
            rng,
            (
                f"Book me a flight from {origin} to {destination} on {date}, economy, for {passenger}.",
                f"I need an economy flight {origin} to {destination} on {date} for {passenger}.",
            ),
        ),
        rephrase=f"Please book the economy flight from {origin} to {destination} on {date} for {passenger}.",
        plan=plan,
        answer=f"Your economy flight from {origin} to {destination} on {date} is booked for {passenger}: "
        f"booking {booking_id}, departing {flight['departure'][-5:]}, seat 14C, ${flight['price']}.",
        wrong_plan=(
            ToolStep(
                "search_flights",
                {"origin": origin, "destination": other, "date": date, "cabin": "economy"},
                {"flights": [wrong], "count": 1},
            ),
        ),
        wrong_answer=f"I found a flight from {origin} to {other} on {date} for ${wrong['price']}.",
        correction=f"No, I meant {destination}, not {other}.",
        drift_answer="Travel insurance covers cancellations, lost luggage and medical costs abroad; the premium "
        "plan also includes rental-car cover and costs about 6% of the trip.",
        question=f"There's a nonstop at {flight['departure'][-5:]} and a cheaper one-stop in the afternoon. "
        "Which do you prefer?",
        question_reply="The nonstop.",
        followup=f"Next, find me a hotel in {destination} for three nights from {date}.",
        followup_question=f"Could you also find me a hotel in {destination} for three nights from {date}?",
        followup_plan=(
            ToolStep(
                "search_hotels",
                {"city": destination, "check_in": date, "nights": 3},
                {"hotels": [{"hotel_id": _id(rng, "H"), "name": "Harbor Inn", "price": 140}]},
            ),
        ),
        followup_answer=f"The Harbor Inn in {destination} has a room for three nights from {date} at $140 a night.",
        explore=tuple(
            ToolStep(
                "search_flights",
                {"origin": origin, "destination": destination, "date": day, "cabin": "economy"},
                {"flights": [], "count": 0} if index < 3 else {"flights": [flight], "count": 1},
            )
            for index, day in enumerate((_date(rng), _date(rng), _date(rng), date))
        ),
        cascade_argument="flight_id",
    )


def _travel_hotel_task(rng: random.Random) -> Task:
    city, other = rng.sample(_CITIES, 2)
    date = _date(rng)
    nights = rng.randrange(2, 6)
    cap = rng.choice((150, 200, 250))
    hotel = {
        "hotel_id": _id(rng, "H"),
        "name": f"{_pick(rng, ('Park', 'Grand', 'Riverside'))} Hotel",
        "price": cap - 20,
    }
    plan = (
        ToolStep(
            "search_hotels",
            {"city": city, "check_in": date, "nights": nights, "max_price": cap},
            {"hotels": [hotel], "count": 1},
        ),
        ToolStep(
            "book_hotel",
            {"hotel_id": hotel["hotel_id"], "check_in": date, "nights": nights},
            {"booking_id": _id(rng, "BK"), "status": "confirmed"},
        ),
    )
    return Task(
        request=_pick(
            rng,
            (
                f"I need a hotel in {city} for {nights} nights from {date}, under ${cap} a night.",
                f"Find and book a hotel in {city} from {date} for {nights} nights, max ${cap} per night.",
            ),
        ),
        rephrase=f"Book a hotel in {city}, {nights} nights from {date}, no more than ${cap} a night.",
        plan=plan,
        answer=f"I booked the {hotel['name']} in {city} for {nights} nights from {date} at ${hotel['price']} a night.",
        wrong_plan=(
            ToolStep(
                "search_hotels",
                {"city": other, "check_in": date, "nights": nights},
                {"hotels": [{**hotel, "hotel_id": _id(rng, "H")}], "count": 1},
            ),
        ),
        wrong_answer=f"The {hotel['name']} in {other} has rooms from ${hotel['price']}.",
        correction=f"Wrong one. I asked for {city}.",
        drift_answer="Our frequent traveller programme earns miles on partner airlines, and gold members get "
        "lounge access and priority boarding.",
        question=f"Breakfast at the {hotel['name']} adds $18 a night. Do you want it included?",
        question_reply="No breakfast.",
        followup=f"What about a rental car in {city} for the same dates?",
        followup_question=f"Is there a rental car I could get in {city} for the same dates?",
        followup_plan=(
            ToolStep(
                "search_hotels",
                {"city": city, "check_in": date, "nights": nights},
                {"hotels": [hotel], "count": 1, "cars": []},
            ),
        ),
        followup_answer=f"I can't book rental cars in {city}, but the {hotel['name']} has a car desk in the lobby.",
        explore=tuple(
            ToolStep(
                "search_hotels",
                {"city": city, "check_in": date, "nights": nights, "max_price": price},
                {"hotels": [hotel] if price >= cap else [], "count": int(price >= cap)},
            )
            for price in (cap - 60, cap - 40, cap - 20, cap)
        ),
        cascade_argument="hotel_id",
    )


def _travel_escalation(rng: random.Random) -> Escalation:
    destination = _pick(rng, _CITIES)
    size = rng.randrange(12, 30)
    return Escalation(
        request=f"Book flights to {destination} for our team of {size} people next month.",
        lookup=ToolStep(
            "search_flights",
            {"origin": "Boston", "destination": destination, "date": _date(rng)},
            {"flights": [{"flight_id": _id(rng, "FL"), "seats_left": size + 3}], "count": 1},
        ),
        handoff=ToolStep(
            "transfer_to_human",
            {"reason": f"group booking for {size} travellers"},
            {"ticket_id": _id(rng, "T-"), "status": "queued"},
        ),
        announcement=f"Group bookings of more than nine travellers are handled by our group desk, so I'm "
        f"connecting you with a human agent there who will hold {size} seats for you.",
    )


def _travel_human_first(rng: random.Random) -> Escalation:
    booking = _id(rng, "BK")
    return Escalation(
        request=_pick(
            rng,
            (
                f"Please connect me to a human agent about booking {booking}, it's a visa issue.",
                f"I want to speak to a person about my booking {booking}.",
            ),
        ),
        lookup=ToolStep("get_booking_status", {"booking_id": booking}, {"booking_id": booking, "state": "confirmed"}),
        handoff=ToolStep(
            "transfer_to_human",
            {"reason": f"customer asked for a person about {booking}"},
            {"ticket_id": _id(rng, "T-"), "status": "queued"},
        ),
        announcement=f"Sure, I'm transferring you to a travel specialist now with booking {booking} attached.",
    )


def _travel_noisy(rng: random.Random) -> tuple[str, ToolStep, str]:
    origin, destination = rng.sample(_CITIES, 2)
    date = _date(rng)
    flights: list[dict[str, Any]] = [
        {
            "flight_id": _id(rng, "FL"),
            "price": rng.randrange(200, 1400),
            "stops": rng.randrange(0, 3),
            "fare_rules": {"change_fee": 75, "errors": [], "refundable": False},
            "on_time_error_margin": round(rng.uniform(0, 0.2), 2),
        }
        for _ in range(80)
    ]
    cheapest = min(flights, key=lambda item: item["price"])
    return (
        f"What's the cheapest flight from {origin} to {destination} on {date}?",
        ToolStep(
            "search_flights",
            {"origin": origin, "destination": destination, "date": date},
            {"flights": flights, "count": len(flights), "error": None, "partial_errors": []},
        ),
        f"The cheapest flight from {origin} to {destination} on {date} is {cheapest['flight_id']} at "
        f"${cheapest['price']} with {cheapest['stops']} stops.",
    )


def _travel_polling(rng: random.Random) -> tuple[str, tuple[ToolStep, ...], str]:
    booking = _id(rng, "BK")
    states = (("pending", 0), ("pending", 30), ("ticketing", 75), ("confirmed", 100))
    steps = tuple(
        ToolStep("get_booking_status", {"booking_id": booking}, {"booking_id": booking, "state": s, "progress": p})
        for s, p in states
    )
    return (
        f"Is booking {booking} confirmed yet? I can wait.",
        steps,
        f"Booking {booking} is now confirmed and ticketed.",
    )


TRAVEL = Scenario(
    name="travel",
    agent="travel-agent",
    system="You book flights and hotels. Group bookings over nine travellers go to the group desk.",
    tools=TRAVEL_TOOLS,
    tasks=(_travel_flight_task, _travel_hotel_task),
    escalation=_travel_escalation,
    human_first=_travel_human_first,
    noisy=_travel_noisy,
    polling=_travel_polling,
    unknown_tools=("upgrade_seat", "get_visa_requirements", "book_train"),
)


# Data analysis ------------------------------------------------------------------------------------------

DATA_TOOLS = [
    _tool("list_tables", "List the warehouse tables.", {}, []),
    _tool("describe_table", "Columns of a table.", {"table": STRING}, ["table"]),
    _tool("run_sql", "Run a read-only SQL query.", {"query": STRING, "limit": INTEGER}, ["query"]),
    _tool(
        "create_chart",
        "Draw a chart from a query.",
        {"kind": {"type": "string", "enum": ["bar", "line", "pie"]}, "query": STRING, "title": STRING},
        ["kind", "query"],
    ),
    _tool("get_query_status", "Status of a long-running query.", {"query_id": STRING}, ["query_id"]),
    _tool("request_human_review", "Ask the data governance team.", {"summary": STRING}, ["summary"]),
]

_REGIONS = ("North", "South", "East", "West")


def _sql(*parts: object) -> str:
    """Query text as an agent would write it (the bench never runs it)."""
    return " ".join(str(part) for part in parts)


def _data_sales_task(rng: random.Random) -> Task:
    year, other_year = rng.sample((2022, 2023, 2024, 2025), 2)
    metric = _pick(rng, ("sales", "revenue"))
    totals = {region: rng.randrange(200_000, 900_000) for region in _REGIONS}
    top = max(totals, key=lambda region: totals[region])
    query = _sql("SELECT region, SUM(amount) FROM orders WHERE year =", year, "GROUP BY region")
    rows = [[region, value] for region, value in totals.items()]
    plan = (
        ToolStep(
            "describe_table",
            {"table": "orders"},
            {"table": "orders", "columns": ["order_id", "region", "amount", "year"]},
        ),
        ToolStep("run_sql", {"query": query}, {"columns": ["region", "sum"], "rows": rows, "row_count": 4}),
    )
    listing = ", ".join(f"{region} ${value:,}" for region, value in totals.items())
    other_query = query.replace(str(year), str(other_year))
    return Task(
        request=_pick(
            rng,
            (
                f"What were total {metric} by region for {year}?",
                f"Show me {metric} by region for {year}.",
            ),
        ),
        rephrase=f"I want the total {metric} for each region in {year}.",
        plan=plan,
        answer=f"Total {metric} by region for {year}: {listing}. {top} had the highest {metric}.",
        wrong_plan=(
            ToolStep("run_sql", {"query": other_query}, {"columns": ["region", "sum"], "rows": rows, "row_count": 4}),
        ),
        wrong_answer=f"Here are the {other_year} figures by region: {listing}.",
        correction=f"No, I meant {year}, not {other_year}.",
        drift_answer="The customers table has 48 columns; the most complete are signup_date, country and plan, "
        "while referral_source is empty for about a third of the rows.",
        question=f"Should {metric} include refunded orders, or only completed ones?",
        question_reply="Only completed ones.",
        followup=f"Now show me {metric} by region for {other_year}.",
        followup_question=f"What were {metric} by region in {other_year}?",
        followup_plan=(
            ToolStep("run_sql", {"query": other_query}, {"columns": ["region", "sum"], "rows": rows, "row_count": 4}),
        ),
        followup_answer=f"{metric.capitalize()} by region for {other_year}: {listing}.",
        explore=tuple(
            ToolStep(
                "run_sql", {"query": variant}, {"columns": ["region", "sum"], "rows": rows[:index], "row_count": index}
            )
            for index, variant in enumerate(
                (
                    query,
                    query + " ORDER BY 2 DESC",
                    query.replace("SUM(amount)", "SUM(amount - discount)"),
                    query.replace("orders", "orders_completed"),
                ),
                start=1,
            )
        ),
        cascade_argument="query",
    )


def _data_signup_task(rng: random.Random) -> Task:
    year = rng.choice((2023, 2024, 2025))
    counts = [rng.randrange(300, 1500) for _ in range(12)]
    peak = max(range(12), key=lambda month: counts[month]) + 1
    query = _sql("SELECT month, COUNT(*) FROM customers WHERE signup_year =", year, "GROUP BY month")
    plan = (
        ToolStep("list_tables", {}, {"tables": ["customers", "orders", "events"]}),
        ToolStep(
            "run_sql",
            {"query": query},
            {"columns": ["month", "count"], "rows": [[m + 1, c] for m, c in enumerate(counts)], "row_count": 12},
        ),
        ToolStep(
            "create_chart",
            {"kind": "bar", "query": query, "title": f"New customers per month, {year}"},
            {"chart_id": _id(rng, "CH"), "url": "https://charts.example/1"},
        ),
    )
    return Task(
        request=_pick(
            rng,
            (
                f"How many new customers signed up each month in {year}? A bar chart would be great.",
                f"Chart the monthly customer signups for {year}.",
            ),
        ),
        rephrase=f"I'd like the number of customer signups per month in {year}, as a chart.",
        plan=plan,
        answer=f"Customer signups in {year} ranged from {min(counts)} to {max(counts)} a month, peaking in month "
        f"{peak}; the bar chart of new customers per month is ready.",
        wrong_plan=(
            ToolStep(
                "run_sql",
                {"query": _sql("SELECT COUNT(*) FROM customers WHERE signup_year =", year)},
                {"columns": ["count"], "rows": [[sum(counts)]], "row_count": 1},
            ),
        ),
        wrong_answer=f"{sum(counts)} customers signed up in {year}.",
        correction="That's not what I asked, I want it per month.",
        drift_answer="The events table is partitioned by day and keeps 400 days of history; queries on it are "
        "cheapest when they filter on event_date first.",
        question="Should trial accounts count as new customers?",
        question_reply="No, paying customers only.",
        followup=f"Also break down the {year} signups by plan.",
        followup_question=f"How do the {year} signups break down by plan?",
        followup_plan=(
            ToolStep(
                "run_sql",
                {"query": query.replace("month", "plan")},
                {"columns": ["plan", "count"], "rows": [["pro", 4000], ["basic", 6000]], "row_count": 2},
            ),
        ),
        followup_answer=f"Of the {year} signups, 4,000 chose the pro plan and 6,000 the basic plan.",
        explore=tuple(
            ToolStep("run_sql", {"query": variant}, {"columns": ["month", "count"], "rows": [], "row_count": 0})
            for variant in (
                query,
                query.replace("customers", "accounts"),
                query.replace("signup_year", "created_year"),
                query + " ORDER BY month",
            )
        ),
        cascade_argument="query",
    )


def _data_escalation(rng: random.Random) -> Escalation:
    return Escalation(
        request="Pull the email addresses and phone numbers of every customer who churned last quarter.",
        lookup=ToolStep(
            "describe_table",
            {"table": "customers_pii"},
            {"table": "customers_pii", "columns": ["customer_id", "email", "phone"], "restricted": True},
        ),
        handoff=ToolStep(
            "request_human_review",
            {"summary": "Export of churned customers' contact details from customers_pii"},
            {"review_id": _id(rng, "REV-"), "status": "requested"},
        ),
        announcement="customers_pii is a restricted table, so I've escalated your request to the data governance "
        "team; a member of our team will approve the export or follow up with you.",
    )


def _data_human_first(rng: random.Random) -> Escalation:
    return Escalation(
        request=_pick(
            rng,
            (
                "Can I talk to a person from the data team about access to the finance tables?",
                "I need a human to grant me access to the finance schema.",
            ),
        ),
        lookup=ToolStep("list_tables", {}, {"tables": ["finance.ledger", "orders"], "restricted": ["finance.ledger"]}),
        handoff=ToolStep(
            "request_human_review",
            {"summary": "Access request for the finance tables"},
            {"review_id": _id(rng, "REV-"), "status": "requested"},
        ),
        announcement="I've escalated this to the data team; a member of our team will review your access to the "
        "finance tables and reply today.",
    )


def _data_noisy(rng: random.Random) -> tuple[str, ToolStep, str]:
    rows: list[list[Any]] = [
        [f"2025-{month:02d}", round(rng.uniform(0.001, 0.03), 4), rng.randrange(0, 3), "no errors"]
        for month in range(1, 13)
        for _ in range(20)
    ]
    worst = max(rows, key=lambda row: row[1])
    return (
        "Which month had the worst checkout error rate last year?",
        ToolStep(
            "run_sql",
            {"query": "SELECT month, error_rate, error_count, note FROM checkout_health WHERE year = 2025"},
            {"columns": ["month", "error_rate", "error_count", "note"], "rows": rows, "row_count": len(rows)},
        ),
        f"The worst checkout error rate last year was {worst[1]:.2%}, in {worst[0]}.",
    )


def _data_polling(rng: random.Random) -> tuple[str, tuple[ToolStep, ...], str]:
    query_id = _id(rng, "Q-")
    states = (("queued", 0), ("running", 25), ("running", 60), ("finished", 100))
    steps = tuple(
        ToolStep("get_query_status", {"query_id": query_id}, {"query_id": query_id, "state": s, "progress": p})
        for s, p in states
    )
    return (
        f"Let me know when query {query_id} finishes.",
        steps,
        f"Query {query_id} has finished; its results are ready in the results tab.",
    )


DATA = Scenario(
    name="data_analysis",
    agent="data-analyst",
    system="You answer questions with SQL over the company warehouse. Restricted tables need governance review.",
    tools=DATA_TOOLS,
    tasks=(_data_sales_task, _data_signup_task),
    escalation=_data_escalation,
    human_first=_data_human_first,
    noisy=_data_noisy,
    polling=_data_polling,
    unknown_tools=("export_to_excel", "send_report_email", "drop_table"),
)

SCENARIOS: tuple[Scenario, ...] = (RIDE, SHOP, CODE, TRAVEL, DATA)


# --- Wording shared by the recipes ----------------------------------------------------------------------

_THANKS = (
    "Thanks, that's all I needed.",
    "Perfect, thank you!",
    "Great, thanks a lot.",
    "That works, thank you.",
    "Thank you so much.",
)
_CLOSINGS = (
    "Is there anything else I can help you with?",
    "Let me know if you need anything else.",
    "Anything else I can do for you today?",
)
# Ways people say things that no phrase list was written for: they keep the measured recall honest.
_SOFT_CORRECTIONS = (
    "Hmm, not quite.",
    "Wait, that's a different one.",
    "Nope, the other one.",
    "That isn't the one I mean.",
    "Hold on, you picked the wrong thing.",
)
_SOFT_THANKS = ("Brilliant.", "Nice one!", "Lovely, that sorts it.", "Super, that's it.")
_SOFT_QUITS = ("Ugh, whatever.", "OK this is going nowhere, bye.", "Nevermind, I'll sort it out another way.")
_SOFT_HUMAN_REQUESTS = ("Is there a phone number I can call instead?", "Can someone from your team call me?")
_NARRATION = (
    "Let me look that up.",
    "I'll check that for you.",
    "One moment while I check.",
    None,
    None,
)


def _error_result(rng: random.Random, tool: str, detail: str) -> tuple[Any, str | None]:
    """A failed call in one of the shapes tools use: (result, span error message)."""
    shape = rng.randrange(9)
    if shape == 0:
        return {"status": "error", "message": detail}, None
    if shape == 1:
        return {"ok": False, "error": {"code": "E_INVALID", "message": detail}}, None
    if shape == 2:
        return {"success": False, "reason": detail}, None
    if shape == 3:
        return {"errors": [{"message": detail, "field": None}]}, None
    if shape == 4:
        return {"status_code": rng.choice((400, 404, 409, 500, 502)), "body": detail}, None
    if shape == 5:
        return {
            "exit_code": 1,
            "stdout": "",
            "stderr": f"Traceback (most recent call last):\n  ...\nValueError: {detail}",
        }, None
    if shape == 6:
        return f'Traceback (most recent call last):\n  File "{tool}.py", line 42\nRuntimeError: {detail}', None
    if shape == 7:
        return f"Error: {detail}", None
    return None, f"{tool} raised: {detail}"


_ERROR_DETAILS = (
    "upstream service rejected the request",
    "record is locked by another process",
    "invalid state transition",
    "backend returned an unexpected response",
    "validation failed for the request body",
)


def _failed(rng: random.Random, step: ToolStep) -> ToolStep:
    result, error = _error_result(rng, step.name, _pick(rng, _ERROR_DETAILS))
    return replace(step, result=result, error=error)


# --- Recipes --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    view: TrajectoryView
    signals: frozenset[str]
    problematic: bool
    config: SignalConfig | None = None


Recipe = Callable[[Scenario, random.Random, int], Outcome]


def _thanks(rng: random.Random) -> str:
    return _pick(rng, _THANKS) if rng.random() < 0.75 else _pick(rng, _SOFT_THANKS)


def _narrate(rng: random.Random) -> str | None:
    return _NARRATION[rng.randrange(len(_NARRATION))]


def _run_plan(trace: TraceBuilder, rng: random.Random, plan: Sequence[ToolStep]) -> None:
    for position, step in enumerate(plan):
        trace.call(step, narration=_narrate(rng) if position == 0 else None)


def _task(scenario: Scenario, rng: random.Random) -> Task:
    return scenario.tasks[rng.randrange(len(scenario.tasks))](rng)


def _labels(*names: str) -> frozenset[str]:
    unknown = set(names) - set(SIGNAL_NAMES)
    if unknown:
        raise ValueError(f"not signals: {sorted(unknown)}")
    return frozenset(names)


def recipe_success(scenario: Scenario, rng: random.Random, number: int) -> Outcome:
    task = _task(scenario, rng)
    trace = TraceBuilder(scenario, number)
    trace.user(task.request)
    _run_plan(trace, rng, task.plan)
    thanks = rng.random() < 0.5
    trace.say(task.answer + (" " + _pick(rng, _CLOSINGS) if rng.random() < 0.5 else ""))
    if thanks:
        trace.user(_thanks(rng))
        trace.say("You're welcome, have a good day.")
    return Outcome(trace.view(), _labels("satisfaction") if thanks else _labels(), False)


def recipe_clarified_success(scenario: Scenario, rng: random.Random, number: int) -> Outcome:
    """The agent asks a question, the polite user answers, the task is done: nothing to fix."""
    task = _task(scenario, rng)
    trace = TraceBuilder(scenario, number)
    trace.user(task.request)
    trace.call(task.plan[0], narration=_narrate(rng))
    trace.say(task.question)
    trace.user(task.question_reply)
    _run_plan(trace, rng, task.plan[1:])
    trace.say(task.answer)
    trace.user(_pick(rng, ("No, that's all, thank you.", "No thanks, that's everything.", "Thank you!")))
    trace.say("Glad I could help.")
    return Outcome(trace.view(), _labels("satisfaction"), False)


def recipe_long_success(scenario: Scenario, rng: random.Random, number: int) -> Outcome:
    trace = TraceBuilder(scenario, number)
    thanked = False
    asked: set[frozenset[str]] = set()
    for position in range(rng.randrange(4, 7)):
        task = _task(scenario, rng)
        as_follow_up = position > 0 and rng.random() < 0.4
        request = task.followup if as_follow_up else task.request
        # The same question twice would be a rephrase, which this recipe does not tell.
        words = frozenset(request.lower().rstrip("?.").split()) - {"now", "also", "next,", "what", "about"}
        if words in asked:
            continue
        asked.add(words)
        trace.user(request)
        _run_plan(trace, rng, task.followup_plan if as_follow_up else task.plan)
        trace.say(task.followup_answer if as_follow_up else task.answer)
        if rng.random() < 0.3:
            trace.user(_pick(rng, ("Great, thanks.", "Thank you, that helps.", "Perfect.")))
            trace.say("You're welcome.")
            thanked = True
    if rng.random() < 0.5:
        trace.user(_thanks(rng))
        trace.say(_pick(rng, ("Happy to help!", "You're welcome, have a great day.")))
        thanked = True
    return Outcome(trace.view(), _labels("satisfaction") if thanked else _labels(), False)


def recipe_follow_up_requests(scenario: Scenario, rng: random.Random, number: int) -> Outcome:
    """A related but new request right after the first one (hard negative for rephrase detection)."""
    task = _task(scenario, rng)
    trace = TraceBuilder(scenario, number)
    trace.user(task.request)
    _run_plan(trace, rng, task.plan)
    trace.say(task.answer)
    trace.user(task.followup)
    _run_plan(trace, rng, task.followup_plan)
    trace.say(task.followup_answer)
    return Outcome(trace.view(), _labels(), False)


def recipe_noisy_output(scenario: Scenario, rng: random.Random, number: int) -> Outcome:
    request, step, answer = scenario.noisy(rng)
    trace = TraceBuilder(scenario, number)
    trace.user(request)
    trace.call(step, narration=_narrate(rng))
    trace.say(answer)
    thanks = rng.random() < 0.4
    if thanks:
        trace.user(_thanks(rng))
        trace.say("Anytime.")
    return Outcome(trace.view(), _labels("satisfaction") if thanks else _labels(), False)


def recipe_polling(scenario: Scenario, rng: random.Random, number: int) -> Outcome:
    request, steps, answer = scenario.polling(rng)
    trace = TraceBuilder(scenario, number)
    trace.user(request)
    trace.calls(steps)
    trace.say(answer)
    return Outcome(trace.view(), _labels(), False)


def recipe_exploration(scenario: Scenario, rng: random.Random, number: int) -> Outcome:
    """The same tool with different arguments each time, converging on the answer: not a loop."""
    task = _task(scenario, rng)
    trace = TraceBuilder(scenario, number)
    trace.user(task.request)
    trace.calls(task.explore)
    _run_plan(trace, rng, task.plan[1:])
    trace.say(task.answer)
    return Outcome(trace.view(), _labels(), False)


def recipe_agent_escalation(scenario: Scenario, rng: random.Random, number: int) -> Outcome:
    """Policy says a person must handle it; the agent hands over correctly."""
    escalation = scenario.escalation(rng)
    trace = TraceBuilder(scenario, number)
    trace.user(escalation.request)
    trace.call(escalation.lookup, narration=_narrate(rng))
    trace.call(escalation.handoff)
    trace.say(escalation.announcement)
    thanks = rng.random() < 0.5
    if thanks:
        trace.user(_pick(rng, ("Okay, thank you.", "Thanks for the help.", "Great, thanks.")))
        trace.say("You're welcome.")
    return Outcome(trace.view(), _labels("satisfaction") if thanks else _labels(), False)


def recipe_user_asks_human(scenario: Scenario, rng: random.Random, number: int) -> Outcome:
    """The user asks for a person up front and gets one: disengagement, but nothing for a reviewer."""
    escalation = scenario.human_first(rng)
    trace = TraceBuilder(scenario, number)
    trace.user(escalation.request)
    trace.call(escalation.lookup)
    trace.call(escalation.handoff)
    trace.say(escalation.announcement)
    return Outcome(trace.view(), _labels("disengagement"), False)


def recipe_correction(scenario: Scenario, rng: random.Random, number: int) -> Outcome:
    task = _task(scenario, rng)
    trace = TraceBuilder(scenario, number)
    trace.user(task.request)
    _run_plan(trace, rng, task.wrong_plan)
    trace.say(task.wrong_answer)
    trace.user(task.correction if rng.random() < 0.7 else _pick(rng, _SOFT_CORRECTIONS))
    _run_plan(trace, rng, task.plan)
    trace.say(task.answer)
    thanks = rng.random() < 0.4
    if thanks:
        trace.user(_thanks(rng))
        trace.say("Sorry for the mix-up, and you're welcome.")
    return Outcome(trace.view(), _labels("misalignment", *(["satisfaction"] if thanks else [])), True)


def recipe_rephrase(scenario: Scenario, rng: random.Random, number: int) -> Outcome:
    task = _task(scenario, rng)
    trace = TraceBuilder(scenario, number)
    trace.user(task.request)
    _run_plan(trace, rng, task.wrong_plan)
    trace.say(task.wrong_answer)
    marker = _pick(rng, ("", "", "Let me rephrase: ", "To be clear, "))
    trace.user(marker + task.rephrase)
    _run_plan(trace, rng, task.plan)
    trace.say(task.answer)
    return Outcome(trace.view(), _labels("misalignment"), True)


_STALL_ANSWERS = (
    "I'm still looking into this for you and will update you as soon as I have more information.",
    "I'm still looking into this for you and will update you as soon as I have more information on it.",
    "I'm still looking into this and will update you as soon as I have more information.",
)
_NUDGES = ("Any update?", "Is it done yet?", "Still waiting...", "Hello? Any news?", "How is it going?")


def recipe_stagnation(scenario: Scenario, rng: random.Random, number: int) -> Outcome:
    task = _task(scenario, rng)
    trace = TraceBuilder(scenario, number)
    trace.user(task.request)
    trace.call(task.plan[0], narration=_narrate(rng))
    repeats = rng.randrange(3, 5)
    for position in range(repeats):
        trace.say(_STALL_ANSWERS[position % len(_STALL_ANSWERS)])
        trace.user(_NUDGES[(position + number) % len(_NUDGES)])
    _run_plan(trace, rng, task.plan[1:])
    trace.say(task.answer)
    return Outcome(trace.view(), _labels("stagnation"), True)


def recipe_quit(scenario: Scenario, rng: random.Random, number: int) -> Outcome:
    task = _task(scenario, rng)
    trace = TraceBuilder(scenario, number)
    trace.user(task.request)
    _run_plan(trace, rng, task.wrong_plan)
    trace.say(task.wrong_answer)
    quits = ("Forget it, I'll do it myself.", "I give up.", "Never mind, forget it.")
    trace.user(_pick(rng, quits) if rng.random() < 0.7 else _pick(rng, _SOFT_QUITS))
    trace.say("I'm sorry I couldn't help this time.")
    return Outcome(trace.view(), _labels("disengagement"), True)


def recipe_human_after_failure(scenario: Scenario, rng: random.Random, number: int) -> Outcome:
    task = _task(scenario, rng)
    trace = TraceBuilder(scenario, number)
    trace.user(task.request)
    trace.call(_failed(rng, task.plan[0]), narration=_narrate(rng))
    trace.say("Sorry, something went wrong on my side. Could you try again in a few minutes?")
    requests = (
        "This is useless. Let me talk to a real person.",
        "I want to speak to a human, please.",
        "Can you just transfer me to a supervisor?",
    )
    trace.user(_pick(rng, requests) if rng.random() < 0.7 else _pick(rng, _SOFT_HUMAN_REQUESTS))
    handoff = next(tool["function"]["name"] for tool in scenario.tools if tool["function"]["name"] in _HANDOFF_NAMES)
    trace.call(
        ToolStep(handoff, {_handoff_field(scenario, handoff): "customer asked for a person"}, {"status": "queued"})
    )
    trace.say("I'm transferring you to a human agent now.")
    return Outcome(trace.view(), _labels("failure", "disengagement"), True)


_HANDOFF_NAMES = ("transfer_to_human", "create_support_ticket", "request_human_review")


def _handoff_field(scenario: Scenario, name: str) -> str:
    for tool in scenario.tools:
        if tool["function"]["name"] == name:
            required: list[str] = tool["function"]["parameters"]["required"]
            return required[0]
    return "reason"


# Provider errors that are no limit (a limit would be `exhaustion`): the call fails, and the run with it.
_MODEL_ERRORS = (
    (
        "Error code: 500 - {'error': {'message': 'The server had an error while processing your request. "
        "Sorry about that!', 'type': 'server_error'}}",
        "InternalServerError",
    ),
    ("Connection error.", "APIConnectionError"),
)


def recipe_unanswered_question(scenario: Scenario, rng: random.Random, number: int) -> Outcome:
    """The user asks a follow-up question, the agent starts on it and the run dies before any answer.

    The failure that ends the run is an exception that nothing catches: the model call that would write
    the answer fails (before or after the lookups), or a tool raises; the agent span ends in that error.
    """
    task = _task(scenario, rng)
    trace = TraceBuilder(scenario, number)
    trace.user(task.request)
    _run_plan(trace, rng, task.plan)
    trace.say(task.answer + (" " + _pick(rng, _CLOSINGS) if rng.random() < 0.3 else ""))
    trace.user(task.followup_question)
    ending = rng.random()
    if ending < 0.3:
        step = task.followup_plan[0]
        error = f"{step.name} raised: {_pick(rng, _ERROR_DETAILS)}"
        trace.call(replace(step, result=None, error=error), narration=_narrate(rng))
    else:
        if ending < 0.8:
            _run_plan(trace, rng, task.followup_plan)
        error, error_type = _MODEL_ERRORS[rng.randrange(len(_MODEL_ERRORS))]
        trace.llm_error(error, error_type)
    return Outcome(trace.view(root_error=error), _labels("failure", "disengagement"), True)


def recipe_clarifying_question(scenario: Scenario, rng: random.Random, number: int) -> Outcome:
    """The agent needs a detail and asks for it, and the trajectory ends on the question: nothing to fix.

    Traced one request per trace, the user's answer opens the session's next trajectory.
    """
    task = _task(scenario, rng)
    trace = TraceBuilder(scenario, number)
    trace.user(task.request)
    trace.call(task.plan[0], narration=_narrate(rng))
    trace.say(task.question)
    return Outcome(trace.view(), _labels(), False)


def recipe_failure_recovered(scenario: Scenario, rng: random.Random, number: int) -> Outcome:
    task = _task(scenario, rng)
    trace = TraceBuilder(scenario, number)
    trace.user(task.request)
    position = rng.randrange(len(task.plan))
    _run_plan(trace, rng, task.plan[:position])
    trace.call(_failed(rng, task.plan[position]))
    _run_plan(trace, rng, task.plan[position:])
    trace.say(task.answer)
    return Outcome(trace.view(), _labels("failure"), True)


def recipe_failure_reported(scenario: Scenario, rng: random.Random, number: int) -> Outcome:
    task = _task(scenario, rng)
    trace = TraceBuilder(scenario, number)
    trace.user(task.request)
    position = rng.randrange(len(task.plan))
    _run_plan(trace, rng, task.plan[:position])
    trace.call(_failed(rng, task.plan[position]))
    trace.say(
        _pick(
            rng,
            (
                "I'm sorry, I was unable to complete that because the system returned an error.",
                "Something went wrong while I was working on this, so it isn't done yet.",
                "Unfortunately I wasn't able to finish: the request failed on our side.",
            ),
        )
    )
    return Outcome(trace.view(), _labels("failure", "disengagement"), True)


def recipe_handled_not_found(scenario: Scenario, rng: random.Random, number: int) -> Outcome:
    """A lookup finds nothing (an HTTP 404 or an empty result), the agent asks again and succeeds."""
    task = _task(scenario, rng)
    trace = TraceBuilder(scenario, number)
    trace.user(task.request)
    as_404 = rng.random() < 0.5
    missing = replace(
        task.plan[0],
        result={"status_code": 404, "detail": "not found"} if as_404 else {"results": [], "total": 0},
    )
    trace.call(missing, narration=_narrate(rng))
    trace.say("I couldn't find a match for that. Could you double-check the details for me?")
    trace.user(task.question_reply)
    _run_plan(trace, rng, task.plan)
    trace.say(task.answer)
    return Outcome(trace.view(), _labels("failure") if as_404 else _labels(), False)


def recipe_retry_loop(scenario: Scenario, rng: random.Random, number: int) -> Outcome:
    task = _task(scenario, rng)
    trace = TraceBuilder(scenario, number)
    trace.user(task.request)
    failing = rng.random() < 0.5
    step = _failed(rng, task.plan[0]) if failing else task.plan[0]
    repeats = rng.randrange(3, 6)
    for _ in range(repeats):
        trace.call(step)
    if failing:
        trace.say("I'm sorry, I was unable to get that information right now.")
        labels = _labels("loop", "failure", "disengagement")
    else:
        _run_plan(trace, rng, task.plan[1:])
        trace.say(task.answer)
        labels = _labels("loop")
    return Outcome(trace.view(), labels, True)


def recipe_cycling_loop(scenario: Scenario, rng: random.Random, number: int) -> Outcome:
    task = _task(scenario, rng)
    trace = TraceBuilder(scenario, number)
    trace.user(task.request)
    first, second = task.explore[0], task.explore[1]
    for _ in range(rng.randrange(2, 3)):
        trace.call(first)
        trace.call(second)
    _run_plan(trace, rng, task.plan[1:])
    trace.say(task.answer)
    return Outcome(trace.view(), _labels("loop"), True)


def recipe_pattern_loop(scenario: Scenario, rng: random.Random, number: int) -> Outcome:
    task = _task(scenario, rng)
    trace = TraceBuilder(scenario, number)
    trace.user(task.request)
    for _ in range(3):
        trace.call(task.plan[0])
        trace.call(task.plan[1])
    _run_plan(trace, rng, task.plan[2:])
    trace.say(task.answer)
    return Outcome(trace.view(), _labels("loop"), True)


def recipe_infinite_loop(scenario: Scenario, rng: random.Random, number: int) -> Outcome:
    task = _task(scenario, rng)
    trace = TraceBuilder(scenario, number)
    trace.user(task.request)
    for _ in range(rng.randrange(7, 11)):
        trace.call(task.plan[0])
    view = trace.view(termination={"termination_reason": "max_iterations", "steps": 12}, root_error=None)
    return Outcome(view, _labels("loop", "infinite_loop", "exhaustion"), True)


def recipe_loop_at_step_limit(scenario: Scenario, rng: random.Random, number: int) -> Outcome:
    task = _task(scenario, rng)
    trace = TraceBuilder(scenario, number)
    trace.user(task.request)
    _run_plan(trace, rng, task.plan[:1])
    for _ in range(2):
        trace.call(task.explore[0])
        trace.call(task.explore[1])
    limit = trace.call_counter
    view = trace.view(root_error=f"Agent stopped: reached max_steps={limit} without a final answer")
    return Outcome(view, _labels("loop", "infinite_loop", "exhaustion"), True, SignalConfig(max_steps=limit))


def recipe_rate_limit(scenario: Scenario, rng: random.Random, number: int) -> Outcome:
    task = _task(scenario, rng)
    trace = TraceBuilder(scenario, number)
    trace.user(task.request)
    recovered = rng.random() < 0.5
    limited = replace(
        task.plan[0],
        result=_pick_value(
            rng,
            (
                {"status_code": 429, "error": "Too Many Requests", "retry_after": 2},
                {"error": {"type": "rate_limit_exceeded", "message": "Rate limit reached, retry in 2s"}},
            ),
        ),
    )
    trace.call(limited, narration=_narrate(rng))
    if recovered:
        _run_plan(trace, rng, task.plan)
        trace.say(task.answer)
        return Outcome(trace.view(), _labels("exhaustion"), False)
    trace.call(limited)
    trace.say("Our systems are busy right now. Please try again in a few minutes.")
    return Outcome(trace.view(), _labels("exhaustion"), True)


def _pick_value(rng: random.Random, options: Sequence[Any]) -> Any:
    return options[rng.randrange(len(options))]


def recipe_context_overflow(scenario: Scenario, rng: random.Random, number: int) -> Outcome:
    task = _task(scenario, rng)
    trace = TraceBuilder(scenario, number)
    trace.user(task.request)
    _run_plan(trace, rng, task.plan[:-1])
    trace.llm_error(
        _pick(
            rng,
            (
                "This model's maximum context length is 128000 tokens. However, your messages resulted in "
                "131072 tokens.",
                "Error code: 400 - context_length_exceeded: prompt is too long",
            ),
        ),
        "BadRequestError",
        input_tokens=131_072,
    )
    return Outcome(trace.view(), _labels("exhaustion", "context_exhaustion"), True)


def recipe_step_limit(scenario: Scenario, rng: random.Random, number: int) -> Outcome:
    """The agent explores sensibly but runs out of steps before answering."""
    task = _task(scenario, rng)
    trace = TraceBuilder(scenario, number)
    trace.user(task.request)
    trace.calls(task.explore[:3])
    termination = _pick_value(
        rng,
        (
            {"termination_reason": "max_steps", "steps": 4},
            {"stop_reason": "Agent stopped due to iteration limit or time limit."},
        ),
    )
    return Outcome(trace.view(termination=termination), _labels("exhaustion"), True)


def recipe_truncated_output(scenario: Scenario, rng: random.Random, number: int) -> Outcome:
    task = _task(scenario, rng)
    trace = TraceBuilder(scenario, number)
    trace.user(task.request)
    _run_plan(trace, rng, task.plan)
    words = task.answer.split()
    trace.say(" ".join(words[: max(len(words) * 2 // 3, 3)]), finish="length", output_tokens=1024)
    return Outcome(trace.view(), _labels("exhaustion"), True, SignalConfig(max_output_tokens=1024))


def recipe_timeout(scenario: Scenario, rng: random.Random, number: int) -> Outcome:
    task = _task(scenario, rng)
    trace = TraceBuilder(scenario, number)
    trace.user(task.request)
    slow = replace(task.plan[0], result=None, error=_pick(rng, ("deadline exceeded after 30s", "request timed out")))
    trace.call(slow, narration=_narrate(rng))
    _run_plan(trace, rng, task.plan)
    trace.say(task.answer)
    return Outcome(trace.view(), _labels("exhaustion"), False)


def recipe_unknown_tool(scenario: Scenario, rng: random.Random, number: int) -> Outcome:
    task = _task(scenario, rng)
    trace = TraceBuilder(scenario, number)
    trace.user(task.request)
    name = _pick(rng, scenario.unknown_tools)
    rejected = rng.random() < 0.6
    result: Any = {"error": f"unknown tool '{name}'"} if rejected else {"status": "done"}
    trace.call(ToolStep(name, dict(task.plan[0].arguments), result), narration=_narrate(rng))
    _run_plan(trace, rng, task.plan)
    trace.say(task.answer)
    return Outcome(trace.view(), _labels("hallucinated_tool_call", *(["failure"] if rejected else [])), True)


def recipe_schema_violation(scenario: Scenario, rng: random.Random, number: int) -> Outcome:
    task = _task(scenario, rng)
    trace = TraceBuilder(scenario, number)
    trace.user(task.request)
    step = task.plan[0]
    arguments = dict(step.arguments)
    mutation = rng.randrange(3)
    if mutation == 0 and arguments:
        arguments.pop(next(iter(arguments)))
    elif mutation == 1 and arguments:
        key = next(iter(arguments))
        arguments[key] = [arguments[key]] if not isinstance(arguments[key], list) else 12
    else:
        arguments["include_archived"] = True
    rejected = rng.random() < 0.5
    if rejected:
        trace.call(replace(step, arguments=arguments, result={"ok": False, "error": "validation failed"}))
    else:
        trace.call(replace(step, arguments=arguments))
    _run_plan(trace, rng, task.plan[1:] if not rejected else task.plan)
    trace.say(task.answer)
    return Outcome(trace.view(), _labels("hallucinated_tool_call", *(["failure"] if rejected else [])), True)


def recipe_cascading_error(scenario: Scenario, rng: random.Random, number: int) -> Outcome:
    task = _task(scenario, rng)
    trace = TraceBuilder(scenario, number)
    trace.user(task.request)
    placeholder = _pick(rng, ("TMP-", "ERR-", "PENDING-", "NULL-")) + str(rng.randrange(10_000, 99_999))
    failing = replace(
        task.plan[0],
        result={"status": "error", "message": "lookup degraded, returning placeholder", "fallback_id": placeholder},
    )
    trace.call(failing, narration=_narrate(rng))
    consumer = task.plan[1]
    arguments = dict(consumer.arguments)
    argument = task.cascade_argument if task.cascade_argument in arguments else next(iter(arguments))
    arguments[argument] = (
        placeholder if argument != "query" else _sql("SELECT * FROM results WHERE id =", repr(placeholder))
    )
    trace.call(replace(consumer, arguments=arguments))
    trace.say(task.answer)
    return Outcome(trace.view(), _labels("failure", "cascading_error"), True)


def recipe_cascading_answer(scenario: Scenario, rng: random.Random, number: int) -> Outcome:
    """The agent relays a placeholder from a failed call as if it were real."""
    task = _task(scenario, rng)
    trace = TraceBuilder(scenario, number)
    trace.user(task.request)
    _run_plan(trace, rng, task.plan[:-1])
    reference = "TMP-" + str(rng.randrange(10_000, 99_999))
    trace.call(
        replace(
            task.plan[-1],
            result={"success": False, "reason": "write rejected upstream", "reference": reference},
        )
    )
    trace.say(f"All done: your reference number is {reference}, and you will receive a confirmation shortly.")
    return Outcome(trace.view(), _labels("failure", "cascading_error"), True)


def recipe_error_hint_followed(scenario: Scenario, rng: random.Random, number: int) -> Outcome:
    """A failed call names the fix (where the record moved) and the agent rightly follows it: a hard negative."""
    for _ in range(20):
        task = _task(scenario, rng)
        candidates = [
            (position, key, value)
            for position, step in enumerate(task.plan)
            for key, value in step.arguments.items()
            if isinstance(value, str) and " " not in value and key not in ("kind", "priority")
        ]
        if candidates:
            break
    position, key, value = candidates[0]
    stem, dot, extension = value.rpartition(".")
    moved = f"{stem}_v2.{extension}" if dot and stem else f"{value}_v2"
    step = task.plan[position]
    trace = TraceBuilder(scenario, number)
    trace.user(task.request)
    _run_plan(trace, rng, task.plan[:position])
    trace.call(
        replace(step, result={"status": "error", "message": f"{value} has moved, use {moved}", "moved_to": moved}),
        narration=_narrate(rng),
    )
    trace.call(replace(step, arguments={**step.arguments, key: moved}))
    _run_plan(trace, rng, task.plan[position + 1 :])
    trace.say(task.answer)
    return Outcome(trace.view(), _labels("failure"), False)


def recipe_goal_drift(scenario: Scenario, rng: random.Random, number: int) -> Outcome:
    task = _task(scenario, rng)
    trace = TraceBuilder(scenario, number)
    trace.user(task.request)
    _run_plan(trace, rng, task.plan[:1])
    trace.say(task.drift_answer)
    return Outcome(trace.view(), _labels("goal_drift"), True)


# Answers that are on topic in other words, and answers about the right thing but the wrong question.
_PARAPHRASED: dict[str, tuple[tuple[str, str], ...]] = {
    "ride_support": (
        ("Did I get my money back for Tuesday?", "Yes: the $12.40 credit for that trip landed on your card today."),
        ("Why so pricey last night?", "Surge pricing was 1.8x at 23:00 because of the concert crowd."),
    ),
    "shopping": (
        ("Where's my stuff?", "Your parcel left the Denver depot this morning and should reach you Friday."),
        ("Is the blue one back yet?", "Yes, the navy colourway was restocked today in sizes 8 to 11."),
    ),
    "coding": (
        ("Can you make the build green again?", "All 214 checks pass now; I fixed the flaky import in scheduler.py."),
        ("Why is CI so slow lately?", "Dependency caching was disabled in March; re-enabling it cut jobs to 6 min."),
    ),
    "travel": (
        ("Get me to Tokyo next Friday, cheapest option.", "Done: NH7 on the 14th, one stop, $842, seat 31A."),
        ("Somewhere to sleep near the venue?", "The Harbor Inn is 400 m away at $140 a night; I held a room."),
    ),
    "data_analysis": (
        ("How did Q3 go?", "Revenue was $4.2M, up 8% on Q2, with the West region leading growth."),
        ("Are people sticking around?", "Twelve-month retention is 71%, three points better than last year."),
    ),
}
_SUBTLE_DRIFT: dict[str, tuple[tuple[str, str], ...]] = {
    "ride_support": (
        (
            "Why was I charged a cancellation fee for my ride to the airport this morning?",
            "Your driver for the airport trip this morning was rated 4.9 stars and drives a grey Prius.",
        ),
    ),
    "shopping": (
        (
            "Can I return the hiking boots from my last order? They are too small.",
            "The hiking boots in your last order are waterproof leather with a lifetime sole guarantee.",
        ),
    ),
    "coding": (
        (
            "Why does the export job run out of memory on large CSV files?",
            "The export job writes CSV files with a header row and uses commas as the default delimiter.",
        ),
    ),
    "travel": (
        (
            "Can I change the date of my Lisbon flight without paying a fee?",
            "Your Lisbon flight departs from terminal 2 and boarding closes 20 minutes before departure.",
        ),
    ),
    "data_analysis": (
        (
            "Why did revenue drop in the South region in March?",
            "The South region includes 14 stores, and its revenue is reported in US dollars every month.",
        ),
    ),
}


def recipe_paraphrased_answer(scenario: Scenario, rng: random.Random, number: int) -> Outcome:
    """A correct answer in other words than the request: a hard negative for goal drift."""
    request, answer = _pick_value(rng, _PARAPHRASED[scenario.name])
    task = _task(scenario, rng)
    trace = TraceBuilder(scenario, number)
    trace.user(request)
    trace.call(task.plan[0], narration=_narrate(rng))
    trace.say(answer)
    return Outcome(trace.view(), _labels(), False)


def recipe_subtle_goal_drift(scenario: Scenario, rng: random.Random, number: int) -> Outcome:
    """The answer is about the right thing but not the question asked: goal drift that shares words."""
    request, answer = _pick_value(rng, _SUBTLE_DRIFT[scenario.name])
    task = _task(scenario, rng)
    trace = TraceBuilder(scenario, number)
    trace.user(request)
    trace.call(task.plan[0], narration=_narrate(rng))
    trace.say(answer)
    return Outcome(trace.view(), _labels("goal_drift"), True)


def _shape_history(plan: Sequence[ToolStep]) -> dict[str, list[dict[str, str]]]:
    return {step.name: [tool_result_shape(step.result)] * 3 for step in plan if isinstance(step.result, dict)}


def recipe_api_change(scenario: Scenario, rng: random.Random, number: int) -> Outcome:
    task = _task(scenario, rng)
    history = _shape_history(task.plan)
    changed_position = next(index for index, step in enumerate(task.plan) if isinstance(step.result, dict))
    step = task.plan[changed_position]
    result = dict(step.result)
    key = rng.choice(sorted(result))
    if rng.random() < 0.5:
        result[f"{key}_v2"] = result.pop(key)
    else:
        value = result[key]
        result[key] = json.dumps(value) if not isinstance(value, str) else {"value": value}
    plan = list(task.plan)
    plan[changed_position] = replace(step, result=result)
    trace = TraceBuilder(scenario, number)
    trace.user(task.request)
    _run_plan(trace, rng, plan)
    trace.say(task.answer)
    return Outcome(trace.view(), _labels("silent_tool_api_change"), True, SignalConfig(tool_result_shapes=history))


def recipe_api_addition(scenario: Scenario, rng: random.Random, number: int) -> Outcome:
    """A tool's result gains a field: backward compatible, not a silent change."""
    task = _task(scenario, rng)
    history = _shape_history(task.plan)
    plan = [
        replace(step, result={**step.result, "request_id": _id(rng, "req_")}) if isinstance(step.result, dict) else step
        for step in task.plan
    ]
    trace = TraceBuilder(scenario, number)
    trace.user(task.request)
    _run_plan(trace, rng, plan)
    trace.say(task.answer)
    return Outcome(trace.view(), _labels(), False, SignalConfig(tool_result_shapes=history))


# Recipe -> how many trajectories per scenario.
RECIPES: tuple[tuple[Recipe, int], ...] = (
    (recipe_success, 6),
    (recipe_clarified_success, 2),
    (recipe_clarifying_question, 2),
    (recipe_long_success, 4),
    (recipe_follow_up_requests, 2),
    (recipe_noisy_output, 3),
    (recipe_polling, 1),
    (recipe_exploration, 2),
    (recipe_agent_escalation, 2),
    (recipe_user_asks_human, 2),
    (recipe_handled_not_found, 2),
    (recipe_api_addition, 1),
    (recipe_correction, 3),
    (recipe_rephrase, 2),
    (recipe_stagnation, 2),
    (recipe_quit, 1),
    (recipe_human_after_failure, 1),
    (recipe_unanswered_question, 2),
    (recipe_failure_recovered, 3),
    (recipe_failure_reported, 2),
    (recipe_retry_loop, 2),
    (recipe_cycling_loop, 1),
    (recipe_pattern_loop, 1),
    (recipe_infinite_loop, 1),
    (recipe_loop_at_step_limit, 1),
    (recipe_rate_limit, 2),
    (recipe_context_overflow, 1),
    (recipe_step_limit, 1),
    (recipe_truncated_output, 1),
    (recipe_timeout, 1),
    (recipe_unknown_tool, 2),
    (recipe_schema_violation, 2),
    (recipe_cascading_error, 2),
    (recipe_cascading_answer, 1),
    (recipe_error_hint_followed, 1),
    (recipe_goal_drift, 2),
    (recipe_subtle_goal_drift, 1),
    (recipe_paraphrased_answer, 2),
    (recipe_api_change, 2),
)


def _scenario_config(scenario: Scenario, extra: SignalConfig | None) -> SignalConfig:
    base = scenario.config
    if extra is None:
        return base
    return replace(
        base,
        max_steps=extra.max_steps if extra.max_steps is not None else base.max_steps,
        max_output_tokens=extra.max_output_tokens if extra.max_output_tokens is not None else base.max_output_tokens,
        tool_result_shapes=extra.tool_result_shapes or base.tool_result_shapes,
    )


def iter_trajectories(seed: int = DEFAULT_SEED, *, scale: int = 1) -> Iterator[LabelledTrajectory]:
    """Every recipe in every scenario, `scale` times the counts of `RECIPES`."""
    rng = SeededRandom(seed)
    number = 0
    for scenario in SCENARIOS:
        for recipe, count in RECIPES:
            for _ in range(count * scale):
                number += 1
                outcome = recipe(scenario, rng, number)
                name = recipe.__name__.removeprefix("recipe_")
                yield LabelledTrajectory(
                    trajectory_id=f"{scenario.name}/{name}/{number}",
                    scenario=scenario.name,
                    recipe=name,
                    view=outcome.view,
                    config=_scenario_config(scenario, outcome.config),
                    signals=outcome.signals,
                    problematic=outcome.problematic,
                )


def triage_dataset_build(seed: int = DEFAULT_SEED) -> list[LabelledTrajectory]:
    return list(iter_trajectories(seed))


def throughput_trajectories(count: int = 1000, seed: int = DEFAULT_SEED + 1, steps: int = 20) -> list[TrajectoryView]:
    """`count` trajectories of exactly `steps` steps, for timing the detectors.

    Each is a run of tasks from the scenarios (request, tool calls, answer), with some failed calls,
    repeated calls and rephrased requests mixed in so the detectors take their slower paths too.
    """
    rng = SeededRandom(seed)
    views: list[TrajectoryView] = []
    number = 0
    while len(views) < count:
        number += 1
        scenario = SCENARIOS[number % len(SCENARIOS)]
        trace = TraceBuilder(scenario, 1_000_000 + number)
        taken = 2  # the root span and the system prompt
        while steps - taken >= 4:
            task = _task(scenario, rng)
            trace.user(task.request if rng.random() < 0.7 else task.rephrase)
            taken += 1
            plan = list(task.plan)
            roll = rng.random()
            if roll < 0.15:
                plan[0] = _failed(rng, plan[0])
            elif roll < 0.25:
                plan = [plan[0], plan[0], *plan]
            for step in plan:
                if steps - taken < 3:
                    break
                trace.call(step)
                taken += 2
            trace.say(task.answer)
            taken += 1
        while taken < steps:
            if steps - taken >= 2:
                trace.user(_thanks(rng))
                taken += 1
            trace.say("You're welcome.")
            taken += 1
        view = trace.view()
        # Repeated identical calls can add message steps of their own; keep the exact length only.
        if len(view.steps) == steps:
            views.append(view)
    return views
