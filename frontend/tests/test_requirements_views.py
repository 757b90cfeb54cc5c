"""The requirements editor, its live check, the history with diffs, and rollback."""

from __future__ import annotations

import json
import re

import pytest

from agent_registry import requirements, selectors
from agent_registry.models import RequirementsVersion
from agent_registry.tests.factories import NO_TIER_LEFT, AgentFactory, requirements_answers
from frontend import forms
from frontend.tests.conftest import db_state

pytestmark = pytest.mark.django_db


def _url(tenant, tail=""):
    return f"/w/{tenant.workspace.slug}/agents/{tenant.agent.slug}/requirements/{tail}"


def _posted(**changes):
    answers = requirements.Requirements.model_validate(requirements_answers()).to_json()
    values = forms.requirements_form_values(answers)
    values.update(changes)
    return values


def test_the_editor_is_prefilled_from_the_current_version(tenant, member_client):
    response = member_client.get(_url(tenant))

    content = response.content.decode()
    assert response.status_code == 200
    assert 'name="io_gap.steps_p95" data-field="io_gap.steps_p95" value="6"' in content
    assert '<option value="conversational" selected>' in content
    assert 'name="routing.enabled_tiers" value="chain" data-field="routing.enabled_tiers" checked' in content
    assert (
        'name="error_surface.actions.1.name" data-field="error_surface.actions.1.name" value="issue_refund"' in content
    )
    for _, title, guidance in requirements.QUESTIONS:
        assert title in content
        assert guidance in content


def test_a_new_agent_starts_from_the_schema_defaults(tenant, member_client):
    agent = AgentFactory.create(workspace=tenant.workspace, slug="blank")

    response = member_client.get(f"/w/{tenant.workspace.slug}/agents/{agent.slug}/requirements/")

    assert response.status_code == 200
    assert 'name="pareto.quality_vs_speed" data-field="pareto.quality_vs_speed" value="50"' in response.content.decode()


def test_an_invalid_save_stores_nothing_and_shows_the_error_on_its_field(tenant, member_client):
    before = db_state()

    response = member_client.post(
        _url(tenant), {**_posted(**{"io_gap.steps_median": ["4"], "io_gap.steps_p95": ["2"]}), "message": "oops"}
    )

    content = response.content.decode()
    assert response.status_code == 422
    assert db_state() == before
    errors = response.context["validation"].errors
    assert errors == {"io_gap.steps_p95": ["steps_p95 must be at least steps_median"]}
    assert (
        '<ul class="field-errors" id="f-io_gap-steps_p95-errors" data-error-for="io_gap.steps_p95">'
        "<li>steps_p95 must be at least steps_median</li></ul>"
    ) in content
    assert 'value="2"' in content
    assert 'value="oops"' in content
    assert "Nothing was saved" in content


def test_a_missing_answer_is_reported_as_required(tenant, member_client):
    before = db_state()

    response = member_client.post(_url(tenant), _posted(**{"constraints.latency.latency_class": [""]}))

    assert response.status_code == 422
    assert response.context["validation"].errors == {"constraints.latency.latency_class": ["Field required"]}
    assert db_state() == before


def test_a_valid_save_creates_a_version_and_reports_the_findings(tenant, member_client):
    posted = _posted(
        **{"constraints.latency.latency_class": ["inline"], "routing.enabled_tiers": ["single_call", "agentic"]}
    )
    posted["routing.default_tier"] = ["single_call"]
    posted = {key: value for key, value in posted.items() if not key.startswith("routing.escalation_rules.")}

    response = member_client.post(_url(tenant), {**posted, "message": "inline, with a loop"}, follow=True)

    agent = selectors.agent_get(workspace=tenant.workspace, slug=tenant.agent.slug)
    assert agent.current_requirements is not None
    assert (agent.current_requirements.version, agent.current_requirements.message) == (3, "inline, with a loop")
    assert agent.current_requirements.created_by is not None
    assert agent.current_requirements.created_by.username == "mia"
    assert response.redirect_chain == [(f"/w/{tenant.workspace.slug}/agents/{tenant.agent.slug}/", 302)]
    messages = [str(message) for message in response.context["messages"]]
    assert messages[0] == "Saved requirements v3; it is now current."
    assert any(message.startswith("Feasibility error: An inline latency wall") for message in messages)
    assert "inline_latency_with_agentic_tier" in response.content.decode()


