"""Test doubles for replays: a fake litellm provider with scripted answers, a recorded refund trajectory,
and a guard that fails any attempt to reach the network."""

from __future__ import annotations

import copy
import json
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from litellm.llms.custom_llm import CustomLLM
from litellm.types.utils import ChatCompletionMessageToolCall, Choices, Function, Message, ModelResponse, Usage

from agent_registry import services as registry_services
from agent_registry.models import PromptVersion, Workspace
from agent_registry.tests.factories import AgentFactory
from tracing import services
from tracing.models import Trajectory

# litellm builds its response models on first use, and pydantic warns there about a typing qualifier
# that litellm's types use; the project's tests turn warnings into errors.

FAKE_PROVIDER = "fake-replay"
RECORDED_MODEL = f"{FAKE_PROVIDER}/support-v1"
SYSTEM_V1 = "You help riders of {{company}}."
SYSTEM_V2 = "You are the refund desk of {{company}}. Refund duplicate charges at once."
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup_trip",
            "description": "Find a trip and its charges.",
            "parameters": {"type": "object", "properties": {"trip_id": {"type": "string"}}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "refund",
            "description": "Refund an amount on a trip.",
            "parameters": {
                "type": "object",
                "properties": {"trip_id": {"type": "string"}, "amount": {"type": "number"}},
            },
        },
    },
]
LOOKUP_RESULT = {"trip_id": "T1", "status": "completed", "charges": [12.5, 12.5]}
REFUND_RESULT = {"refunded": 12.5, "currency": "USD"}
ANSWER = "I refunded the duplicate charge of 12.50 USD."


@dataclass(frozen=True)
class Reply:
    """One scripted answer: text, tool calls, or both."""

    content: str | None = None
    tool_calls: tuple[tuple[str, str, str], ...] = ()  # (id, name, arguments as JSON text)
    input_tokens: int = 50
    output_tokens: int = 10


def say(text: str) -> Reply:
    return Reply(content=text)


def call(name: str, arguments: str | dict[str, Any], call_id: str = "call-a") -> Reply:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return Reply(tool_calls=((call_id, name, text),))


@dataclass
class FakeRequest:
    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    params: dict[str, Any]


class FakeReplayLLM(CustomLLM):
    """A fake provider: answers each completion with the next scripted reply (or raises the scripted
    exception) and keeps every request it received, and where it was sent (`servers`: api_base, api_key).
    `before_reply`, when set, runs first, so a test can look at the database while the replay waits for
    the model."""

    def __init__(self) -> None:
        super().__init__()
        self.script: list[Reply | Exception] = []
        self.requests: list[FakeRequest] = []
        self.servers: list[tuple[str | None, str | None]] = []
        self.before_reply: Callable[[], None] | None = None

    def completion(self, model: str, messages: list[Any], *args: Any, **kwargs: Any) -> ModelResponse:
        self.servers.append((kwargs.get("api_base"), kwargs.get("api_key")))
        params = dict(kwargs.get("optional_params") or {})
        self.requests.append(
            FakeRequest(model=model, messages=copy.deepcopy(messages), tools=params.get("tools"), params=params)
        )
        if self.before_reply is not None:
            self.before_reply()
        if not self.script:
            raise AssertionError("the fake provider has no scripted reply left")
        reply = self.script.pop(0)
        if isinstance(reply, Exception):
            raise reply
        tool_calls = [
            ChatCompletionMessageToolCall(id=call_id, type="function", function=Function(name=name, arguments=text))
            for call_id, name, text in reply.tool_calls
        ]
        return ModelResponse(
            model=model,
            choices=[
                Choices(
                    index=0,
                    finish_reason="tool_calls" if tool_calls else "stop",
                    message=Message(role="assistant", content=reply.content, tool_calls=tool_calls or None),
                )
            ],
            usage=Usage(
                prompt_tokens=reply.input_tokens,
                completion_tokens=reply.output_tokens,
                total_tokens=reply.input_tokens + reply.output_tokens,
            ),
        )


