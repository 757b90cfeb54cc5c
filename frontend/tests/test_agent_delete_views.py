"""Deleting an agent from its settings page, after a confirmation: members may, as write keys may through
the API. Every route's role and tenancy checks are in test_access.py."""

from __future__ import annotations

import pytest

from agent_registry import services
from agent_registry.models import Agent, ApiKey, Prompt
from frontend.tests.conftest import db_state
from tracing.models import Trajectory

pytestmark = pytest.mark.django_db


def _url(tenant, tail="delete/"):
    return f"/w/{tenant.workspace.slug}/agents/{tenant.agent.slug}/{tail}"


def test_the_confirmation_says_what_goes_and_which_keys_are_revoked(tenant, member_client):
    services.apikey_create(workspace=tenant.workspace, name="only-rides", scopes=["read"], agents=[tenant.agent])
    before = db_state()

    response = member_client.get(_url(tenant))

    assert response.status_code == 200
    content = response.content.decode()
    assert "2 requirements versions;" in content
    assert "2 prompts (support/triage, support/welcome)" in content
    assert "1 API key limited to this agent alone (only-rides) is revoked" in content
    assert db_state() == before


def test_deleting_the_agent(tenant, other_tenant, member_client):
    limited, _ = services.apikey_create(workspace=tenant.workspace, name="only", scopes=["read"], agents=[tenant.agent])

    response = member_client.post(_url(tenant))

    assert response.status_code == 302
    assert response["Location"] == f"/w/{tenant.workspace.slug}/agents/"
    assert list(Agent.objects.all()) == [other_tenant.agent]
    assert set(Prompt.objects.values_list("workspace", flat=True)) == {other_tenant.workspace.pk}
    assert ApiKey.objects.get(pk=limited.pk).revoked_at is not None
    # Trajectories stay, without their agent.
    assert Trajectory.objects.get(pk=tenant.trajectory.pk).agent_id is None


def test_the_settings_page_links_to_it_for_members_only(tenant, member_client, viewer_client):
    member_page = member_client.get(_url(tenant, "settings/")).content.decode()
    viewer_page = viewer_client.get(_url(tenant, "settings/")).content.decode()

    assert f'href="{_url(tenant)}"' in member_page
    assert "Delete agent" not in viewer_page
    assert viewer_client.get(_url(tenant)).status_code == 403
