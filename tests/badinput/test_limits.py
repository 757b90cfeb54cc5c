"""Limits on every surface that takes a body: an oversized body is 413 before it is read, JSON nested
10,000 deep and bytes that are not UTF-8 are a clear 4xx, JSON that PostgreSQL cannot hold (NaN, NUL,
lone surrogates) is refused before anything is written, a 5 MB attribute value is stored cut with a
marker, and the largest protobuf of tiny spans that fits under the body limit is refused in bounded memory
(and one at the span limit stored in bounded memory by the request that brought it)."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import Client

from agent_registry import services as registry_services
from agent_registry.tests.factories import prompt_with_versions
from evals import services as evals_services
from tests.badinput.conftest import assert_refused, row_counts
from tracing import otlp, selectors
from tracing import services as tracing_services
from tracing.models import IngestBatch, Span

pytestmark = pytest.mark.django_db

PROTOBUF = otlp.CONTENT_TYPE_PROTOBUF
DEEP = b"[" * 10_000 + b"]" * 10_000


@dataclass(frozen=True)
class Surface:
    """One endpoint that reads a body, and how to wrap a JSON value into a body it would otherwise accept."""

    name: str
    path: str
    content_type: str
    wrap: Callable[[bytes], bytes]

    def post(self, client: Client, body: bytes, **extra: Any) -> Any:
        return client.generic("POST", self.path, body, content_type=self.content_type, **extra)


def _csv_cell(value: bytes) -> bytes:
    return b'"' + value.replace(b'"', b'""') + b'"'


SURFACES = [
    Surface("agents", "/api/v1/agents", "application/json", lambda v: b'{"slug": "a1", "name": ' + v + b"}"),
    Surface(
        "langfuse-prompts",
        "/api/public/v2/prompts",
        "application/json",
        lambda v: b'{"name": "p", "type": "text", "prompt": ' + v + b"}",
    ),
    Surface(
        "trajectories",
        "/api/v1/ingest/trajectories",
        "application/json",
        lambda v: b'{"messages": [{"role": "user", "content": ' + v + b"}]}",
    ),
    Surface(
        "dataset-items",
        "/api/v1/datasets/regressions/versions",
        "application/json",
        lambda v: b'{"items": [{"task": "t", "metadata": {"x": ' + v + b"}}]}",
    ),
    Surface(
        "dataset-jsonl",
        "/api/v1/datasets/regressions/upload?format=jsonl",
        "application/x-ndjson",
        lambda v: b'{"task": "t", "metadata": {"x": ' + v + b"}}\n",
    ),
    Surface(
        "dataset-csv",
        "/api/v1/datasets/regressions/upload?format=csv",
        "text/csv",
        lambda v: b"task,metadata\nt," + _csv_cell(b'{"x": ' + v + b"}") + b"\n",
    ),
    Surface(
        "runs-import",
        "/api/v1/runs/import",
        "application/x-ndjson",
        lambda v: (
            b'{"responses_create_params": {"input": "q"}, "response": {"output": [{"type": "message", '
            b'"role": "assistant", "content": [{"type": "output_text", "text": "a"}]}]}, "reward": 1.0, '
            b'"x": ' + v + b"}\n"
        ),
    ),
    Surface(
        "guardrail-check",
        "/api/v1/guardrails/check",
        "application/json",
        lambda v: b'{"agent": "support", "layer": "input", "content": ' + v + b"}",
    ),
    Surface(
        "guardrail-tool-call",
        "/api/v1/guardrails/tool-calls",
        "application/json",
        lambda v: b'{"agent": "support", "tool": "refund", "arguments": {"x": ' + v + b"}}",
    ),
    Surface(
        "gateway",
        "/v1/chat/completions",
        "application/json",
        lambda v: (
            b'{"model": "agent/ride-support", "variables": {"company": "Acme"}, '
            b'"messages": [{"role": "user", "content": ' + v + b"}]}"
        ),
    ),
    Surface(
        "otlp-json",
        "/v1/traces",
        "application/json",
        lambda v: (
            b'{"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": [{"traceId": '
            b'"5b8efff798038103d269b633813fc60c", "spanId": "eee19b7ec3c1b174", "name": "s", '
            b'"startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000001000000000", '
            b'"attributes": [{"key": "k", "value": {"stringValue": ' + v + b"}}]}]}]}]}"
        ),
    ),
]
IDS = [surface.name for surface in SURFACES]


@pytest.fixture
def ready(workspace, agent, gateway, raw_key):
    """Everything the surfaces' paths and bodies name: the agent `support` and its prompt `p`, the
    gateway's agent, a dataset."""
    prompt_with_versions(agent=agent, name="p")
    evals_services.dataset_create(workspace=workspace, name="regressions", description="", agent=None)
    return Client(headers={"Authorization": f"Bearer {raw_key}"})


