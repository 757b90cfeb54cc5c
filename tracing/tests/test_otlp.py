"""Decoding OTLP/HTTP trace export requests: formats, encodings, limits, per-span rejection."""

from __future__ import annotations

import gzip
import json
import zlib
from typing import Any

import pytest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.trace import SpanKind, Status, StatusCode

from tracing import otlp
from tracing.tests.conftest import (
    PARENT_ID,
    SPAN_ID,
    TRACE_ID,
    OtelRecorder,
    decode_pb,
    otlp_json_document,
    pb_request,
    pb_span,
)

PROTOBUF = otlp.CONTENT_TYPE_PROTOBUF
JSON = otlp.CONTENT_TYPE_JSON


def string_attribute(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def decode_json(document: Any, **limits: int) -> otlp.ExportRequest:
    return otlp.decode_request(json.dumps(document).encode(), JSON, None, **limits)


def json_span(**fields: Any) -> dict[str, Any]:
    span: dict[str, Any] = {
        "traceId": TRACE_ID.hex(),
        "spanId": SPAN_ID.hex(),
        "name": "chat gpt-4o",
        "kind": 3,
        "startTimeUnixNano": "1700000000000000000",
        "endTimeUnixNano": "1700000001500000000",
    }
    span.update(fields)
    return span


def json_request(*spans: dict[str, Any]) -> dict[str, Any]:
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "checkout-agent"}}]},
                "scopeSpans": [{"scope": {"name": "keel.tests", "version": "1.0.0"}, "spans": list(spans)}],
            }
        ]
    }


# --- Formats --------------------------------------------------------------------------------------------


def record_sdk_spans(otel: OtelRecorder) -> None:
    tracer = otel.tracer()
    with tracer.start_as_current_span("invoke_agent support", kind=SpanKind.INTERNAL) as root:
        root.set_attribute("gen_ai.operation.name", "invoke_agent")
        with tracer.start_as_current_span("chat gpt-4o", kind=SpanKind.CLIENT) as chat:
            chat.set_attributes(
                {
                    "gen_ai.request.model": "gpt-4o",
                    "gen_ai.usage.input_tokens": 120,
                    "gen_ai.request.temperature": 0.25,
                    "gen_ai.request.stream": False,
                    "gen_ai.response.finish_reasons": ["stop", "length"],
                    "gen_ai.request.stop_sequences": [],
                    "llm.token_ids": [1, 2, 3],
                }
            )
            chat.add_event("gen_ai.user.message", {"content": "hi"}, timestamp=1_700_000_000_000_000_100)
            chat.set_status(Status(StatusCode.ERROR, "rate limited"))


def test_sdk_protobuf_export_decodes_ids_times_kinds_status_attributes_and_events(otel: OtelRecorder) -> None:
    record_sdk_spans(otel)
    finished = {span.name: span for span in otel.exporter.get_finished_spans()}

    request = otlp.decode_request(otel.protobuf(), PROTOBUF, None)

    assert request.rejected_spans == 0
    assert request.rejection_reasons == {}
    assert request.error_message == ""
    spans = {span.name: span for span in request.spans}
    chat, root = spans["chat gpt-4o"], spans["invoke_agent support"]
    sdk_chat, sdk_root = finished["chat gpt-4o"], finished["invoke_agent support"]
    assert sdk_chat.context is not None
    assert sdk_root.context is not None
    assert chat.trace_id == format(sdk_chat.context.trace_id, "032x")
    assert chat.span_id == format(sdk_chat.context.span_id, "016x")
    assert chat.parent_span_id == root.span_id == format(sdk_root.context.span_id, "016x")
    assert root.parent_span_id is None
    assert (chat.kind, root.kind) == (3, 1)
    assert (chat.start_time_ns, chat.end_time_ns) == (sdk_chat.start_time, sdk_chat.end_time)
    assert (chat.status_code, chat.status_message) == (2, "rate limited")
    assert chat.attributes == {
        "gen_ai.request.model": "gpt-4o",
        "gen_ai.usage.input_tokens": 120,
        "gen_ai.request.temperature": 0.25,
        "gen_ai.request.stream": False,
        "gen_ai.response.finish_reasons": ["stop", "length"],
        "gen_ai.request.stop_sequences": [],
        "llm.token_ids": [1, 2, 3],
    }
    assert chat.events == (
        otlp.SpanEvent(name="gen_ai.user.message", time_ns=1_700_000_000_000_000_100, attributes={"content": "hi"}),
    )
    assert chat.resource_attributes["service.name"] == "checkout-agent"
    assert (chat.scope_name, chat.scope_version) == ("keel.tests", "1.0.0")
    assert chat.truncated_attributes == {}