def test_the_live_check_returns_findings_and_marks_their_fields(tenant, member_client):
    posted = _posted(**{"constraints.latency.latency_class": ["inline"]})
    posted["routing.enabled_tiers"] = ["single_call", "chain", "agentic", "human"]

    response = member_client.post(_url(tenant, "validate/"), posted, headers={"HX-Request": "true"})

    assert response.status_code == 200
    validation = response.context["validation"]
    assert validation.errors == {}
    assert validation.findings[0].finding.code == "inline_latency_with_agentic_tier"
    # The page's script reads this to mark the inputs the findings point at.
    script = re.search(
        r'<script id="validation-data" type="application/json">(.*?)</script>', response.content.decode()
    )
    assert script is not None
    data = json.loads(script.group(1))
    assert data["errors"] == {}
    assert {"constraints.latency.latency_class", "routing.enabled_tiers"} <= set(data["flagged"])
    assert RequirementsVersion.objects.filter(agent=tenant.agent).count() == 2


def test_the_live_check_returns_field_errors(tenant, member_client):
    response = member_client.post(_url(tenant, "validate/"), _posted(**{"error_surface.actions.0.name": ["Bad Name"]}))

    content = response.content.decode()
    assert response.status_code == 200
    assert list(response.context["validation"].errors) == ["error_surface.actions.0.name"]
    assert 'href="#f-error_surface-actions-0-name"' in content
    assert "1 field to fix" in content


def test_history_diffs_two_versions(tenant, member_client):
    response = member_client.get(_url(tenant, "history/?a=1&b=2"))

    changes = response.context["changes"]
    assert [(c.path, c.kind, c.before, c.after) for c in changes] == [("io_gap.steps_p95", "changed", "5", "6")]
    assert changes[0].label == "I/O gap › steps p95"
    content = response.content.decode()
    assert "Changes from v1 to v2" in content
    assert 'class="kind-changed"' in content


def test_history_diffs_the_latest_change_by_default_and_lists_authors(tenant, member_client):
    response = member_client.get(_url(tenant, "history/"))

    assert (response.context["before"].version, response.context["after"].version) == (1, 2)
    assert [v.created_by.username for v in response.context["versions"]] == ["author", "author"]


def test_history_with_unknown_versions_shows_no_diff(tenant, member_client):
    response = member_client.get(_url(tenant, "history/?a=1&b=9"))

    assert response.status_code == 200
    assert response.context["changes"] is None


@pytest.mark.parametrize("number", ["²", "١"])
def test_history_with_a_version_that_is_a_digit_but_no_number_shows_no_diff(tenant, member_client, number):
    # str.isdigit() takes '²' and the Arabic-Indic '١', which int() refuses: it was a 500.
    response = member_client.get(_url(tenant, f"history/?a={number}&b=2"))

    assert response.status_code == 200
    assert response.context["changes"] is None


def test_a_posted_row_whose_index_is_no_number_is_ignored(tenant, member_client):
    before = db_state()

    response = member_client.post(
        _url(tenant), {**_posted(**{"error_surface.actions.².name": ["refund"]}), "message": "x"}
    )

    assert response.status_code == 302
    assert db_state() != before
    saved = RequirementsVersion.objects.filter(agent=tenant.agent).order_by("-version").first()
    assert saved is not None
    posted = requirements.Requirements.model_validate(requirements_answers()).to_json()
    assert saved.answers["error_surface"]["actions"] == posted["error_surface"]["actions"]


