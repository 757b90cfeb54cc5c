"""The ride-support agent that every example instruments: its tools, their data, and a fake model.

Nothing here talks to a network or needs an API key. `fake_chat_completion` stands in for the model:
it reads the conversation and answers as an OpenAI chat model would (a tool call, or the final
answer), the same way every time. `fake_openai_server` serves it over HTTP on localhost as an
OpenAI-compatible `/v1/chat/completions`, for examples that use a real client library.

The agent handles one rider's ticket at a time: it looks the trip up, checks the refund policy and,
when the policy allows it, issues the refund.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

AGENT_NAME = "ride-support"
MODEL = "fake-ride-model-1"
USER_ID = "rider-314"
SYSTEM_PROMPT = (
    "You are Acme Rides' support agent. Look the trip up before you answer, check the refund policy "
    "before you promise anything, and issue a refund only when the policy allows it."
)

# Two tickets from one rider in one chat session: a duplicate charge (refunded) and a late
# cancellation fee (the policy says no).
TICKETS = (
    "Hi, I was charged twice for my ride T-1042 yesterday. Can you fix it?",
    "I also paid a cancellation fee on trip T-2077. I'd like that refunded too.",
)

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "lookup_trip",
            "description": "Look a trip up by its id: status, fare and every charge made for it.",
            "parameters": {
                "type": "object",
                "properties": {"trip_id": {"type": "string"}},
                "required": ["trip_id"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "check_refund_policy",
            "description": "Whether the refund policy allows a refund for this trip and reason, and up to how much.",
            "parameters": {
                "type": "object",
                "properties": {
                    "trip_id": {"type": "string"},
                    "reason": {"type": "string", "enum": ["duplicate_charge", "cancellation_fee"]},
                },
                "required": ["trip_id", "reason"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "issue_refund",
            "description": "Refund an amount to the card the trip was charged to.",
            "parameters": {
                "type": "object",
                "properties": {"trip_id": {"type": "string"}, "amount_usd": {"type": "number"}},
                "required": ["trip_id", "amount_usd"],
            },
        },
    },
]
TOOL_DESCRIPTIONS = {tool["function"]["name"]: tool["function"]["description"] for tool in TOOLS}
TOOL_PARAMETERS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}

_TRIPS: dict[str, dict[str, Any]] = {
    "T-1042": {
        "trip_id": "T-1042",
        "status": "completed",
        "date": "2026-11-21",
        "fare_usd": 18.4,
        "charges_usd": [18.4, 18.4],
    },
    "T-2077": {
        "trip_id": "T-2077",
        "status": "cancelled_by_rider",
        "date": "2026-11-20",
        "cancelled_after_minutes": 9,
        "charges_usd": [5.0],
    },
}
FREE_CANCELLATION_MINUTES = 5


# --- Tools --------------------------------------------------------------------------------------------


def lookup_trip(trip_id: str) -> dict[str, Any]:
    trip = _TRIPS.get(trip_id)
    return dict(trip) if trip else {"error": f"no trip {trip_id}"}


def check_refund_policy(trip_id: str, reason: str) -> dict[str, Any]:
    trip = _TRIPS[trip_id]
    charges: list[float] = trip["charges_usd"]
    if reason == "duplicate_charge":
        extra = round(sum(charges[1:]), 2)
        return {"eligible": extra > 0, "max_refund_usd": extra, "rule": "duplicate charges are always refunded"}
    minutes = trip.get("cancelled_after_minutes", 0)
    if minutes <= FREE_CANCELLATION_MINUTES:
        return {"eligible": True, "max_refund_usd": charges[0], "rule": "free cancellation within 5 minutes"}
    return {"eligible": False, "max_refund_usd": 0.0, "rule": "the fee applies to cancellations after 5 minutes"}


def issue_refund(trip_id: str, amount_usd: float) -> dict[str, Any]:
    return {"refund_id": f"RF-{trip_id}-{round(amount_usd * 100)}", "amount_usd": amount_usd, "status": "issued"}


def tool_run(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    if name == "lookup_trip":
        return lookup_trip(**arguments)
    if name == "check_refund_policy":
        return check_refund_policy(**arguments)
    if name == "issue_refund":
        return issue_refund(**arguments)
    raise ValueError(f"unknown tool {name}")


# --- The fake model -------------------------------------------------------------------------------------

# (prompt tokens, completion tokens) of the n-th model call of a ticket: fixed, so a test can add them up.
FAKE_USAGE = ((412, 23), (486, 31), (553, 27), (601, 58))


@dataclass(frozen=True)
class FakeCompletion:
    """One answer of the fake model, in OpenAI's chat completion terms."""

    id: str
    model: str
    message: dict[str, Any]  # {"role": "assistant", "content": ..., "tool_calls"?: [...]}
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int

    def as_openai_response(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": 1_763_800_000,
            "model": self.model,
            "choices": [{"index": 0, "message": self.message, "finish_reason": self.finish_reason, "logprobs": None}],
            "usage": {
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
            },
        }


