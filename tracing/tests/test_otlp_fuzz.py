"""Property tests: whatever the bytes, decoding raises nothing but OtlpError, and mapping raises nothing."""

from __future__ import annotations

import gzip
import json
import os
import zlib
from functools import lru_cache
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.trace import SpanKind, Status, StatusCode

from tracing import otlp, steps
from tracing.tests.conftest import OtelRecorder, otlp_json_document
from tracing.tests.test_otlp_mapping import raw_span

# KEEL_FUZZ_EXAMPLES raises the count for a longer hunt than CI's.
FUZZ = settings(
    max_examples=int(os.environ.get("KEEL_FUZZ_EXAMPLES", "300")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
CONTENT_TYPES = st.sampled_from([otlp.CONTENT_TYPE_PROTOBUF, otlp.CONTENT_TYPE_JSON])
ENCODINGS = st.sampled_from([None, "gzip", "deflate"])


def ingest(body: bytes, content_type: str, content_encoding: str | None) -> otlp.ExportRequest | None:
    """What ingest does with a body: validate, decode, map, assemble. Only OtlpError may escape.

    Validation must agree with decoding: the same counts, or the same kind of error.
    """
    summary: otlp.ExportSummary | None = None
    validation_error: type[otlp.OtlpError] | None = None
    try:
        summary = otlp.validate_request(body, content_type, content_encoding, max_decompressed_bytes=1_000_000)
    except otlp.OtlpError as error:
        validation_error = type(error)
    decoding_error: type[otlp.OtlpError] | None = None
    try:
        request = otlp.decode_request(body, content_type, content_encoding, max_decompressed_bytes=1_000_000)
    except otlp.OtlpError as error:
        decoding_error = type(error)
    assert decoding_error is validation_error
    if decoding_error is not None:
        return None
    assert summary == request.summary
    spans = otlp.map_spans(request.spans)
    steps.trajectory_view_build(spans)
    assert request.rejected_spans == sum(request.rejection_reasons.values())
    return request


@lru_cache(maxsize=1)
def valid_request() -> tuple[bytes, dict[str, Any]]:
    """A realistic agent trajectory, encoded by the SDK's exporter, as protobuf bytes and as an OTLP JSON document."""
    recorder = OtelRecorder()
    tracer = recorder.tracer()
    messages = [{"role": "user", "parts": [{"type": "text", "content": "Refund order A-1"}]}]
    with tracer.start_as_current_span("invoke_agent refunds") as root:
        root.set_attributes(
            {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "refunds", "session.id": "s"}
        )
        with tracer.start_as_current_span("chat gpt-4o", kind=SpanKind.CLIENT) as chat:
            chat.set_attributes(
                {
                    "gen_ai.operation.name": "chat",
                    "gen_ai.request.model": "gpt-4o",
                    "gen_ai.usage.input_tokens": 40,
                    "gen_ai.usage.output_tokens": 8,
                    "gen_ai.input.messages": json.dumps(messages),
                    "gen_ai.output.messages": json.dumps(
                        [
                            {
                                "role": "assistant",
                                "parts": [{"type": "tool_call", "id": "c1", "name": "refund", "arguments": {}}],
                            }
                        ]
                    ),
                    "llm.input_messages.0.message.role": "user",
                    "llm.input_messages.0.message.content": "Refund order A-1",
                    "gen_ai.prompt.0.role": "user",
                    "keel.tags": ["a", "b"],
                    "ratio": 0.5,
                    "flags": [True, False],
                }
            )
            chat.add_event("gen_ai.choice", {"index": 0, "message": '{"content": "ok"}'})
        with tracer.start_as_current_span("execute_tool refund") as tool:
            tool.set_attributes(
                {"gen_ai.tool.name": "refund", "gen_ai.tool.call.id": "c1", "gen_ai.tool.call.result": "{}"}
            )
            tool.record_exception(RuntimeError("gateway down"))
            tool.set_status(Status(StatusCode.ERROR, "gateway down"))
    request = recorder.request()
    recorder.provider.shutdown()
    return request.SerializeToString(), otlp_json_document(request)


def test_the_seed_payloads_are_valid() -> None:
    protobuf, document = valid_request()

    from_protobuf = ingest(protobuf, otlp.CONTENT_TYPE_PROTOBUF, None)
    from_json = ingest(json.dumps(document).encode(), otlp.CONTENT_TYPE_JSON, None)

    assert from_protobuf is not None
    assert from_json == from_protobuf
    assert len(from_protobuf.spans) == 3


@FUZZ
@given(body=st.binary(max_size=4096), content_type=CONTENT_TYPES, content_encoding=ENCODINGS)
def test_random_bytes(body: bytes, content_type: str, content_encoding: str | None) -> None:
    ingest(body, content_type, content_encoding)


MUTATION = st.tuples(
    st.sampled_from(["flip", "set", "delete", "insert", "truncate"]), st.integers(0, 10**6), st.integers(0, 255)
)


def mutate(data: bytes, mutations: list[tuple[str, int, int]]) -> bytes:
    buffer = bytearray(data)
    for operation, position, byte in mutations:
        if not buffer:
            break
        at = position % len(buffer)
        if operation == "flip":
            buffer[at] ^= 1 << (byte % 8)
        elif operation == "set":
            buffer[at] = byte
        elif operation == "delete":
            del buffer[at]
        elif operation == "insert":
            buffer.insert(at, byte)
        else:
            del buffer[at:]
    return bytes(buffer)


@FUZZ
@given(mutations=st.lists(MUTATION, min_size=1, max_size=8))
def test_mutated_protobuf(mutations: list[tuple[str, int, int]]) -> None:
    protobuf, _ = valid_request()

    ingest(mutate(protobuf, mutations), otlp.CONTENT_TYPE_PROTOBUF, None)


@FUZZ
@given(mutations=st.lists(MUTATION, min_size=1, max_size=8), content_encoding=st.sampled_from(["gzip", "deflate"]))
def test_mutated_compressed_protobuf(mutations: list[tuple[str, int, int]], content_encoding: str) -> None:
    protobuf, _ = valid_request()
    compressed = gzip.compress(protobuf) if content_encoding == "gzip" else zlib.compress(protobuf)

    ingest(mutate(compressed, mutations), otlp.CONTENT_TYPE_PROTOBUF, content_encoding)


@FUZZ
@given(mutations=st.lists(MUTATION, min_size=1, max_size=8))
def test_mutated_json_bytes(mutations: list[tuple[str, int, int]]) -> None:
    _, document = valid_request()

    ingest(mutate(json.dumps(document).encode(), mutations), otlp.CONTENT_TYPE_JSON, None)


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
    | st.sampled_from(
        ["", "00", "5b8efff798038103d269b633813fc60c", "eee19b7ec3c1b174", "STATUS_CODE_ERROR", "[{", "1e400"]
    ),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=20,
)


def paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            found.extend(paths(value, (*prefix, key)))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found.extend(paths(value, (*prefix, index)))
    return found


def replace(node: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(node, dict):
        return {key: replace(item, rest, value) if key == head else item for key, item in node.items()}
    return [replace(item, rest, value) if index == head else item for index, item in enumerate(node)]


@FUZZ
@given(edits=st.lists(st.tuples(st.integers(0, 10**6), JSON_VALUES), min_size=1, max_size=4))
def test_structurally_mutated_json(edits: list[tuple[int, Any]]) -> None:
    _, document = valid_request()
    for choice, value in edits:
        candidates = paths(document)
        document = replace(document, candidates[choice % len(candidates)], value)

    ingest(json.dumps(document).encode(), otlp.CONTENT_TYPE_JSON, None)


@FUZZ
@given(document=JSON_VALUES)
def test_random_json_documents(document: Any) -> None:
    ingest(json.dumps(document).encode(), otlp.CONTENT_TYPE_JSON, None)
    ingest(
        json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [document]}]}]}).encode(), otlp.CONTENT_TYPE_JSON, None
    )


