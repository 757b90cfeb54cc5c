"""Routing's management API: model targets, router configuration, chains, tools, decisions, the router
report and hand-offs. Two workspaces throughout: Globex's key never reads or changes Acme's rows, and a
refused call changes nothing. Secrets go in and never come out."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from agent_registry.models import Agent, Workspace
from agent_registry.tests.factories import AgentFactory, prompt_with_versions
from config import crypto
from routing import services
from routing.models import (
    AgentTool,
    ChainStep,
    Handoff,
    HandoffStatus,
    ModelTarget,
    OutcomeStatus,
    RouterConfig,
    RoutingDecision,
    ShadowRun,
    ShadowStatus,
    TargetSource,
)
from routing.tests.factories import ModelTargetFactory, RoutingDecisionFactory

pytestmark = pytest.mark.django_db

KEY = "sk-never-shown"
TOOL_SECRET = "tool-secret-never-shown"


@dataclass
class Site:
    workspace: Workspace
    agent: Agent
    target: ModelTarget
    decision: RoutingDecision
    handoff: Handoff
    client: Client


def _site(workspace: Workspace, api_client_for: Any, slug: str) -> Site:
    agent = AgentFactory.create(workspace=workspace, slug=slug)
    target = services.model_target_create(workspace=workspace, alias=f"{slug}-fast", model="openai/m", api_key=KEY)
    services.router_config_update(agent=agent, single_call_target=target.alias, shadow_rate=0.1)
    services.chain_steps_set(agent=agent, steps=[{"name": "draft", "instructions": "Draft an answer."}])
    services.agent_tool_create(
        agent=agent, name="lookup", endpoint_url="https://tools.example.com/x", endpoint_secret=TOOL_SECRET
    )
    decision = RoutingDecisionFactory.create(
        workspace=workspace,
        agent=agent,
        tier="chain",
        method="estimate",
        status=OutcomeStatus.OK,
        quality=0.6,
        cost_usd=Decimal("0.002"),
        latency_ms=800,
        features={"words": 12},
        estimates={"chain": {"quality": 0.7}},
    )
    ShadowRun.objects.create(
        decision=decision, tier="agentic", trace_id="b" * 32, status=ShadowStatus.DONE, quality=0.9, cost_usd=0.01
    )
    handoff = Handoff.objects.create(
        workspace=workspace, agent=agent, trace_id=decision.trace_id, reason="asked for a person"
    )
    return Site(workspace, agent, target, decision, handoff, api_client_for(workspace))


@pytest.fixture
def acme(workspace, api_client_for) -> Site:
    return _site(workspace, api_client_for, "support")


@pytest.fixture
def globex(other_workspace, api_client_for) -> Site:
    return _site(other_workspace, api_client_for, "theirs")


def state() -> dict[str, list[Any]]:
    return {
        "targets": list(ModelTarget.objects.order_by("pk").values_list("pk", "alias", "model", "api_key_encrypted")),
        "configs": list(RouterConfig.objects.order_by("pk").values_list("pk", "shadow_rate", "single_call_target")),
        "steps": list(ChainStep.objects.order_by("pk").values_list("pk", "name", "instructions")),
        "tools": list(AgentTool.objects.order_by("pk").values_list("pk", "name", "description")),
        "handoffs": list(Handoff.objects.order_by("pk").values_list("pk", "status", "resolution")),
    }


def call(client: Client, method: str, path: str, body: Any = None) -> Any:
    data = json.dumps(body) if body is not None else ""
    return client.generic(method, path, data=data, content_type="application/json")


def assert_error(response: Any, status: int, code: str) -> None:
    assert response.status_code == status, response.content
    body = response.json()
    assert body["code"] == code
    assert body["detail"]


# --- Model targets ----------------------------------------------------------------------------------


def test_a_model_target_is_created_read_changed_and_deleted(acme):
    created = call(
        acme.client,
        "POST",
        "/api/v1/model-targets",
        {"alias": "strong", "model": "openai/gpt-4o", "api_key": "sk-new", "fallbacks": ["support-fast"]},
    )
    assert created.status_code == 201
    assert created.json()["has_api_key"] is True
    assert created.json()["health"] == {
        "state": "ok",
        "consecutive_failures": 0,
        "cooldown_until": None,
        "last_error": "",
    }

    listed = call(acme.client, "GET", "/api/v1/model-targets").json()
    assert [target["alias"] for target in listed] == ["strong", "support-fast"]
    patched = call(acme.client, "PATCH", "/api/v1/model-targets/strong", {"timeout_seconds": 5, "fallbacks": []})
    assert (patched.json()["timeout_seconds"], patched.json()["fallbacks"]) == (5.0, [])
    stored = ModelTarget.objects.get(workspace=acme.workspace, alias="strong")
    assert crypto.decrypt(stored.api_key_encrypted) == "sk-new"
    assert call(acme.client, "DELETE", "/api/v1/model-targets/strong").status_code == 204
    assert not ModelTarget.objects.filter(alias="strong").exists()


def test_no_answer_carries_a_secret(acme):
    bodies = [
        call(acme.client, "GET", "/api/v1/model-targets").content,
        call(acme.client, "GET", "/api/v1/model-targets/support-fast").content,
        call(acme.client, "PATCH", "/api/v1/model-targets/support-fast", {"api_key": "sk-rotated"}).content,
        call(acme.client, "GET", f"/api/v1/agents/{acme.agent.slug}/tools").content,
        call(acme.client, "PATCH", f"/api/v1/agents/{acme.agent.slug}/tools/lookup", {"description": "d"}).content,
    ]

    for body in bodies:
        text = body.decode()
        assert KEY not in text
        assert "sk-rotated" not in text
        assert TOOL_SECRET not in text
        assert "encrypted" not in text
    assert json.loads(bodies[3])[0]["has_endpoint_secret"] is True


def test_the_health_of_a_resting_target_shows(acme):
    until = timezone.now() + timedelta(seconds=30)
    ModelTarget.objects.filter(pk=acme.target.pk).update(
        consecutive_failures=3, cooldown_until=until, last_error="timed out"
    )

    health = call(acme.client, "GET", "/api/v1/model-targets/support-fast").json()["health"]

    assert (health["state"], health["consecutive_failures"], health["last_error"]) == ("cooling_down", 3, "timed out")


def test_a_taken_alias_is_a_conflict_and_a_bad_target_names_its_field(acme):
    before = state()

    taken = call(acme.client, "POST", "/api/v1/model-targets", {"alias": "support-fast", "model": "m"})
    invalid = call(acme.client, "POST", "/api/v1/model-targets", {"alias": "x", "model": "m", "fallbacks": ["nowhere"]})

    assert_error(taken, 409, "model_target_alias_taken")
    assert_error(invalid, 422, "model_target_invalid")
    assert invalid.json()["errors"] == [
        {"field": "fallbacks", "message": "no model target named nowhere in this workspace"}
    ]
    assert state() == before


def test_an_environment_target_is_read_only(acme):
    ModelTargetFactory.create(workspace=acme.workspace, alias="env-fast", source=TargetSource.ENVIRONMENT)
    before = state()

    assert call(acme.client, "GET", "/api/v1/model-targets/env-fast").json()["source"] == "env"
    assert_error(
        call(acme.client, "PATCH", "/api/v1/model-targets/env-fast", {"model": "x"}), 409, "model_target_read_only"
    )
    assert_error(call(acme.client, "DELETE", "/api/v1/model-targets/env-fast"), 409, "model_target_read_only")
    assert state() == before


def test_a_key_limited_to_an_agent_reads_targets_but_cannot_change_them(acme, api_client_for):
    limited = api_client_for(acme.workspace, agents=[acme.agent])
    before = state()

    assert call(limited, "GET", "/api/v1/model-targets").status_code == 200
    assert_error(call(limited, "POST", "/api/v1/model-targets", {"alias": "y", "model": "m"}), 403, "permission_denied")
    assert_error(call(limited, "PATCH", "/api/v1/model-targets/support-fast", {"model": "n"}), 403, "permission_denied")
    assert_error(call(limited, "DELETE", "/api/v1/model-targets/support-fast"), 403, "permission_denied")
    assert state() == before


# --- Router configuration, chain, tools ----------------------------------------------------------------


def test_the_router_configuration_is_read_and_changed_in_part(acme):
    path = f"/api/v1/agents/{acme.agent.slug}/router"
    rules = [{"name": "refunds", "kind": "keywords", "value": "refund", "to_tier": "agentic", "reason": "money"}]

    changed = call(
        acme.client,
        "PUT",
        path,
        {"rules": rules, "cache_enabled": True, "agentic_target": "support-fast", "speculative_single_call": True},
    )
    read = call(acme.client, "GET", path).json()

    assert changed.status_code == 200
    assert read == changed.json()
    assert (read["single_call_target"], read["agentic_target"], read["shadow_rate"]) == (
        "support-fast",
        "support-fast",
        0.1,
    )
    assert (read["rules"], read["cache_enabled"], read["speculative_single_call"]) == (rules, True, True)


def test_a_bad_router_configuration_changes_nothing(acme, globex):
    path = f"/api/v1/agents/{acme.agent.slug}/router"
    before = state()

    out_of_range = call(acme.client, "PUT", path, {"shadow_rate": 2})
    their_target = call(acme.client, "PUT", path, {"single_call_target": globex.target.alias})
    bad_rule = call(
        acme.client, "PUT", path, {"rules": [{"name": "r", "kind": "pattern", "value": "(", "to_tier": "chain"}]}
    )
    not_a_switch = call(acme.client, "PUT", path, {"speculative_single_call": "sometimes"})

    assert_error(out_of_range, 422, "router_config_invalid")
    assert_error(not_a_switch, 422, "validation_error")
    assert_error(their_target, 422, "router_config_invalid")
    assert_error(bad_rule, 422, "router_config_invalid")
    assert state() == before


def test_an_agent_never_configured_reads_the_defaults(acme):
    fresh = AgentFactory.create(workspace=acme.workspace, slug="fresh")

    body = call(acme.client, "GET", f"/api/v1/agents/{fresh.slug}/router").json()

    assert (body["shadow_rate"], body["cache_threshold"], body["updated_at"]) == (0.0, 0.93, None)
    assert not RouterConfig.objects.filter(agent=fresh).exists()


def test_the_chain_is_replaced_whole(acme):
    prompt = prompt_with_versions(agent=acme.agent, name="support/extract", templates=["Extract the order id."])
    version = prompt.versions.get()
    path = f"/api/v1/agents/{acme.agent.slug}/chain"
    schema = {"type": "object", "properties": {"order_id": {"type": "string"}}}

    body = call(
        acme.client,
        "PUT",
        path,
        {
            "steps": [
                {"name": "extract", "prompt_version": version.pk, "output_schema": schema},
                {"name": "answer", "instructions": "Answer.", "model_target": "support-fast"},
            ]
        },
    ).json()

    assert body == call(acme.client, "GET", path).json()
    assert [(step["position"], step["name"], step["prompt"], step["model_target"]) for step in body["steps"]] == [
        (1, "extract", "support/extract:1", None),
        (2, "answer", None, "support-fast"),
    ]
    invalid = call(acme.client, "PUT", path, {"steps": [{"name": "x", "output_schema": {"type": 3}}]})
    assert_error(invalid, 422, "chain_invalid")
    assert {item["field"] for item in invalid.json()["errors"]} == {"steps[0].instructions", "steps[0].output_schema"}
    assert ChainStep.objects.filter(agent=acme.agent).count() == 2


def test_a_chain_step_names_its_prompt_version_as_it_is_read_back(acme):
    prompt_with_versions(agent=acme.agent, name="support/extract", templates=["Extract the order id.", "Extract it."])
    path = f"/api/v1/agents/{acme.agent.slug}/chain"

    body = call(acme.client, "PUT", path, {"steps": [{"name": "extract", "prompt": "support/extract:2"}]}).json()
    unknown = call(acme.client, "PUT", path, {"steps": [{"name": "x", "prompt": "support/extract:9"}]})
    both = call(
        acme.client, "PUT", path, {"steps": [{"name": "x", "prompt": "support/extract:1", "prompt_version": 1}]}
    )

    assert [(step["name"], step["prompt"]) for step in body["steps"]] == [("extract", "support/extract:2")]
    assert body["steps"][0]["prompt_version"] == acme.agent.prompts.get().versions.get(version=2).pk
    assert_error(unknown, 422, "validation_error")
    assert unknown.json()["errors"] == [
        {"field": "steps[0].prompt", "message": "no such version of this agent's prompts"}
    ]
    assert_error(both, 422, "validation_error")
    assert call(acme.client, "GET", path).json() == body


def test_a_patch_with_an_unknown_field_is_422(acme):
    tool = call(acme.client, "PATCH", f"/api/v1/agents/{acme.agent.slug}/tools/lookup", {"descripton": "typo"})
    target = call(acme.client, "PATCH", "/api/v1/model-targets/support-fast", {"timeout": 5})

    assert_error(tool, 422, "validation_error")
    assert_error(target, 422, "validation_error")
    assert target.json()["errors"] == [{"field": "timeout", "message": "Extra inputs are not permitted"}]


def test_tools_are_created_changed_and_deleted(acme):
    base = f"/api/v1/agents/{acme.agent.slug}/tools"
    parameters = {"type": "object", "properties": {"order_id": {"type": "string"}}}

    created = call(acme.client, "POST", base, {"name": "refund", "parameters": parameters})
    taken = call(acme.client, "POST", base, {"name": "refund"})
    invalid = call(acme.client, "POST", base, {"name": "bad name!"})
    renamed = call(acme.client, "PATCH", f"{base}/refund", {"name": "refund_ride"})

    assert created.status_code == 201
    assert created.json()["has_endpoint_secret"] is False
    assert_error(taken, 409, "agent_tool_name_taken")
    assert_error(invalid, 422, "agent_tool_invalid")
    assert renamed.json()["name"] == "refund_ride"
    assert [tool["name"] for tool in call(acme.client, "GET", base).json()] == ["lookup", "refund_ride"]
    assert call(acme.client, "DELETE", f"{base}/refund_ride").status_code == 204
    assert_error(call(acme.client, "DELETE", f"{base}/refund_ride"), 404, "agent_tool_not_found")


# --- Decisions and the report ----------------------------------------------------------------------------


def test_decisions_are_listed_newest_first_filtered_and_paged(acme):
    now = timezone.now()
    older = [
        RoutingDecisionFactory.create(
            workspace=acme.workspace, agent=acme.agent, tier="single_call", created_at=now - timedelta(hours=hours)
        )
        for hours in (3, 2, 1)
    ]
    expected = [acme.decision.pk, *[decision.pk for decision in reversed(older)]]

    first = call(acme.client, "GET", "/api/v1/routing-decisions?limit=3").json()
    second = call(acme.client, "GET", f"/api/v1/routing-decisions?limit=3&cursor={first['next_cursor']}").json()
    singles = call(acme.client, "GET", "/api/v1/routing-decisions?tier=single_call").json()
    since = (now - timedelta(minutes=90)).isoformat().replace("+00:00", "Z")
    recent = call(acme.client, "GET", f"/api/v1/routing-decisions?since={since}&agent={acme.agent.slug}").json()

    assert [item["id"] for item in first["items"] + second["items"]] == expected
    assert second["next_cursor"] is None
    assert [item["id"] for item in singles["items"]] == [decision.pk for decision in reversed(older)]
    assert [item["id"] for item in recent["items"]] == [acme.decision.pk, older[2].pk]
    assert_error(
        call(acme.client, "GET", "/api/v1/routing-decisions?cursor=garbage"), 422, "routing_decision_list_invalid"
    )
    assert_error(call(acme.client, "GET", "/api/v1/routing-decisions?tier=moon"), 422, "validation_error")


def test_a_decision_shows_its_features_estimates_shadows_and_trajectory(acme):
    body = call(acme.client, "GET", f"/api/v1/routing-decisions/{acme.decision.pk}").json()

    assert (body["tier"], body["method"], body["features"], body["estimates"]) == (
        "chain",
        "estimate",
        {"words": 12},
        {"chain": {"quality": 0.7}},
    )
    assert body["trajectory_url"] == f"/w/acme/trajectories/{acme.decision.trace_id}/"
    assert [(shadow["tier"], shadow["quality"], shadow["trajectory_url"]) for shadow in body["shadows"]] == [
        ("agentic", 0.9, f"/w/acme/trajectories/{'b' * 32}/")
    ]


def test_the_router_report_measures_the_agent(acme):
    body = call(acme.client, "GET", f"/api/v1/agents/{acme.agent.slug}/router-report?days=7").json()

    report = body["report"]
    assert body["tiers"] == ["single_call", "chain", "agentic", "human"]
    assert report["total"] == 1
    chain = next(tier for tier in report["tiers"] if tier["tier"] == "chain")
    assert (chain["count"], chain["share"], chain["mean_quality"], chain["mean_cost_usd"]) == (1, 1.0, 0.6, 0.002)
    # The agentic shadow scored 0.9 against the chain's 0.6: the router did not pick the best tier.
    assert (report["best_tier_rate"], report["compared"]) == (0.0, 1)
    assert [bucket["total"] for bucket in body["daily"]] == [1]
    assert body["speculation"] == {"started": 0, "taken": 0, "unused": 0, "unused_cost_usd": None}
    assert_error(
        call(acme.client, "GET", f"/api/v1/agents/{acme.agent.slug}/router-report?days=0"), 422, "validation_error"
    )


# --- Hand-offs ------------------------------------------------------------------------------------------


def test_handoffs_are_listed_and_resolved_once(acme):
    path = f"/api/v1/handoffs/{acme.handoff.pk}/resolve"

    listed = call(acme.client, "GET", "/api/v1/handoffs?status=open").json()
    resolved = call(acme.client, "POST", path, {"resolution": "Refunded."})
    again = call(acme.client, "POST", path, {"resolution": "Twice."})

    assert [item["id"] for item in listed] == [acme.handoff.pk]
    assert listed[0]["trajectory_url"] == f"/w/acme/trajectories/{acme.handoff.trace_id}/"
    assert (resolved.json()["status"], resolved.json()["resolution"]) == ("resolved", "Refunded.")
    assert_error(again, 409, "handoff_conflict")
    assert Handoff.objects.get(pk=acme.handoff.pk).resolution == "Refunded."
    assert call(acme.client, "GET", "/api/v1/handoffs?status=open").json() == []


# --- Tenancy and scopes -----------------------------------------------------------------------------

# Every endpoint that names a row, called with Globex's key on Acme's names: 404, and nothing changes.
NAMED: list[tuple[str, str, Any, str]] = [
    ("GET", "/api/v1/model-targets/{alias}", None, "model_target_not_found"),
    ("PATCH", "/api/v1/model-targets/{alias}", {"model": "stolen"}, "model_target_not_found"),
    ("DELETE", "/api/v1/model-targets/{alias}", None, "model_target_not_found"),
    ("GET", "/api/v1/agents/{agent}/router", None, "agent_not_found"),
    ("PUT", "/api/v1/agents/{agent}/router", {"shadow_rate": 1}, "agent_not_found"),
    ("GET", "/api/v1/agents/{agent}/chain", None, "agent_not_found"),
    ("PUT", "/api/v1/agents/{agent}/chain", {"steps": []}, "agent_not_found"),
    ("GET", "/api/v1/agents/{agent}/tools", None, "agent_not_found"),
    ("POST", "/api/v1/agents/{agent}/tools", {"name": "planted"}, "agent_not_found"),
    ("PATCH", "/api/v1/agents/{agent}/tools/lookup", {"description": "x"}, "agent_not_found"),
    ("DELETE", "/api/v1/agents/{agent}/tools/lookup", None, "agent_not_found"),
    ("GET", "/api/v1/agents/{agent}/router-report", None, "agent_not_found"),
    ("GET", "/api/v1/routing-decisions?agent={agent}", None, "agent_not_found"),
    ("GET", "/api/v1/routing-decisions/{decision}", None, "routing_decision_not_found"),
    ("POST", "/api/v1/handoffs/{handoff}/resolve", {"resolution": "closed by a stranger"}, "handoff_not_found"),
]


def _fill(text: str, site: Site) -> str:
    return (
        text.replace("{alias}", site.target.alias)
        .replace("{agent}", site.agent.slug)
        .replace("{decision}", str(site.decision.pk))
        .replace("{handoff}", str(site.handoff.pk))
    )


@pytest.mark.parametrize(("method", "path", "body", "code"), NAMED, ids=[f"{m} {p}" for m, p, _, _ in NAMED])
def test_another_workspaces_key_finds_nothing_and_changes_nothing(acme, globex, method, path, body, code):
    before = state()

    response = call(globex.client, method, _fill(path, acme), body)

    assert_error(response, 404, code)
    assert state() == before


# Model targets belong to the workspace, not to an agent: a limited key reads them (and writes none).
AGENT_NAMED = [case for case in NAMED if not case[1].startswith("/api/v1/model-targets")]


@pytest.mark.parametrize(
    ("method", "path", "body", "code"), AGENT_NAMED, ids=[f"{m} {p}" for m, p, _, _ in AGENT_NAMED]
)
def test_a_key_limited_to_another_agent_finds_nothing(acme, api_client_for, method, path, body, code):
    other = AgentFactory.create(workspace=acme.workspace, slug="other")
    limited = api_client_for(acme.workspace, agents=[other])
    before = state()

    response = call(limited, method, _fill(path, acme), body)

    assert response.status_code == 404
    assert state() == before


def test_lists_hold_only_ones_own_workspace(acme, globex):
    targets = call(globex.client, "GET", "/api/v1/model-targets").json()
    decisions = call(globex.client, "GET", "/api/v1/routing-decisions").json()
    handoffs = call(globex.client, "GET", "/api/v1/handoffs").json()

    assert [target["alias"] for target in targets] == ["theirs-fast"]
    assert [item["id"] for item in decisions["items"]] == [globex.decision.pk]
    assert [item["id"] for item in handoffs] == [globex.handoff.pk]


def test_the_same_alias_in_two_workspaces_is_each_ones_own(acme, globex):
    call(globex.client, "POST", "/api/v1/model-targets", {"alias": "support-fast", "model": "globex/m"})

    mine = call(acme.client, "GET", "/api/v1/model-targets/support-fast").json()
    theirs = call(globex.client, "GET", "/api/v1/model-targets/support-fast").json()

    assert (mine["model"], theirs["model"]) == ("openai/m", "globex/m")


WRITES: list[tuple[str, str, Any]] = [
    ("POST", "/api/v1/model-targets", {"alias": "y", "model": "m"}),
    ("PATCH", "/api/v1/model-targets/{alias}", {"model": "n"}),
    ("DELETE", "/api/v1/model-targets/{alias}", None),
    ("PUT", "/api/v1/agents/{agent}/router", {"shadow_rate": 1}),
    ("PUT", "/api/v1/agents/{agent}/chain", {"steps": []}),
    ("POST", "/api/v1/agents/{agent}/tools", {"name": "planted"}),
    ("PATCH", "/api/v1/agents/{agent}/tools/lookup", {"description": "x"}),
    ("DELETE", "/api/v1/agents/{agent}/tools/lookup", None),
    ("POST", "/api/v1/handoffs/{handoff}/resolve", {"resolution": "done"}),
]


@pytest.mark.parametrize(("method", "path", "body"), WRITES, ids=[f"{m} {p}" for m, p, _ in WRITES])
def test_a_read_only_key_cannot_write(acme, api_client_for, method, path, body):
    reader = api_client_for(acme.workspace, scopes=["read"])
    before = state()

    response = call(reader, method, _fill(path, acme), body)

    assert_error(response, 403, "insufficient_scope")
    assert state() == before


@pytest.mark.parametrize(("method", "path", "body"), WRITES, ids=[f"{m} {p}" for m, p, _ in WRITES])
def test_no_key_no_answer(acme, method, path, body):
    before = state()

    response = call(Client(), method, _fill(path, acme), body)

    assert_error(response, 401, "unauthenticated")
    assert state() == before


def test_handoff_status_filter_and_claim_states_show(acme):
    Handoff.objects.filter(pk=acme.handoff.pk).update(status=HandoffStatus.CLAIMED)

    assert call(acme.client, "GET", "/api/v1/handoffs?status=open").json() == []
    assert [item["status"] for item in call(acme.client, "GET", "/api/v1/handoffs").json()] == ["claimed"]
