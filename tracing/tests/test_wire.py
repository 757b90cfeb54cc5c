"""tracing.wire reads an OTLP/protobuf request into the very spans protobuf's runtime gives tracing.otlp,
or leaves the request to it (`Unread`); never anything else. Both the module as imported (compiled, where
`make install` built it) and its source are held to that."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from bench.workload import templates_build
from tracing import otlp, wire
from tracing.tests.agent_traces import long_conversation, refund_conversation
from tracing.tests.conftest import OtelRecorder
from tracing.tests.test_otlp_fuzz import FUZZ, MUTATION, mutate, valid_request

LIMITS = (otlp.DEFAULT_MAX_ATTRIBUTE_LENGTH, 40, 3)


def _source_module() -> Any:
    spec = importlib.util.spec_from_file_location("tracing.wire_as_source", Path(wire.__file__).with_name("wire.py"))
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as an import does, before the module runs
    spec.loader.exec_module(module)
    return module


_SOURCE = _source_module()


class _Reading:
    """One of the two readers, as an ExportRequest; raises the module's Unread (`unread`)."""

    def __init__(self, module: Any) -> None:
        self.module = module
        self.unread: type[Exception] = module.Unread

    def __call__(self, body: bytes, limit: int) -> otlp.ExportRequest:
        spans, reasons = self.module.spans_read(body, limit)
        return otlp.ExportRequest(
            spans=tuple(spans), rejected_spans=sum(reasons.values()), rejection_reasons=dict(reasons)
        )


@pytest.fixture(scope="module", params=["imported", "source"])
def read(request: pytest.FixtureRequest) -> _Reading:
    return _Reading(wire if request.param == "imported" else _SOURCE)


def _same_or_unread(read: _Reading, body: bytes, limit: int) -> bool:
    """Check the reader against protobuf's runtime on one body; returns whether the reader read it."""
    try:
        expected: otlp.ExportRequest | None = otlp.decode_protobuf_runtime(body, limit)
    except otlp.MalformedPayload:
        expected = None
    try:
        got = read(body, limit)
    except read.unread:
        return False
    assert expected is not None, "the reader read a body protobuf refuses"
    assert got == expected
    return True


def _agent_runs() -> bytes:
    recorder = OtelRecorder()
    tracer = recorder.tracer()
    refund_conversation(tracer)
    refund_conversation(tracer, session="session-2", tool_fails=True, prompt=("refunds", "3"))
    long_conversation(tracer, turns=12, tool_spans=False, big_number=True)
    return recorder.protobuf()


def test_it_reads_the_benchmarks_requests_and_agent_runs_as_protobuf_does(read: _Reading) -> None:
    # A root span sent with an all-zero parent id, as some SDKs do: no parent.
    zero_parent = _plain_span()
    zero_parent.parent_span_id = bytes(8)
    bodies = [template.body for template in templates_build(2)]
    bodies += [_agent_runs(), valid_request()[0], _encoded(_request(zero_parent))]
    for body in bodies:
        for limit in LIMITS:
            assert _same_or_unread(read, body, limit), "a plain SDK export was left to protobuf"
    # Cut short, attributes are truncated and their lengths kept, as protobuf's path keeps them.
    short = read(bodies[0], 40)
    assert any(span.truncated_attributes for span in short.spans)


def _wire_type(field: Any) -> int:
    if field.type in (field.TYPE_DOUBLE, field.TYPE_FIXED64, field.TYPE_SFIXED64):
        return 1
    if field.type in (field.TYPE_FLOAT, field.TYPE_FIXED32, field.TYPE_SFIXED32):
        return 5
    if field.type in (field.TYPE_STRING, field.TYPE_BYTES, field.TYPE_MESSAGE):
        return 2
    return 0


def test_the_fields_it_reads_are_the_schemas_with_their_wire_types() -> None:
    descriptors: dict[str, Any] = {}
    pending = [ExportTraceServiceRequest.DESCRIPTOR]
    while pending:
        descriptor = pending.pop()
        if descriptor.full_name not in descriptors:
            descriptors[descriptor.full_name] = descriptor
            pending.extend(field.message_type for field in descriptor.fields if field.message_type is not None)

    assert wire.schema_fields() == {
        name: frozenset(field.number for field in descriptor.fields) for name, descriptor in descriptors.items()
    }
    for name, fields in wire.READ_FIELDS.items():
        by_number = {field.number: field for field in descriptors[name].fields}
        for number, wire_type in fields.items():
            field = by_number[number]
            assert _wire_type(field) == wire_type, (name, field.name)
            # A message it reads is one whose fields it knows.
            assert field.message_type is None or field.message_type.full_name in wire.READ_FIELDS, (name, field.name)


