"""An agent wired for the gateway: requirements with every tier enabled, a production prompt, model
targets on the fake provider, a router configuration, and a key with the gateway scope."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.test import Client

from agent_registry import services as registry_services
from agent_registry.models import Agent, ApiKey, Workspace
from agent_registry.tests.factories import AgentFactory, prompt_with_versions, requirements_answers
from routing.models import ModelTarget, RouterConfig, RoutingDecision
from routing.tests.fakes import FAKE_PROVIDER, FakeGatewayLLM, fake_gateway_provider

SYSTEM = "You are {{company}}'s ride support assistant."


@dataclass
class Gateway:
    workspace: Workspace
    agent: Agent
    key: ApiKey
    raw_key: str
    client: Client
    fast: ModelTarget
    strong: ModelTarget
    config: RouterConfig
    fake: FakeGatewayLLM

    def post(self, body: dict[str, Any], **headers: str) -> Any:
        return self.client.post(
            "/v1/chat/completions", data=json.dumps(body), content_type="application/json", headers=headers
        )

    def ask(self, text: str, **body: Any) -> Any:
        return self.post(
            {
                "model": f"agent/{self.agent.slug}",
                "messages": [{"role": "user", "content": text}],
                "variables": {"company": "Acme"},
                **body,
            }
        )


def gateway_agent(workspace: Workspace, *, slug: str = "ride-support", **answers: Any) -> Agent:
    agent = AgentFactory.create(workspace=workspace, slug=slug, name="Ride support")
    changes = {
        "routing.enabled_tiers": ["single_call", "chain", "agentic", "human"],
        "routing.signal": "learned_difficulty",
        "routing.escalation_rules": [
            {"trigger": "keywords", "value": "unsafe, assault", "to_tier": "human", "reason": "safety"},
            {"trigger": "amount_over", "value": "100", "to_tier": "human", "reason": "high-value dispute"},
        ],
        **answers,
    }
    registry_services.requirements_version_create(
        agent=agent, answers=requirements_answers(**changes), message="gateway"
    )
    prompt_with_versions(
        agent=agent,
        name=f"{slug}/system",
        type="chat",
        templates=([{"role": "system", "content": SYSTEM}, {"role": "user", "content": "{{message}}"}],),
        labels={1: ["production"]},
    )
    return agent


def targets(workspace: Workspace) -> tuple[ModelTarget, ModelTarget]:
    fast = ModelTarget.objects.create(
        workspace=workspace, alias="fast", model=f"{FAKE_PROVIDER}/fast", tier="single_call", max_retries=1
    )
    strong = ModelTarget.objects.create(
        workspace=workspace, alias="strong", model=f"{FAKE_PROVIDER}/strong", tier="agentic", max_retries=0
    )
    return fast, strong


def past_decisions(gateway: Gateway, text: str, quality: dict[str, float]) -> None:
    """Six past requests of `text` per tier, each with the quality that tier reached on it (the single call
    the cheaper and quicker), for the learned router to find as the request's neighbours."""
    from routing import cache

    vector = cache.request_embed(text=text, target=None).vector
    for index in range(6):
        for tier, score in quality.items():
            RoutingDecision.objects.create(
                workspace=gateway.workspace,
                agent=gateway.agent,
                trace_id=f"{tier[:6]}{index:026d}",
                request_text=text,
                embedding=vector,
                tier=tier,
                method="estimate",
                reason="seed",
                status="ok",
                quality=score,
                cost_usd=Decimal("0.001") if tier == "single_call" else Decimal("0.004"),
                latency_ms=800 if tier == "single_call" else 2400,
            )


@pytest.fixture
def fake() -> Iterator[FakeGatewayLLM]:
    with fake_gateway_provider() as provider:
        yield provider


@pytest.fixture
def gateway(workspace: Workspace, fake: FakeGatewayLLM) -> Gateway:
    agent = gateway_agent(workspace)
    fast, strong = targets(workspace)
    config = RouterConfig.objects.create(agent=agent, single_call_target=fast, agentic_target=strong, min_neighbours=4)
    key, raw = registry_services.apikey_create(workspace=workspace, name="gateway", scopes=["gateway"])
    return Gateway(
        workspace=workspace,
        agent=agent,
        key=key,
        raw_key=raw,
        client=Client(headers={"Authorization": f"Bearer {raw}"}),
        fast=fast,
        strong=strong,
        config=config,
        fake=fake,
    )


class ToolServer:
    """A customer's tool endpoint on the loopback interface: answers each tool with a fixed result."""

    def __init__(self, results: dict[str, Any]) -> None:
        self.results = results
        self.calls: list[dict[str, Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.calls.append({**body, "authorization": self.headers.get("Authorization")})
                result = server.results.get(body["tool"], {"error": "unknown tool"})
                status = 500 if isinstance(result, dict) and result.get("fail") else 200
                data = json.dumps(result).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/tools"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> ToolServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def tool_server(settings: Any) -> Iterator[ToolServer]:
    # The server is on 127.0.0.1, where Keel calls tool endpoints only when the operator permits private
    # addresses (tracing/outbound.py).
    settings.KEEL_OUTBOUND_ALLOW_PRIVATE = True
    with ToolServer(
        {"lookup_trip": {"trip_id": "T1", "charges": [12.5, 12.5]}, "issue_refund": {"refunded": 12.5}}
    ) as server:
        yield server