def test_json_export_of_the_same_spans_decodes_to_the_same_raw_spans(otel: OtelRecorder) -> None:
    record_sdk_spans(otel)

    from_protobuf = otlp.decode_request(otel.protobuf(), PROTOBUF, None)
    from_json = otlp.decode_request(otel.json(), JSON, None)

    assert from_json == from_protobuf
    assert len(from_json.spans) == 2


def test_json_accepts_numbers_for_int64_enum_names_snake_case_and_base64_ids() -> None:
    document = {
        "resource_spans": [
            {
                "resource": {},
                "scope_spans": [
                    {
                        "spans": [
                            {
                                "trace_id": "W47/95gDgQPSabYzgT/GDA==",
                                "span_id": SPAN_ID.hex().upper(),
                                "parent_span_id": "0000000000000000",
                                "name": "retrieve",
                                "kind": "SPAN_KIND_SERVER",
                                "start_time_unix_nano": 1_700_000_000_000_000_000,
                                "end_time_unix_nano": 1.7000000015e18,
                                "status": {"code": "STATUS_CODE_OK"},
                                "attributes": [
                                    {"key": "n", "value": {"int_value": 7}},
                                    {"key": "big", "value": {"intValue": "9223372036854775807"}},
                                ],
                            }
                        ]
                    }
                ],
            }
        ]
    }

    (span,) = decode_json(document).spans

    assert span.trace_id == TRACE_ID.hex()
    assert span.span_id == SPAN_ID.hex()
    assert span.parent_span_id is None
    assert (span.kind, span.status_code) == (2, 1)
    assert (span.start_time_ns, span.end_time_ns) == (1_700_000_000_000_000_000, 1_700_000_001_500_000_000)
    assert span.attributes == {"n": 7, "big": 9223372036854775807}
    assert span.resource_attributes == {}
    assert (span.scope_name, span.scope_version) == ("", "")


def test_every_any_value_kind_decodes_the_same_from_protobuf_and_json() -> None:
    nested = AnyValue(
        kvlist_value=KeyValueList(
            values=[
                KeyValue(key="role", value=AnyValue(string_value="user")),
                KeyValue(
                    key="scores",
                    value=AnyValue(array_value=ArrayValue(values=[AnyValue(double_value=0.5), AnyValue(int_value=2)])),
                ),
                KeyValue(key="empty", value=AnyValue()),
            ]
        )
    )
    span = pb_span(
        attributes=[
            string_attribute("text", "héllo"),
            KeyValue(key="count", value=AnyValue(int_value=-3)),
            KeyValue(key="ratio", value=AnyValue(double_value=1.25)),
            KeyValue(key="flag", value=AnyValue(bool_value=True)),
            KeyValue(key="blob", value=AnyValue(bytes_value=b"\x00\x01\xff")),
            KeyValue(key="nan", value=AnyValue(double_value=float("nan"))),
            KeyValue(key="message", value=nested),
        ]
    )
    request = pb_request(span)

    from_protobuf = decode_pb(request)
    from_json = decode_json(otlp_json_document(request))

    expected = {
        "text": "héllo",
        "count": -3,
        "ratio": 1.25,
        "flag": True,
        "blob": "AAH/",
        "nan": "nan",
        "message": {"role": "user", "scores": [0.5, 2], "empty": None},
    }
    assert from_protobuf.spans[0].attributes == expected
    assert from_json.spans[0].attributes == expected


def test_an_empty_request_has_no_spans_and_no_rejections() -> None:
    for request in (
        otlp.decode_request(b"", PROTOBUF, None),
        otlp.decode_request(b"{}", JSON, None),
        decode_json({"resourceSpans": []}),
    ):
        assert request == otlp.ExportRequest(spans=(), rejected_spans=0, rejection_reasons={})


# --- Content types and encodings -------------------------------------------------------------------------


@pytest.mark.parametrize("content_type", ["application/json; charset=utf-8", "Application/JSON"])
def test_content_type_parameters_and_case_are_ignored(content_type: str) -> None:
    request = otlp.decode_request(json.dumps(json_request(json_span())).encode(), content_type, None)

    assert len(request.spans) == 1


