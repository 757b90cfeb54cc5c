"""Mapping spans to Keel's form: one test per attribute convention family, and the priority between them."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.trace import SpanKind, Status, StatusCode

from tracing import otlp, records, steps
from tracing.tests.conftest import OtelRecorder, decode_pb, pb_request, pb_span

JSON = otlp.CONTENT_TYPE_JSON
PROTOBUF = otlp.CONTENT_TYPE_PROTOBUF
BOTH = pytest.mark.parametrize("content_type", [PROTOBUF, JSON])

WEATHER_PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Current weather for a city", "parameters": WEATHER_PARAMETERS},
}


def raw_span(attributes: dict[str, Any], **fields: Any) -> otlp.RawSpan:
    values: dict[str, Any] = {
        "trace_id": "5b8efff798038103d269b633813fc60c",
        "span_id": "eee19b7ec3c1b174",
        "parent_span_id": None,
        "name": "span",
        "kind": 1,
        "start_time_ns": 1_000,
        "end_time_ns": 2_000,
        "status_code": 0,
        "status_message": "",
        "attributes": attributes,
        "events": (),
        "resource_attributes": {},
        "scope_name": "",
        "scope_version": "",
        "truncated_attributes": {},
    }
    values.update(fields)
    return otlp.RawSpan(**values)


def structured(value: Any) -> AnyValue:
    """A Python value as a structured OTLP AnyValue (what the SDK cannot build, other exporters do)."""
    if isinstance(value, dict):
        return AnyValue(
            kvlist_value=KeyValueList(values=[KeyValue(key=key, value=structured(item)) for key, item in value.items()])
        )
    if isinstance(value, list):
        return AnyValue(array_value=ArrayValue(values=[structured(item) for item in value]))
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    return AnyValue(string_value=str(value))


# --- Keel ---------------------------------------------------------------------------------------------


@BOTH
def test_keel_attributes(otel: OtelRecorder, content_type: str) -> None:
    with otel.tracer().start_as_current_span("refund step") as span:
        span.set_attributes(
            {
                "keel.span.type": "tool",
                "keel.session.id": "session-7",
                "keel.user.id": "user-3",
                "keel.agent.name": "refunds",
                "keel.input": json.dumps({"order": "A-1"}),
                "keel.output": "refunded",
                "keel.prompt.name": "refund-policy",
                "keel.prompt.version": 4,
                "keel.tags": ["billing", "refund"],
                "keel.metadata.region": "eu",
                "keel.metadata.attempt": 2,
                "keel.tool.definitions": json.dumps([WEATHER_TOOL]),
                "keel.task.id": "task-42",
                "keel.reward": 0.75,
                "custom.flag": True,
            }
        )

    mapped = otel.span(content_type)

    assert mapped.span_type == "tool"
    assert (mapped.session_id, mapped.user_id, mapped.agent_name) == ("session-7", "user-3", "refunds")
    assert mapped.input == {"order": "A-1"}
    assert mapped.output == "refunded"
    assert (mapped.tool_name, mapped.tool_arguments, mapped.tool_result) == (
        "refund step",
        {"order": "A-1"},
        "refunded",
    )
    assert (mapped.prompt_name, mapped.prompt_version) == ("refund-policy", "4")
    assert mapped.tags == ("billing", "refund")
    assert mapped.metadata == {"region": "eu", "attempt": 2}
    assert mapped.tool_definitions == (WEATHER_TOOL,)
    assert (mapped.task_id, mapped.reward) == ("task-42", 0.75)
    assert mapped.service_name == "checkout-agent"
    assert (mapped.scope_name, mapped.scope_version) == ("keel.tests", "1.0.0")
    assert mapped.attributes == {"custom.flag": True}


def test_keel_attributes_win_over_every_other_convention() -> None:
    mapped = otlp.map_span(
        raw_span(
            {
                "keel.span.type": "agent",
                "langfuse.observation.type": "generation",
                "openinference.span.kind": "TOOL",
                "gen_ai.operation.name": "chat",
                "keel.session.id": "keel",
                "langfuse.session.id": "langfuse",
                "session.id": "openinference",
                "gen_ai.conversation.id": "gen_ai",
                "keel.user.id": "keel-user",
                "langfuse.user.id": "langfuse-user",
                "user.id": "oi-user",
                "keel.agent.name": "keel-agent",
                "agent.name": "oi-agent",
                "gen_ai.agent.name": "gen-ai-agent",
                "keel.input": "keel input",
                "langfuse.observation.input": "langfuse input",
                "input.value": "oi input",
                "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": "x"}]}]),
                "keel.prompt.name": "keel-prompt",
                "langfuse.observation.prompt.name": "langfuse-prompt",
                "gen_ai.prompt.name": "gen-ai-prompt",
                "keel.tags": "a, b",
                "langfuse.trace.tags": ["c"],
                "tag.tags": ["d"],
                "keel.metadata.shared": "keel",
                "langfuse.observation.metadata.shared": "langfuse",
                "metadata": json.dumps({"shared": "openinference", "only_oi": 1}),
            }
        )
    )

    assert mapped.span_type == "agent"
    assert (mapped.session_id, mapped.user_id, mapped.agent_name) == ("keel", "keel-user", "keel-agent")
    assert mapped.input == "keel input"
    assert mapped.prompt_name == "keel-prompt"
    assert mapped.tags == ("a", "b")
    assert mapped.metadata == {"shared": "keel", "only_oi": 1}
    # What lost to a higher-priority attribute is kept, not dropped.
    assert mapped.attributes == {
        "langfuse.observation.type": "generation",
        "openinference.span.kind": "TOOL",
        "gen_ai.operation.name": "chat",
        "langfuse.session.id": "langfuse",
        "session.id": "openinference",
        "gen_ai.conversation.id": "gen_ai",
        "langfuse.user.id": "langfuse-user",
        "user.id": "oi-user",
        "agent.name": "oi-agent",
        "gen_ai.agent.name": "gen-ai-agent",
        "langfuse.observation.input": "langfuse input",
        "input.value": "oi input",
        "gen_ai.input.messages": '[{"role": "user", "parts": [{"type": "text", "content": "x"}]}]',
        "langfuse.observation.prompt.name": "langfuse-prompt",
        "gen_ai.prompt.name": "gen-ai-prompt",
        "langfuse.trace.tags": ["c"],
        "tag.tags": ["d"],
    }


# --- Langfuse ----------------------------------------------------------------------------------------------


@BOTH
def test_langfuse_attributes(otel: OtelRecorder, content_type: str) -> None:
    with otel.tracer("langfuse-sdk", "3.2.1").start_as_current_span("OpenAI-generation") as span:
        span.set_attributes(
            {
                "langfuse.observation.type": "generation",
                "langfuse.observation.input": json.dumps(
                    {
                        "messages": [
                            {"role": "system", "content": "You are terse."},
                            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
                        ],
                        "tools": [WEATHER_TOOL],
                    }
                ),
                "langfuse.observation.output": json.dumps(
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                            }
                        ],
                    }
                ),
                "langfuse.observation.model.name": "gpt-4o-mini",
                "langfuse.observation.usage_details": json.dumps(
                    {"input": 30, "output": 12, "total": 62, "input_cached_tokens": 20}
                ),
                "langfuse.observation.cost_details": json.dumps({"input": 0.0001, "output": 0.0002}),
                "langfuse.observation.prompt.name": "weather-bot",
                "langfuse.observation.prompt.version": 3,
                "langfuse.observation.level": "ERROR",
                "langfuse.observation.status_message": "upstream timeout",
                "langfuse.observation.metadata.request_id": "r-1",
                "langfuse.trace.name": "weather chat",
                "langfuse.trace.tags": ["prod"],
                "langfuse.trace.metadata": json.dumps({"team": "support"}),
                "langfuse.session.id": "lf-session",
                "langfuse.user.id": "lf-user",
                "langfuse.environment": "production",
            }
        )

    mapped = otel.span(content_type)

    assert mapped.span_type == "generation"
    assert mapped.input == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Weather in Paris?"},
    ]
    assert mapped.output == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        }
    ]
    assert mapped.tool_definitions == (WEATHER_TOOL,)
    assert (mapped.request_model, mapped.response_model, mapped.model) == ("gpt-4o-mini", "gpt-4o-mini", "gpt-4o-mini")
    assert mapped.usage == otlp.Usage(input_tokens=50, output_tokens=12, total_tokens=62, cache_read_tokens=20)
    assert mapped.cost_usd == pytest.approx(0.0003)
    assert (mapped.prompt_name, mapped.prompt_version) == ("weather-bot", "3")
    assert (mapped.status, mapped.status_message) == ("error", "upstream timeout")
    assert (mapped.error_type, mapped.error_message) == (None, "upstream timeout")
    assert mapped.trace_name == "weather chat"
    assert mapped.tags == ("prod",)
    assert mapped.metadata == {"team": "support", "request_id": "r-1"}
    assert (mapped.session_id, mapped.user_id) == ("lf-session", "lf-user")
    assert mapped.attributes == {
        "langfuse.observation.type": "generation",
        "langfuse.observation.level": "ERROR",
        "langfuse.environment": "production",
    }


def test_langfuse_trace_input_and_output_stand_in_when_the_observation_has_none() -> None:
    mapped = otlp.map_span(
        raw_span({"langfuse.trace.input": json.dumps({"question": "why?"}), "langfuse.trace.output": "because"})
    )

    assert (mapped.span_type, mapped.input, mapped.output) == ("other", {"question": "why?"}, "because")


def test_anthropic_content_blocks_become_openai_style_messages() -> None:
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
            ],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "12°C"}]},
    ]

    mapped = otlp.map_span(
        raw_span({"langfuse.observation.type": "generation", "langfuse.observation.input": json.dumps(history)})
    )

    assert mapped.input == [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "content": "12°C", "tool_call_id": "toolu_1"},
    ]


# --- OpenInference ---------------------------------------------------------------------------------------


@BOTH
def test_openinference_llm_span(otel: OtelRecorder, content_type: str) -> None:
    with otel.tracer("openinference.instrumentation.openai").start_as_current_span("ChatCompletion") as span:
        span.set_attributes(
            {
                "openinference.span.kind": "LLM",
                "llm.model_name": "gpt-4o-2024-08-06",
                "llm.input_messages.0.message.role": "system",
                "llm.input_messages.0.message.content": "You are terse.",
                "llm.input_messages.1.message.role": "user",
                "llm.input_messages.1.message.contents.0.message_content.type": "text",
                "llm.input_messages.1.message.contents.0.message_content.text": "What is in this picture?",
                "llm.input_messages.1.message.contents.1.message_content.type": "image",
                "llm.input_messages.1.message.contents.1.message_content.image.image.url": "https://x.test/a.png",
                "llm.input_messages.2.message.role": "assistant",
                "llm.input_messages.2.message.tool_calls.0.tool_call.id": "call_9",
                "llm.input_messages.2.message.tool_calls.0.tool_call.function.name": "describe",
                "llm.input_messages.2.message.tool_calls.0.tool_call.function.arguments": '{"detail": "high"}',
                "llm.input_messages.3.message.role": "tool",
                "llm.input_messages.3.message.tool_call_id": "call_9",
                "llm.input_messages.3.message.name": "describe",
                "llm.input_messages.3.message.content": "a cat",
                "llm.output_messages.0.message.role": "assistant",
                "llm.output_messages.0.message.content": "A cat.",
                "llm.token_count.prompt": 812,
                "llm.token_count.completion": 3,
                "llm.token_count.total": 815,
                "llm.token_count.prompt_details.cache_read": 512,
                "llm.token_count.completion_details.reasoning": 0,
                "llm.cost.total": 0.0021,
                "llm.tools.0.tool.json_schema": json.dumps(WEATHER_TOOL),
                "llm.prompt_template.version": "v2",
                "llm.prompt_template.template": "Describe {image}",
                "session.id": "oi-session",
                "user.id": "oi-user",
                "tag.tags": ["vision"],
                "metadata": json.dumps({"experiment": "b"}),
                "input.value": '{"model": "gpt-4o"}',
                "input.mime_type": "application/json",
                "llm.provider": "openai",
            }
        )

    mapped = otel.span(content_type)

    assert mapped.span_type == "generation"
    assert mapped.input == [
        {"role": "system", "content": "You are terse."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in this picture?"},
                {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_9",
                    "type": "function",
                    "function": {"name": "describe", "arguments": '{"detail": "high"}'},
                }
            ],
        },
        {"role": "tool", "content": "a cat", "tool_call_id": "call_9", "name": "describe"},
    ]
    assert mapped.output == [{"role": "assistant", "content": "A cat."}]
    assert (mapped.request_model, mapped.response_model) == ("gpt-4o-2024-08-06", "gpt-4o-2024-08-06")
    assert mapped.usage == otlp.Usage(
        input_tokens=812, output_tokens=3, total_tokens=815, cache_read_tokens=512, reasoning_tokens=0
    )
    assert mapped.cost_usd == 0.0021
    assert mapped.tool_definitions == (WEATHER_TOOL,)
    assert mapped.prompt_version == "v2"
    assert (mapped.session_id, mapped.user_id) == ("oi-session", "oi-user")
    assert mapped.tags == ("vision",)
    assert mapped.metadata == {"experiment": "b"}
    assert mapped.attributes == {
        "openinference.span.kind": "LLM",
        "llm.prompt_template.template": "Describe {image}",
        "input.value": '{"model": "gpt-4o"}',
        "input.mime_type": "application/json",
        "llm.provider": "openai",
    }


def test_openinference_tool_span() -> None:
    mapped = otlp.map_span(
        raw_span(
            {
                "openinference.span.kind": "TOOL",
                "tool.name": "get_weather",
                "tool.description": "Current weather for a city",
                "tool.parameters": json.dumps(WEATHER_PARAMETERS),
                "tool_call.id": "call_1",
                "input.value": '{"city": "Paris"}',
                "input.mime_type": "application/json",
                "output.value": "12°C and rain",
                "output.mime_type": "text/plain",
            },
            name="get_weather",
        )
    )

    assert mapped.span_type == "tool"
    assert (mapped.tool_name, mapped.tool_call_id) == ("get_weather", "call_1")
    assert (mapped.tool_arguments, mapped.tool_result) == ({"city": "Paris"}, "12°C and rain")
    assert (mapped.input, mapped.output) == ({"city": "Paris"}, "12°C and rain")
    assert mapped.tool_definitions == (WEATHER_TOOL,)
    assert mapped.attributes == {"openinference.span.kind": "TOOL"}


def test_openinference_chain_and_retriever_spans_keep_their_values() -> None:
    chain = otlp.map_span(
        raw_span({"openinference.span.kind": "CHAIN", "input.value": "plan the trip", "output.value": '["a", "b"]'})
    )
    reranker = otlp.map_span(raw_span({"openinference.span.kind": "RERANKER"}))
    prompt = otlp.map_span(raw_span({"openinference.span.kind": "PROMPT"}))

    assert (chain.span_type, chain.input, chain.output) == ("chain", "plan the trip", ["a", "b"])
    assert reranker.span_type == "retriever"
    assert prompt.span_type == "other"


def test_openinference_completions_api_prompts_and_choices() -> None:
    mapped = otlp.map_span(
        raw_span(
            {
                "openinference.span.kind": "LLM",
                "llm.prompts.0.prompt.text": "def fib(n):",
                "llm.choices.0.completion.text": " return n",
            }
        )
    )

    assert mapped.input == [{"role": "user", "content": "def fib(n):"}]
    assert mapped.output == [{"role": "assistant", "content": " return n"}]
    assert mapped.attributes == {"openinference.span.kind": "LLM"}


# --- OpenTelemetry GenAI, current conventions ----------------------------------------------------------


@BOTH
def test_gen_ai_chat_span_with_messages_as_json_strings(otel: OtelRecorder, content_type: str) -> None:
    input_messages = [
        {"role": "user", "parts": [{"type": "text", "content": "Weather in Paris?"}]},
        {
            "role": "assistant",
            "parts": [{"type": "tool_call", "id": "call_1", "name": "get_weather", "arguments": {"city": "Paris"}}],
        },
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "call_1", "response": {"temp_c": 12}}]},
    ]
    output_messages = [
        {
            "role": "assistant",
            "parts": [
                {"type": "reasoning", "content": "It is cold."},
                {"type": "text", "content": "It is 12°C in Paris."},
            ],
            "finish_reason": "stop",
        }
    ]
    with otel.tracer("opentelemetry.instrumentation.openai_v2").start_as_current_span(
        "chat gpt-4o", kind=SpanKind.CLIENT
    ) as span:
        span.set_attributes(
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": "openai",
                "gen_ai.request.model": "gpt-4o",
                "gen_ai.response.model": "gpt-4o-2024-08-06",
                "gen_ai.response.id": "chatcmpl-1",
                "gen_ai.usage.input_tokens": 31,
                "gen_ai.usage.output_tokens": 9,
                "gen_ai.usage.cache_read.input_tokens": 16,
                "gen_ai.usage.reasoning.output_tokens": 4,
                "gen_ai.system_instructions": json.dumps([{"type": "text", "content": "Answer in one line."}]),
                "gen_ai.input.messages": json.dumps(input_messages),
                "gen_ai.output.messages": json.dumps(output_messages),
                "gen_ai.tool.definitions": json.dumps(
                    [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]
                ),
                "gen_ai.conversation.id": "conv_5j66",
                "gen_ai.agent.name": "weather-agent",
                "gen_ai.prompt.name": "weather-v1",
            }
        )

    mapped = otel.span(content_type)

    assert (mapped.span_type, mapped.kind) == ("generation", "client")
    assert mapped.input == [
        {"role": "system", "content": "Answer in one line."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "content": '{"temp_c":12}', "tool_call_id": "call_1"},
    ]
    assert mapped.output == [
        {"role": "assistant", "content": "It is 12°C in Paris.", "reasoning_content": "It is cold."}
    ]
    assert (mapped.request_model, mapped.response_model) == ("gpt-4o", "gpt-4o-2024-08-06")
    assert mapped.usage == otlp.Usage(
        input_tokens=31, output_tokens=9, total_tokens=40, cache_read_tokens=16, reasoning_tokens=4
    )
    assert mapped.tool_definitions == (
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
    )
    assert (mapped.session_id, mapped.agent_name, mapped.prompt_name) == ("conv_5j66", "weather-agent", "weather-v1")
    assert mapped.attributes == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.response.id": "chatcmpl-1",
    }


def test_gen_ai_messages_in_structured_form() -> None:
    request = pb_request(
        pb_span(
            attributes=[
                KeyValue(key="gen_ai.operation.name", value=AnyValue(string_value="chat")),
                KeyValue(
                    key="gen_ai.input.messages",
                    value=structured([{"role": "user", "parts": [{"type": "text", "content": "hi"}]}]),
                ),
                KeyValue(
                    key="gen_ai.output.messages",
                    value=structured(
                        [
                            {
                                "role": "assistant",
                                "parts": [{"type": "text", "content": "hello"}],
                                "finish_reason": "stop",
                            }
                        ]
                    ),
                ),
                KeyValue(key="gen_ai.system_instructions", value=structured([{"type": "text", "content": "be kind"}])),
            ]
        )
    )

    (mapped,) = otlp.map_spans(decode_pb(request).spans)

    assert mapped.input == [{"role": "system", "content": "be kind"}, {"role": "user", "content": "hi"}]
    assert mapped.output == [{"role": "assistant", "content": "hello"}]
    assert mapped.attributes == {"gen_ai.operation.name": "chat"}


@BOTH
def test_gen_ai_execute_tool_span(otel: OtelRecorder, content_type: str) -> None:
    with otel.tracer().start_as_current_span("execute_tool get_weather") as span:
        span.set_attributes(
            {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "get_weather",
                "gen_ai.tool.call.id": "call_1",
                "gen_ai.tool.type": "function",
                "gen_ai.tool.call.arguments": '{"city": "Paris"}',
                "gen_ai.tool.call.result": '{"temp_c": 12}',
            }
        )

    mapped = otel.span(content_type)

    assert mapped.span_type == "tool"
    assert (mapped.tool_name, mapped.tool_call_id) == ("get_weather", "call_1")
    assert (mapped.tool_arguments, mapped.tool_result) == ({"city": "Paris"}, {"temp_c": 12})
    assert (mapped.input, mapped.output) == ({"city": "Paris"}, {"temp_c": 12})
    assert mapped.attributes == {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.type": "function"}


def test_a_tool_span_without_a_tool_name_takes_it_from_the_span_name() -> None:
    mapped = otlp.map_span(raw_span({"gen_ai.operation.name": "execute_tool"}, name="execute_tool search_orders"))

    assert mapped.tool_name == "search_orders"


@BOTH
def test_gen_ai_invoke_agent_span(otel: OtelRecorder, content_type: str) -> None:
    with otel.tracer().start_as_current_span("invoke_agent Math Tutor") as span:
        span.set_attributes(
            {
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": "Math Tutor",
                "gen_ai.agent.id": "asst_1",
                "gen_ai.conversation.id": "conv_1",
                "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": "2+2?"}]}]),
                "gen_ai.output.messages": json.dumps(
                    [{"role": "assistant", "parts": [{"type": "text", "content": "4"}]}]
                ),
            }
        )

    mapped = otel.span(content_type)

    assert (mapped.span_type, mapped.agent_name, mapped.session_id) == ("agent", "Math Tutor", "conv_1")
    assert mapped.input == [{"role": "user", "content": "2+2?"}]
    assert mapped.output == [{"role": "assistant", "content": "4"}]


# --- Finish reasons ---------------------------------------------------------------------------------------


def finish_reasons_of(attributes: dict[str, Any], **fields: Any) -> tuple[str, ...]:
    return otlp.map_span(raw_span({"gen_ai.operation.name": "chat", **attributes}, **fields)).finish_reasons


def openai_response(*reasons: str) -> str:
    choices = [
        {"index": index, "message": {"role": "assistant", "content": "Monday"}, "finish_reason": reason}
        for index, reason in enumerate(reasons)
    ]
    return json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "choices": choices})


@BOTH
def test_gen_ai_finish_reasons_attribute_is_read_and_kept(otel: OtelRecorder, content_type: str) -> None:
    with otel.tracer().start_as_current_span("chat gpt-4o") as span:
        span.set_attributes({"gen_ai.operation.name": "chat", "gen_ai.response.finish_reasons": ["length", "stop"]})

    mapped = otel.span(content_type)

    assert mapped.finish_reasons == ("length", "stop")
    # Still passed on by the exports, which forward the attributes Keel did not map to a name of theirs.
    assert mapped.attributes == {"gen_ai.operation.name": "chat", "gen_ai.response.finish_reasons": ["length", "stop"]}


@pytest.mark.parametrize(
    ("attributes", "reasons"),
    [
        # The GenAI conventions' output messages.
        (
            {
                "gen_ai.output.messages": json.dumps(
                    [{"role": "assistant", "parts": [{"type": "text", "content": "Mon"}], "finish_reason": "length"}]
                )
            },
            ("length",),
        ),
        # OpenInference: the messages are flattened, the response as sent is in output.value.
        (
            {
                "openinference.span.kind": "LLM",
                "llm.output_messages.0.message.role": "assistant",
                "llm.output_messages.0.message.content": "Monday",
                "output.value": openai_response("length"),
            },
            ("length",),
        ),
        ({"openinference.span.kind": "LLM", "output.value": openai_response("stop", "length")}, ("stop", "length")),
        ({"openinference.span.kind": "LLM", "llm.finish_reason": "length"}, ("length",)),
        # Langfuse with an Anthropic message as the output.
        (
            {
                "langfuse.observation.type": "generation",
                "langfuse.observation.output": json.dumps(
                    {"role": "assistant", "content": [{"type": "text", "text": "Mon"}], "stop_reason": "max_tokens"}
                ),
            },
            ("max_tokens",),
        ),
        # The older GenAI attributes, and OpenLLMetry's.
        ({"gen_ai.completion.0.role": "assistant", "gen_ai.completion.0.finish_reason": "length"}, ("length",)),
        ({"llm.response.finish_reason": "length"}, ("length",)),
        # The span's own attribute wins over its messages; text that is not a reason is none.
        (
            {
                "gen_ai.response.finish_reasons": json.dumps(["stop"]),
                "gen_ai.output.messages": json.dumps([{"role": "assistant", "content": "a", "finish_reason": "x"}]),
            },
            ("stop",),
        ),
        ({"gen_ai.response.finish_reasons": [], "llm.finish_reason": ""}, ()),
        ({"gen_ai.output.messages": json.dumps([{"role": "assistant", "content": "a"}])}, ()),
    ],
)
def test_finish_reasons_are_read_from_every_convention(attributes: dict[str, Any], reasons: tuple[str, ...]) -> None:
    assert finish_reasons_of(attributes) == reasons


def test_finish_reasons_of_choice_events() -> None:
    choice = otlp.SpanEvent(
        "gen_ai.choice",
        5,
        {"index": 0, "finish_reason": "length", "message": json.dumps({"role": "assistant", "content": "Mon"})},
    )

    assert finish_reasons_of({}, events=(choice,)) == ("length",)


def test_finish_reasons_survive_storage_and_rows_from_before_read_as_none() -> None:
    mapped = otlp.map_span(raw_span({"gen_ai.operation.name": "chat", "gen_ai.response.finish_reasons": ["length"]}))
    record = records.span_record(mapped)
    columns = {field.name: getattr(record, field.name) for field in dataclasses.fields(record)}
    data = json.loads(record.data)

    assert records.span_from_record(columns, data) == mapped
    del data["finish_reasons"]
    assert records.span_from_record(columns, data).finish_reasons == ()


def test_a_tool_spans_arguments_and_result_are_stored_once_and_read_back() -> None:
    arguments, result = {"order_id": "A-1", "reason": "late"}, {"status": "in transit", "eta": "2 days"}
    mapped = otlp.map_span(
        raw_span(
            {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "lookup_order",
                "gen_ai.tool.call.arguments": json.dumps(arguments),
                "gen_ai.tool.call.result": json.dumps(result),
            }
        )
    )
    assert (mapped.span_type, mapped.tool_arguments, mapped.tool_result) == ("tool", arguments, result)
    record = records.span_record(mapped)
    columns = {field.name: getattr(record, field.name) for field in dataclasses.fields(record)}
    data = json.loads(record.data)

    assert "tool_arguments" not in data
    assert "tool_result" not in data
    assert (data["input"], data["output"]) == (arguments, result)
    assert record.data.count('"late"') == 1
    assert records.span_from_record(columns, data) == mapped


def test_tool_arguments_and_results_that_differ_from_input_and_output_keep_their_own_keys() -> None:
    # A generation span that names a tool call: input and output are its messages, not the call's.
    mapped = otlp.map_span(
        raw_span(
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.input.messages": json.dumps([{"role": "user", "content": "where is A-1?"}]),
                "gen_ai.tool.call.arguments": json.dumps({"order_id": "A-1"}),
            }
        )
    )
    assert mapped.tool_arguments == {"order_id": "A-1"}
    assert mapped.tool_result is None
    record = records.span_record(mapped)
    columns = {field.name: getattr(record, field.name) for field in dataclasses.fields(record)}
    data = json.loads(record.data)

    assert data["tool_arguments"] == {"order_id": "A-1"}
    assert data["tool_result"] is None
    assert records.span_from_record(columns, data) == mapped

    # Rows stored before tool spans kept their arguments once still read as they were written.
    stored_before = {**data, "tool_arguments": {"order_id": "A-2"}, "input": None}
    assert records.span_from_record(columns, stored_before).tool_arguments == {"order_id": "A-2"}


# --- OpenTelemetry GenAI, older conventions --------------------------------------------------------------


@BOTH
def test_gen_ai_older_indexed_prompt_and_completion_attributes(otel: OtelRecorder, content_type: str) -> None:
    with otel.tracer("opentelemetry.instrumentation.openai").start_as_current_span("openai.chat") as span:
        span.set_attributes(
            {
                "gen_ai.system": "openai",
                "gen_ai.request.model": "gpt-4",
                "gen_ai.usage.prompt_tokens": 20,
                "gen_ai.usage.completion_tokens": 7,
                "gen_ai.prompt.0.role": "system",
                "gen_ai.prompt.0.content": "Be brief.",
                "gen_ai.prompt.1.role": "user",
                "gen_ai.prompt.1.content": "Book a table",
                "gen_ai.completion.0.role": "assistant",
                "gen_ai.completion.0.finish_reason": "tool_calls",
                "gen_ai.completion.0.tool_calls.0.id": "call_7",
                "gen_ai.completion.0.tool_calls.0.name": "book",
                "gen_ai.completion.0.tool_calls.0.arguments": '{"seats": 2}',
            }
        )

    mapped = otel.span(content_type)

    assert mapped.span_type == "generation"
    assert mapped.input == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Book a table"}]
    assert mapped.output == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_7", "type": "function", "function": {"name": "book", "arguments": '{"seats": 2}'}}
            ],
        }
    ]
    assert mapped.usage == otlp.Usage(input_tokens=20, output_tokens=7, total_tokens=27)
    assert mapped.attributes == {"gen_ai.system": "openai"}


@BOTH
def test_gen_ai_older_message_events(otel: OtelRecorder, content_type: str) -> None:
    with otel.tracer().start_as_current_span("chat gpt-4") as span:
        span.set_attribute("gen_ai.operation.name", "chat")
        span.add_event("gen_ai.system.message", {"gen_ai.system": "openai", "content": "Be brief."})
        span.add_event("gen_ai.user.message", {"gen_ai.system": "openai", "content": "Weather?"})
        span.add_event(
            "gen_ai.assistant.message",
            {
                "gen_ai.system": "openai",
                "tool_calls": json.dumps(
                    [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]
                ),
            },
        )
        span.add_event("gen_ai.tool.message", {"gen_ai.system": "openai", "id": "call_1", "content": "sunny"})
        span.add_event(
            "gen_ai.choice",
            {
                "gen_ai.system": "openai",
                "index": 0,
                "finish_reason": "stop",
                "message": json.dumps({"role": "assistant", "content": "Sunny."}),
            },
        )

    mapped = otel.span(content_type)

    assert mapped.input == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
    ]
    assert mapped.output == [{"role": "assistant", "content": "Sunny."}]
    assert [event.name for event in mapped.events] == [
        "gen_ai.system.message",
        "gen_ai.user.message",
        "gen_ai.assistant.message",
        "gen_ai.tool.message",
        "gen_ai.choice",
    ]


def test_gen_ai_content_prompt_and_completion_events() -> None:
    events = (
        otlp.SpanEvent(
            "gen_ai.content.prompt", 1_100, {"gen_ai.prompt": json.dumps([{"role": "user", "content": "hi"}])}
        ),
        otlp.SpanEvent(
            "gen_ai.content.completion",
            1_900,
            {"gen_ai.completion": json.dumps([{"role": "assistant", "content": "yo"}])},
        ),
    )

    mapped = otlp.map_span(raw_span({"gen_ai.request.model": "gpt-4"}, events=events))

    assert mapped.input == [{"role": "user", "content": "hi"}]
    assert mapped.output == [{"role": "assistant", "content": "yo"}]


# --- Status, errors, type inference, resource --------------------------------------------------------------


@BOTH
def test_exception_events_and_error_status(otel: OtelRecorder, content_type: str) -> None:
    with otel.tracer().start_as_current_span("execute_tool charge_card", record_exception=False) as span:
        span.set_attribute("gen_ai.operation.name", "execute_tool")
        span.record_exception(ValueError("card declined"))
        span.set_status(Status(StatusCode.ERROR, "ValueError: card declined"))

    mapped = otel.span(content_type)

    assert (mapped.status, mapped.status_message) == ("error", "ValueError: card declined")
    assert (mapped.error_type, mapped.error_message) == ("ValueError", "card declined")
    assert [event.name for event in mapped.events] == ["exception"]


def test_error_type_attribute_marks_an_unset_status_as_error() -> None:
    mapped = otlp.map_span(raw_span({"error.type": "timeout"}))
    ok = otlp.map_span(raw_span({}, status_code=1))

    assert (mapped.status, mapped.error_type, mapped.error_message) == ("error", "timeout", None)
    assert mapped.attributes == {}
    assert (ok.status, ok.error_type) == ("ok", None)


@pytest.mark.parametrize(
    ("attributes", "span_type"),
    [
        ({"langfuse.observation.type": "span", "gen_ai.operation.name": "chat"}, "generation"),
        ({"langfuse.observation.type": "EVENT"}, "event"),
        ({"langfuse.observation.type": "guardrail"}, "guardrail"),
        ({"langfuse.observation.type": "evaluator"}, "evaluator"),
        ({"openinference.span.kind": "embedding"}, "embedding"),
        ({"openinference.span.kind": "AGENT"}, "agent"),
        ({"openinference.span.kind": "UNKNOWN"}, "other"),
        ({"gen_ai.operation.name": "text_completion"}, "generation"),
        ({"gen_ai.operation.name": "generate_content"}, "generation"),
        ({"gen_ai.operation.name": "embeddings"}, "embedding"),
        ({"gen_ai.operation.name": "create_agent"}, "agent"),
        ({"gen_ai.operation.name": "invoke_workflow"}, "chain"),
        ({"gen_ai.operation.name": "retrieval"}, "retriever"),
        ({"gen_ai.operation.name": "apply_guardrail"}, "guardrail"),
        ({"gen_ai.operation.name": "create_memory"}, "other"),
        ({"gen_ai.tool.name": "search"}, "tool"),
        ({"gen_ai.request.model": "gpt-4o"}, "generation"),
        ({"llm.input_messages.0.message.role": "user"}, "generation"),
        ({"keel.span.type": "nonsense", "openinference.span.kind": "CHAIN"}, "chain"),
        ({"keel.span.type": "OTHER", "openinference.span.kind": "CHAIN"}, "other"),
        ({"http.method": "GET"}, "other"),
    ],
)
def test_span_type_inference(attributes: dict[str, Any], span_type: str) -> None:
    assert otlp.map_span(raw_span(attributes)).span_type == span_type


def test_session_user_and_agent_fall_back_to_resource_attributes() -> None:
    mapped = otlp.map_span(
        raw_span(
            {},
            resource_attributes={
                "service.name": "billing",
                "session.id": "s-1",
                "user.id": "u-1",
                "gen_ai.agent.name": "a",
            },
        )
    )

    assert (mapped.service_name, mapped.session_id, mapped.user_id, mapped.agent_name) == ("billing", "s-1", "u-1", "a")


def test_kinds_durations_and_unknown_kind() -> None:
    mapped = otlp.map_span(raw_span({}, kind=4, start_time_ns=10, end_time_ns=35))
    unknown = otlp.map_span(raw_span({}, kind=99))

    assert (mapped.kind, mapped.duration_ns) == ("producer", 25)
    assert unknown.kind == "unspecified"


def test_values_of_the_wrong_type_are_read_leniently() -> None:
    mapped = otlp.map_span(
        raw_span(
            {
                "gen_ai.usage.input_tokens": "17",
                "gen_ai.usage.output_tokens": 2.0,
                "gen_ai.usage.total_tokens": "many",
                "keel.reward": "0.5",
                "keel.prompt.version": 3,
                "keel.tags": json.dumps(["x", 2]),
                "session.id": 1234,
                "gen_ai.input.messages": "not json",
                "gen_ai.output.messages": json.dumps({"unexpected": True}),
                "llm.cost.total": float("inf"),
            }
        )
    )

    assert mapped.usage == otlp.Usage(input_tokens=17, output_tokens=2, total_tokens=19)
    assert (mapped.reward, mapped.prompt_version, mapped.tags, mapped.session_id) == (0.5, "3", ("x", "2"), "1234")
    assert (mapped.input, mapped.output, mapped.cost_usd) == (None, None, None)
    assert mapped.attributes == {
        "gen_ai.usage.total_tokens": "many",
        "gen_ai.input.messages": "not json",
        "gen_ai.output.messages": '{"unexpected": true}',
        "llm.cost.total": float("inf"),
    }


def test_a_content_block_whose_type_is_not_text_is_kept_as_it_is() -> None:
    mapped = otlp.map_span(
        raw_span(
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.input.messages": json.dumps([{"role": "user", "content": [{"type": ["text"], "text": "hi"}]}]),
            }
        )
    )

    assert mapped.input == [{"role": "user", "content": [{"type": ["text"], "text": "hi"}]}]


def test_map_span_survives_content_nested_past_the_recursion_limit() -> None:
    deep = "[" * 5000 + "]" * 5000

    mapped = otlp.map_span(raw_span({"gen_ai.request.model": "m", "keel.input": deep, "keel.output": deep}))

    assert mapped.request_model == "m"
    assert mapped.input == [{"role": "user", "content": deep}]
    assert mapped.output == [{"role": "assistant", "content": deep}]


def test_openllmetry_tool_definitions() -> None:
    # OpenLLMetry (Traceloop) lists the request's functions by index; replay offers them to the model.
    mapped = otlp.map_span(
        raw_span(
            {
                "gen_ai.system": "openai",
                "llm.request.type": "chat",
                "gen_ai.request.model": "gpt-4o",
                "llm.request.functions.0.name": "get_weather",
                "llm.request.functions.0.description": "Current weather for a city",
                "llm.request.functions.0.parameters": json.dumps(WEATHER_PARAMETERS),
            }
        )
    )

    assert mapped.tool_definitions == (WEATHER_TOOL,)
    assert not any(key.startswith("llm.request.functions.") for key in mapped.attributes)


def model_call(trace_id: str, span_id: str, history: str, **attributes: Any) -> otlp.RawSpan:
    return raw_span(
        {"gen_ai.operation.name": "chat", "gen_ai.input.messages": history, **attributes},
        trace_id=trace_id,
        span_id=span_id,
    )


USER = {"role": "user", "parts": [{"type": "text", "content": "Where is A-1?"}]}
CALL = {"role": "assistant", "parts": [{"type": "tool_call", "id": "c1", "name": "lookup", "arguments": {"o": "A-1"}}]}
RESULT = {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "response": {"status": "shipped"}}]}
ANSWER = {"role": "assistant", "parts": [{"type": "text", "content": "It shipped."}]}
FIRST = "5b8efff798038103d269b633813fc60c"
SECOND = "5b8efff798038103d269b633813fc60d"


@pytest.mark.parametrize(
    "histories",
    [
        # A loop's calls, each history going on from the last (the SDK's spacing, then compact JSON).
        [json.dumps([USER]), json.dumps([USER, CALL, RESULT]), json.dumps([USER, CALL, RESULT, ANSWER, USER])],
        [
            json.dumps([USER], separators=(",", ":")),
            json.dumps([USER, CALL, RESULT], separators=(",", ":")),
        ],
        # The calls out of order, a history cut short, one edited, one repeated.
        [json.dumps([USER, CALL, RESULT]), json.dumps([USER]), json.dumps([USER, CALL, RESULT])],
        [json.dumps([USER, CALL]), json.dumps([{**USER, "role": "system"}, CALL, RESULT])],
        # What follows the last history's text is not JSON, not messages, an empty tail after a comma, an item
        # without the comma, or text after the bracket; the last history was empty, or a `messages` object.
        [json.dumps([USER]), json.dumps([USER])[:-1] + ", {]"],
        [json.dumps([USER]), json.dumps([USER])[:-1] + ", 7]"],
        [json.dumps([USER]), json.dumps([USER])[:-1] + ", ]"],
        [json.dumps([USER]), json.dumps([USER])[:-1] + " " + json.dumps(CALL) + "]"],
        [json.dumps([USER]), json.dumps([USER])[:-1] + ", " + json.dumps(CALL) + "] trailing"],
        ["[]", "[, " + json.dumps(USER) + "]"],
        [json.dumps({"messages": [USER]}), json.dumps({"messages": [USER]})[:-1] + ", " + json.dumps(CALL) + "]"],
        ["[ ]", json.dumps([USER])],
    ],
)
def test_a_requests_model_calls_map_as_each_would_alone(histories: list[str]) -> None:
    """`map_spans` reads a call's history on from where the trace's previous one ended; the spans are
    the ones `map_span` gives each by itself, continuation or not, valid or not. Two traces' calls
    taken in turns are followed each on its own."""
    first = [model_call(FIRST, f"{n + 1:016x}", history) for n, history in enumerate(histories)]
    second = [model_call(SECOND, f"{n + 1:016x}", history) for n, history in enumerate(histories)]
    in_turns = [span for pair in zip(first, second, strict=True) for span in pair]

    assert otlp.map_spans(first) == [otlp.map_span(raw) for raw in first]
    assert otlp.map_spans(in_turns) == [otlp.map_span(raw) for raw in in_turns]
    # Assembled from spans that share their histories' messages, a trajectory is the same.
    assert steps.trajectory_view_build(otlp.map_spans(first)) == steps.trajectory_view_build(
        [otlp.map_span(raw) for raw in first]
    )


def test_a_history_that_goes_on_from_the_last_reuses_its_messages() -> None:
    instructions = {"gen_ai.system_instructions": "Be brief."}
    first = model_call(SECOND, "0000000000000001", json.dumps([USER, CALL]), **instructions)
    second = model_call(SECOND, "0000000000000002", json.dumps([USER, CALL, RESULT, ANSWER]), **instructions)

    # Another trace's call comes in between.
    spans = otlp.map_spans([first, model_call(FIRST, "0000000000000003", json.dumps([ANSWER])), second])

    assert spans[2].input == otlp.map_span(second).input
    # The system message and the first call's two are the very objects read for the first call.
    assert [message is known for message, known in zip(spans[2].input, spans[0].input, strict=False)] == [True] * 3
    assert spans[2].input[3:] == [
        {"role": "tool", "content": '{"status":"shipped"}', "tool_call_id": "c1"},
        {"role": "assistant", "content": "It shipped."},
    ]


def test_a_rows_data_leaves_out_what_is_empty_and_reads_it_back_as_mapped() -> None:
    mapped = otlp.map_span(raw_span({"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o"}))
    record = records.span_record(mapped)
    columns = {field.name: getattr(record, field.name) for field in dataclasses.fields(record)}
    data = json.loads(record.data)

    for name in ("session_id", "metadata", "resource_attributes", "tags", "events", "usage", "finish_reasons"):
        assert name not in data
    assert records.span_from_record(columns, data) == mapped

    # A value that is falsy but not empty is kept, as are a tool call's arguments and result when None.
    kept = dataclasses.replace(mapped, reward=0.0, input=[], output="", tool_arguments=None, task_id="")
    record = records.span_record(kept)
    data = json.loads(record.data)
    assert (data["reward"], data["input"], data["output"], data["task_id"]) == (0.0, [], "", "")
    assert data["tool_arguments"] is None
    assert records.span_from_record(columns, data) == kept


def _history_spans() -> list[otlp.Span]:
    """A trace's three model calls, each sending the dialogue so far, and a tool call between, as mapped."""
    history: list[dict[str, Any]] = [{"role": "user", "content": "Where is order A-2?"}]
    raws = []
    for number in range(3):
        raws.append(
            raw_span(
                {"gen_ai.operation.name": "chat", "gen_ai.input.messages": json.dumps(history)},
                span_id=f"{number:016x}",
            )
        )
        if number == 0:
            arguments = json.dumps([{"order": "A-2"}])
            raws.append(
                raw_span(
                    {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.call.arguments": arguments},
                    span_id="00000000000000ff",
                )
            )
        history = [*history, {"role": "assistant", "content": f"Looking ({number})"}]
    return otlp.map_spans(raws)


def _row_records(rows: list[tuple[Any, ...]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(dict(zip(records.RECORD_COLUMNS, row[:-1], strict=True)), json.loads(row[-1])) for row in rows]


def test_a_history_is_written_as_what_each_call_adds_and_read_back_whole() -> None:
    spans = _history_spans()
    histories = records.InputHistories()
    rows = [records.span_row(span, histories.input_from(span)) for span in spans]
    data = [json.loads(row[-1]) for row in rows]

    first, tool, second, third = data
    assert records.INPUT_FROM not in first
    assert first["input"] == spans[0].input
    # The tool span's input is its arguments, kept once: left whole.
    assert records.INPUT_FROM not in tool
    assert tool["input"] == [{"order": "A-2"}]
    assert second[records.INPUT_FROM] == [spans[0].span_id, 1]
    assert second["input"] == [{"role": "assistant", "content": "Looking (0)"}]
    assert third[records.INPUT_FROM] == [spans[2].span_id, 2]
    assert third["input"] == [{"role": "assistant", "content": "Looking (1)"}]

    # Read back in any order, each input is whole again.
    read = records.spans_from_records(reversed(_row_records(rows)))
    assert list(reversed(read)) == spans


def test_only_an_input_that_starts_with_the_very_messages_of_an_earlier_one_is_written_as_its_addition() -> None:
    first, _, second, _ = _history_spans()
    histories = records.InputHistories()
    assert histories.input_from(first) is None
    # Equal messages, but parsed again (another request): written whole.
    copied = dataclasses.replace(second, input=json.loads(json.dumps(second.input)))
    assert histories.input_from(copied) is None
    # The same history sent again adds nothing: written whole, not as an empty addition. The latest of
    # equal histories is the one named.
    again = dataclasses.replace(first, span_id="00000000000000aa")
    assert histories.input_from(again) is None
    assert histories.input_from(second) == (again.span_id, 1)


def test_a_row_whose_earlier_span_is_missing_reads_back_what_it_added(caplog) -> None:
    spans = _history_spans()
    histories = records.InputHistories()
    rows = [records.span_row(span, histories.input_from(span)) for span in spans]

    read = records.spans_from_records(_row_records(rows[1:]))

    assert read[0] == spans[1]
    assert read[1].input == [{"role": "assistant", "content": "Looking (0)"}]
    assert read[2].input == [{"role": "assistant", "content": "Looking (1)"}]
    assert [record.message for record in caplog.records] == ["tracing.span_input_base_missing"] * 2


def test_a_traces_spans_of_one_resource_and_scope_keep_them_once_and_read_them_back() -> None:
    resource = {"service.name": "support-agent", "telemetry.sdk.name": "opentelemetry"}
    billing = {"service.name": "billing"}
    sent = [(resource, "agents"), (resource, "agents"), (resource, "tools"), (billing, "agents"), (resource, "tools")]
    raws = [
        raw_span(
            {"gen_ai.operation.name": "chat"},
            span_id=f"{number:016x}",
            resource_attributes=attributes,
            scope_name=scope,
        )
        for number, (attributes, scope) in enumerate(sent)
    ]
    spans = otlp.map_spans(raws)
    resources = records.Resources()
    rows = [records.span_row(span, None, resources.resource_from(span)) for span in spans]
    data = [json.loads(row[-1]) for row in rows]

    assert [item.get(records.RESOURCE_FROM) for item in data] == [None, spans[0].span_id, None, None, spans[2].span_id]
    for item in (data[1], data[4]):
        assert not {"service_name", "resource_attributes", "scope_name", "scope_version"} & set(item)
    assert data[0]["resource_attributes"] == resource
    assert records.spans_from_records(reversed(_row_records(rows))) == list(reversed(spans))
    # Equal attributes of another resource (another request) are not the same dict: kept whole.
    copied = dataclasses.replace(spans[1], resource_attributes=dict(resource))
    assert resources.resource_from(copied) is None


def test_a_row_whose_resource_span_is_missing_reads_back_without_resource(caplog) -> None:
    resource = {"service.name": "support-agent"}
    spans = otlp.map_spans(
        [
            raw_span({}, span_id=f"{number:016x}", resource_attributes=resource, scope_name="agents")
            for number in range(2)
        ]
    )
    resources = records.Resources()
    rows = [records.span_row(span, None, resources.resource_from(span)) for span in spans]

    (read,) = records.spans_from_records(_row_records(rows[1:]))

    assert (read.resource_attributes, read.scope_name, read.service_name) == ({}, "", None)
    assert read == dataclasses.replace(spans[1], resource_attributes={}, scope_name="", service_name=None)
    assert [record.message for record in caplog.records] == ["tracing.span_resource_missing"]