KNOWN_KEYS = [
    "keel.span.type",
    "keel.input",
    "keel.output",
    "keel.tags",
    "keel.reward",
    "keel.tool.definitions",
    "keel.metadata.x",
    "langfuse.observation.type",
    "langfuse.observation.input",
    "langfuse.observation.output",
    "langfuse.observation.usage_details",
    "langfuse.observation.cost_details",
    "langfuse.observation.level",
    "langfuse.trace.metadata",
    "langfuse.trace.tags",
    "openinference.span.kind",
    "input.value",
    "output.value",
    "llm.input_messages.0.message.role",
    "llm.input_messages.0.message.content",
    "llm.input_messages.0.message.tool_calls.0.tool_call.function.arguments",
    "llm.input_messages.0.message.contents.0.message_content.image.image.url",
    "llm.input_messages.x",
    "llm.output_messages.0.message.tool_calls",
    "llm.tools.0.tool.json_schema",
    "llm.tools.1.tool.name",
    "llm.prompts.0.prompt.text",
    "llm.choices.0",
    "metadata",
    "tag.tags",
    "tool.parameters",
    "tool.name",
    "gen_ai.operation.name",
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.system_instructions",
    "gen_ai.tool.definitions",
    "gen_ai.tool.call.arguments",
    "gen_ai.tool.call.result",
    "gen_ai.tool.name",
    "gen_ai.usage.input_tokens",
    "gen_ai.prompt.0.role",
    "gen_ai.prompt.0.tool_calls.0.name",
    "gen_ai.prompt.0",
    "gen_ai.completion.0.content",
    "gen_ai.completion.1.tool_calls",
    "error.type",
    "session.id",
]
MESSAGE_LIKE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool", "model", "", 3])},
    optional={"content": JSON_VALUES, "parts": JSON_VALUES, "tool_calls": JSON_VALUES, "tool_call_id": JSON_VALUES},
)
ATTRIBUTE_VALUES = (
    JSON_VALUES
    | st.lists(MESSAGE_LIKE, max_size=3)
    | st.lists(MESSAGE_LIKE, max_size=3).map(json.dumps)
    | JSON_VALUES.map(json.dumps)
)