@contextmanager
def fake_provider() -> Iterator[FakeReplayLLM]:
    """Register the fake under `fake-replay/...` model names for the duration."""
    import litellm

    fake = FakeReplayLLM()
    previous = litellm.custom_provider_map
    litellm.custom_provider_map = [*previous, {"provider": FAKE_PROVIDER, "custom_handler": fake}]
    try:
        yield fake
    finally:
        litellm.custom_provider_map = previous


def network_forbid(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any TCP connection or name lookup fail loudly (PostgreSQL is reached over a unix socket)."""
    real_connect = socket.socket.connect

    def connect(self: socket.socket, address: Any) -> None:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            raise AssertionError(f"a replay test tried to reach the network: {address!r}")
        real_connect(self, address)

    def getaddrinfo(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"a replay test tried to look up a host: {args[:2]!r}")

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


# --- A recorded trajectory ----------------------------------------------------------------------------


def refund_document(**changes: Any) -> dict[str, Any]:
    """A finished refund conversation as JSON ingest takes it. Its steps, once stored:
    0 agent, 1 system, 2 user, 3 LLM call → 4 lookup_trip, 5 LLM call → 6 refund, 7 LLM call (the answer)."""
    document: dict[str, Any] = {
        "name": "refund request",
        "agent": "ride-support",
        "session_id": "session-7",
        "user_id": "rider-42",
        "model": RECORDED_MODEL,
        "started_at": 1795316000.0,
        "tags": ["production"],
        "metadata": {"prompt_variables": {"company": "Acme"}},
        "tools": TOOLS,
        "messages": [
            {"role": "system", "content": "You help riders of Acme."},
            {"role": "user", "content": "I was charged twice for trip T1."},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "lookup_trip", "arguments": '{"trip_id": "T1"}'},
                    }
                ],
                "usage": {"input_tokens": 100, "output_tokens": 12},
                "duration_ms": 800,
            },
            {"role": "tool", "tool_call_id": "c1", "content": json.dumps(LOOKUP_RESULT), "duration_ms": 30},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c2",
                        "type": "function",
                        "function": {"name": "refund", "arguments": '{"trip_id": "T1", "amount": 12.5}'},
                    }
                ],
                "usage": {"input_tokens": 160, "output_tokens": 14},
                "duration_ms": 900,
            },
            {"role": "tool", "tool_call_id": "c2", "content": json.dumps(REFUND_RESULT), "duration_ms": 50},
            {"role": "assistant", "content": ANSWER, "usage": {"input_tokens": 200, "output_tokens": 16}},
        ],
    }
    document.update(changes)
    return document


def trajectory_record(workspace: Workspace, document: dict[str, Any]) -> Trajectory:
    """Store a trajectory the way ingest does: accept the JSON body, then process the batch."""
    api_key, _ = registry_services.apikey_create(workspace=workspace, name="recorder", scopes=["ingest"])
    accepted, (trace_id,) = services.ingest_trajectories_accept(api_key=api_key, payload=document)
    assert accepted.batch_id is not None
    services.span_batch_process(batch_id=accepted.batch_id)
    return Trajectory.objects.get(workspace=workspace, trace_id=trace_id)


@dataclass(frozen=True)
class Recorded:
    """What replay tests start from: a recorded refund of agent `ride-support`, and its prompt
    `ride-support/system` in two versions (v1 as recorded, v2 a new one)."""

    trajectory: Trajectory
    version_1: PromptVersion
    version_2: PromptVersion


def refund_recorded(workspace: Workspace, **changes: Any) -> Recorded:
    agent = AgentFactory.create(workspace=workspace, slug="ride-support", name="Ride support")
    version_1 = registry_services.prompt_create(
        agent=agent, name="ride-support/system", type="text", template=SYSTEM_V1, labels=["production"]
    )
    version_2 = registry_services.prompt_version_create(
        prompt=version_1.prompt, template=SYSTEM_V2, config={"temperature": 0.2, "model": "ignored"}
    )
    return Recorded(
        trajectory=trajectory_record(workspace, refund_document(**changes)),
        version_1=version_1,
        version_2=version_2,
    )
