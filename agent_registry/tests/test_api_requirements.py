"""The requirements endpoints: schema, check, versions, current, diff, activate."""

import pytest

from agent_registry import requirements
from agent_registry.models import Agent, ApiKey, RequirementsVersion
from agent_registry.tests.factories import NO_TIER_LEFT, AgentFactory, requirements_answers

pytestmark = pytest.mark.django_db

VERSION_KEYS = ["version", "current", "message", "author", "created_at", "answers", "feasibility"]


def test_the_schema_is_the_json_schema_of_the_answers(workspace, api_client_for):
    response = api_client_for(workspace, scopes=["read"]).get("/api/v1/requirements/schema")

    assert response.status_code == 200
    assert response.json() == requirements.Requirements.model_json_schema()
    assert response.json()["required"] == [
        "error_surface",
        "io_gap",
        "constraints",
        "pareto",
        "evaluation",
        "routing",
    ]


def test_check_returns_findings_and_configuration_and_saves_nothing(workspace, registry, api_client_for, row_counts):
    client = api_client_for(workspace, scopes=["read"])
    before = row_counts()
    answers = requirements_answers(**{"constraints.governance": "full_audit_trail"})

    response = client.post("/api/v1/requirements/check", data={"answers": answers}, content_type="application/json")

    assert response.status_code == 200
    assert response.json()["feasibility"] == []
    assert response.json()["configuration"] == requirements.derived_configuration(
        requirements.Requirements.model_validate(answers)
    ).model_dump(mode="json")
    assert response.json()["configuration"]["trajectory_sampling_rate"]["value"] == 1.0
    assert row_counts() == before


def test_check_of_invalid_answers_is_422_naming_the_field(workspace, api_client_for):
    response = api_client_for(workspace, scopes=["read"]).post(
        "/api/v1/requirements/check",
        data={"answers": requirements_answers(**{"pareto.quality_vs_speed": 101})},
        content_type="application/json",
    )

    assert response.status_code == 422
    assert response.json() == {
        "detail": "invalid requirements: pareto.quality_vs_speed: Input should be less than or equal to 100",
        "code": "requirements_invalid",
        "errors": [{"field": "pareto.quality_vs_speed", "message": "Input should be less than or equal to 100"}],
    }


def test_version_list(workspace, registry, api_client_for):
    response = api_client_for(workspace, scopes=["read"]).get("/api/v1/agents/support/requirements")

    assert response.status_code == 200
    body = response.json()
    assert [{key: item[key] for key in ("version", "current", "message", "author")} for item in body] == [
        {"version": 2, "current": True, "message": "tighter", "author": None},
        {"version": 1, "current": False, "message": "initial", "author": None},
    ]
    assert [list(item) for item in body] == [["version", "current", "message", "author", "created_at"]] * 2


def test_version_create(workspace, registry, api_client_for):
    client = api_client_for(workspace)
    key = ApiKey.objects.get(name="test key")
    answers = requirements_answers(**{"constraints.governance": "output_monitoring"})

    response = client.post(
        "/api/v1/agents/support/requirements",
        data={"answers": answers, "message": "loosen governance"},
        content_type="application/json",
    )

    assert response.status_code == 201
    body = response.json()
    assert list(body) == VERSION_KEYS
    assert {key: body[key] for key in ("version", "current", "message", "author")} == {
        "version": 3,
        "current": True,
        "message": "loosen governance",
        "author": f"API key {key.prefix}",
    }
    assert body["answers"] == requirements.Requirements.model_validate(answers).to_json()
    assert [finding["code"] for finding in body["feasibility"]] == ["governance_below_authority"]
    stored = RequirementsVersion.objects.get(agent=registry.support, version=3)
    assert (stored.message, stored.created_via_key) == ("loosen governance", key)
    assert Agent.objects.get(pk=registry.support.pk).current_requirements == stored


