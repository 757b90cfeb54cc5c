"""The workspace and agent endpoints."""

import pytest

from agent_registry import services
from agent_registry.models import Agent, AgentStatus, ApiKey, Prompt, RequirementsVersion
from agent_registry.tests.factories import NO_TIER_LEFT, AgentFactory, requirements_answers

pytestmark = pytest.mark.django_db

AGENT_KEYS = [
    "slug",
    "name",
    "description",
    "status",
    "owner",
    "requirements_version",
    "trace_retention_days",
    "created_at",
    "updated_at",
]


def test_workspace(workspace, api_client_for):
    response = api_client_for(workspace, scopes=["read"]).get("/api/v1/workspace")

    assert (response.status_code, response.json()) == (200, {"slug": "acme", "name": "Acme"})


def test_agent_list(workspace, other_workspace, registry, api_client_for):
    AgentFactory.create(workspace=workspace, slug="draft-bot", name="Draft bot", status=AgentStatus.DRAFT)
    AgentFactory.create(workspace=other_workspace, slug="hidden", status=AgentStatus.DRAFT)
    client = api_client_for(workspace, scopes=["read"])

    response = client.get("/api/v1/agents")

    assert response.status_code == 200
    body = response.json()
    assert [list(agent) for agent in body] == [AGENT_KEYS] * 3
    assert [(agent["slug"], agent["name"], agent["status"], agent["requirements_version"]) for agent in body] == [
        ("billing", "Billing", "draft", 1),
        ("draft-bot", "Draft bot", "draft", None),
        ("support", "Ride support", "draft", 2),
    ]


def test_agent_list_by_status(workspace, registry, api_client_for):
    Agent.objects.filter(pk=registry.support.pk).update(status=AgentStatus.ACTIVE)

    response = api_client_for(workspace, scopes=["read"]).get("/api/v1/agents?status=active")

    assert [agent["slug"] for agent in response.json()] == ["support"]


def test_agent_get(workspace, registry, api_client_for):
    response = api_client_for(workspace, scopes=["read"]).get("/api/v1/agents/support")

    assert response.status_code == 200
    body = response.json()
    assert list(body) == [*AGENT_KEYS, "feasibility"]
    assert {key: body[key] for key in ("slug", "name", "description", "owner", "requirements_version")} == {
        "slug": "support",
        "name": "Ride support",
        "description": "An agent made by a test.",
        "owner": None,
        "requirements_version": 2,
    }
    assert body["feasibility"] == []


def test_agent_get_shows_feasibility_findings(workspace, api_client_for):
    agent = AgentFactory.create(workspace=workspace, slug="risky")
    services.requirements_version_create(
        agent=agent, answers=requirements_answers(**{"evaluation.trajectory_metrics": []})
    )

    body = api_client_for(workspace, scopes=["read"]).get("/api/v1/agents/risky").json()

    assert [(finding["code"], finding["severity"], finding["fields"]) for finding in body["feasibility"]] == [
        (
            "autonomous_actions_without_trajectory_audit",
            "error",
            ["error_surface.actions", "evaluation.trajectory_metrics"],
        )
    ]


def test_an_unknown_agent_is_404(workspace, registry, api_client_for):
    response = api_client_for(workspace, scopes=["read"]).get("/api/v1/agents/nobody")

    assert response.status_code == 404
    assert response.json() == {"detail": "no agent 'nobody' in this workspace", "code": "agent_not_found"}


def test_agent_create(workspace, registry, api_client_for):
    client = api_client_for(workspace)

    response = client.post(
        "/api/v1/agents",
        data={"slug": "new-bot", "name": "New bot", "description": "Fresh.", "status": "active"},
        content_type="application/json",
    )

    assert response.status_code == 201
    body = response.json()
    assert {key: body[key] for key in ("slug", "name", "description", "status", "requirements_version")} == {
        "slug": "new-bot",
        "name": "New bot",
        "description": "Fresh.",
        "status": "active",
        "requirements_version": None,
    }
    assert body["feasibility"] == []
    agent = Agent.objects.get(slug="new-bot")
    assert (agent.workspace, agent.name, agent.status, agent.current_requirements) == (
        workspace,
        "New bot",
        "active",
        None,
    )


def test_agent_create_with_requirements_saves_version_1(workspace, api_client_for):
    client = api_client_for(workspace)

    response = client.post(
        "/api/v1/agents",
        data={"slug": "new-bot", "name": "New bot", "requirements": requirements_answers()},
        content_type="application/json",
    )

    assert response.status_code == 201
    assert response.json()["requirements_version"] == 1
    version = RequirementsVersion.objects.get(agent__slug="new-bot")
    assert (version.version, version.message, version.created_via_key) == (
        1,
        "Initial requirements",
        ApiKey.objects.get(),
    )


