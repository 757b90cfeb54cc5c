"""The scripts in examples/, run as a person runs them: as programs, configured only by environment
variables, sending to a live Keel (pytest-django's live_server) over HTTP.

OTLP requests are stored by the time Keel answers them, so once an OTLP example has exited its spans
are there and no batch is left. The JSON example's trajectories are queued as batches, and the test
has no Celery worker: it processes them as the worker would (`span_batch_process`). Then it reads the
trajectories back through the API and compares them with what the ride-support agent did: its
tickets, tool calls, answers and token counts are fixed by the examples' fake model, and written out
here in full rather than read from the examples' code.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from agent_registry import services as registry_services
from agent_registry.tests.factories import AgentFactory
from tracing import services
from tracing.models import BatchStatus, IngestBatch, Span, Trajectory

pytestmark = pytest.mark.django_db(transaction=True)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SENT = re.compile(r"^sent trace ([0-9a-f]{32}) \(session (chat-[0-9a-f]{12})\)$", re.MULTILINE)

MODEL = "fake-ride-model-1"
SYSTEM_PROMPT = (
    "You are Acme Rides' support agent. Look the trip up before you answer, check the refund policy "
    "before you promise anything, and issue a refund only when the policy allows it."
)
TOOL_NAMES = ["lookup_trip", "check_refund_policy", "issue_refund"]
# The price the test gives the fake model, so that cost is computed from tokens exactly.
INPUT_USD_PER_MILLION = Decimal(2)
OUTPUT_USD_PER_MILLION = Decimal(8)


@dataclass(frozen=True)
class Ticket:
    question: str
    calls: tuple[tuple[str, dict[str, Any], dict[str, Any]], ...]  # (tool, arguments, result) in order
    answer: str
    usage: tuple[tuple[int, int], ...]  # (input, output) tokens of each model call

    @property
    def input_tokens(self) -> int:
        return sum(tokens for tokens, _ in self.usage)

    @property
    def output_tokens(self) -> int:
        return sum(tokens for _, tokens in self.usage)

    @property
    def cost(self) -> Decimal:
        return (self.input_tokens * INPUT_USD_PER_MILLION + self.output_tokens * OUTPUT_USD_PER_MILLION) / 1_000_000


DUPLICATE_CHARGE = Ticket(
    question="Hi, I was charged twice for my ride T-1042 yesterday. Can you fix it?",
    calls=(
        (
            "lookup_trip",
            {"trip_id": "T-1042"},
            {
                "trip_id": "T-1042",
                "status": "completed",
                "date": "2026-11-21",
                "fare_usd": 18.4,
                "charges_usd": [18.4, 18.4],
            },
        ),
        (
            "check_refund_policy",
            {"trip_id": "T-1042", "reason": "duplicate_charge"},
            {"eligible": True, "max_refund_usd": 18.4, "rule": "duplicate charges are always refunded"},
        ),
        (
            "issue_refund",
            {"trip_id": "T-1042", "amount_usd": 18.4},
            {"refund_id": "RF-T-1042-1840", "amount_usd": 18.4, "status": "issued"},
        ),
    ),
    answer=(
        "I've refunded $18.40 for trip T-1042 (refund RF-T-1042-1840). "
        "It will be back on your card within 3-5 business days."
    ),
    usage=((412, 23), (486, 31), (553, 27), (601, 58)),
)
CANCELLATION_FEE = Ticket(
    question="I also paid a cancellation fee on trip T-2077. I'd like that refunded too.",
    calls=(
        (
            "lookup_trip",
            {"trip_id": "T-2077"},
            {
                "trip_id": "T-2077",
                "status": "cancelled_by_rider",
                "date": "2026-11-20",
                "cancelled_after_minutes": 9,
                "charges_usd": [5.0],
            },
        ),
        (
            "check_refund_policy",
            {"trip_id": "T-2077", "reason": "cancellation_fee"},
            {"eligible": False, "max_refund_usd": 0.0, "rule": "the fee applies to cancellations after 5 minutes"},
        ),
    ),
    answer=(
        "I'm sorry: trip T-2077 was cancelled 9 minutes after booking, and the fee applies to "
        "cancellations after 5 minutes, so I can't refund that fee."
    ),
    usage=((412, 23), (486, 31), (553, 27)),
)
TICKETS = (DUPLICATE_CHARGE, CANCELLATION_FEE)  # in the order the examples handle (and print) them


@dataclass(frozen=True)
class StepNames:
    """How each instrumentation names its spans: the agent's, a model call's, a tool call's."""

    agent: str
    chat: str
    tool: str  # with {tool} for the tool's name