def test_invalid_requirements_are_422_with_the_field_and_save_no_version(
    workspace, registry, api_client_for, registry_state
):
    client = api_client_for(workspace)
    before = registry_state()

    response = client.post(
        "/api/v1/agents/support/requirements",
        data={"answers": requirements_answers(**{"io_gap.steps_median": 3, "io_gap.steps_p95": 2})},
        content_type="application/json",
    )

    assert response.status_code == 422
    assert response.json() == {
        "detail": "invalid requirements: io_gap.steps_p95: Value error, steps_p95 must be at least steps_median",
        "code": "requirements_invalid",
        "errors": [{"field": "io_gap.steps_p95", "message": "Value error, steps_p95 must be at least steps_median"}],
    }
    assert registry_state() == before


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        (
            {"evaluation.output_metrics": [{"name": "resolution_rate", "target": "NaN"}]},
            "evaluation.output_metrics.0.target",
        ),
        (
            {"evaluation.output_metrics": [{"name": "resolution_rate", "target": "Infinity"}]},
            "evaluation.output_metrics.0.target",
        ),
        (
            {"routing.escalation_rules": [{"trigger": "amount_over", "value": "NaN", "to_tier": "human"}]},
            "routing.escalation_rules.0",
        ),
        (
            {"routing.escalation_rules": [{"trigger": "amount_over", "value": "inf", "to_tier": "human"}]},
            "routing.escalation_rules.0",
        ),
    ],
)
def test_a_number_that_is_not_finite_is_422_naming_the_field(
    workspace, registry, api_client_for, registry_state, changes, field
):
    # A NaN target got past validation and failed in PostgreSQL's JSON (400, no field); a NaN amount was
    # saved, and an amount rule comparing with it never fires.
    client = api_client_for(workspace)
    before = registry_state()

    response = client.post(
        "/api/v1/agents/support/requirements",
        data={"answers": requirements_answers(**changes)},
        content_type="application/json",
    )

    assert response.status_code == 422
    assert response.json()["code"] == "requirements_invalid"
    assert [error["field"] for error in response.json()["errors"]] == [field]
    assert registry_state() == before


def test_an_unknown_enum_is_422_and_saves_no_version(workspace, registry, api_client_for, registry_state):
    client = api_client_for(workspace)
    before = registry_state()

    response = client.post(
        "/api/v1/agents/support/requirements",
        data={"answers": requirements_answers(**{"routing.mode": "psychic"})},
        content_type="application/json",
    )

    assert response.status_code == 422
    assert response.json()["code"] == "requirements_invalid"
    assert response.json()["errors"] == [
        {"field": "routing.mode", "message": "Input should be 'single_level' or 'adaptive'"}
    ]
    assert registry_state() == before


def test_a_missing_section_is_named(workspace, registry, api_client_for, registry_state):
    answers = requirements_answers()
    del answers["pareto"]
    client = api_client_for(workspace)
    before = registry_state()

    response = client.post(
        "/api/v1/agents/support/requirements", data={"answers": answers}, content_type="application/json"
    )

    assert response.status_code == 422
    assert response.json()["errors"] == [{"field": "pareto", "message": "Field required"}]
    assert registry_state() == before


def test_answers_that_are_not_an_object_are_422(workspace, registry, api_client_for, registry_state):
    client = api_client_for(workspace)
    before = registry_state()

    response = client.post(
        "/api/v1/agents/support/requirements", data={"answers": ["a", "list"]}, content_type="application/json"
    )

    assert response.status_code == 422
    assert response.json()["code"] == "validation_error"
    assert response.json()["errors"] == [{"field": "answers", "message": "Input should be a valid dictionary"}]
    assert registry_state() == before


def test_current(workspace, registry, api_client_for):
    response = api_client_for(workspace, scopes=["read"]).get("/api/v1/agents/support/requirements/current")

    assert response.status_code == 200
    assert (response.json()["version"], response.json()["current"]) == (2, True)
    assert response.json()["answers"]["io_gap"]["steps_p95"] == 4


def test_current_before_any_requirements_is_404(workspace, api_client_for):
    AgentFactory.create(workspace=workspace, slug="blank")

    response = api_client_for(workspace, scopes=["read"]).get("/api/v1/agents/blank/requirements/current")

    assert response.status_code == 404
    assert response.json() == {
        "detail": "agent 'blank' has no requirements yet",
        "code": "requirements_version_not_found",
    }


def test_a_version_by_number(workspace, registry, api_client_for):
    client = api_client_for(workspace, scopes=["read"])

    first = client.get("/api/v1/agents/support/requirements/1")
    missing = client.get("/api/v1/agents/support/requirements/3")

    assert first.status_code == 200
    assert (first.json()["version"], first.json()["current"], first.json()["message"]) == (1, False, "initial")
    assert first.json()["answers"]["io_gap"]["steps_p95"] == 5
    assert missing.status_code == 404
    assert missing.json() == {
        "detail": "agent 'support' has no requirements version 3",
        "code": "requirements_version_not_found",
    }