def test_agent_create_with_invalid_requirements_creates_nothing(workspace, api_client_for, row_counts):
    client = api_client_for(workspace)
    before = row_counts()

    response = client.post(
        "/api/v1/agents",
        data={"slug": "new-bot", "name": "New bot", "requirements": requirements_answers(**{"io_gap.steps_p95": 0})},
        content_type="application/json",
    )

    assert response.status_code == 422
    assert response.json()["code"] == "requirements_invalid"
    assert response.json()["errors"] == [
        {"field": "io_gap.steps_p95", "message": "Value error, steps_p95 must be at least steps_median"}
    ]
    assert row_counts() == before


def test_agent_create_with_a_taken_slug_is_409(workspace, registry, api_client_for, registry_state):
    client = api_client_for(workspace)
    before = registry_state()

    response = client.post("/api/v1/agents", data={"slug": "support", "name": "Dup"}, content_type="application/json")

    assert response.status_code == 409
    assert response.json() == {
        "detail": "an agent with slug 'support' already exists in this workspace",
        "code": "agent_slug_taken",
    }
    assert registry_state() == before


def test_agent_create_with_a_slug_used_in_another_workspace(workspace, registry, api_client_for):
    response = api_client_for(workspace).post(
        "/api/v1/agents", data={"slug": "theirs", "name": "Ours"}, content_type="application/json"
    )

    assert response.status_code == 201
    assert sorted(Agent.objects.filter(slug="theirs").values_list("workspace__slug", "name")) == [
        ("acme", "Ours"),
        ("globex", "Theirs"),
    ]


def test_agent_create_with_an_unknown_status_is_422(workspace, api_client_for, row_counts):
    client = api_client_for(workspace)
    before = row_counts()

    response = client.post(
        "/api/v1/agents", data={"slug": "x", "name": "X", "status": "sleeping"}, content_type="application/json"
    )

    assert response.status_code == 422
    assert response.json()["errors"] == [
        {"field": "status", "message": "Input should be 'draft', 'active', 'paused' or 'retired'"}
    ]
    assert row_counts() == before


def test_a_key_limited_to_an_agent_cannot_create_agents(workspace, registry, api_client_for, registry_state):
    client = api_client_for(workspace, agents=[registry.support])
    before = registry_state()

    response = client.post("/api/v1/agents", data={"slug": "x", "name": "X"}, content_type="application/json")

    assert response.status_code == 403
    assert response.json() == {
        "detail": "a key limited to some agents cannot create agents",
        "code": "permission_denied",
    }
    assert registry_state() == before


def test_agent_update(workspace, registry, api_client_for):
    response = api_client_for(workspace).patch(
        "/api/v1/agents/support", data={"name": "Rider support", "status": "paused"}, content_type="application/json"
    )

    assert response.status_code == 200
    assert (response.json()["name"], response.json()["status"], response.json()["description"]) == (
        "Rider support",
        "paused",
        "An agent made by a test.",
    )
    stored = Agent.objects.get(pk=registry.support.pk)
    assert (stored.slug, stored.name, stored.status) == ("support", "Rider support", "paused")


def test_agent_update_refuses_read_only_fields(workspace, registry, api_client_for):
    # A 200 that left the slug as it was told the caller the rename had been made.
    response = api_client_for(workspace).patch(
        "/api/v1/agents/support", data={"slug": "renamed", "name": "Same"}, content_type="application/json"
    )

    assert response.status_code == 422
    assert response.json()["errors"] == [{"field": "slug", "message": "Extra inputs are not permitted"}]
    assert Agent.objects.get(pk=registry.support.pk).name != "Same"
    assert list(Agent.objects.filter(workspace=workspace).order_by("slug").values_list("slug", flat=True)) == [
        "billing",
        "support",
    ]


def test_agent_update_with_an_unknown_status_changes_nothing(workspace, registry, api_client_for, registry_state):
    client = api_client_for(workspace)
    before = registry_state()

    response = client.patch(
        "/api/v1/agents/support", data={"name": "Y", "status": "sleeping"}, content_type="application/json"
    )

    assert response.status_code == 422
    assert registry_state() == before


def test_agent_delete(workspace, registry, api_client_for):
    response = api_client_for(workspace).delete("/api/v1/agents/support")

    assert response.status_code == 204
    assert response.content == b""
    assert sorted(Agent.objects.values_list("slug", flat=True)) == ["billing", "theirs"]
    assert sorted(Prompt.objects.values_list("name", flat=True)) == ["billing/intro", "globex/secret"]


