"""Realistic agent traces recorded with the OpenTelemetry SDK (GenAI conventions), for ingest tests."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from opentelemetry.trace import Status, StatusCode, Tracer


def _messages(*items: tuple[str, str]) -> str:
    return json.dumps([{"role": role, "parts": [{"type": "text", "content": text}]} for role, text in items])


def refund_conversation(
    tracer: Tracer,
    *,
    agent: str = "ride-support",
    session: str = "session-1",
    question: str = "I was charged twice for a cancelled ride",
    tool_fails: bool = False,
    prompt: tuple[str, str] | None = None,
) -> str:
    """An agent turn: a chat call that asks for a tool, the tool, a chat call that answers. Returns the trace id."""
    extra: dict[str, Any] = {}
    if prompt is not None:
        extra = {"langfuse.observation.prompt.name": prompt[0], "langfuse.observation.prompt.version": prompt[1]}
    with tracer.start_as_current_span(
        f"invoke_agent {agent}",
        attributes={
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": agent,
            "gen_ai.conversation.id": session,
        },
    ) as root:
        with tracer.start_as_current_span(
            "chat gpt-4o",
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": "gpt-4o",
                "gen_ai.usage.input_tokens": 100,
                "gen_ai.usage.output_tokens": 20,
                "gen_ai.input.messages": _messages(("user", question)),
                "gen_ai.output.messages": json.dumps(
                    [
                        {
                            "role": "assistant",
                            "parts": [
                                {
                                    "type": "tool_call",
                                    "id": "call-1",
                                    "name": "lookup_trip",
                                    "arguments": {"trip_id": "T-1"},
                                }
                            ],
                        }
                    ]
                ),
                **extra,
            },
        ):
            pass
        with tracer.start_as_current_span(
            "execute_tool lookup_trip",
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "lookup_trip",
                "gen_ai.tool.call.id": "call-1",
                "gen_ai.tool.call.arguments": '{"trip_id": "T-1"}',
                "gen_ai.tool.call.result": '{"error": "internal error", "status": 500}'
                if tool_fails
                else '{"status": "cancelled"}',
            },
        ) as tool:
            if tool_fails:
                tool.set_status(Status(StatusCode.ERROR, "trip service answered HTTP 500"))
        with tracer.start_as_current_span(
            "chat gpt-4o",
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": "gpt-4o",
                "gen_ai.usage.input_tokens": 160,
                "gen_ai.usage.output_tokens": 30,
                "gen_ai.input.messages": _messages(("user", question)),
                "gen_ai.output.messages": _messages(("assistant", "I have refunded the duplicate charge.")),
            },
        ):
            pass
        return format(root.get_span_context().trace_id, "032x")


def long_conversation(
    tracer: Tracer, *, turns: int, agent: str = "ride-support", tool_spans: bool = True, big_number: bool = False
) -> str:
    """An agent run of `turns` rounds: a chat call that asks for a tool (its input the whole history so
    far), then the tool: 2 × turns + 1 spans, or turns + 1 without `tool_spans` (the tools' results are
    then only in the next call's input, as an agent instrumented at its LLM client sends them). With
    `big_number`, every tool result carries an integer past 64 bits. Returns the trace id."""
    history: list[dict[str, Any]] = [{"role": "user", "parts": [{"type": "text", "content": "Where are my trips?"}]}]
    with tracer.start_as_current_span(
        f"invoke_agent {agent}", attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent}
    ) as root:
        for turn in range(turns):
            call = {"type": "tool_call", "id": f"call-{turn}", "name": "lookup_trip", "arguments": {"trip": turn}}
            with tracer.start_as_current_span(
                "chat gpt-4o",
                attributes={
                    "gen_ai.operation.name": "chat",
                    "gen_ai.request.model": "gpt-4o",
                    "gen_ai.usage.input_tokens": 100 + 10 * turn,
                    "gen_ai.usage.output_tokens": 20,
                    "gen_ai.input.messages": json.dumps(history),
                    "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [call]}]),
                },
            ):
                pass
            result = json.dumps({"trip": turn, "status": "done"})
            if big_number:
                result = result[:-1] + ', "ref": 123456789012345678901234567}'
            with (
                contextlib.ExitStack()
                if not tool_spans
                else tracer.start_as_current_span(
                    "execute_tool lookup_trip",
                    attributes={
                        "gen_ai.operation.name": "execute_tool",
                        "gen_ai.tool.name": "lookup_trip",
                        "gen_ai.tool.call.id": f"call-{turn}",
                        "gen_ai.tool.call.arguments": json.dumps({"trip": turn}),
                        "gen_ai.tool.call.result": result,
                    },
                )
            ):
                pass
            history += [
                {"role": "assistant", "parts": [call]},
                {"role": "tool", "parts": [{"type": "tool_call_response", "id": f"call-{turn}", "response": result}]},
            ]
        return format(root.get_span_context().trace_id, "032x")