def test_activating_an_old_version_rolls_back(tenant, member_client):
    response = member_client.post(_url(tenant, "1/activate/"), follow=True)

    agent = selectors.agent_get(workspace=tenant.workspace, slug=tenant.agent.slug)
    assert agent.current_requirements is not None
    assert agent.current_requirements.version == 1
    assert RequirementsVersion.objects.filter(agent=agent).count() == 2
    assert "Requirements v1 is current again." in [str(m) for m in response.context["messages"]]


def test_answers_that_leave_no_tier_are_not_saved_and_the_tiers_are_marked(tenant, member_client):
    # They were saved before, and the gateway then served a tier the answers never enabled.
    answers = requirements.Requirements.model_validate(requirements_answers(**NO_TIER_LEFT)).to_json()
    before = db_state()

    response = member_client.post(_url(tenant), {**forms.requirements_form_values(answers), "message": "agentic"})

    assert response.status_code == 422
    assert db_state() == before
    errors = response.context["validation"].errors
    assert sorted(errors) == ["constraints.latency.latency_class", "routing.enabled_tiers"]
    assert errors["routing.enabled_tiers"][0].startswith("no enabled tier can serve a request")
    assert 'data-error-for="routing.enabled_tiers"' in response.content.decode()


def test_activating_a_stored_version_that_leaves_no_tier_explains_and_moves_nothing(tenant, member_client):
    # Stored before the rule (past the service); activating it answered 500 once the service refused it.
    answers = requirements.Requirements.model_validate(requirements_answers(**NO_TIER_LEFT)).to_json()
    stored = RequirementsVersion.objects.create(agent=tenant.agent, version=3, answers=answers)
    before = db_state()

    response = member_client.post(_url(tenant, f"{stored.version}/activate/"), follow=True)

    assert response.status_code == 200
    assert db_state() == before
    shown = [str(m) for m in response.context["messages"]]
    assert len(shown) == 1
    assert shown[0].startswith("Requirements v3 was not made current: invalid requirements: routing.enabled_tiers:")


def test_activating_an_unknown_version_is_404(tenant, member_client):
    before = db_state()

    assert member_client.post(_url(tenant, "7/activate/")).status_code == 404
    assert db_state() == before


def test_the_overview_links_findings_to_their_questions(tenant, member_client):
    agent = AgentFactory.create(workspace=tenant.workspace, slug="risky")
    answers = requirements_answers(**{"constraints.latency.latency_class": "inline"})
    answers["routing"]["enabled_tiers"] = ["single_call", "agentic", "human"]
    from agent_registry import services

    services.requirements_version_create(agent=agent, answers=answers)

    content = member_client.get(f"/w/{tenant.workspace.slug}/agents/risky/").content.decode()

    assert "inline_latency_with_agentic_tier" in content
    assert 'href="/w/acme/agents/risky/requirements/#f-constraints-latency-latency_class"' in content
    assert 'class="badge badge-error"' in content


def test_the_derived_configuration_links_each_value_to_its_answers(tenant, member_client):
    response = member_client.get(f"/w/{tenant.workspace.slug}/agents/{tenant.agent.slug}/configuration/")

    cards = {card.key: card for card in response.context["cards"]}
    assert list(cards) == list(requirements.DerivedConfiguration.model_fields)
    assert [s.anchor for s in cards["trajectory_sampling_rate"].sources] == ["f-constraints-governance"]
    content = response.content.decode()
    assert "25%" in content
    assert 'href="/w/acme/agents/ride-support/requirements/#f-routing-enabled_tiers"' in content


def test_an_agent_without_requirements_shows_empty_states(tenant, member_client):
    AgentFactory.create(workspace=tenant.workspace, slug="fresh")
    ws = tenant.workspace.slug

    overview = member_client.get(f"/w/{ws}/agents/fresh/").content.decode()
    configuration = member_client.get(f"/w/{ws}/agents/fresh/configuration/").content.decode()
    history = member_client.get(f"/w/{ws}/agents/fresh/requirements/history/").content.decode()

    assert "The six questions are not answered yet" in overview
    assert "Nothing to derive yet" in configuration
    assert "No versions yet" in history
