"""OTLP parse speed: decode + map spans/s of realistic agent trajectories, on one core.

Each trajectory has 10 spans, as an OpenTelemetry-instrumented agent exports them with the GenAI
conventions and message content on: an invoke_agent root, four chat calls whose input repeats the
growing history (JSON `gen_ai.input.messages`, system instructions, output messages, usage), three
tool executions with arguments and results, a retrieval and a guardrail. The SDK's own OTLP encoder
builds the protobuf bodies; the JSON bodies are the same requests in OTLP/JSON (hex ids).

    python -m bench.bench_otlp_parse [--trajectories 1000] [--per-request 50] [--repeat 3]

(from the repository root, so that `tracing` imports).
"""

from __future__ import annotations

import argparse
import base64
import gzip
import importlib
import json
import os
import statistics
import string
import time
from collections.abc import Callable
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Tracer

from tracing import otlp, steps

# protobuf has no type stubs in this project; the JSON mapping is imported by name (see tracing/otlp.py).
_json_format = importlib.import_module("google.protobuf.json_format")

SPANS_PER_TRAJECTORY = 10
WORDS = [
    "order",
    "refund",
    "shipping",
    "account",
    "invoice",
    "delivery",
    "warehouse",
    "customer",
    "payment",
    "status",
    "address",
    "return",
    "policy",
    "support",
    "tracking",
    "package",
    "credit",
    "balance",
]


class Pseudo:
    """A seeded 64-bit LCG: the same trajectories on every run (the `random` module draws a lint warning)."""

    def __init__(self, seed: int) -> None:
        self.state = seed

    def next(self) -> int:
        self.state = (self.state * 6364136223846793005 + 1442695040888963407) % 2**64
        return self.state >> 11

    def random(self) -> float:
        return self.next() / 2**53

    def randrange(self, start: int, stop: int | None = None) -> int:
        low, high = (0, start) if stop is None else (start, stop)
        return low + self.next() % (high - low)

    def choice(self, options: list[str]) -> str:
        return options[self.randrange(len(options))]

    def letters(self, count: int) -> str:
        return "".join(self.choice(LETTERS) for _ in range(count))


LETTERS = list(string.ascii_lowercase)


def sentence(rng: Pseudo, length: int) -> str:
    words: list[str] = []
    size = 0
    while size < length:
        word = rng.choice(WORDS) if rng.random() < 0.8 else rng.letters(6)
        words.append(word)
        size += len(word) + 1
    return " ".join(words).capitalize() + "."


def text(role: str, content: str) -> dict[str, Any]:
    return {"role": role, "parts": [{"type": "text", "content": content}]}


