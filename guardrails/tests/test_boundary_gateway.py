"""The action boundary as the gateway meets it: a refund over the autonomy limit waits for a person, and
runs after approval, once; a rejected refund never reaches the tool endpoint."""

from __future__ import annotations

from typing import Any

import pytest

from agent_registry.tests.factories import UserFactory
from guardrails import services
from guardrails.models import ApprovalRequest
from routing.models import AgentTool
from routing.tests import conftest as routing_fixtures
from routing.tests.conftest import Gateway, ToolServer
from routing.tests.fakes import call, say

pytestmark = pytest.mark.django_db

# The routing tests' gateway: an agent with every tier on the fake provider, and a loopback tool server.
fake = routing_fixtures.fake
gateway = routing_fixtures.gateway
tool_server = routing_fixtures.tool_server


def agentic_refunds(gateway: Gateway, tool_server: ToolServer) -> None:
    gateway.config.rules = [{"name": "account", "kind": "keywords", "value": "refund", "to_tier": "agentic"}]
    gateway.config.save()
    for name in ("lookup_trip", "issue_refund"):
        AgentTool.objects.create(
            agent=gateway.agent, name=name, parameters={"type": "object"}, endpoint_url=tool_server.url
        )


def ask(gateway: Gateway, text: str) -> Any:
    body = {
        "model": f"agent/{gateway.agent.slug}",
        "messages": [{"role": "user", "content": text}],
        "variables": {"company": "Acme"},
    }
    return gateway.post(body, **{"X-Keel-Conversation-Id": "conv-42"}).json()


def test_a_refund_over_the_limit_waits_for_approval_and_runs_once_after_it(gateway, tool_server):
    agentic_refunds(gateway, tool_server)
    refund = call("issue_refund", {"trip_id": "T1", "amount": 80}, "c1")
    gateway.fake.script("strong", refund, refund, say("Refunded $80."), refund)

    waiting = ask(gateway, "Please refund $80 for trip T1")
    approval = ApprovalRequest.objects.get()
    services.approval_decide(approval=approval, user=UserFactory.create(), approved=True, note="verified")
    resumed = ask(gateway, "Please refund $80 for trip T1")
    repeated = ask(gateway, "Please refund $80 for trip T1 again")

    assert waiting["choices"][0]["message"]["content"].startswith(
        f"I can't do that: waiting for a person's approval (request {approval.pk})"
    )
    assert waiting["keel"]["approval"] == {"id": approval.pk, "status": "pending"}
    assert waiting["keel"]["error"]["type"] == "approval_required"
    assert "approval" not in resumed["keel"]
    assert (approval.conversation_id, approval.tool, approval.arguments) == (
        "conv-42",
        "issue_refund",
        {"trip_id": "T1", "amount": 80},
    )
    assert resumed["choices"][0]["message"]["content"] == "Refunded $80."
    assert [c["tool"] for c in tool_server.calls] == ["issue_refund"]  # once, after the approval
    assert repeated["choices"][0]["message"]["content"].startswith("I can't do that: waiting for a person's approval")
    assert list(ApprovalRequest.objects.order_by("pk").values_list("status", flat=True)) == ["used", "pending"]


def test_a_rejected_refund_never_reaches_the_tool(gateway, tool_server):
    agentic_refunds(gateway, tool_server)
    refund = call("issue_refund", {"trip_id": "T1", "amount": 80}, "c1")
    gateway.fake.script("strong", refund, refund)

    ask(gateway, "Please refund $80 for trip T1")
    services.approval_decide(
        approval=ApprovalRequest.objects.get(), user=UserFactory.create(), approved=False, note="duplicate claim"
    )
    refused = ask(gateway, "Please refund $80 for trip T1")

    assert "a person rejected this call" in refused["choices"][0]["message"]["content"]
    assert tool_server.calls == []


def test_a_refund_within_the_limit_runs_without_asking(gateway, tool_server):
    agentic_refunds(gateway, tool_server)
    gateway.fake.script("strong", call("issue_refund", {"trip_id": "T1", "amount": 12.5}, "c1"), say("Done."))

    answer = ask(gateway, "Please refund the $12.50 duplicate on trip T1")

    assert answer["choices"][0]["message"]["content"] == "Done."
    assert ApprovalRequest.objects.count() == 0
