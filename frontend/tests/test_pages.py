"""The workspace home, the agents list, and the error pages."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from agent_registry import services
from agent_registry.models import Agent, AgentStatus, WorkerHeartbeat
from agent_registry.tests.factories import AgentFactory, requirements_answers
from frontend.tests.conftest import db_state

pytestmark = pytest.mark.django_db


def test_home_without_a_heartbeat_says_so(tenant, member_client):
    content = member_client.get(f"/w/{tenant.workspace.slug}/").content.decode()

    assert "No worker heartbeat yet." in content


def test_home_shows_how_long_ago_the_worker_was_seen(tenant, member_client):
    WorkerHeartbeat.objects.create(hostname="w1", last_seen_at=timezone.now() - timedelta(seconds=12), beats=3)

    response = member_client.get(f"/w/{tenant.workspace.slug}/")

    assert response.context["heartbeat_age"] in (12, 13)
    assert response.context["heartbeat_healthy"] is True
    assert "Worker last seen 1" in response.content.decode()


def test_home_warns_when_the_worker_has_been_quiet(tenant, member_client):
    WorkerHeartbeat.objects.create(hostname="w1", last_seen_at=timezone.now() - timedelta(minutes=5), beats=3)

    response = member_client.get(f"/w/{tenant.workspace.slug}/")

    assert response.context["heartbeat_healthy"] is False
    assert "More than three heartbeats missed" in response.content.decode()


def test_home_summarises_agents_findings_and_deployments(tenant, other_tenant, member_client):
    risky = AgentFactory.create(workspace=tenant.workspace, slug="risky", status=AgentStatus.ACTIVE)
    answers = requirements_answers(**{"constraints.latency.latency_class": "inline"})
    answers["routing"]["enabled_tiers"] = ["single_call", "agentic", "human"]
    services.requirements_version_create(agent=risky, answers=answers)

    response = member_client.get(f"/w/{tenant.workspace.slug}/")

    assert [agent.slug for agent, _ in response.context["agent_findings"]] == ["ride-support", "risky"]
    flagged = dict(response.context["agents_with_findings"])
    assert next(finding.code for finding in flagged[risky]) == "inline_latency_with_agentic_tier"
    assert response.context["error_count"] == 1
    assert response.context["active_count"] == 1
    assert [(m.prompt.name, m.label) for m in response.context["deployments"]] == [("support/triage", "production")]
    assert all(m.prompt.workspace_id == tenant.workspace.pk for m in response.context["deployments"])


def test_a_member_creates_an_agent(tenant, member_client):
    response = member_client.post(
        f"/w/{tenant.workspace.slug}/agents/", {"slug": "refunds", "name": "Refunds", "description": "Refunds."}
    )

    agent = Agent.objects.get(workspace=tenant.workspace, slug="refunds")
    assert response.status_code == 302
    assert response["Location"] == f"/w/{tenant.workspace.slug}/agents/refunds/"
    assert (agent.name, agent.description, agent.status) == ("Refunds", "Refunds.", AgentStatus.DRAFT)
    assert agent.owner is not None
    assert agent.owner.username == "mia"


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        ({"slug": "ride-support", "name": "Again"}, "slug", "already exists in this workspace"),
        ({"slug": "Not A Slug", "name": "x"}, "slug", "Enter a valid “slug”"),
        ({"slug": "fine", "name": ""}, "name", "This field is required."),
    ],
)
def test_an_invalid_agent_is_not_created(tenant, member_client, data, field, message):
    before = db_state()

    response = member_client.post(f"/w/{tenant.workspace.slug}/agents/", data)

    assert response.status_code == 422
    assert db_state() == before
    assert any(message in error for error in response.context["form"].errors[field])


def test_the_agent_slug_of_another_workspace_is_free(tenant, other_tenant, member_client):
    response = member_client.post(f"/w/{tenant.workspace.slug}/agents/", {"slug": "solo", "name": "Solo"})

    assert response.status_code == 302
    assert not Agent.objects.filter(workspace=other_tenant.workspace, slug="solo").exists()


def test_unknown_pages_and_wrong_methods(tenant, member_client):
    assert member_client.get(f"/w/{tenant.workspace.slug}/agents/nobody/").status_code == 404
    assert member_client.get(f"/w/{tenant.workspace.slug}/prompts/999999/").status_code == 404
    assert (
        member_client.get(f"/w/{tenant.workspace.slug}/agents/ride-support/requirements/validate/").status_code == 405
    )
    assert member_client.post(f"/w/{tenant.workspace.slug}/").status_code == 405


def test_the_error_pages_render_without_a_request_context(db):
    from django.template.loader import render_to_string

    assert "Something went wrong" in render_to_string("500.html")
    assert "Page not found" in render_to_string("404.html")


def test_the_error_handlers_render_the_dashboards_pages(tenant):
    from django.test import RequestFactory

    from frontend import views

    request = RequestFactory().get("/nowhere/")
    request.user = tenant.agent.owner

    not_found = views.page_not_found(request, Exception("no such page"))
    server_error = views.server_error(request)

    assert not_found.status_code == 404
    assert b"Page not found" in not_found.content
    assert server_error.status_code == 500
    assert b"Something went wrong" in server_error.content


def test_pages_name_their_icon_so_browsers_do_not_ask_for_a_missing_favicon(tenant, member_client, client):
    from django.contrib.staticfiles import finders

    for response in (member_client.get(f"/w/{tenant.workspace.slug}/"), client.get("/login/")):
        assert '<link rel="icon" href="/static/frontend/favicon.svg' in response.content.decode()
    assert finders.find("frontend/favicon.svg") is not None