def test_each_surface_accepts_its_wrapped_body(ready, settings):
    """The bodies below are refused for what is in them, not for their shape."""
    settings.KEEL_INGEST_MAX_QUEUE_SECONDS = 3600  # no worker runs here: the JSON trajectories' batches wait
    for surface in SURFACES:
        response = surface.post(ready, surface.wrap(b'"hello"'))
        assert response.status_code in (200, 201, 202), (surface.name, response.status_code, response.content[:300])


class CountingStream:
    """A request body that would yield `size` bytes, counting what is read of it."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.read_bytes = 0

    def read(self, size: int = -1) -> bytes:
        left = self.size - self.read_bytes
        count = left if size is None or size < 0 else min(size, left)
        self.read_bytes += count
        return b" " * count

    def readline(self, size: int = -1) -> bytes:
        return self.read(size)


@pytest.mark.parametrize("surface", SURFACES, ids=IDS)
def test_a_body_declared_over_the_limit_is_413_before_a_byte_is_read(ready, surface):
    declared = settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1
    stream = CountingStream(declared)
    before = row_counts()

    response = surface.post(ready, b"{}", CONTENT_LENGTH=str(declared), **{"wsgi.input": stream})

    assert response.status_code == 413
    if surface.name == "gateway":
        assert response.json()["error"]["code"] == "payload_too_large"
    assert assert_refused(response)["code"] in ("payload_too_large", "content_too_large")
    assert stream.read_bytes == 0
    assert row_counts() == before


@pytest.mark.parametrize("surface", SURFACES, ids=IDS)
def test_a_chunked_body_without_a_length_is_411_not_read_as_empty(ready, surface):
    """Django reads a body up to its Content-Length; without one, OTLP answered 200 and stored nothing."""
    before = row_counts()

    response = surface.post(ready, surface.wrap(b'"hello"'), CONTENT_LENGTH="", HTTP_TRANSFER_ENCODING="chunked")

    assert assert_refused(response, 411)["code"] == "length_required"
    assert row_counts() == before


@pytest.mark.parametrize("surface", SURFACES, ids=IDS)
def test_a_body_over_the_limit_is_413(ready, surface, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 64 * 1024
    body = surface.wrap(json.dumps("x" * (64 * 1024)).encode())
    before = row_counts()

    response = surface.post(ready, body)

    assert_refused(response, 413)
    assert row_counts() == before


@pytest.mark.parametrize("surface", SURFACES, ids=IDS)
def test_json_nested_ten_thousand_deep_is_a_4xx(ready, surface):
    before = row_counts()

    response = surface.post(ready, surface.wrap(DEEP))

    assert_refused(response, 400, 422)
    assert row_counts() == before


@pytest.mark.parametrize("surface", SURFACES, ids=IDS)
def test_bytes_that_are_not_utf8_are_400(ready, surface):
    before = row_counts()

    response = surface.post(ready, surface.wrap(b'"caf\xe9 \xff\xfe"'))

    assert_refused(response, 400, 422)
    assert row_counts() == before


UNSTORABLE = {
    "nan": b"NaN",
    "infinity": b"-Infinity",
    "nul": b'"a\\u0000b"',
    "lone-surrogate": b'"a\\ud800b"',
    "huge-number": b"1e400",
}


@pytest.mark.parametrize("surface", [s for s in SURFACES if s.name != "otlp-json"], ids=IDS[:-1])
@pytest.mark.parametrize("value", UNSTORABLE.values(), ids=UNSTORABLE.keys())
def test_json_postgresql_cannot_hold_is_refused_and_nothing_is_written(ready, surface, value):
    before = row_counts()

    response = surface.post(ready, surface.wrap(value))

    assert_refused(response, 400, 422)
    assert row_counts() == before


OTLP_STORED = {"nan": None, "infinity": None, "nul": "a\ufffdb", "lone-surrogate": "a?b", "huge-number": None}


@pytest.mark.parametrize(("name", "value"), UNSTORABLE.items(), ids=UNSTORABLE.keys())
def test_otlp_json_keeps_what_it_can_of_unstorable_values(ready, workspace, name, value):
    """OTLP keeps a span whose attribute holds a NUL (as U+FFFD) or a lone surrogate (replaced), stored by
    the time it answers; a body that is not JSON (NaN, infinities) is refused whole (400), never stored half."""
    surface = SURFACES[-1]
    before = row_counts()

    response = surface.post(ready, surface.wrap(value))

    if OTLP_STORED[name] is None:
        assert_refused(response, 400)
        assert row_counts() == before
        return
    assert response.status_code == 200, response.content[:300]
    # Stored in the request: no batch was left for a worker (which would mean writing it hit a bug).
    assert not IngestBatch.objects.exists()
    trace_id = "5b8efff798038103d269b633813fc60c"
    (span,) = selectors.trace_spans(workspace_id=workspace.pk, trace_ids=[trace_id])[trace_id]
    assert span.attributes == {"k": OTLP_STORED[name]}


# --- A 5 MB attribute value ------------------------------------------------------------------------


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _fixed64(number: int, value: int) -> bytes:
    return _varint(number << 3 | 1) + struct.pack("<Q", value)


def _string_attribute(key: str, value: bytes) -> bytes:
    # KeyValue{key=1, value=2: AnyValue{string_value=1}}
    return _field(1, key.encode()) + _field(2, _field(1, value))


def _span(trace_id: bytes, span_id: bytes, name: bytes, attributes: bytes = b"") -> bytes:
    # Span{trace_id=1, span_id=2, name=5, start=7, end=8, attributes=9}
    return (
        _field(1, trace_id)
        + _field(2, span_id)
        + _field(5, name)
        + _fixed64(7, 1_700_000_000_000_000_000)
        + _fixed64(8, 1_700_000_000_000_001_000)
        + attributes
    )


def _request(spans: bytes) -> bytes:
    """ExportTraceServiceRequest{resource_spans=1: ResourceSpans{resource=1, scope_spans=2: ScopeSpans{spans=2}}}
    around already encoded `spans` (each a length-delimited field 2)."""
    resource = _field(1, _field(1, _string_attribute("service.name", b"tiny")))
    resource_spans = resource + _field(2, spans)
    return _field(1, resource_spans)


TRACE_ID = bytes.fromhex("5b8efff798038103d269b633813fc60c")


def test_a_five_megabyte_attribute_is_stored_cut_to_the_limit_with_a_marker(ready, workspace):
    value = "é" * 2_500_000  # 5 MB of UTF-8
    body = _request(
        _field(
            2,
            _span(
                TRACE_ID, bytes.fromhex("eee19b7ec3c1b174"), b"big", _field(9, _string_attribute("big", value.encode()))
            ),
        )
    )

    response = ready.post("/v1/traces", body, content_type=PROTOBUF)

    assert response.status_code == 200
    assert not IngestBatch.objects.exists()  # stored in the request, not left for a worker
    (span,) = selectors.trace_spans(workspace_id=workspace.pk, trace_ids=[TRACE_ID.hex()])[TRACE_ID.hex()]
    limit = settings.KEEL_MAX_ATTRIBUTE_LENGTH
    marker = otlp.TRUNCATION_MARKER.format(length=len(value))
    assert span.attributes["big"] == value[:limit] + marker
    assert span.truncated_attributes == {"big": len(value)}


# --- Many tiny spans ------------------------------------------------------------------------------


def _peak_rss_reset() -> bool:
    """Reset the kernel's peak-RSS mark for this process (Linux 4.0+); False when it cannot be."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"{field} is not in /proc/self/status")


