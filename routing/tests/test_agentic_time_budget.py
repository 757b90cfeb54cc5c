"""The agentic tier against a tool endpoint slower than the request's time budget."""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from agent_registry import services as registry_services
from routing.models import AgentTool
from routing.tests.conftest import Gateway
from routing.tests.fakes import call, say
from routing.tests.test_gateway import _stored

pytestmark = pytest.mark.django_db

ENDPOINT_DELAY_SECONDS = 5.0


@pytest.fixture
def slow_endpoint(settings: Any) -> Iterator[str]:
    """A tool endpoint that answers after ENDPOINT_DELAY_SECONDS (or when the test ends), on 127.0.0.1."""
    settings.KEEL_OUTBOUND_ALLOW_PRIVATE = True
    release = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            release.wait(ENDPOINT_DELAY_SECONDS)
            data = b'{"late": true}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # Keel stopped waiting
                self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/tools"
    finally:
        release.set()
        server.shutdown()
        server.server_close()


def _time_budget(gateway: Gateway, milliseconds: int) -> None:
    assert gateway.agent.current_requirements is not None
    answers = copy.deepcopy(gateway.agent.current_requirements.answers)
    answers["constraints"]["latency"]["hard_ceiling_ms"] = milliseconds
    registry_services.requirements_version_create(agent=gateway.agent, answers=answers, message="tight budget")


def test_a_tool_endpoint_slower_than_the_time_budget_is_cut_off_at_the_budget(gateway, slow_endpoint):
    _time_budget(gateway, 800)
    gateway.config.rules = [{"name": "account", "kind": "keywords", "value": "refund", "to_tier": "agentic"}]
    gateway.config.save()
    AgentTool.objects.create(
        agent=gateway.agent, name="lookup_trip", parameters={"type": "object"}, endpoint_url=slow_endpoint
    )
    gateway.fake.script("strong", call("lookup_trip", {"trip_id": "T1"}, "c1"), say("never reached"))
    gateway.ask("Hello")  # the first request of a process pays for imports; this one is timed

    started = time.monotonic()
    body = gateway.ask("Please refund trip T1").json()
    elapsed = time.monotonic() - started

    assert elapsed < ENDPOINT_DELAY_SECONDS / 2
    assert body["keel"]["tier"] == "agentic"
    assert body["keel"]["error"] == {"type": "time_budget", "message": "time limit reached (800 ms budget)"}
    assert body["choices"][0]["finish_reason"] == "length"
    assert [r.model for r in gateway.fake.received] == [
        "fast",
        "strong",
    ]  # the loop stopped instead of asking the model again


def test_the_time_budget_stop_fires_the_timeout_exhaustion_signal_on_the_trajectory(gateway, slow_endpoint):
    _time_budget(gateway, 800)
    gateway.config.rules = [{"name": "account", "kind": "keywords", "value": "refund", "to_tier": "agentic"}]
    gateway.config.save()
    AgentTool.objects.create(
        agent=gateway.agent, name="lookup_trip", parameters={"type": "object"}, endpoint_url=slow_endpoint
    )
    gateway.fake.script("strong", call("lookup_trip", {"trip_id": "T1"}, "c1"))

    body = gateway.ask("Please refund trip T1").json()

    trajectory = _stored(gateway, body["keel"]["trace_id"])
    exhaustion = [signal for signal in trajectory.signals if signal["signal"] == "exhaustion"]
    assert exhaustion
    assert "token_budget" not in {signal["kind"] for signal in exhaustion}
    assert any(
        signal["kind"] == "timeout" and "time limit reached (800 ms budget)" in signal["snippets"]
        for signal in exhaustion
    )
