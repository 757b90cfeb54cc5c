"""The ride-support agent instrumented by hand with the plain OpenTelemetry SDK, sending to Keel over OTLP/HTTP.

Spans follow the OpenTelemetry GenAI semantic conventions: one `invoke_agent` span per ticket (a
trace), a `chat` span per model call with the messages in and out (`gen_ai.input.messages`,
`gen_ai.output.messages`, `gen_ai.system_instructions`) and the token usage, and an `execute_tool`
span per tool call with its arguments and result. Both tickets share one `gen_ai.conversation.id`,
which Keel shows as a session. The model is `fake_chat_completion` from `ride_support.py`: no
network, no API key.

The exporter is configured by the standard variables only:

    OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:8000 \\
    OTEL_EXPORTER_OTLP_HEADERS="Authorization=Bearer $KEY" \\
    OTEL_SERVICE_NAME=ride-support \\
    .venv/bin/python examples/otel_sdk_agent.py

(or KEEL_URL and KEEL_API_KEY, which fill those in; see otlp_export.py). Prints the trace ids it sent;
exits with 1 when Keel did not accept them.
"""

from __future__ import annotations

import json
import sys
import uuid
from typing import Any

import otlp_export
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, Tracer
from ride_support import (
    AGENT_NAME,
    MODEL,
    SYSTEM_PROMPT,
    TICKETS,
    TOOL_DESCRIPTIONS,
    TOOLS,
    USER_ID,
    FakeCompletion,
    fake_chat_completion,
    tool_run,
)

PROVIDER = "keel-example-fake"  # gen_ai.provider.name: the fake model is nobody's real API


# --- OpenAI-style messages as the GenAI conventions write them -----------------------------------------


def _parts(message: dict[str, Any]) -> list[dict[str, Any]]:
    if message["role"] == "tool":
        return [
            {"type": "tool_call_response", "id": message["tool_call_id"], "response": json.loads(message["content"])}
        ]
    parts: list[dict[str, Any]] = []
    if message.get("content"):
        parts.append({"type": "text", "content": message["content"]})
    for call in message.get("tool_calls") or ():
        function = call["function"]
        parts.append(
            {
                "type": "tool_call",
                "id": call["id"],
                "name": function["name"],
                "arguments": json.loads(function["arguments"]),
            }
        )
    return parts


def _input_messages(messages: list[dict[str, Any]]) -> str:
    """`gen_ai.input.messages`: the chat history; the system prompt goes to `gen_ai.system_instructions`."""
    return json.dumps([{"role": m["role"], "parts": _parts(m)} for m in messages if m["role"] != "system"])


def _output_messages(completion: FakeCompletion) -> str:
    message = completion.message
    return json.dumps([{"role": "assistant", "parts": _parts(message), "finish_reason": completion.finish_reason}])


def _tool_definitions() -> str:
    return json.dumps([{"type": "function", **tool["function"]} for tool in TOOLS])


# --- The agent -----------------------------------------------------------------------------------------


def _chat(tracer: Tracer, messages: list[dict[str, Any]], session_id: str) -> FakeCompletion:
    with tracer.start_as_current_span(
        f"chat {MODEL}",
        kind=SpanKind.CLIENT,
        attributes={
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": PROVIDER,
            "gen_ai.request.model": MODEL,
            "gen_ai.conversation.id": session_id,
            "gen_ai.system_instructions": json.dumps([{"type": "text", "content": SYSTEM_PROMPT}]),
            "gen_ai.input.messages": _input_messages(messages),
            "gen_ai.tool.definitions": _tool_definitions(),
        },
    ) as span:
        completion = fake_chat_completion(messages)
        span.set_attributes(
            {
                "gen_ai.response.id": completion.id,
                "gen_ai.response.model": completion.model,
                "gen_ai.response.finish_reasons": [completion.finish_reason],
                "gen_ai.usage.input_tokens": completion.prompt_tokens,
                "gen_ai.usage.output_tokens": completion.completion_tokens,
                "gen_ai.output.messages": _output_messages(completion),
            }
        )
        return completion


def _execute_tool(tracer: Tracer, call: dict[str, Any]) -> dict[str, Any]:
    name = call["function"]["name"]
    arguments = call["function"]["arguments"]
    with tracer.start_as_current_span(
        f"execute_tool {name}",
        kind=SpanKind.INTERNAL,
        attributes={
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            "gen_ai.tool.type": "function",
            "gen_ai.tool.description": TOOL_DESCRIPTIONS[name],
            "gen_ai.tool.call.id": call["id"],
            "gen_ai.tool.call.arguments": arguments,
        },
    ) as span:
        result = tool_run(name, json.loads(arguments))
        span.set_attribute("gen_ai.tool.call.result", json.dumps(result))
        return result


def ticket_handle(tracer: Tracer, ticket: str, session_id: str) -> str:
    """One rider ticket, as one trace; returns its trace id."""
    user_message = {"role": "user", "content": ticket}
    with tracer.start_as_current_span(
        f"invoke_agent {AGENT_NAME}",
        kind=SpanKind.INTERNAL,
        attributes={
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": AGENT_NAME,
            "gen_ai.provider.name": PROVIDER,
            "gen_ai.request.model": MODEL,
            "gen_ai.conversation.id": session_id,
            "user.id": USER_ID,
            "gen_ai.input.messages": _input_messages([user_message]),
        },
    ) as agent_span:
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT}, user_message]
        while True:
            completion = _chat(tracer, messages, session_id)
            messages.append(completion.message)
            calls = completion.message.get("tool_calls") or []
            if not calls:
                break
            for call in calls:
                result = _execute_tool(tracer, call)
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)})
        agent_span.set_attribute("gen_ai.output.messages", _output_messages(completion))
        return format(agent_span.get_span_context().trace_id, "032x")


def main() -> int:
    otlp_export.otlp_environment_prepare(service_name=AGENT_NAME)
    exporter = otlp_export.CheckedExporter(OTLPSpanExporter())  # endpoint and headers from OTEL_EXPORTER_OTLP_*
    provider = TracerProvider()  # the resource's service.name comes from OTEL_SERVICE_NAME
    provider.add_span_processor(BatchSpanProcessor(exporter))
    tracer = provider.get_tracer("keel.examples.otel_sdk_agent", "1.0.0")

    session_id = f"chat-{uuid.uuid4().hex[:12]}"
    trace_ids = [ticket_handle(tracer, ticket, session_id) for ticket in TICKETS]
    provider.shutdown()  # flushes the batch processor: every span is sent (or has failed) after this

    if exporter.failed_spans or not exporter.exported_spans:
        print(f"Keel did not accept {exporter.failed_spans} spans; see the exporter's log above", file=sys.stderr)
        return 1
    for trace_id in trace_ids:
        print(f"sent trace {trace_id} (session {session_id})")
    print(f"Keel accepted {exporter.exported_spans} spans")
    return 0


if __name__ == "__main__":
    sys.exit(main())