EVENT_KEYS = st.sampled_from(["content", "role", "tool_calls", "message", "id", "index", "body"])
EVENT_NAMES = st.sampled_from(
    ["gen_ai.user.message", "gen_ai.assistant.message", "gen_ai.tool.message", "gen_ai.choice", "exception"]
)


@FUZZ
@given(
    attributes=st.dictionaries(st.sampled_from(KNOWN_KEYS) | st.text(max_size=10), ATTRIBUTE_VALUES, max_size=10),
    event_attributes=st.dictionaries(EVENT_KEYS, ATTRIBUTE_VALUES, max_size=4),
    event_name=EVENT_NAMES | st.just("gen_ai.content.prompt"),
    parent=st.sampled_from([None, "eee19b7ec3c1b174", "0000000000000001"]),
)
def test_mapping_and_assembly_accept_any_attribute_values(
    attributes: dict[str, Any], event_attributes: dict[str, Any], event_name: str, parent: str | None
) -> None:
    raw = otlp.RawSpan(
        trace_id="5b8efff798038103d269b633813fc60c",
        span_id="eee19b7ec3c1b174",
        parent_span_id=parent,
        name="span",
        kind=1,
        start_time_ns=1,
        end_time_ns=2,
        status_code=0,
        status_message="",
        attributes=attributes,
        events=(otlp.SpanEvent(event_name, 1, event_attributes),),
        resource_attributes={},
        scope_name="",
        scope_version="",
        truncated_attributes={},
    )
    sibling = otlp.RawSpan(**{**{field: getattr(raw, field) for field in raw.__slots__}, "span_id": "0000000000000001"})

    mapped = [otlp.map_span(raw), otlp.map_span(sibling)]
    view = steps.trajectory_view_build(mapped)

    assert mapped[0].span_type in otlp.SPAN_TYPES
    assert {step.span_id for step in view.steps} <= {"eee19b7ec3c1b174", "0000000000000001"}


MESSAGE_ITEMS = (
    st.sampled_from(
        [
            {"role": "user", "parts": [{"type": "text", "content": "hi"}]},
            {"role": "assistant", "parts": [{"type": "tool_call", "id": "c", "name": "f", "arguments": {"a": 1}}]},
            {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c", "response": [1, "x"]}]},
            {"role": "user", "content": "plain"},
        ]
    )
    | JSON_VALUES
)
SEPARATORS = st.sampled_from([(", ", ": "), (",", ":"), (" , ", " : ")])
# How the next call's history is written: going on from the last one, or the last one's text with a
# random edit (a character put in, taken out or changed), or a history of its own.
NEXT = st.tuples(
    st.sampled_from(["goes on", "edited", "own"]),
    st.lists(MESSAGE_ITEMS, max_size=3),
    SEPARATORS,
    st.integers(0, 10**6),
    st.sampled_from(["", ",", "]", "[", " ", "{", "x"]),
)


@FUZZ
@given(first=st.lists(MESSAGE_ITEMS, max_size=3), steps_=st.lists(NEXT, min_size=1, max_size=5))
def test_model_calls_of_one_request_map_as_each_would_alone(
    first: list[Any], steps_: list[tuple[str, list[Any], tuple[str, str], int, str]]
) -> None:
    """Whatever a trace's successive histories look like, `map_spans` (which reads a history on from
    the last one when it can) gives what `map_span` gives each span by itself, and the trajectory
    assembled from spans that share the messages of their histories is the one assembled from spans
    that do not."""
    texts = [json.dumps(first)]
    items = list(first)
    for how, more, separators, at, character in steps_:
        last = texts[-1]
        if how == "goes on":
            items += more
            texts.append(json.dumps(items, separators=separators))
        elif how == "edited":
            at %= len(last) + 1
            texts.append(last[:at] + character + last[at + (len(character) == 0) :])
        else:
            items = list(more)
            texts.append(json.dumps(items, separators=separators))
    raws = [
        raw_span({"gen_ai.operation.name": "chat", "gen_ai.input.messages": text}, span_id=f"{number + 1:016x}")
        for number, text in enumerate(texts)
    ]

    shared, alone = otlp.map_spans(raws), [otlp.map_span(raw) for raw in raws]

    assert shared == alone
    assert steps.trajectory_view_build(shared) == steps.trajectory_view_build(alone)
