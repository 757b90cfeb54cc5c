"""The ride-support agent on the official `openai` client, traced by OpenInference, sending to Keel over OTLP/HTTP.

OpenInference's `OpenAIInstrumentor` (package `openinference-instrumentation-openai`) records every
chat completion the client makes as an OpenInference `LLM` span (`llm.input_messages.*`,
`llm.output_messages.*`, `llm.token_count.*`, `llm.tools.*`, `input.value`/`output.value`). The
agent adds what no client library can know: an `AGENT` span per ticket (with `agent.name`) and a
`TOOL` span per tool call (`tool.name`, `tool.id`, `tool.parameters`, the arguments as `input.value`,
the result as `output.value`), through OpenInference's own tracer. `using_attributes` puts the
session and the rider on every span.

The client talks HTTP to a fake OpenAI-compatible server that this script starts on localhost
(`ride_support.fake_openai_server`): no network, no API key. The exporter is configured by the
standard variables (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_HEADERS, OTEL_SERVICE_NAME), or by
KEEL_URL and KEEL_API_KEY (see otlp_export.py):

    KEEL_URL=http://127.0.0.1:8000 KEEL_API_KEY=$KEY .venv/bin/python examples/openinference_openai_agent.py

Needs `pip install openai openinference-instrumentation-openai opentelemetry-exporter-otlp-proto-http`
(all in Keel's `dev` extra). Prints the trace ids it sent; exits with 1 when Keel did not accept them.
"""

from __future__ import annotations

import json
import sys
import uuid
from typing import Any

import otlp_export
from openai import OpenAI
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam
from openinference.instrumentation import OITracer, TracerProvider, using_attributes
from openinference.instrumentation.openai import OpenAIInstrumentor
from openinference.semconv.trace import OpenInferenceSpanKindValues, SpanAttributes
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from ride_support import (
    AGENT_NAME,
    MODEL,
    SYSTEM_PROMPT,
    TICKETS,
    TOOL_DESCRIPTIONS,
    TOOL_PARAMETERS,
    TOOLS,
    USER_ID,
    fake_openai_server,
    tool_run,
)

TOOL_PARAMS: list[ChatCompletionToolParam] = [
    {"type": "function", "function": tool["function"]}  # the same schemas, typed for the client
    for tool in TOOLS
]


def _tool_call_run(tracer: OITracer, call_id: str, name: str, arguments_json: str) -> dict[str, Any]:
    with tracer.start_as_current_span(name, openinference_span_kind=OpenInferenceSpanKindValues.TOOL) as span:
        arguments = json.loads(arguments_json)
        span.set_tool(name=name, description=TOOL_DESCRIPTIONS[name], parameters=TOOL_PARAMETERS[name])
        span.set_attribute(SpanAttributes.TOOL_ID, call_id)
        span.set_input(arguments)
        result = tool_run(name, arguments)
        span.set_output(result)
        return result


def ticket_handle(tracer: OITracer, client: OpenAI, ticket: str) -> str:
    """One rider ticket, as one trace; returns its trace id."""
    with tracer.start_as_current_span(
        AGENT_NAME,
        openinference_span_kind=OpenInferenceSpanKindValues.AGENT,
        attributes={SpanAttributes.AGENT_NAME: AGENT_NAME},
    ) as agent_span:
        agent_span.set_input(ticket)
        messages: list[ChatCompletionMessageParam] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": ticket},
        ]
        while True:
            response = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOL_PARAMS)
            message = response.choices[0].message
            if not message.tool_calls:
                break
            messages.append(
                {
                    "role": "assistant",
                    "content": message.content,
                    "tool_calls": [
                        {
                            "id": call.id,
                            "type": "function",
                            "function": {"name": call.function.name, "arguments": call.function.arguments},
                        }
                        for call in message.tool_calls
                        if call.type == "function"
                    ],
                }
            )
            for call in message.tool_calls:
                if call.type != "function":
                    continue
                result = _tool_call_run(tracer, call.id, call.function.name, call.function.arguments)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})
        agent_span.set_output(message.content or "")
        return format(agent_span.get_span_context().trace_id, "032x")


def main() -> int:
    otlp_export.otlp_environment_prepare(service_name=AGENT_NAME)
    exporter = otlp_export.CheckedExporter(OTLPSpanExporter())  # endpoint and headers from OTEL_EXPORTER_OTLP_*
    provider = TracerProvider()  # OpenInference's provider: an OpenTelemetry SDK TracerProvider with OI's tracer
    provider.add_span_processor(BatchSpanProcessor(exporter))
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    tracer = provider.get_tracer("keel.examples.openinference_openai_agent", "1.0.0")

    session_id = f"chat-{uuid.uuid4().hex[:12]}"
    with fake_openai_server() as base_url:
        client = OpenAI(base_url=base_url, api_key="fake-key-for-the-local-fake-server", max_retries=0)
        with using_attributes(session_id=session_id, user_id=USER_ID):
            trace_ids = [ticket_handle(tracer, client, ticket) for ticket in TICKETS]
        client.close()
    instrumentor.uninstrument()
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
