"""POST /v1/traces end to end: what ingest acknowledges is stored by the time it answers, and reads back
as sent.

tracing/tests/test_otlp_fuzz.py fuzzes the parser alone (no exception but OtlpError, validation agrees
with decoding) and tracing/tests/test_api_ingest.py checks that random bodies get no 5xx. Here the
request goes through the view, which stores its spans before answering: generated spans (any ids, names,
times up to the last storable nanosecond, every attribute type) read back equal, with the documented
normalizations (a NUL becomes U+FFFD, NaN and infinities become text, bytes become base64); a mutated
body is either refused with a 4xx that leaves every table as it was, or stored whole in the request,
never left as a batch for a worker (which ingest does only when writing the spans hit a bug).
"""

from __future__ import annotations

import base64
import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from tests.badinput.conftest import assert_refused, fuzz, rolled_back, row_counts
from tracing import otlp, selectors
from tracing.models import IngestBatch
from tracing.tests.conftest import otlp_json_document
from tracing.tests.test_otlp_fuzz import MUTATION, mutate

pytestmark = pytest.mark.django_db

PROTOBUF = otlp.CONTENT_TYPE_PROTOBUF
JSON = otlp.CONTENT_TYPE_JSON

TEXT = st.text(st.characters(codec="utf-8"), max_size=30)
NAME = st.text(st.characters(codec="utf-8"), min_size=1, max_size=30)
SCALAR = st.one_of(
    TEXT.map(lambda text: AnyValue(string_value=text)),
    st.integers(-(2**63), 2**63 - 1).map(lambda number: AnyValue(int_value=number)),
    st.floats().map(lambda number: AnyValue(double_value=number)),
    st.booleans().map(lambda flag: AnyValue(bool_value=flag)),
    st.binary(max_size=20).map(lambda data: AnyValue(bytes_value=data)),
)
VALUE = st.recursive(
    SCALAR,
    lambda children: st.one_of(
        st.lists(children, max_size=3).map(lambda items: AnyValue(array_value=ArrayValue(values=items))),
        st.dictionaries(NAME, children, max_size=3).map(
            lambda entries: AnyValue(
                kvlist_value=KeyValueList(values=[KeyValue(key=key, value=value) for key, value in entries.items()])
            )
        ),
    ),
    max_leaves=6,
)
# Keys no mapper reads into a field (tracing/otlp.py), so they stay in the span's attributes.
ATTRIBUTES = st.dictionaries(NAME.map(lambda key: f"app.{key}"), VALUE, max_size=5)
LAST_NS = otlp.LAST_STORABLE_TIME_NS
START = st.one_of(st.integers(1, LAST_NS), st.sampled_from([1, LAST_NS - 1, 1_700_000_000_000_000_000]))


def expected(value: AnyValue) -> Any:
    """An attribute value as Keel stores it."""
    which = value.WhichOneof("value")
    if which == "string_value":
        return value.string_value.replace("\x00", "\ufffd")
    if which == "double_value":
        number = value.double_value
        return number if math.isfinite(number) else str(number)
    if which == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    if which == "array_value":
        return [expected(item) for item in value.array_value.values]
    if which == "kvlist_value":
        return {item.key.replace("\x00", "\ufffd"): expected(item.value) for item in value.kvlist_value.values}
    if which is None:
        return None
    return getattr(value, which)


@st.composite
def spans(draw: st.DrawFn) -> PbSpan:
    start = draw(START)
    fields: dict[str, Any] = {
        "trace_id": draw(st.binary(min_size=16, max_size=16).filter(any)),
        "span_id": draw(st.binary(min_size=8, max_size=8).filter(any)),
        "parent_span_id": draw(st.one_of(st.just(b""), st.binary(min_size=8, max_size=8).filter(any))),
        "name": draw(NAME),
        "kind": draw(st.integers(0, 5)),
        "start_time_unix_nano": start,
        "end_time_unix_nano": draw(st.integers(start, LAST_NS)),
        "attributes": [KeyValue(key=key, value=value) for key, value in draw(ATTRIBUTES).items()],
    }
    status: dict[str, Any] = {"code": draw(st.integers(0, 2)), "message": draw(TEXT)}
    return PbSpan(**fields, status=Status(**status))


def export_request(items: list[PbSpan]) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    resource_spans.resource.attributes.add(key="service.name", value=AnyValue(string_value="fuzzed-agent"))
    resource_spans.scope_spans.add().spans.extend(items)
    return request


