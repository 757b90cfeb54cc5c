"""Request bodies for the ingest benchmark: real OTel SDK exports of agent trajectories, reusable.

Encoding trajectories with the OpenTelemetry SDK costs far more CPU than sending them, and the load
generator shares two cores with the servers it measures. So a few template bodies are built once
(`bench.bench_otlp_parse.record_trajectory`: 10 spans per trajectory, GenAI attributes with message
content, 50 trajectories = 500 spans per request, the SDK's default batch size) with trace ids of the
form `<8-byte tag><8-byte index>`. Each send replaces the tag with 8 fresh random bytes, a plain
bytes.replace on the serialised request, so every request carries new trace ids (new trajectories)
for the price of a memcpy, while the span ids stay unique within each trace.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator

from bench.bench_otlp_parse import SPANS_PER_TRAJECTORY, Pseudo, record_trajectory

TRAJECTORIES_PER_REQUEST = 50
TAG_BYTES = 8


class _TaggedIds(IdGenerator):
    """Trace ids `tag + counter`; span ids from a seeded generator (unique within a trace)."""

    def __init__(self, tag: bytes, seed: int) -> None:
        self.tag = tag
        self.counter = 0
        self.spans = Pseudo(seed)

    def generate_span_id(self) -> int:
        return self.spans.next() or 1

    def generate_trace_id(self) -> int:
        self.counter += 1
        return int.from_bytes(self.tag + self.counter.to_bytes(8, "big"), "big")


@dataclass(frozen=True)
class Template:
    body: bytes
    tag: bytes
    # The 8-byte suffix of each trace id in the body, in the order the trajectories were recorded.
    suffixes: tuple[bytes, ...]

    @property
    def spans(self) -> int:
        return len(self.suffixes) * SPANS_PER_TRAJECTORY

    def fresh(self) -> tuple[bytes, list[str]]:
        """The body with new trace ids, and those ids (hex) in recorded order."""
        tag = os.urandom(TAG_BYTES)
        return self.body.replace(self.tag, tag), [(tag + suffix).hex() for suffix in self.suffixes]


def templates_build(count: int, per_request: int = TRAJECTORIES_PER_REQUEST, seed: int = 20_261_122) -> list[Template]:
    rng = Pseudo(seed)
    built: list[Template] = []
    for index in range(count):
        tag = os.urandom(TAG_BYTES)
        ids = _TaggedIds(tag, seed + index)
        exporter = InMemorySpanExporter()
        provider = TracerProvider(
            resource=Resource.create({"service.name": "support-agent"}),
            id_generator=ids,
        )
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tracer = provider.get_tracer("bench.agent", "1.0.0")
        for number in range(per_request):
            record_trajectory(tracer, rng, index * per_request + number)
        body = encode_spans(exporter.get_finished_spans()).SerializeToString()
        provider.shutdown()
        if body.count(tag) != per_request * SPANS_PER_TRAJECTORY:
            raise RuntimeError("the trace-id tag also occurs outside the trace ids; build again")
        built.append(Template(body, tag, tuple((n + 1).to_bytes(8, "big") for n in range(per_request))))
    return built