def record_trajectory(tracer: Tracer, rng: Pseudo, number: int) -> None:
    system = "You are the support agent of an online shop. " + sentence(rng, 400)
    history: list[dict[str, Any]] = [text("user", sentence(rng, 200))]
    conversation_id = f"conv-{number}"
    with tracer.start_as_current_span("invoke_agent support") as root:
        root.set_attributes(
            {
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": "support",
                "gen_ai.conversation.id": conversation_id,
                "gen_ai.input.messages": json.dumps(history),
                "user.id": f"user-{number % 97}",
            }
        )
        with tracer.start_as_current_span("retrieval kb") as retrieval:
            retrieval.set_attributes(
                {
                    "gen_ai.operation.name": "retrieval",
                    "gen_ai.data_source.id": "kb-main",
                    "gen_ai.retrieval.query.text": sentence(rng, 60),
                    "gen_ai.retrieval.documents": json.dumps(
                        [{"id": f"doc-{index}", "score": rng.random()} for index in range(3)]
                    ),
                }
            )
        for turn in range(4):
            last = turn == 3
            if last:
                output = [text("assistant", sentence(rng, 300))]
            else:
                arguments = {"order_id": f"A-{rng.randrange(10_000)}", "reason": sentence(rng, 40)}
                output = [
                    {
                        "role": "assistant",
                        "parts": [
                            {"type": "text", "content": sentence(rng, 80)},
                            {"type": "tool_call", "id": f"call_{turn}", "name": "lookup_order", "arguments": arguments},
                        ],
                    }
                ]
            with tracer.start_as_current_span("chat gpt-4o", kind=SpanKind.CLIENT) as chat:
                chat.set_attributes(
                    {
                        "gen_ai.operation.name": "chat",
                        "gen_ai.provider.name": "openai",
                        "gen_ai.request.model": "gpt-4o",
                        "gen_ai.response.model": "gpt-4o-2024-08-06",
                        "gen_ai.response.id": f"chatcmpl-{number}-{turn}",
                        "gen_ai.response.finish_reasons": ["stop" if last else "tool_calls"],
                        "gen_ai.request.temperature": 0.2,
                        "gen_ai.usage.input_tokens": 400 + 150 * turn,
                        "gen_ai.usage.output_tokens": rng.randrange(20, 200),
                        "gen_ai.conversation.id": conversation_id,
                        "gen_ai.system_instructions": json.dumps([{"type": "text", "content": system}]),
                        "gen_ai.input.messages": json.dumps(history),
                        "gen_ai.output.messages": json.dumps(output),
                    }
                )
            history = [*history, *output]
            if not last:
                result = {"status": rng.choice(["delivered", "in transit", "lost"]), "notes": sentence(rng, 600)}
                with tracer.start_as_current_span("execute_tool lookup_order") as tool:
                    tool.set_attributes(
                        {
                            "gen_ai.operation.name": "execute_tool",
                            "gen_ai.tool.name": "lookup_order",
                            "gen_ai.tool.call.id": f"call_{turn}",
                            "gen_ai.tool.call.arguments": json.dumps(arguments),
                            "gen_ai.tool.call.result": json.dumps(result),
                        }
                    )
                history.append(
                    {
                        "role": "tool",
                        "parts": [{"type": "tool_call_response", "id": f"call_{turn}", "response": result}],
                    }
                )
        with tracer.start_as_current_span("apply_guardrail output") as guardrail:
            guardrail.set_attributes(
                {
                    "gen_ai.operation.name": "apply_guardrail",
                    "gen_ai.guardrail.result.type": "action",
                    "gen_ai.guardrail.result.value": "NONE",
                }
            )


def _hex_ids(node: Any) -> Any:
    if isinstance(node, list):
        return [_hex_ids(item) for item in node]
    if isinstance(node, dict):
        return {
            key: base64.b64decode(value).hex()
            if key in ("traceId", "spanId", "parentSpanId") and isinstance(value, str)
            else _hex_ids(value)
            for key, value in node.items()
        }
    return node


def build_bodies(trajectories: int, per_request: int) -> tuple[list[bytes], list[bytes]]:
    """Protobuf and JSON request bodies, `per_request` trajectories each."""
    rng = Pseudo(20_240_601)
    protobuf: list[bytes] = []
    json_bodies: list[bytes] = []
    for first in range(0, trajectories, per_request):
        exporter = InMemorySpanExporter()
        provider = TracerProvider(resource=Resource.create({"service.name": "support-agent"}))
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tracer = provider.get_tracer("bench.agent", "1.0.0")
        for number in range(first, min(first + per_request, trajectories)):
            record_trajectory(tracer, rng, number)
        request = encode_spans(exporter.get_finished_spans())
        provider.shutdown()
        protobuf.append(request.SerializeToString())
        document = _hex_ids(_json_format.MessageToDict(request, use_integers_for_enums=True))
        json_bodies.append(json.dumps(document).encode())
    return protobuf, json_bodies