def _call_id(*parts: str) -> str:
    return "call_" + hashlib.sha256("/".join(parts).encode()).hexdigest()[:24]


def fake_chat_completion(messages: list[dict[str, Any]], model: str = MODEL) -> FakeCompletion:
    """What a well-behaved model would answer next, decided from the tool results of the current ticket."""
    last_user = max(index for index, message in enumerate(messages) if message["role"] == "user")
    ticket = messages[last_user:]
    found = re.search(r"T-\d{4}", str(ticket[0]["content"]))
    trip_id = found.group(0) if found else "unknown"
    requested: dict[str, str] = {}  # tool call id -> tool name
    results: dict[str, Any] = {}  # tool name -> its result
    for message in ticket:
        for requested_call in message.get("tool_calls") or ():
            requested[requested_call["id"]] = requested_call["function"]["name"]
        if message["role"] == "tool":
            results[requested[message["tool_call_id"]]] = json.loads(message["content"])
    turn = sum(1 for message in ticket if message["role"] == "assistant")
    prompt_tokens, completion_tokens = FAKE_USAGE[min(turn, len(FAKE_USAGE) - 1)]

    call: tuple[str, dict[str, Any]] | None = None
    text = ""
    if "lookup_trip" not in results:
        call = ("lookup_trip", {"trip_id": trip_id})
    elif "check_refund_policy" not in results:
        trip = results["lookup_trip"]
        reason = "duplicate_charge" if len(trip.get("charges_usd", ())) > 1 else "cancellation_fee"
        call = ("check_refund_policy", {"trip_id": trip_id, "reason": reason})
    elif results["check_refund_policy"]["eligible"] and "issue_refund" not in results:
        call = ("issue_refund", {"trip_id": trip_id, "amount_usd": results["check_refund_policy"]["max_refund_usd"]})
    elif "issue_refund" in results:
        refund = results["issue_refund"]
        text = (
            f"I've refunded ${refund['amount_usd']:.2f} for trip {trip_id} (refund {refund['refund_id']}). "
            "It will be back on your card within 3-5 business days."
        )
    else:
        text = (
            f"I'm sorry: trip {trip_id} was cancelled {results['lookup_trip']['cancelled_after_minutes']} minutes "
            f"after booking, and {results['check_refund_policy']['rule']}, so I can't refund that fee."
        )

    answer: dict[str, Any]
    if call is not None:
        name, arguments = call
        answer = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": _call_id(trip_id, name),
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments)},
                }
            ],
        }
    else:
        answer = {"role": "assistant", "content": text}
    return FakeCompletion(
        id="chatcmpl-" + hashlib.sha256(json.dumps(messages).encode()).hexdigest()[:20],
        model=model,
        message=answer,
        finish_reason="tool_calls" if call is not None else "stop",
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
    )


class _FakeOpenAIHandler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._answer(404, {"error": {"message": f"no route {self.path}", "type": "invalid_request_error"}})
            return
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        completion = fake_chat_completion(request["messages"], model=request.get("model", MODEL))
        self._answer(200, completion.as_openai_response())

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the example prints what it sent to Keel, not the fake model's access log."""


@contextmanager
def fake_openai_server() -> Iterator[str]:
    """An OpenAI-compatible chat completions server on a free localhost port; yields its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeOpenAIHandler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), name="fake-openai", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