class PeakRss:
    """How far this process's peak RSS rose over a block, in MiB (None where the kernel cannot say).
    Memory freed earlier and reused is not counted, so this is a lower bound on what the block used,
    and an upper bound on what it added: a generous bound check, not a benchmark."""

    def __enter__(self) -> PeakRss:
        self.measured = _peak_rss_reset()
        self.before = _rss_kib("VmRSS")
        self.grown_mib: float | None = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self.measured:
            self.grown_mib = (_rss_kib("VmHWM") - self.before) / 1024


def tiny_spans_request(count: int, *, distinct_traces: bool = False) -> bytes:
    """A request of `count` tiny spans (a name of one letter, no attributes), each with its own span id;
    all of one trace, or each of its own."""
    template = _span(TRACE_ID, b"\xaa" * 8, b"s")
    head, tail = template.split(b"\xaa" * 8)
    if distinct_traces:
        trace_at = head.index(TRACE_ID)
        spans = b"".join(
            _field(
                2, head[:trace_at] + index.to_bytes(16, "big") + head[trace_at + 16 :] + index.to_bytes(8, "big") + tail
            )
            for index in range(1, count + 1)
        )
    else:
        prefix = _varint(2 << 3 | 2) + _varint(len(template))
        spans = b"".join(prefix + head + index.to_bytes(8, "big") + tail for index in range(1, count + 1))
    return _request(spans)