GEN_AI_NAMES = StepNames(agent="invoke_agent ride-support", chat=f"chat {MODEL}", tool="execute_tool {tool}")
OPENINFERENCE_NAMES = StepNames(agent="ride-support", chat="ChatCompletion", tool="{tool}")
JSON_NAMES = StepNames(agent="ride support ticket", chat=f"chat {MODEL}", tool="execute_tool {tool}")


@dataclass(frozen=True)
class Keel:
    url: str
    key: str
    client: Client


@pytest.fixture
def keel(live_server, workspace) -> Keel:
    """A workspace with the ride-support agent, a price for the fake model, and an ingest + read key."""
    AgentFactory(workspace=workspace, slug="ride-support", name="Ride support")
    services.model_price_set(
        workspace=workspace,
        model=MODEL,
        input_usd_per_million=INPUT_USD_PER_MILLION,
        output_usd_per_million=OUTPUT_USD_PER_MILLION,
    )
    _, key = registry_services.apikey_create(workspace=workspace, name="examples", scopes=["ingest", "read"])
    return Keel(url=live_server.url, key=key, client=Client(headers={"Authorization": f"Bearer {key}"}))


def _run(script: str, tmp_path: Path, **variables: str) -> subprocess.CompletedProcess[str]:
    """Run an example from another directory, with this machine's OTLP and Keel settings left out."""
    inherited = {name: value for name, value in os.environ.items() if not name.startswith(("OTEL_", "KEEL_"))}
    return subprocess.run(
        [sys.executable, str(EXAMPLES / script)],
        env={**inherited, **variables},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _sent(result: subprocess.CompletedProcess[str]) -> tuple[list[str], str]:
    """The trace ids the example printed, in order, and the one session they share."""
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    sent = SENT.findall(result.stdout)
    assert len(sent) == len(TICKETS), result.stdout
    sessions = {session for _, session in sent}
    assert len(sessions) == 1, result.stdout
    assert result.stdout.endswith("Keel accepted 14 spans\n")
    return [trace_id for trace_id, _ in sent], sessions.pop()


def _stored_when_answered(workspace) -> int:
    """How many spans an OTLP example left stored; none of them waits in a batch for a worker, since
    Keel answered each export only once its spans were stored."""
    assert not IngestBatch.objects.filter(workspace=workspace).exists()
    return Span.objects.filter(workspace=workspace).count()


def _batches_process(workspace) -> int:
    """What the worker would do: process every batch the JSON example left, in the order they arrived."""
    batch_ids = (
        IngestBatch.objects.filter(workspace=workspace).order_by("received_at", "pk").values_list("pk", flat=True)
    )
    written = sum(services.span_batch_process(batch_id=batch_id) for batch_id in batch_ids)
    assert set(IngestBatch.objects.filter(workspace=workspace).values_list("status", flat=True)) == {BatchStatus.DONE}
    return written


def _output(message: dict[str, Any]) -> tuple[Any, list[tuple[str, Any]]]:
    """An assistant message as (text, [(tool, parsed arguments)]): each instrumentation spaces JSON its own way."""
    calls = [
        (call["function"]["name"], json.loads(call["function"]["arguments"])) for call in message.get("tool_calls", ())
    ]
    return message["content"], calls


def _step(step: dict[str, Any]) -> tuple[Any, ...]:
    kind = step["kind"]
    if kind == "agent":
        return (kind, step["name"], step["agent_name"], step["error"])
    if kind == "message":
        return (kind, step["name"], step["role"], step["content"])
    if kind == "llm_call":
        return (
            kind,
            step["name"],
            step["model"],
            step["usage"]["input_tokens"],
            step["usage"]["output_tokens"],
            [message["role"] for message in step["input_messages"]],
            _output(step["output_message"]),
            step["error"],
        )
    if kind == "tool_call":
        return (kind, step["name"], step["tool_name"], step["tool_arguments"], step["tool_result"], step["error"])
    raise AssertionError(f"unexpected step {step}")


def _expected_steps(ticket: Ticket, names: StepNames) -> list[tuple[Any, ...]]:
    steps: list[tuple[Any, ...]] = [
        ("agent", names.agent, "ride-support", None),
        ("message", names.chat, "system", SYSTEM_PROMPT),
        ("message", names.chat, "user", ticket.question),
    ]
    history = ["system", "user"]
    for turn, (input_tokens, output_tokens) in enumerate(ticket.usage):
        if turn < len(ticket.calls):
            tool, arguments, result = ticket.calls[turn]
            steps.append(
                (
                    "llm_call",
                    names.chat,
                    MODEL,
                    input_tokens,
                    output_tokens,
                    list(history),
                    (None, [(tool, arguments)]),
                    None,
                )
            )
            steps.append(("tool_call", names.tool.format(tool=tool), tool, arguments, result, None))
            history += ["assistant", "tool"]
        else:
            steps.append(
                ("llm_call", names.chat, MODEL, input_tokens, output_tokens, list(history), (ticket.answer, []), None)
            )
    return steps


def _trajectory_check(
    keel: Keel, trace_id: str, ticket: Ticket, names: StepNames, session_id: str, listed: dict[str, Any]
) -> dict[str, Any]:
    """Compare one trajectory, as the list and the detail API give it, with what the agent did."""
    calls = len(ticket.calls)
    summary = {
        "trace_id": trace_id,
        "agent": "ride-support",
        "name": names.agent,
        "status": "ok",
        "steps": 4 + 2 * calls,  # the agent, the system and user messages, calls + 1 model calls, the calls
        "spans": 2 + 2 * calls,
        "llm_calls": calls + 1,
        "tool_calls": calls,
        "errors": 0,
        "tokens": {
            "input": ticket.input_tokens,
            "output": ticket.output_tokens,
            "total": ticket.input_tokens + ticket.output_tokens,
        },
        "session_id": session_id,
        "user_id": "rider-314",
        "input_preview": ticket.question,
        "output_preview": ticket.answer,
    }
    assert {key: listed[key] for key in summary} == summary
    assert Decimal(listed["cost"]) == ticket.cost

    response = keel.client.get(f"/api/v1/trajectories/{trace_id}", {"include_inputs": "true"})
    assert response.status_code == 200
    detail: dict[str, Any] = response.json()
    assert {key: detail[key] for key in summary} == summary
    assert Decimal(detail["cost"]) == ticket.cost

    steps = detail["step_details"]
    assert [_step(step) for step in steps] == _expected_steps(ticket, names)
    assert all(step["depth"] == (0 if step["kind"] == "agent" else 1) for step in steps)
    # Each tool step answers the tool call of the model call just before it, by the model's call id.
    model_calls = [step for step in steps if step["kind"] == "llm_call"]
    requested = [step["output_message"]["tool_calls"][0]["id"] for step in model_calls[:calls]]
    tool_steps = [step for step in steps if step["kind"] == "tool_call"]
    assert [step["tool_call_id"] for step in tool_steps] == requested
    assert len(set(requested)) == calls
    assert all(call_id for call_id in requested)

    conversation = detail["conversation"]
    assert [message["role"] for message in conversation] == [
        "system",
        "user",
        *["assistant", "tool"] * calls,
        "assistant",
    ]
    assert conversation[:2] == [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": ticket.question},
    ]
    assert [(m["tool_call_id"], json.loads(m["content"])) for m in conversation if m["role"] == "tool"] == [
        (call_id, result) for call_id, (_, _, result) in zip(requested, ticket.calls, strict=True)
    ]
    assert _output(conversation[-1]) == (ticket.answer, [])

    assert [
        (call["name"], call["call_id"], call["arguments"], call["result"], call["source"])
        for call in detail["tool_calls_detail"]
    ] == [
        (tool, call_id, arguments, result, "span")
        for call_id, (tool, arguments, result) in zip(requested, ticket.calls, strict=True)
    ]
    assert [definition["function"]["name"] for definition in detail["tool_definitions"]] == TOOL_NAMES
    return detail


def _trajectories_check(keel: Keel, trace_ids: list[str], session_id: str, names: StepNames) -> list[dict[str, Any]]:
    response = keel.client.get("/api/v1/trajectories", {"session_id": session_id, "agent": "ride-support"})
    assert response.status_code == 200
    page = response.json()
    listed = {item["trace_id"]: item for item in page["items"]}
    assert (sorted(listed), page["next_cursor"]) == (sorted(trace_ids), None)
    return [
        _trajectory_check(keel, trace_id, ticket, names, session_id, listed[trace_id])
        for trace_id, ticket in zip(trace_ids, TICKETS, strict=True)
    ]


@pytest.mark.parametrize("path", ["/v1/traces", "/api/public/otel/v1/traces"])
def test_otel_sdk_agent_configured_by_the_standard_variables(keel, workspace, tmp_path, path):
    """Keel's own OTLP path with a Bearer key, and Langfuse's path with Basic auth, as a Langfuse user
    would switch: only the endpoint and the header change."""
    if path == "/v1/traces":
        authorization = f"Bearer {keel.key}"
    else:
        authorization = "Basic " + base64.b64encode(f"pk-lf-ride-support:{keel.key}".encode()).decode()
    result = _run(
        "otel_sdk_agent.py",
        tmp_path,
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=f"{keel.url}{path}",
        OTEL_EXPORTER_OTLP_HEADERS=f"Authorization={authorization}",
        OTEL_SERVICE_NAME="ride-support",
    )
    trace_ids, session_id = _sent(result)

    assert _stored_when_answered(workspace) == 14

    details = _trajectories_check(keel, trace_ids, session_id, GEN_AI_NAMES)
    for detail in details:
        assert (detail["tags"], detail["reward"]) == ([], None)
        # The agent span carries the ticket and the answer as GenAI messages.
        assert detail["step_details"][0]["input"][0]["role"] == "user"
        assert detail["step_details"][0]["output"][0]["role"] == "assistant"


def test_otel_sdk_agent_with_keel_url_and_key(keel, workspace, tmp_path):
    result = _run("otel_sdk_agent.py", tmp_path, KEEL_URL=keel.url, KEEL_API_KEY=keel.key)
    trace_ids, session_id = _sent(result)

    assert _stored_when_answered(workspace) == 14

    _trajectories_check(keel, trace_ids, session_id, GEN_AI_NAMES)


def test_openinference_openai_agent(keel, workspace, tmp_path):
    """The official openai client against the example's fake server, traced by OpenInference's instrumentor."""
    result = _run("openinference_openai_agent.py", tmp_path, KEEL_URL=keel.url, KEEL_API_KEY=keel.key)
    trace_ids, session_id = _sent(result)

    assert _stored_when_answered(workspace) == 14

    details = _trajectories_check(keel, trace_ids, session_id, OPENINFERENCE_NAMES)
    for detail, ticket in zip(details, TICKETS, strict=True):
        agent_step = detail["step_details"][0]
        assert (agent_step["input"], agent_step["output"]) == (ticket.question, ticket.answer)
        # The instrumentor marks each model call OK; the example's own spans leave the status unset.
        assert {step["status"] for step in detail["step_details"] if step["kind"] == "llm_call"} == {"ok"}


def test_json_trajectory(keel, workspace, tmp_path):
    result = _run("json_trajectory.py", tmp_path, KEEL_URL=keel.url, KEEL_API_KEY=keel.key)
    trace_ids, session_id = _sent(result)

    assert _batches_process(workspace) == 14

    details = _trajectories_check(keel, trace_ids, session_id, JSON_NAMES)
    for detail in details:
        assert (detail["tags"], detail["reward"]) == (["example", "json-ingest"], 1.0)


@pytest.mark.parametrize(
    ("script", "complaint"),
    [
        ("otel_sdk_agent.py", "Keel did not accept 14 spans"),
        ("openinference_openai_agent.py", "Keel did not accept 14 spans"),
        ("json_trajectory.py", "Keel answered 403"),
    ],
)
def test_an_example_whose_key_may_not_ingest_fails_and_stores_nothing(keel, workspace, tmp_path, script, complaint):
    _, read_only = registry_services.apikey_create(workspace=workspace, name="read only", scopes=["read"])

    result = _run(script, tmp_path, KEEL_URL=keel.url, KEEL_API_KEY=read_only)

    assert (result.returncode, result.stdout) == (1, "")
    assert complaint in result.stderr
    assert not IngestBatch.objects.filter(workspace=workspace).exists()
    assert not Span.objects.filter(workspace=workspace).exists()
    assert not Trajectory.objects.filter(workspace=workspace).exists()