def _post_and_store(client: Any, body: bytes, content_type: str, **headers: str) -> Any:
    """POST a body; when it is taken, check that the request stored it rather than leave it to a worker."""
    before = row_counts()
    batches = IngestBatch.objects.count()
    response = client.post("/v1/traces", body, content_type=content_type, headers=headers)
    assert response.status_code < 500, response.content[:500]
    if response.status_code != 200:
        assert_refused(response, 400, 413, 415)
        assert row_counts() == before
        return response
    # What ingest acknowledged is stored: writing it in the request never fails and falls back to a batch.
    assert IngestBatch.objects.count() == batches
    return response


@fuzz(40)
@given(items=st.lists(spans(), min_size=1, max_size=4, unique_by=lambda span: span.span_id), as_json=st.booleans())
def test_generated_spans_are_stored_and_read_back_as_sent(client, workspace, items, as_json):
    with rolled_back():
        request = export_request(items)
        body = json.dumps(otlp_json_document(request)).encode() if as_json else request.SerializeToString()

        response = _post_and_store(client, body, JSON if as_json else PROTOBUF)

        assert response.status_code == 200, response.content[:500]
        _assert_stored_as_sent(workspace, items)


def _assert_stored_as_sent(workspace: Any, items: list[PbSpan]) -> None:
    trace_ids = {span.trace_id.hex() for span in items}
    stored = {
        (span.trace_id, span.span_id): span
        for found in selectors.trace_spans(workspace_id=workspace.pk, trace_ids=trace_ids).values()
        for span in found
    }
    for sent in items:
        span = stored.pop((sent.trace_id.hex(), sent.span_id.hex()))
        assert span.name == sent.name.replace("\x00", "\ufffd")
        assert (span.start_time_ns, span.end_time_ns) == (sent.start_time_unix_nano, sent.end_time_unix_nano)
        assert span.parent_span_id == (sent.parent_span_id.hex() or None)
        assert span.kind == otlp.SPAN_KINDS[sent.kind]
        assert span.status == ("unset", "ok", "error")[sent.status.code]
        assert span.status_message == sent.status.message.replace("\x00", "\ufffd")
        assert span.attributes == {
            attribute.key.replace("\x00", "\ufffd"): expected(attribute.value) for attribute in sent.attributes
        }
    assert stored == {}


@fuzz(60)
@given(
    items=st.lists(spans(), min_size=1, max_size=3, unique_by=lambda span: span.span_id),
    mutations=st.lists(MUTATION, min_size=1, max_size=6),
    as_json=st.booleans(),
)
def test_a_mutated_body_is_stored_whole_or_refused_leaving_nothing(client, items, mutations, as_json):
    request = export_request(items)
    body = json.dumps(otlp_json_document(request)).encode() if as_json else request.SerializeToString()

    with rolled_back():
        _post_and_store(client, mutate(body, mutations), JSON if as_json else PROTOBUF)


def test_a_span_ending_after_the_last_storable_nanosecond_is_rejected_and_the_rest_stored(client, workspace):
    fits = PbSpan(
        trace_id=b"\x01" * 16, span_id=b"\x01" * 8, name="fits", start_time_unix_nano=1, end_time_unix_nano=LAST_NS
    )
    late = PbSpan(
        trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="late", start_time_unix_nano=1, end_time_unix_nano=LAST_NS + 1
    )

    response = _post_and_store(client, export_request([fits, late]).SerializeToString(), PROTOBUF)

    assert response.status_code == 200
    stored = selectors.trace_spans(workspace_id=workspace.pk, trace_ids=[(b"\x01" * 16).hex()])[(b"\x01" * 16).hex()]
    assert [span.name for span in stored] == ["fits"]


def test_token_counts_no_model_could_report_are_dropped_and_the_batch_stored(client, workspace):
    spans = [
        PbSpan(
            trace_id=b"\x02" * 16,
            span_id=bytes([index + 1]) * 8,
            name="chat",
            start_time_unix_nano=1,
            end_time_unix_nano=2,
            attributes=[
                KeyValue(key="gen_ai.operation.name", value=AnyValue(string_value="chat")),
                KeyValue(key="gen_ai.usage.input_tokens", value=AnyValue(int_value=2**63 - 1)),
                KeyValue(key="gen_ai.usage.output_tokens", value=AnyValue(int_value=7)),
            ],
        )
        for index in range(3)
    ]

    response = _post_and_store(client, export_request(spans).SerializeToString(), PROTOBUF)

    assert response.status_code == 200
    stored = selectors.trace_spans(workspace_id=workspace.pk, trace_ids=[(b"\x02" * 16).hex()])[(b"\x02" * 16).hex()]
    assert [(span.usage.input_tokens, span.usage.output_tokens) for span in stored] == [(None, 7)] * 3