@pytest.mark.parametrize("content_type", ["text/plain", "application/grpc", "", "application/x-www-form-urlencoded"])
def test_other_content_types_are_unsupported(content_type: str) -> None:
    with pytest.raises(otlp.UnsupportedContentType) as error:
        otlp.decode_request(b"{}", content_type, None)

    assert error.value.message == (
        f"content type {content_type!r} is not supported; send application/x-protobuf or application/json"
    )
    assert error.value.code == "unsupported_content_type"


def test_unsupported_content_encoding_is_reported() -> None:
    with pytest.raises(otlp.UnsupportedContentType) as error:
        otlp.decode_request(b"{}", JSON, "br")

    assert error.value.message == "content encoding 'br' is not supported; use gzip or deflate"


def raw_deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


@pytest.mark.parametrize(
    ("encoding", "compress"),
    [
        ("gzip", gzip.compress),
        ("GZIP", gzip.compress),
        ("x-gzip", gzip.compress),
        ("deflate", zlib.compress),
        ("deflate", raw_deflate),
        ("identity", bytes),
        (None, bytes),
    ],
)
def test_compressed_bodies_decode(encoding: str | None, compress: Any) -> None:
    body = pb_request(pb_span()).SerializeToString()

    request = otlp.decode_request(compress(body), PROTOBUF, encoding)

    assert [span.span_id for span in request.spans] == [SPAN_ID.hex()]


def test_concatenated_gzip_members_decode_as_one_body() -> None:
    body = json.dumps(json_request(json_span())).encode()
    compressed = gzip.compress(body[:10]) + gzip.compress(body[10:])

    request = otlp.decode_request(compressed, JSON, "gzip")

    assert len(request.spans) == 1


def test_a_gzip_bomb_stops_at_the_decompressed_size_limit() -> None:
    bomb = gzip.compress(b"\x00" * (20 * 1024 * 1024))
    assert len(bomb) < 30_000

    with pytest.raises(otlp.PayloadTooLarge) as error:
        otlp.decode_request(bomb, PROTOBUF, "gzip", max_decompressed_bytes=1024 * 1024)

    assert error.value.message == "the request body decompresses to more than 1048576 bytes"
    assert error.value.code == "payload_too_large"


def test_an_uncompressed_body_over_the_limit_is_too_large() -> None:
    with pytest.raises(otlp.PayloadTooLarge):
        otlp.decode_request(b" " * 2048, JSON, None, max_decompressed_bytes=1024)


def test_a_body_exactly_at_the_limit_is_accepted() -> None:
    body = json.dumps(json_request(json_span())).encode()

    request = otlp.decode_request(gzip.compress(body), JSON, "gzip", max_decompressed_bytes=len(body))

    assert len(request.spans) == 1


@pytest.mark.parametrize(
    ("body", "encoding", "message"),
    [
        (
            b"not gzip at all",
            "gzip",
            "the body is not valid gzip data: Error -3 while decompressing data: incorrect header check",
        ),
        (gzip.compress(b"{}" * 100, mtime=0)[:20], "gzip", "the gzip stream is truncated"),
        (
            b"\xff\xfe",
            "deflate",
            "the body is not valid deflate data: Error -3 while decompressing data: invalid block type",
        ),
    ],
)
def test_broken_compressed_bodies_are_malformed(body: bytes, encoding: str, message: str) -> None:
    with pytest.raises(otlp.MalformedPayload) as error:
        otlp.decode_request(body, JSON, encoding)

    assert error.value.message == message


# --- Malformed envelopes ------------------------------------------------------------------------------------


