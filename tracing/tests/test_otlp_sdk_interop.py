"""What real instrumentations send, as they send it: Langfuse's OpenAI integration and @observe decorator,
and the GenAI conventions' retrieval attributes and inference-details event. Each payload copies what the
SDK was seen to export (langfuse 5.0.4, opentelemetry-sdk 1.45), built here without a network."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from tracing import langfuse_encode, otlp, records
from tracing.steps import trajectory_view_build
from tracing.tests.conftest import OtelRecorder
from tracing.tests.test_otlp_mapping import raw_span

JSON = otlp.CONTENT_TYPE_JSON
PROTOBUF = otlp.CONTENT_TYPE_PROTOBUF
BOTH = pytest.mark.parametrize("content_type", [PROTOBUF, JSON])

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
SYSTEM = {"role": "system", "content": "You are a weather bot."}
USER = {"role": "user", "content": "Weather in Paris?"}
CALL = {
    "id": "call_a948c90a",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
ASKS_FOR_WEATHER = {"role": "assistant", "content": None, "tool_calls": [CALL]}
TOOL_RESULT = {"role": "tool", "tool_call_id": "call_a948c90a", "content": '{"temp_c": 21, "city": "Paris"}'}
# OpenAI's usage object, as `langfuse.openai` passes it on (its `_parse_usage` keeps the nested details).
OPENAI_USAGE = {
    "completion_tokens": 7,
    "prompt_tokens": 42,
    "total_tokens": 49,
    "completion_tokens_details": {"reasoning_tokens": 3},
    "prompt_tokens_details": {"cached_tokens": 10},
}


def langfuse_generation(
    messages: list[dict[str, Any]], output: dict[str, Any], usage: dict[str, Any]
) -> dict[str, Any]:
    """The attributes of a `langfuse.openai` chat completion span."""
    return {
        "session.id": "lf-oai-session",
        "user.id": "lf-user",
        "langfuse.observation.input": json.dumps({"tools": [WEATHER_TOOL], "messages": messages}),
        "langfuse.observation.model.parameters": json.dumps({"temperature": 1, "max_tokens": "Infinity"}),
        "langfuse.observation.type": "generation",
        "langfuse.observation.output": json.dumps(output),
        "langfuse.observation.model.name": "gpt-4o-mini-2024-07-18",
        "langfuse.observation.usage_details": json.dumps(usage),
    }


# --- Langfuse: usage details -----------------------------------------------------------------------------


@BOTH
def test_langfuse_openai_integration_usage_keeps_nested_cache_and_reasoning_counts(
    otel: OtelRecorder, content_type: str
) -> None:
    with otel.tracer("langfuse-sdk", "5.0.4").start_as_current_span("OpenAI-generation") as span:
        span.set_attributes(langfuse_generation([SYSTEM, USER], ASKS_FOR_WEATHER, OPENAI_USAGE))

    mapped = otel.span(content_type)

    # The cached tokens are what makes the call cheaper: without them the cost counts all 42 at full price.
    assert mapped.usage == otlp.Usage(
        input_tokens=42, output_tokens=7, total_tokens=49, cache_read_tokens=10, reasoning_tokens=3
    )
    assert "langfuse.observation.usage_details" not in mapped.attributes


def test_the_langfuse_openai_integrations_finish_reason_is_the_calls() -> None:
    # It sends the reason in the observation's metadata; the step showed none.
    attributes = langfuse_generation([SYSTEM, USER], ASKS_FOR_WEATHER, OPENAI_USAGE)
    attributes["langfuse.observation.metadata.finish_reason"] = "tool_calls"

    mapped = otlp.map_span(_sdk_raw(attributes))

    assert mapped.finish_reasons == ("tool_calls",)


def test_the_responses_apis_nested_usage_details_are_read_too() -> None:
    usage = {
        "input_tokens": 42,
        "output_tokens": 7,
        "total_tokens": 49,
        "input_tokens_details": {"cached_tokens": 10},
        "output_tokens_details": {"reasoning_tokens": 3},
    }
    mapped = otlp.map_span(_sdk_raw({"langfuse.observation.usage_details": json.dumps(usage)}))

    assert mapped.usage == otlp.Usage(
        input_tokens=42, output_tokens=7, total_tokens=49, cache_read_tokens=10, reasoning_tokens=3
    )


def test_usage_details_keel_has_no_field_for_are_kept_as_sent() -> None:
    # OpenAI's audio counts: read what Keel can, and keep the attribute, rather than drop what it cannot hold.
    usage = {**OPENAI_USAGE, "prompt_tokens_details": {"cached_tokens": 10, "audio_tokens": 0}}

    mapped = otlp.map_span(_sdk_raw({"langfuse.observation.usage_details": json.dumps(usage)}))

    assert mapped.usage == otlp.Usage(
        input_tokens=42, output_tokens=7, total_tokens=49, cache_read_tokens=10, reasoning_tokens=3
    )
    assert json.loads(mapped.attributes["langfuse.observation.usage_details"]) == usage


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        # Anthropic's usage object as Langfuse's integrations pass it on: its input_tokens leave out the cache's.
        (
            {
                "input_tokens": 12,
                "output_tokens": 30,
                "cache_read_input_tokens": 900,
                "cache_creation_input_tokens": 2048,
            },
            otlp.Usage(
                input_tokens=2960, output_tokens=30, total_tokens=2990, cache_read_tokens=900, cache_write_tokens=2048
            ),
        ),
        # Langfuse's LangChain handler: each part of the prompt and of the output in a bucket of its own.
        (
            {"input": 12, "output": 20, "input_cache_read": 900, "input_cache_creation": 48, "output_reasoning": 10},
            otlp.Usage(
                input_tokens=960,
                output_tokens=30,
                total_tokens=990,
                cache_read_tokens=900,
                reasoning_tokens=10,
                cache_write_tokens=48,
            ),
        ),
    ],
    ids=["anthropic", "langchain-buckets"],
)
def test_langfuses_usage_buckets_add_up_to_the_prompt_and_the_output(
    usage: dict[str, int], expected: otlp.Usage
) -> None:
    # Langfuse prices each bucket; Keel counts the cache's tokens within the prompt. Read as a prompt of 12
    # tokens, the call above was priced at a tenth of its cost.
    mapped = otlp.map_span(_sdk_raw({"langfuse.observation.usage_details": json.dumps(usage)}))

    assert mapped.usage == expected
    assert "langfuse.observation.usage_details" not in mapped.attributes


def test_the_langfuse_mirror_sends_usage_as_langfuses_buckets_which_read_back_the_same() -> None:
    usage = {"input_tokens": 12, "output_tokens": 30, "cache_read_input_tokens": 900, "cache_creation_input_tokens": 48}
    mapped = otlp.map_span(_sdk_raw({"langfuse.observation.usage_details": json.dumps(usage)}))

    mirrored = json.loads(str(langfuse_encode.langfuse_attributes(mapped)["langfuse.observation.usage_details"]))
    again = otlp.map_span(_sdk_raw({"langfuse.observation.usage_details": json.dumps(mirrored)}))

    # Sending the whole prompt as `input` beside the cache's buckets had Langfuse count the cache twice.
    assert mirrored == {
        "input": 12,
        "output": 30,
        "total": 990,
        "cache_read_input_tokens": 900,
        "cache_creation_input_tokens": 48,
    }
    assert again.usage == mapped.usage


# --- Langfuse: @observe(as_type="tool") ------------------------------------------------------------------


def test_a_langfuse_observe_tool_called_with_keyword_arguments_has_those_as_its_arguments() -> None:
    mapped = otlp.map_span(
        _sdk_raw(
            {
                "langfuse.observation.input": json.dumps({"args": [], "kwargs": {"city": "Paris"}}),
                "langfuse.observation.type": "tool",
                "langfuse.observation.output": json.dumps({"temp_c": 21}),
            },
            name="get_weather",
        )
    )

    assert (mapped.span_type, mapped.tool_name) == ("tool", "get_weather")
    assert mapped.tool_arguments == {"city": "Paris"}
    # The observation's input is shown as Langfuse recorded it.
    assert mapped.input == {"args": [], "kwargs": {"city": "Paris"}}
    record = records.span_record(mapped)
    columns = {field.name: getattr(record, field.name) for field in dataclasses.fields(record)}
    assert records.span_from_record(columns, json.loads(record.data)) == mapped


def test_a_langfuse_observe_tool_called_with_positional_arguments_keeps_the_recorded_call() -> None:
    recorded = {"args": ["Paris"], "kwargs": {}}
    mapped = otlp.map_span(
        _sdk_raw({"langfuse.observation.input": json.dumps(recorded), "langfuse.observation.type": "tool"}, name="w")
    )
    # Names of positional parameters are not sent: nothing better to show than the call as recorded.
    assert mapped.tool_arguments == recorded
    # Keel's own input is taken as the agent wrote it, whatever its keys.
    keel = otlp.map_span(
        _sdk_raw({"keel.span.type": "tool", "keel.input": json.dumps({"args": [], "kwargs": {"a": 1}})})
    )
    assert keel.tool_arguments == {"args": [], "kwargs": {"a": 1}}


@BOTH
def test_a_langfuse_agent_with_an_observed_tool_has_one_tool_call_per_call(
    otel: OtelRecorder, content_type: str
) -> None:
    tracer = otel.tracer("langfuse-sdk", "5.0.4")
    with tracer.start_as_current_span("weather-agent") as agent:
        agent.set_attributes(
            {
                "langfuse.observation.type": "agent",
                "langfuse.observation.input": json.dumps({"args": [False], "kwargs": {}}),
                "langfuse.observation.output": "It is sunny in Paris.",
            }
        )
        with tracer.start_as_current_span("weather-llm") as first:
            first.set_attributes(langfuse_generation([SYSTEM, USER], ASKS_FOR_WEATHER, OPENAI_USAGE))
        with tracer.start_as_current_span("get_weather") as tool:
            tool.set_attributes(
                {
                    "langfuse.observation.input": json.dumps({"args": [], "kwargs": {"city": "Paris"}}),
                    "langfuse.observation.type": "tool",
                    "langfuse.observation.output": TOOL_RESULT["content"],
                }
            )
        with tracer.start_as_current_span("weather-llm") as second:
            second.set_attributes(
                langfuse_generation(
                    [SYSTEM, USER, ASKS_FOR_WEATHER, TOOL_RESULT],
                    {"role": "assistant", "content": "It is sunny in Paris."},
                    OPENAI_USAGE,
                )
            )

    view = trajectory_view_build(otel.spans(content_type))

    assert [(call.name, call.arguments, call.result, call.source) for call in view.tool_calls] == [
        ("get_weather", {"city": "Paris"}, {"temp_c": 21, "city": "Paris"}, "span")
    ]
    assert [step.kind for step in view.steps] == ["agent", "message", "message", "llm_call", "tool_call", "llm_call"]
    assert view.totals.tool_call_count == 1


# --- GenAI conventions: retrieval ----------------------------------------------------------------------------


@BOTH
def test_gen_ai_retrieval_span_shows_its_query_and_documents(otel: OtelRecorder, content_type: str) -> None:
    documents = [{"id": "doc-1", "score": 0.92, "content": "Paris: sunny, 21°C"}]
    with otel.tracer().start_as_current_span("retrieval weather-kb") as span:
        span.set_attributes(
            {
                "gen_ai.operation.name": "retrieval",
                "gen_ai.data_source.id": "weather-kb",
                "gen_ai.retrieval.query.text": "weather in paris",
                "gen_ai.retrieval.documents": json.dumps(documents),
            }
        )

    mapped = otel.span(content_type)

    assert mapped.span_type == "retriever"
    assert (mapped.input, mapped.output) == ("weather in paris", documents)
    assert mapped.attributes == {"gen_ai.operation.name": "retrieval", "gen_ai.data_source.id": "weather-kb"}


def test_retrieval_attributes_do_not_stand_in_for_another_spans_content() -> None:
    mapped = otlp.map_span(
        _sdk_raw(
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": "Hi"}]}]),
                "gen_ai.retrieval.query.text": "hi",
            }
        )
    )
    assert mapped.input == [{"role": "user", "content": "Hi"}]
    assert mapped.output is None
    assert mapped.attributes["gen_ai.retrieval.query.text"] == "hi"


# --- GenAI conventions: the inference details event ----------------------------------------------------------


@BOTH
def test_gen_ai_inference_operation_details_event_gives_the_calls_messages(
    otel: OtelRecorder, content_type: str
) -> None:
    with otel.tracer().start_as_current_span("chat gpt-4o-mini") as span:
        span.set_attributes({"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o-mini"})
        span.add_event(
            "gen_ai.client.inference.operation.details",
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.system_instructions": json.dumps([{"type": "text", "content": "You are a weather bot."}]),
                "gen_ai.input.messages": json.dumps(
                    [
                        {"role": "user", "parts": [{"type": "text", "content": "Weather in Paris?"}]},
                        {
                            "role": "assistant",
                            "parts": [
                                {
                                    "type": "tool_call",
                                    "id": "call_1",
                                    "name": "get_weather",
                                    "arguments": {"city": "Paris"},
                                }
                            ],
                        },
                        {
                            "role": "tool",
                            "parts": [{"type": "tool_call_response", "id": "call_1", "response": "sunny"}],
                        },
                    ]
                ),
                "gen_ai.output.messages": json.dumps(
                    [{"role": "assistant", "parts": [{"type": "text", "content": "Sunny."}], "finish_reason": "stop"}]
                ),
            },
        )

    mapped = otel.span(content_type)

    assert mapped.input == [
        SYSTEM,
        USER,
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
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
    ]
    assert mapped.output == [{"role": "assistant", "content": "Sunny."}]
    assert mapped.finish_reasons == ("stop",)
    # The event itself is kept, as every event is.
    assert [event.name for event in mapped.events] == ["gen_ai.client.inference.operation.details"]


def _sdk_raw(attributes: dict[str, Any], *, name: str = "span") -> otlp.RawSpan:
    return raw_span(attributes, name=name, scope_name="langfuse-sdk", scope_version="5.0.4")