def measure(run: Callable[[], int], repeat: int) -> tuple[float, float, int]:
    """Best of `repeat` runs: (CPU seconds, wall seconds, spans).

    CPU time is the figure to plan capacity with: on a shared machine the wall clock also counts the
    time other processes held the core.
    """
    cpu: list[float] = []
    wall: list[float] = []
    spans = 0
    for _ in range(repeat):
        started_cpu, started_wall = time.process_time(), time.perf_counter()
        spans = run()
        cpu.append(time.process_time() - started_cpu)
        wall.append(time.perf_counter() - started_wall)
    return min(cpu), min(wall), spans


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trajectories", type=int, default=1000)
    parser.add_argument("--per-request", type=int, default=50, help="trajectories per export request")
    parser.add_argument("--repeat", type=int, default=3)
    arguments = parser.parse_args()

    if hasattr(os, "sched_setaffinity"):
        # One core, as the figure claims.
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})

    protobuf, json_bodies = build_bodies(arguments.trajectories, arguments.per_request)
    gzip_protobuf = [gzip.compress(body) for body in protobuf]
    gzip_json = [gzip.compress(body) for body in json_bodies]
    total_spans = arguments.trajectories * SPANS_PER_TRAJECTORY
    span_bytes = statistics.mean(len(body) for body in protobuf) / (arguments.per_request * SPANS_PER_TRAJECTORY)

    def decode(bodies: list[bytes], content_type: str, encoding: str | None) -> Callable[[], int]:
        def run() -> int:
            return sum(len(otlp.decode_request(body, content_type, encoding).spans) for body in bodies)

        return run

    def validate(bodies: list[bytes], content_type: str, encoding: str | None) -> Callable[[], int]:
        def run() -> int:
            return sum(otlp.validate_request(body, content_type, encoding).accepted_spans for body in bodies)

        return run

    def decode_and_map(bodies: list[bytes], content_type: str, encoding: str | None) -> Callable[[], int]:
        def run() -> int:
            count = 0
            for body in bodies:
                spans, _ = otlp.decode_and_map(body, content_type, encoding)
                count += len(spans)
            return count

        return run

    mapped, _ = otlp.decode_and_map(protobuf[0], otlp.CONTENT_TYPE_PROTOBUF, None)
    by_trace: dict[str, list[otlp.Span]] = {}
    for span in mapped:
        by_trace.setdefault(span.trace_id, []).append(span)

    def assemble() -> int:
        return sum(len(steps.trajectory_view_build(group).steps) and len(group) for group in by_trace.values())

    print(
        f"OTLP parse benchmark: {arguments.trajectories} trajectories x {SPANS_PER_TRAJECTORY} spans, "
        f"{arguments.per_request} trajectories per request, best of {arguments.repeat}, one core, CPU time"
    )
    request_megabytes = statistics.mean(map(len, protobuf)) / 1e6
    print(f"protobuf body {request_megabytes:.2f} MB per request, {span_bytes / 1e3:.1f} kB per span")
    print(f"{'operation':<46} {'spans/s':>9} {'MB/s':>6} {'wall spans/s':>13}")
    cases: list[tuple[str, Callable[[], int], list[bytes]]] = [
        ("protobuf: validate (the API's answer)", validate(protobuf, otlp.CONTENT_TYPE_PROTOBUF, None), protobuf),
        ("protobuf + gzip: validate", validate(gzip_protobuf, otlp.CONTENT_TYPE_PROTOBUF, "gzip"), protobuf),
        ("protobuf: decode", decode(protobuf, otlp.CONTENT_TYPE_PROTOBUF, None), protobuf),
        ("protobuf: decode + map", decode_and_map(protobuf, otlp.CONTENT_TYPE_PROTOBUF, None), protobuf),
        ("protobuf + gzip: decode + map", decode_and_map(gzip_protobuf, otlp.CONTENT_TYPE_PROTOBUF, "gzip"), protobuf),
        ("json: decode", decode(json_bodies, otlp.CONTENT_TYPE_JSON, None), json_bodies),
        ("json: decode + map", decode_and_map(json_bodies, otlp.CONTENT_TYPE_JSON, None), json_bodies),
        ("json + gzip: decode + map", decode_and_map(gzip_json, otlp.CONTENT_TYPE_JSON, "gzip"), json_bodies),
    ]
    for label, run, bodies in cases:
        cpu, wall, spans = measure(run, arguments.repeat)
        assert spans == total_spans, (label, spans, total_spans)
        megabytes = sum(map(len, bodies)) / 1e6
        print(f"{label:<46} {spans / cpu:>9,.0f} {megabytes / cpu:>6,.0f} {spans / wall:>13,.0f}")
    cpu, wall, spans = measure(assemble, arguments.repeat)
    label = "steps: trajectory_view_build, 10-span traces"
    print(f"{label:<46} {spans / cpu:>9,.0f} {'':>6} {spans / wall:>13,.0f}")
    print(f"load average while measuring: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