def _any_value(kind: str, value: Any) -> AnyValue:
    if kind == "string":
        return AnyValue(string_value=value)
    if kind == "bool":
        return AnyValue(bool_value=value)
    if kind == "int":
        return AnyValue(int_value=value)
    if kind == "double":
        return AnyValue(double_value=value)
    return AnyValue(bytes_value=value)


SCALARS = st.one_of(
    st.tuples(st.just("string"), st.text(max_size=60) | st.sampled_from(["", "a\x00b", "x" * 50, "é" * 45])),
    st.tuples(st.just("bool"), st.booleans()),
    st.tuples(st.just("int"), st.integers(-(2**63), 2**63 - 1)),
    st.tuples(st.just("double"), st.floats() | st.sampled_from([math.inf, -math.inf, math.nan, -0.0])),
    st.tuples(st.just("bytes"), st.binary(max_size=40)),
).map(lambda pair: _any_value(*pair))
KEYS = st.text(max_size=12) | st.sampled_from(["gen_ai.input.messages", "k\x00", ""])


def _array(values: list[AnyValue]) -> AnyValue:
    value = AnyValue()
    value.array_value.values.extend(values)
    return value


def _kv_list(items: list[tuple[str, AnyValue]]) -> AnyValue:
    value = AnyValue()
    value.kvlist_value.values.extend(KeyValue(key=key, value=item) for key, item in items)
    return value


VALUES = st.recursive(
    SCALARS | st.just(AnyValue()),
    lambda children: (
        st.lists(children, max_size=3).map(_array) | st.lists(st.tuples(KEYS, children), max_size=3).map(_kv_list)
    ),
    max_leaves=6,
)
ATTRIBUTES = st.lists(st.builds(KeyValue, key=KEYS, value=VALUES) | st.builds(KeyValue, key=KEYS), max_size=5)
IDS = st.sampled_from([b"", bytes(16), bytes(8), b"\x01" * 16, b"\x02" * 8, b"\x03" * 7, b"\x04" * 17])


@st.composite
def spans(draw: st.DrawFn) -> Span:
    span = Span(
        trace_id=draw(IDS | st.binary(min_size=16, max_size=16)),
        span_id=draw(IDS | st.binary(min_size=8, max_size=8)),
        parent_span_id=draw(IDS),
        trace_state=draw(st.sampled_from(["", "vendor=1"])),
        name=draw(st.text(max_size=20) | st.sampled_from(["", "chat gpt-4o", "n\x00"])),
        kind=cast(Any, draw(st.integers(-(2**31), 2**31 - 1) | st.integers(0, 5))),
        start_time_unix_nano=draw(st.integers(0, 2**64 - 1) | st.integers(0, 10)),
        end_time_unix_nano=draw(st.integers(0, 2**64 - 1) | st.integers(0, 10)),
        flags=draw(st.integers(0, 2**32 - 1)),
        dropped_attributes_count=draw(st.integers(0, 3)),
    )
    span.attributes.extend(draw(ATTRIBUTES))
    for name, time_ns, attributes in draw(
        st.lists(st.tuples(st.text(max_size=8), st.integers(0, 2**64 - 1), ATTRIBUTES), max_size=2)
    ):
        event = span.events.add(name=name, time_unix_nano=time_ns)
        event.attributes.extend(attributes)
    if draw(st.booleans()):
        span.status.CopyFrom(
            Status(
                code=cast(Any, draw(st.integers(-(2**31), 2**31 - 1) | st.integers(0, 2))),
                message=draw(st.text(max_size=10)),
            )
        )
    return span


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    request = ExportTraceServiceRequest()
    for _ in range(draw(st.integers(0, 2))):
        resource_spans = ResourceSpans(
            schema_url=draw(st.sampled_from(["", "https://opentelemetry.io/schemas/1.26.0"]))
        )
        if draw(st.booleans()):
            resource_spans.resource.attributes.extend(draw(ATTRIBUTES))
            resource_spans.resource.SetInParent()
        for _ in range(draw(st.integers(0, 2))):
            scope_spans = ScopeSpans()
            if draw(st.booleans()):
                scope_spans.scope.name = draw(st.text(max_size=10))
                scope_spans.scope.version = draw(st.sampled_from(["", "1.0.0"]))
                scope_spans.scope.SetInParent()
            scope_spans.spans.extend(draw(st.lists(spans(), max_size=3)))
            resource_spans.scope_spans.append(scope_spans)
        request.resource_spans.append(resource_spans)
    body: bytes = request.SerializeToString()
    return body


@FUZZ
@given(body=requests(), limit=st.sampled_from(LIMITS))
def test_any_request_without_what_it_leaves_is_read_as_protobuf_reads_it(
    read: _Reading, body: bytes, limit: int
) -> None:
    assert _same_or_unread(read, body, limit), "left to protobuf a request with only what the reader reads"