def test_sixteen_megabytes_of_tiny_spans_are_refused_with_413_in_bounded_memory(ready):
    """About 330,000 spans fit in 16 MB (a million would need 50 MB). Accepted, one trace of that many
    took a worker 7 GB to store; the request is refused instead, having stored none of them."""
    one = len(tiny_spans_request(1)) - len(_request(b""))
    count = min(1_000_000, (settings.DATA_UPLOAD_MAX_MEMORY_SIZE - 64) // one)
    body = tiny_spans_request(count)
    assert len(body) <= settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    before = row_counts()

    with PeakRss() as peak:
        response = ready.post("/v1/traces", body, content_type=PROTOBUF)

    assert_refused(response, 413)
    assert f"holds {count:,} spans" in response.json()["detail"]
    assert row_counts() == before
    if peak.grown_mib is not None:
        assert peak.grown_mib < 1024, f"refusing took {peak.grown_mib:.0f} MiB"


@pytest.mark.parametrize("path", ["/v1/traces", "/api/v1/ingest/trajectories"])
def test_one_span_over_the_per_request_limit_is_413_and_the_limit_itself_is_taken(ready, workspace, settings, path):
    settings.KEEL_INGEST_MAX_SPANS_PER_REQUEST = 40
    if path == "/v1/traces":
        over, at = tiny_spans_request(41), tiny_spans_request(40)
        content_type = PROTOBUF
    else:
        # An agent root span, then one span per assistant message.
        over, at = (
            json.dumps({"messages": [{"role": "assistant", "content": str(n)} for n in range(count)]}).encode()
            for count in (40, 39)
        )
        content_type = "application/json"

    before = row_counts()

    refused = ready.post(path, over, content_type=content_type)
    after_refused = row_counts()
    taken = ready.post(path, at, content_type=content_type)

    assert "send at most 40 per request" in assert_refused(refused, 413)["detail"]
    assert after_refused == before
    if path == "/v1/traces":
        # OTLP is stored in the request that brings it; no batch is left for a worker.
        assert taken.status_code == 200, taken.content[:300]
        assert not IngestBatch.objects.exists()
        assert Span.objects.filter(workspace=workspace).count() == 40
    else:
        # JSON trajectories are queued whole, as one batch, for a worker.
        assert taken.status_code == 202, taken.content[:300]
        assert IngestBatch.objects.get().span_count == 40


LONG = pytest.mark.skipif(not os.environ.get("KEEL_FUZZ_EXAMPLES"), reason="long: set KEEL_FUZZ_EXAMPLES to run it")


@LONG
@pytest.mark.parametrize("distinct_traces", [False, True], ids=["one-trace", "a-trace-each"])
def test_a_request_at_the_span_limit_is_stored_in_bounded_memory(ready, workspace, distinct_traces):
    """The web process decodes and stores an OTLP request itself, so the bound a worker keeps must hold
    for the request too: measured around the POST, which answers once the spans are stored."""
    count = settings.KEEL_INGEST_MAX_SPANS_PER_REQUEST
    body = tiny_spans_request(count, distinct_traces=distinct_traces)

    with PeakRss() as peak:
        response = ready.post("/v1/traces", body, content_type=PROTOBUF)

    assert response.status_code == 200, response.content[:300]
    assert not IngestBatch.objects.exists()
    assert Span.objects.filter(workspace=workspace).count() == count
    if peak.grown_mib is not None:
        print(f"request: {count} spans, peak RSS rose {peak.grown_mib:.0f} MiB")
        assert peak.grown_mib < 1024, f"the request took {peak.grown_mib:.0f} MiB"


@LONG
@pytest.mark.parametrize("distinct_traces", [False, True], ids=["one-trace", "a-trace-each"])
def test_a_worker_stores_a_deferred_request_at_the_span_limit_in_bounded_memory(workspace, distinct_traces):
    """A request whose writing hit a bug is left as a batch (`ingest_otlp_defer`), and a worker stores it
    whole: the same bound holds there."""
    count = settings.KEEL_INGEST_MAX_SPANS_PER_REQUEST
    api_key, _ = registry_services.apikey_create(workspace=workspace, name="ingest", scopes=["ingest"])
    deferred = tracing_services.ingest_otlp_defer(
        api_key=api_key,
        body=tiny_spans_request(count, distinct_traces=distinct_traces),
        content_type=PROTOBUF,
        content_encoding="",
    )
    assert deferred.batch_id is not None

    with PeakRss() as peak:
        written = tracing_services.span_batch_process(batch_id=deferred.batch_id)

    assert written == count
    assert Span.objects.filter(workspace=workspace).count() == count
    if peak.grown_mib is not None:
        print(f"worker: {count} spans, peak RSS rose {peak.grown_mib:.0f} MiB")
        assert peak.grown_mib < 1024, f"the worker took {peak.grown_mib:.0f} MiB"


# --- NUL in the URL -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "/api/v1/agents/sup%00port",
        "/api/v1/agents?status=%00",
        "/api/v1/trajectories?agent=a%00",
        "/api/v1/prompts/x%00y/versions",
        "/api/public/v2/prompts/p%00",
        "/v1/models?agent=%00",
        "/api/v1/agents?%00=1",
    ],
)
def test_a_nul_in_the_url_is_400_before_any_lookup(ready, url):
    response = ready.get(url)

    assert assert_refused(response, 400)["code"] == "invalid_url"


