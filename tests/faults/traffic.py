"""What the fault tests send and the servers they stop: OTLP/JSON bodies and JSON trajectories with known trace ids,
a Redis server of their own, free ports, waiting on a condition; and what they measured, for
bench/bench_reliability.py."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

SPANS_PER_TRACE = 2
# bench/bench_reliability.py sets this to a file; each fault test appends what it measured there.
FACTS_FILE_VARIABLE = "KEEL_RELIABILITY_FACTS"


def record_facts(name: str, **facts: object) -> None:
    """Append one JSON line, `{"test": <pytest node id>, "name": name, "facts": facts}`, to the file named by
    KEEL_RELIABILITY_FACTS; nothing at all when it is unset (a plain test run). A test that runs processes calls it
    before its final asserts, so that the figures of a failure are reported too."""
    path = os.environ.get(FACTS_FILE_VARIABLE)
    if not path:
        return
    # "tests/faults/test_x.py::test_y[case] (call)": pytest's own name for the test running now.
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]
    with open(path, "a") as output:
        output.write(json.dumps({"test": test, "name": name, "facts": facts}, default=str) + "\n")


def otlp_json(trace_ids: list[str], *, agent: str = "faults-agent") -> bytes:
    """An OTLP/JSON export request: per trace id, an agent span and a chat span under it."""
    now = time.time_ns()
    spans = []
    for trace_id in trace_ids:
        root = secrets.token_hex(8)
        spans.append(
            {
                "traceId": trace_id,
                "spanId": root,
                "name": f"invoke_agent {agent}",
                "kind": 2,
                "startTimeUnixNano": str(now),
                "endTimeUnixNano": str(now + 2_000_000),
                "attributes": [
                    {"key": "gen_ai.operation.name", "value": {"stringValue": "invoke_agent"}},
                    {"key": "gen_ai.agent.name", "value": {"stringValue": agent}},
                ],
            }
        )
        spans.append(
            {
                "traceId": trace_id,
                "spanId": secrets.token_hex(8),
                "parentSpanId": root,
                "name": "chat stub",
                "kind": 3,
                "startTimeUnixNano": str(now + 100_000),
                "endTimeUnixNano": str(now + 1_900_000),
                "attributes": [
                    {"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
                    {"key": "gen_ai.request.model", "value": {"stringValue": "stub"}},
                    {"key": "gen_ai.usage.input_tokens", "value": {"intValue": "10"}},
                    {"key": "gen_ai.usage.output_tokens", "value": {"intValue": "3"}},
                ],
            }
        )
    document = {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": agent}}]},
                "scopeSpans": [{"scope": {"name": "keel.tests.faults"}, "spans": spans}],
            }
        ]
    }
    return json.dumps(document).encode()


def trajectories_json(trace_ids: list[str], *, agent: str = "faults-agent") -> bytes:
    """JSON trajectories for POST /api/v1/ingest/trajectories, which go through the batch queue and a worker (OTLP
    is stored in the request): per trace id, a user question and an answer, which become an agent root span and a
    chat span under it, SPANS_PER_TRACE as `otlp_json` sends."""
    documents = [
        {
            "trace_id": trace_id,
            "agent": agent,
            "messages": [
                {"role": "user", "content": f"Where is my refund? ({trace_id})"},
                {"role": "assistant", "content": "It is on its way."},
            ],
        }
        for trace_id in trace_ids
    ]
    return json.dumps(documents).encode()


def trace_ids_new(count: int) -> list[str]:
    return [secrets.token_hex(16) for _ in range(count)]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for(
    condition: Callable[[], bool], timeout: float, what: str | Callable[[], str], log: Path | None = None
) -> None:
    """Poll until `condition()` holds; a generous `timeout` is a hang detector, not a speed requirement.
    `what` (or what it returns, read when the wait fails) and the log's tail explain a failure."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    tail = f"; log:\n{log.read_text(errors='replace')[-6000:]}" if log is not None and log.exists() else ""
    raise AssertionError(f"{what if isinstance(what, str) else what()} within {timeout} s{tail}")


class RedisServer:
    """A redis-server of the test's own on a spare port, with no persistence: stopping it loses what it held,
    as a broker that went away and came back empty does. The machine's shared Redis is never touched."""

    def __init__(self, log: Path) -> None:
        self.port = free_port()
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        import redis

        with self.log.open("ab") as output:
            self.process = subprocess.Popen(
                ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly", "no"],
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        client = redis.Redis(port=self.port, socket_connect_timeout=1)

        def answers() -> bool:
            try:
                return bool(client.ping())
            except redis.ConnectionError:
                return False

        wait_for(answers, 30, "redis-server did not answer", self.log)

    def kill(self) -> None:
        """Gone at once (SIGKILL): no shutdown, no save."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None