def test_bytes_that_are_not_an_export_request_are_malformed_protobuf() -> None:
    with pytest.raises(otlp.MalformedPayload) as error:
        otlp.decode_request(b"\x0a\xff\xff\xff\xff\x0f", PROTOBUF, None)

    assert error.value.message == "the body is not a valid OTLP ExportTraceServiceRequest protobuf message"
    assert error.value.code == "malformed_payload"
    assert isinstance(error.value, otlp.OtlpError)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            b"{",
            "the body is not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
        ),
        (b"[]", "the JSON body must be an object with resourceSpans"),
        (b'{"resourceSpans": {}}', "resourceSpans must be a list"),
        (b'{"resourceSpans": [1]}', "each resourceSpans item must be an object"),
        (b'{"resourceSpans": [{"resource": []}]}', "resource must be an object"),
        (
            b'{"resourceSpans": [{"resource": {"attributes": {"a": 1}}}]}',
            "resource: attributes are not a list of key-value pairs",
        ),
        (b'{"resourceSpans": [{"scopeSpans": "x"}]}', "scopeSpans must be a list"),
        (b'{"resourceSpans": [{"scopeSpans": [{"spans": {}}]}]}', "spans must be a list"),
        (b'{"resourceSpans": [{"scopeSpans": [{"scope": 3}]}]}', "scope must be an object"),
        (b'{"a": NaN}', "the body is not valid JSON: NaN is not valid JSON"),
        (
            b"\xff\xfe\x00",
            "the body is not valid JSON: 'utf-16-le' codec can't decode byte 0x00 in position 2: truncated data",
        ),
        (b"[" * 100_000 + b"]" * 100_000, "the JSON body is nested too deeply"),
    ],
)
def test_json_envelope_errors_are_malformed(body: bytes, message: str) -> None:
    with pytest.raises(otlp.MalformedPayload) as error:
        otlp.decode_request(body, JSON, None)

    assert error.value.message == message


def test_the_error_hierarchy() -> None:
    for error_type in (otlp.UnsupportedContentType, otlp.MalformedPayload, otlp.PayloadTooLarge):
        assert issubclass(error_type, otlp.OtlpError)
    error = otlp.MalformedPayload("the body is not valid JSON")
    assert (str(error), error.message) == ("the body is not valid JSON", "the body is not valid JSON")


# --- Per-span rejection -------------------------------------------------------------------------------------


def test_invalid_spans_are_rejected_and_counted_while_the_rest_are_kept() -> None:
    request = pb_request(
        pb_span(),
        pb_span(trace_id=TRACE_ID[:15]),
        pb_span(trace_id=bytes(16)),
        pb_span(span_id=bytes(8)),
        pb_span(span_id=b""),
        pb_span(parent_span_id=b"\x01\x02"),
        pb_span(name=""),
        pb_span(start_time_unix_nano=0),
        pb_span(end_time_unix_nano=1_699_999_999_000_000_000),
        pb_span(span_id=PARENT_ID, parent_span_id=bytes(8)),
    )

    decoded = decode_pb(request)

    assert [(span.span_id, span.parent_span_id) for span in decoded.spans] == [
        (SPAN_ID.hex(), None),
        (PARENT_ID.hex(), None),
    ]
    assert decoded.rejected_spans == 8
    assert decoded.rejection_reasons == {
        "invalid trace id": 2,
        "invalid span id": 2,
        "invalid parent span id": 1,
        "missing name": 1,
        "missing start time": 1,
        "end time before start time": 1,
    }
    assert decoded.error_message == (
        "rejected 8 spans: 1 end time before start time, 1 invalid parent span id, 2 invalid span id, "
        "2 invalid trace id, 1 missing name, 1 missing start time"
    )


def test_invalid_json_spans_are_rejected_and_counted_while_the_rest_are_kept() -> None:
    document = json_request(
        json_span(),
        json_span(traceId="zz" * 16),
        json_span(traceId=TRACE_ID.hex()[:30]),
        json_span(traceId=None),
        json_span(spanId="0000000000000000"),
        json_span(parentSpanId="abc"),
        json_span(name=None),
        json_span(startTimeUnixNano="soon"),
        json_span(endTimeUnixNano="1"),
        json_span(attributes={"gen_ai.request.model": "gpt-4o"}),
        json_span(attributes=[{"value": {"stringValue": "no key"}}]),
        json_span(attributes=[{"key": "n", "value": {"intValue": "twelve"}}]),
        json_span(attributes=[{"key": "n", "value": {"boolValue": "yes"}}]),
        json_span(attributes=[{"key": "n", "value": {"bytesValue": "***"}}]),
        json_span(events={"name": "x"}),
        json_span(events=[7]),
    )
    document["resourceSpans"][0]["scopeSpans"][0]["spans"].append("not a span")

    decoded = decode_json(document)

    assert len(decoded.spans) == 1
    assert decoded.rejected_spans == 16
    assert decoded.rejection_reasons == {
        "invalid trace id": 3,
        "invalid span id": 1,
        "invalid parent span id": 1,
        "missing name": 1,
        "missing start time": 1,
        "end time before start time": 1,
        "attributes are not a list of key-value pairs": 1,
        "attribute without a key": 1,
        "malformed attribute value": 3,
        "malformed event": 2,
        "malformed span": 1,
    }