def test_a_key_limited_to_the_deleted_agent_stops_working(workspace, registry, api_client_for):
    client = api_client_for(workspace, agents=[registry.support])

    assert client.delete("/api/v1/agents/support").status_code == 204

    response = client.get("/api/v1/agents")
    assert response.status_code == 401
    assert list(Agent.objects.filter(workspace=workspace).values_list("slug", flat=True)) == ["billing"]


def test_agent_feasibility(workspace, registry, api_client_for):
    services.requirements_version_create(
        agent=registry.billing, answers=requirements_answers(**{"constraints.governance": "output_monitoring"})
    )
    client = api_client_for(workspace, scopes=["read"])

    assert client.get("/api/v1/agents/support/feasibility").json() == []
    assert client.get("/api/v1/agents/billing/feasibility").json() == [
        {
            "code": "governance_below_authority",
            "severity": "warning",
            "message": "Bounded autonomy needs policy compliance auditing; the governance level is only "
            "output monitoring.",
            "fields": ["constraints.governance", "error_surface.decision_authority"],
        }
    ]


def test_agent_feasibility_without_requirements_is_empty(workspace, api_client_for):
    AgentFactory.create(workspace=workspace, slug="blank")

    response = api_client_for(workspace, scopes=["read"]).get("/api/v1/agents/blank/feasibility")

    assert (response.status_code, response.json()) == (200, [])


def test_agent_configuration(workspace, registry, api_client_for):
    response = api_client_for(workspace, scopes=["read"]).get("/api/v1/agents/support/configuration")

    assert response.status_code == 200
    body = response.json()
    assert list(body) == [
        "requirements_version",
        "allowed_tiers",
        "tier_budgets",
        "budgets",
        "approval_rules",
        "tool_allow_list",
        "mandatory_guardrails",
        "eval_suites",
        "router",
        "trajectory_sampling_rate",
    ]
    assert body["requirements_version"] == 2
    assert body["allowed_tiers"] == {
        "value": ["single_call", "chain", "human"],
        "sources": ["routing.enabled_tiers", "constraints.latency.latency_class"],
        "explanation": "The enabled tiers, less any that the latency wall rules out.",
    }
    assert body["trajectory_sampling_rate"]["value"] == 0.25
    assert body["approval_rules"]["value"] == [
        {"action": "issue_refund", "approval": "above_amount", "amount_usd": "20"}
    ]


def test_agent_configuration_without_requirements_is_404(workspace, api_client_for):
    AgentFactory.create(workspace=workspace, slug="blank")

    response = api_client_for(workspace, scopes=["read"]).get("/api/v1/agents/blank/configuration")

    assert response.status_code == 404
    assert response.json() == {
        "detail": "agent 'blank' has no requirements yet",
        "code": "requirements_version_not_found",
    }


def test_agent_configuration_when_the_latency_wall_rules_out_every_tier(workspace, api_client_for):
    # Saving such answers is refused now (test_api_requirements); a version stored before that still reads.
    agent = AgentFactory.create(workspace=workspace, slug="stuck")
    answers = requirements_answers(**NO_TIER_LEFT)
    stored = RequirementsVersion.objects.create(agent=agent, version=1, answers=answers)
    Agent.objects.filter(pk=agent.pk).update(current_requirements=stored)

    response = api_client_for(workspace, scopes=["read"]).get("/api/v1/agents/stuck/configuration")

    assert response.status_code == 200
    assert response.json()["router"]["value"]["default_tier"] is None
    assert response.json()["allowed_tiers"]["value"] == []


def test_agent_retention_is_set_and_cleared(workspace, registry, api_client_for):
    client = api_client_for(workspace)

    set_days = client.patch(
        "/api/v1/agents/support", data={"trace_retention_days": 30}, content_type="application/json"
    )
    zero = client.patch("/api/v1/agents/support", data={"trace_retention_days": 0}, content_type="application/json")
    assert (set_days.status_code, set_days.json()["trace_retention_days"]) == (200, 30)
    assert zero.status_code == 422
    assert Agent.objects.get(pk=registry.support.pk).trace_retention_days == 30

    cleared = client.patch(
        "/api/v1/agents/support", data={"trace_retention_days": None}, content_type="application/json"
    )
    assert (cleared.status_code, cleared.json()["trace_retention_days"]) == (200, None)
    assert Agent.objects.get(pk=registry.support.pk).trace_retention_days is None
