"""Trajectories for the dashboard's tests, recorded with the OpenTelemetry SDK (tracing.demo's recorder)
and stored through Keel's ingest path, as an instrumented agent's would be."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from agent_registry import services as registry_services
from agent_registry.models import Workspace
from tracing import demo, services
from tracing.models import Trajectory

SUPPORT = demo.AgentSpec(
    slug="ride-support",
    model="gpt-4o",
    prompt_name="support/triage",
    variables={"name": "Ada", "topic": "refunds"},
    tools=demo.RIDE_TOOLS,
    model_ms=(300, 900),
)


def ingest(workspace: Workspace, recorder: demo.Recorder) -> None:
    """Send what the recorder holds through `ingest_otlp_accept`, which stores it at once."""
    api_key, _ = registry_services.apikey_create(workspace=workspace, name="test ingest", scopes=["ingest"])
    services.ingest_otlp_accept(
        api_key=api_key, body=demo.otlp_encode(recorder.spans()), content_type=demo.PROTOBUF, content_encoding=""
    )
    recorder.shutdown()


def conversation(
    workspace: Workspace,
    key: str,
    *,
    question: str = "I was charged twice for trip T-1",
    answer: str = "I refunded the duplicate charge.",
    tools: Sequence[tuple[str, dict[str, Any], Any]] = (("lookup_trip", {"trip_id": "T-1"}, {"status": "ok"}),),
    failing_tool: str | None = None,
    session: str = "session-1",
    user: str = "rider-1",
    tags: Sequence[str] = ("refund",),
    started_at: datetime | None = None,
    prompt_version: int = 1,
    agent: demo.AgentSpec = SUPPORT,
) -> Trajectory:
    """One agent turn: the user asks, the model calls `tools` one after the other, then answers."""
    recorder = demo.Recorder(agent.slug)
    recorder.ids.begin(key)
    dialogue = demo.Dialogue(
        agent=agent,
        session_id=session,
        user_id=user,
        system_prompt="You are ride support.",
        prompt_version=prompt_version,
    )
    turn = demo.Turn(recorder, dialogue, demo.Dice(key), started_at or timezone.now() - timedelta(minutes=5))
    with turn.agent_run(tags=tags):
        turn.user(question)
        for name, arguments, result in tools:
            turn.tool(
                name, arguments, result, error=f"TimeoutError: {name} timed out" if name == failing_tool else None
            )
        turn.answer(answer)
    ingest(workspace, recorder)
    return Trajectory.objects.get(workspace=workspace, trace_id=demo.trace_hex(key))


def long_trajectory(workspace: Workspace, key: str, *, tool_calls: int) -> Trajectory:
    """A run of `tool_calls` model calls, each asking for one tool: about two steps per call.

    Each model call sends only its own short exchange, so the trace stays small however long it gets.
    """
    recorder = demo.Recorder("long-runner")
    recorder.ids.begin(key)
    tracer = recorder.tracer
    clock = int((timezone.now() - timedelta(minutes=10)).timestamp() * 1e9)
    root = tracer.start_span(
        "invoke_agent long-runner",
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "ride-support"},
        start_time=clock,
    )
    with trace.use_span(root, end_on_exit=False):
        for number in range(tool_calls):
            call_id = f"call-{number}"
            arguments = f'{{"trip_id": "T-{number}"}}'
            messages = [{"role": "user", "content": f"Check trip T-{number}"}]
            output = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": call_id, "type": "function", "function": {"name": "lookup_trip", "arguments": arguments}}
                ],
            }
            chat = tracer.start_span(
                "chat gpt-4o",
                kind=SpanKind.CLIENT,
                attributes={
                    "gen_ai.operation.name": "chat",
                    "gen_ai.request.model": "gpt-4o",
                    "gen_ai.usage.input_tokens": 20,
                    "gen_ai.usage.output_tokens": 5,
                    "gen_ai.input.messages": json.dumps(messages),
                    "gen_ai.output.messages": json.dumps([output]),
                },
                start_time=clock,
            )
            clock += 3_000_000
            chat.end(end_time=clock)
            tool = tracer.start_span(
                "execute_tool lookup_trip",
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": "lookup_trip",
                    "gen_ai.tool.call.id": call_id,
                    "gen_ai.tool.call.arguments": arguments,
                    "gen_ai.tool.call.result": f'{{"trip_id": "T-{number}", "status": "completed"}}',
                },
                start_time=clock,
            )
            clock += 1_000_000
            if number == tool_calls - 1:
                tool.set_status(Status(StatusCode.ERROR, "lookup failed"))
            tool.end(end_time=clock)
    root.end(end_time=clock + 1_000_000)
    ingest(workspace, recorder)
    return Trajectory.objects.get(workspace=workspace, trace_id=demo.trace_hex(key))