# --- Values out of range ---------------------------------------------------------------------------


OUT_OF_RANGE = [
    ("GET", "/api/v1/guardrails/violations?until=0824-04-12T10%3A44%3A31%2B17%3A18", None),
    ("GET", "/api/v1/trajectories?started_after=2026-01-01T00%3A00%3A00-23%3A00", None),
    ("POST", "/api/v1/review/samples", {"strategy": "random", "hours": 24, "window_end": "2026-04-26T14:21:41+17:21"}),
    ("POST", "/api/v1/review/samples", {"strategy": "random", "hours": 600, "window_end": "0001-01-02T00:00:00+00:00"}),
]


# Transactional, as production runs: a database error ends the statement, not the test's transaction.
@pytest.mark.django_db(transaction=True)
def test_a_time_postgresql_or_python_cannot_hold_is_400_and_changes_nothing(client, agent):
    for method, url, body in OUT_OF_RANGE:
        before = row_counts()

        response = client.generic(method, url, json.dumps(body) if body else "", content_type="application/json")

        assert assert_refused(response, 400)["code"] == "value_out_of_range", url
        assert row_counts() == before


@pytest.mark.parametrize("field", ["name", "description", "status"])
def test_null_for_a_field_that_cannot_be_null_is_422_and_changes_nothing(client, agent, field):
    before = list(type(agent).objects.filter(pk=agent.pk).values())

    response = client.patch("/api/v1/agents/support", json.dumps({field: None}), content_type="application/json")

    assert assert_refused(response, 422)["errors"] == [{"field": field, "message": "not null"}]
    assert list(type(agent).objects.filter(pk=agent.pk).values()) == before