@FUZZ
@given(body=requests(), mutations=st.lists(MUTATION, min_size=1, max_size=6))
def test_mutated_requests_are_read_as_protobuf_reads_them_or_left_to_it(
    read: _Reading, body: bytes, mutations: list[tuple[str, int, int]]
) -> None:
    _same_or_unread(read, mutate(body, mutations), otlp.DEFAULT_MAX_ATTRIBUTE_LENGTH)


@FUZZ
@given(mutations=st.lists(MUTATION, min_size=1, max_size=8))
def test_mutated_sdk_exports_are_read_as_protobuf_reads_them_or_left_to_it(
    read: _Reading, mutations: list[tuple[str, int, int]]
) -> None:
    _same_or_unread(read, mutate(valid_request()[0], mutations), otlp.DEFAULT_MAX_ATTRIBUTE_LENGTH)


def _request(span: Span) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    resource_spans.resource.attributes.add(key="service.name", value=AnyValue(string_value="agent"))
    resource_spans.scope_spans.add().spans.append(span)
    return request


def _encoded(request: ExportTraceServiceRequest) -> bytes:
    body: bytes = request.SerializeToString()
    return body


def _plain_span() -> Span:
    return Span(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="chat", start_time_unix_nano=5, end_time_unix_nano=9)


def _with_link() -> bytes:
    span = _plain_span()
    span.links.add(trace_id=b"\x03" * 16, span_id=b"\x04" * 8)
    return _encoded(_request(span))


def _with_scope_attributes() -> bytes:
    request = _request(_plain_span())
    request.resource_spans[0].scope_spans[0].scope.attributes.add(key="k", value=AnyValue(string_value="v"))
    return _encoded(request)


def _with_string_index() -> bytes:
    span = _plain_span()
    span.attributes.add(key="k", value=AnyValue(string_value_strindex=3))
    return _encoded(_request(span))


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, content: bytes) -> bytes:
    """A LEN field, encoded."""
    return _varint(number << 3 | 2) + _varint(len(content)) + content


def _with_a_second_status() -> bytes:
    """A span whose status field comes twice: protobuf merges the two messages into one status."""
    first = _plain_span()
    first.status.message = "first"
    span = first.SerializeToString() + Span(status=Status(code=Status.STATUS_CODE_ERROR)).SerializeToString()
    resource = _request(Span()).resource_spans[0].resource.SerializeToString()
    return _field(1, _field(1, resource) + _field(2, _field(2, span)))


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(_with_link(), id="a link"),
        pytest.param(_with_scope_attributes(), id="a scope's attributes"),
        pytest.param(_with_string_index(), id="a string-table index"),
        pytest.param(_with_a_second_status(), id="a status sent twice"),
    ],
)
def test_what_it_does_not_read_is_left_to_protobuf_and_decoded_all_the_same(read: _Reading, body: bytes) -> None:
    with pytest.raises(read.unread):
        read(body, otlp.DEFAULT_MAX_ATTRIBUTE_LENGTH)

    decoded = otlp.decode_request(body, otlp.CONTENT_TYPE_PROTOBUF, None)
    assert decoded == otlp.decode_protobuf_runtime(body, otlp.DEFAULT_MAX_ATTRIBUTE_LENGTH)
    assert len(decoded.spans) == 1


def test_a_status_sent_twice_is_merged_by_protobuf() -> None:
    (span,) = otlp.decode_request(_with_a_second_status(), otlp.CONTENT_TYPE_PROTOBUF, None).spans

    assert (span.status_code, span.status_message) == (Status.STATUS_CODE_ERROR, "first")


def test_decoding_takes_the_reader_when_compiled_and_protobuf_for_what_it_leaves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []

    def spans_read(body: bytes, limit: int) -> Any:
        calls.append(len(body))
        return _SOURCE.spans_read(body, limit)

    monkeypatch.setattr(wire, "COMPILED", True)
    monkeypatch.setattr(wire, "spans_read", spans_read)
    monkeypatch.setattr(wire, "Unread", _SOURCE.Unread)
    plain = _encoded(_request(_plain_span()))
    assert otlp.decode_request(plain, otlp.CONTENT_TYPE_PROTOBUF, None).spans[0].name == "chat"
    assert otlp.decode_request(_with_link(), otlp.CONTENT_TYPE_PROTOBUF, None).spans[0].name == "chat"
    assert calls == [len(plain), len(_with_link())]

    monkeypatch.setattr(wire, "COMPILED", False)
    otlp.decode_request(plain, otlp.CONTENT_TYPE_PROTOBUF, None)
    assert len(calls) == 2
