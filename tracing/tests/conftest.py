"""Fixtures for the OTLP parser and steps tests: real OpenTelemetry SDK spans, encoded as the SDK's exporter does."""

from __future__ import annotations

import base64
import importlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Tracer

from tracing import otlp

# No stubs for protobuf in this project (see tracing/otlp.py); import the JSON mapping by name.
_json_format = importlib.import_module("google.protobuf.json_format")

_ID_FIELDS = {"traceId": 16, "spanId": 8, "parentSpanId": 8}


def _ids_to_hex(node: Any) -> Any:
    """protobuf's JSON mapping writes bytes as base64; OTLP JSON writes trace and span ids as hex."""
    if isinstance(node, list):
        return [_ids_to_hex(item) for item in node]
    if isinstance(node, dict):
        return {
            key: base64.b64decode(value).hex() if key in _ID_FIELDS and isinstance(value, str) else _ids_to_hex(value)
            for key, value in node.items()
        }
    return node


def otlp_json_document(request: ExportTraceServiceRequest) -> dict[str, Any]:
    """The OTLP/JSON form of a request: lowerCamelCase keys, int64 as strings, enums as integers, hex ids."""
    document = _json_format.MessageToDict(request, use_integers_for_enums=True)
    converted: dict[str, Any] = _ids_to_hex(document)
    return converted


# Requests built from opentelemetry-proto messages directly, for what the SDK will not produce
# (invalid ids, structured attribute values).
TRACE_ID = bytes.fromhex("5b8efff798038103d269b633813fc60c")
SPAN_ID = bytes.fromhex("eee19b7ec3c1b174")
PARENT_ID = bytes.fromhex("eee19b7ec3c1b173")


def pb_span(**fields: Any) -> PbSpan:
    values: dict[str, Any] = {
        "trace_id": TRACE_ID,
        "span_id": SPAN_ID,
        "name": "chat gpt-4o",
        "kind": PbSpan.SPAN_KIND_CLIENT,
        "start_time_unix_nano": 1_700_000_000_000_000_000,
        "end_time_unix_nano": 1_700_000_001_500_000_000,
    }
    values.update(fields)
    return PbSpan(**values)


def pb_request(*spans: PbSpan, resource: dict[str, str] | None = None) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    for key, value in (resource or {"service.name": "checkout-agent"}).items():
        resource_spans.resource.attributes.add(key=key, value=AnyValue(string_value=value))
    scope_spans = resource_spans.scope_spans.add()
    scope_spans.scope.name = "keel.tests"
    scope_spans.scope.version = "1.0.0"
    scope_spans.spans.extend(spans)
    return request


def decode_pb(request: ExportTraceServiceRequest, **limits: int) -> otlp.ExportRequest:
    return otlp.decode_request(request.SerializeToString(), otlp.CONTENT_TYPE_PROTOBUF, None, **limits)


class OtelRecorder:
    """An SDK tracer provider whose finished spans can be exported as OTLP protobuf or JSON bodies."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider(
            resource=Resource.create({"service.name": "checkout-agent", "deployment.environment": "test"})
        )
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    def tracer(self, name: str = "keel.tests", version: str = "1.0.0") -> Tracer:
        return self.provider.get_tracer(name, version)

    def request(self) -> ExportTraceServiceRequest:
        return encode_spans(self.exporter.get_finished_spans())

    def protobuf(self) -> bytes:
        body: bytes = self.request().SerializeToString()
        return body

    def json(self) -> bytes:
        return json.dumps(otlp_json_document(self.request())).encode()

    def spans(self, content_type: str = otlp.CONTENT_TYPE_PROTOBUF) -> list[otlp.Span]:
        body = self.json() if content_type == otlp.CONTENT_TYPE_JSON else self.protobuf()
        spans, request = otlp.decode_and_map(body, content_type, None)
        assert request.rejected_spans == 0
        return spans

    def span(self, content_type: str = otlp.CONTENT_TYPE_PROTOBUF) -> otlp.Span:
        (span,) = self.spans(content_type)
        return span

    def ingest(self, workspace: Any) -> None:
        """Store the finished spans in `workspace` as OTLP ingest does (with a new ingest key), then forget them."""
        from agent_registry import services as registry_services
        from tracing import services

        api_key, _ = registry_services.apikey_create(workspace=workspace, name="ingest", scopes=["ingest"])
        services.ingest_otlp_accept(
            api_key=api_key, body=self.protobuf(), content_type=otlp.CONTENT_TYPE_PROTOBUF, content_encoding=""
        )
        self.exporter.clear()


@pytest.fixture
def otel() -> Iterator[OtelRecorder]:
    recorder = OtelRecorder()
    yield recorder
    recorder.provider.shutdown()


# --- Replays: a recorded refund and the fake model it is replayed on (tracing/tests/replay_fakes.py) -----


@pytest.fixture
def fake_llm(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from tracing.tests.replay_fakes import fake_provider, network_forbid

    network_forbid(monkeypatch)
    with fake_provider() as fake:
        yield fake


@pytest.fixture
def recorded(workspace: Any) -> Any:
    from tracing.tests.replay_fakes import refund_recorded

    return refund_recorded(workspace)


@pytest.fixture
def fake_dns() -> Iterator[dict[str, list[str]]]:
    """The test resolver's names (tracing/tests/fake_dns.py): add `name: [addresses]`; emptied afterwards."""
    from tracing.tests import fake_dns as resolver

    resolver.HOSTS.clear()
    resolver.ASKED.clear()
    yield resolver.HOSTS
    resolver.HOSTS.clear()
    resolver.ASKED.clear()