def test_json_attribute_values_nested_too_deeply_reject_the_span() -> None:
    value: dict[str, Any] = {"stringValue": "leaf"}
    for _ in range(40):
        value = {"arrayValue": {"values": [value]}}

    decoded = decode_json(json_request(json_span(attributes=[{"key": "deep", "value": value}])))

    assert decoded.rejection_reasons == {"attribute value nested too deeply": 1}


# --- Attribute limits and cleaning ----------------------------------------------------------------------------


def test_oversized_attribute_values_are_truncated_with_a_marker_and_their_length_kept() -> None:
    span = pb_span(
        attributes=[
            string_attribute("gen_ai.input.messages", "x" * 50),
            string_attribute("short", "y" * 10),
            KeyValue(key="blob", value=AnyValue(bytes_value=b"z" * 30)),
            KeyValue(key="list", value=AnyValue(array_value=ArrayValue(values=[AnyValue(string_value="w" * 11)]))),
        ]
    )
    request = pb_request(span)

    for decoded in (
        decode_pb(request, max_attribute_length=10),
        decode_json(otlp_json_document(request), max_attribute_length=10),
    ):
        (raw,) = decoded.spans
        assert raw.attributes == {
            "gen_ai.input.messages": "xxxxxxxxxx…[truncated by Keel; original length 50]",
            "short": "yyyyyyyyyy",
            "blob": "enp6enp6en…[truncated by Keel; original length 40]",
            "list": ["wwwwwwwwww…[truncated by Keel; original length 11]"],
        }
        assert raw.truncated_attributes == {"gen_ai.input.messages": 50}
        assert decoded.rejected_spans == 0


def test_nul_characters_become_replacement_characters() -> None:
    span = pb_span(name="chat\x00", attributes=[string_attribute("k\x00ey", "va\x00lue")])
    request = pb_request(span)

    for decoded in (decode_pb(request), decode_json(otlp_json_document(request))):
        (raw,) = decoded.spans
        assert raw.name == "chat\ufffd"
        assert raw.attributes == {"k\ufffdey": "va\ufffdlue"}


def test_lone_surrogates_in_json_are_replaced() -> None:
    body = json.dumps(json_request(json_span(attributes=[{"key": "text", "value": {"stringValue": "a\ud800b"}}])))

    (raw,) = otlp.decode_request(body.encode(), JSON, None).spans

    assert raw.attributes == {"text": "a?b"}


def test_utf16_json_bodies_decode() -> None:
    body = json.dumps(json_request(json_span(name="résumé")), ensure_ascii=False).encode("utf-16")

    (raw,) = otlp.decode_request(body, JSON, None).spans

    assert raw.name == "résumé"


# --- Validation without decoding -------------------------------------------------------------------------


def test_validation_counts_what_decoding_accepts_and_rejects() -> None:
    request = pb_request(pb_span(), pb_span(trace_id=bytes(16)), pb_span(name=""), pb_span(span_id=PARENT_ID))
    body = request.SerializeToString()
    json_body = json.dumps(otlp_json_document(request)).encode()

    for content_type, payload in ((PROTOBUF, body), (JSON, json_body)):
        summary = otlp.validate_request(gzip.compress(payload), content_type, "gzip")
        assert summary == otlp.ExportSummary(
            accepted_spans=2, rejected_spans=2, rejection_reasons={"invalid trace id": 1, "missing name": 1}
        )
        assert summary == otlp.decode_request(payload, content_type, None).summary
        assert summary.error_message == "rejected 2 spans: 1 invalid trace id, 1 missing name"


@pytest.mark.parametrize(
    ("body", "content_type", "encoding", "error_type"),
    [
        (b"\x0a\xff", PROTOBUF, None, otlp.MalformedPayload),
        (b"{", JSON, None, otlp.MalformedPayload),
        (b"{}", "text/plain", None, otlp.UnsupportedContentType),
        (b"{}", JSON, "br", otlp.UnsupportedContentType),
        (gzip.compress(b" " * 5000, mtime=0), JSON, "gzip", otlp.PayloadTooLarge),
    ],
)
def test_validation_raises_what_decoding_raises(
    body: bytes, content_type: str, encoding: str | None, error_type: type[otlp.OtlpError]
) -> None:
    with pytest.raises(error_type):
        otlp.validate_request(body, content_type, encoding, max_decompressed_bytes=1000)
    with pytest.raises(error_type):
        otlp.decode_request(body, content_type, encoding, max_decompressed_bytes=1000)