def test_diff(workspace, registry, api_client_for):
    response = api_client_for(workspace, scopes=["read"]).get(
        "/api/v1/agents/support/requirements/diff?from_version=1&to_version=2"
    )

    assert response.status_code == 200
    assert response.json() == {
        "from_version": 1,
        "to_version": 2,
        "changes": [{"path": "io_gap.steps_p95", "kind": "changed", "before": 5, "after": 4}],
    }


def test_diff_needs_both_versions(workspace, registry, api_client_for):
    client = api_client_for(workspace, scopes=["read"])

    missing_query = client.get("/api/v1/agents/support/requirements/diff?from_version=1")
    missing_version = client.get("/api/v1/agents/support/requirements/diff?from_version=1&to_version=9")

    assert missing_query.status_code == 422
    assert missing_query.json()["errors"] == [{"field": "to_version", "message": "Field required"}]
    assert missing_version.status_code == 404
    assert missing_version.json()["code"] == "requirements_version_not_found"


def test_activate_rolls_back(workspace, registry, api_client_for):
    response = api_client_for(workspace).post("/api/v1/agents/support/requirements/1/activate")

    assert response.status_code == 200
    assert (response.json()["version"], response.json()["current"]) == (1, True)
    assert Agent.objects.get(pk=registry.support.pk).current_requirements == RequirementsVersion.objects.get(
        agent=registry.support, version=1
    )
    assert RequirementsVersion.objects.filter(agent=registry.support).count() == 2


def test_activate_an_unknown_version_is_404_and_changes_nothing(workspace, registry, api_client_for, registry_state):
    client = api_client_for(workspace)
    before = registry_state()

    response = client.post("/api/v1/agents/support/requirements/7/activate")

    assert response.status_code == 404
    assert response.json()["code"] == "requirements_version_not_found"
    assert registry_state() == before


NO_TIER_LEFT_ERRORS = [
    {
        "field": "routing.enabled_tiers",
        "message": "no enabled tier can serve a request: the inline latency wall rules out agentic; enable "
        "another tier (single_call, chain or human) or relax the latency class",
    },
    {"field": "constraints.latency.latency_class", "message": "rules out agentic"},
]


def test_requirements_that_leave_the_router_no_tier_are_422_naming_the_field(
    workspace, registry, api_client_for, registry_state
):
    # Saved, the gateway would route to single_call, a tier these answers never enabled, with no budgets.
    client = api_client_for(workspace)
    before = registry_state()

    response = client.post(
        "/api/v1/agents/support/requirements",
        data={"answers": requirements_answers(**NO_TIER_LEFT), "message": "agentic only"},
        content_type="application/json",
    )

    assert response.status_code == 422
    assert response.json()["code"] == "requirements_invalid"
    assert response.json()["errors"] == NO_TIER_LEFT_ERRORS
    assert registry_state() == before


def test_the_check_refuses_answers_that_leave_no_tier(workspace, api_client_for):
    response = api_client_for(workspace, scopes=["read"]).post(
        "/api/v1/requirements/check",
        data={"answers": requirements_answers(**NO_TIER_LEFT)},
        content_type="application/json",
    )

    assert response.status_code == 422
    assert response.json()["errors"] == NO_TIER_LEFT_ERRORS


def test_an_agent_created_with_requirements_that_leave_no_tier_is_not_created(
    workspace, api_client_for, registry_state
):
    client = api_client_for(workspace)
    before = registry_state()

    response = client.post(
        "/api/v1/agents",
        data={"slug": "stuck", "name": "Stuck", "requirements": requirements_answers(**NO_TIER_LEFT)},
        content_type="application/json",
    )

    assert response.status_code == 422
    assert response.json()["errors"] == NO_TIER_LEFT_ERRORS
    assert registry_state() == before


def test_activating_a_stored_version_that_leaves_no_tier_is_422_and_moves_nothing(
    workspace, registry, api_client_for, registry_state
):
    # A version stored before the rule existed (written past the service, as an old deployment had it).
    stored = RequirementsVersion.objects.create(
        agent=registry.support,
        version=3,
        answers=requirements.Requirements.model_validate(requirements_answers(**NO_TIER_LEFT)).to_json(),
    )
    client = api_client_for(workspace)
    before = registry_state()

    response = client.post(f"/api/v1/agents/support/requirements/{stored.version}/activate")

    assert response.status_code == 422
    assert response.json()["errors"] == NO_TIER_LEFT_ERRORS
    assert registry_state() == before
