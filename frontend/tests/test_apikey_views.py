"""API keys: the key is shown once, in the response to its creation, and nowhere else."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from agent_registry import services
from agent_registry.models import ApiKey
from frontend.tests.conftest import db_state

pytestmark = pytest.mark.django_db


def test_an_owner_creates_a_key_and_sees_it_once(tenant, owner_client):
    tomorrow = timezone.now().date() + timedelta(days=1)

    response = owner_client.post(
        f"/w/{tenant.workspace.slug}/keys/",
        {"name": "gateway", "scopes": ["gateway", "read"], "agents": [tenant.agent.pk], "expires_on": tomorrow},
    )

    assert response.status_code == 200
    assert response["Cache-Control"] == "no-store"
    raw_key = response.context["raw_key"]
    assert raw_key in response.content.decode()
    assert "It will not be shown again" in response.content.decode()
    api_key = ApiKey.objects.get(workspace=tenant.workspace, name="gateway")
    assert api_key.scopes == ["gateway", "read"]
    assert list(api_key.agents.all()) == [tenant.agent]
    assert api_key.expires_at == datetime.combine(tomorrow + timedelta(days=1), datetime.min.time(), tzinfo=UTC)
    assert api_key.created_by is not None
    assert api_key.created_by.username == "olga"
    assert services.apikey_authenticate(raw_key=raw_key) == api_key
    # Not in the session, and not on any later page.
    assert raw_key not in str(dict(owner_client.session))
    assert raw_key not in owner_client.get(f"/w/{tenant.workspace.slug}/keys/").content.decode()


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"name": "", "scopes": ["ingest"]}, "name"),
        ({"name": "k", "scopes": []}, "scopes"),
        ({"name": "k", "scopes": ["admin"]}, "scopes"),
        ({"name": "k", "scopes": ["ingest"], "expires_on": "2000-01-01"}, "expires_on"),
        # The end of that day is past the last datetime: it was a 500 (OverflowError).
        ({"name": "k", "scopes": ["ingest"], "expires_on": "9999-12-31"}, "expires_on"),
    ],
)
def test_an_invalid_key_is_not_created(tenant, owner_client, data, field):
    before = db_state()

    response = owner_client.post(f"/w/{tenant.workspace.slug}/keys/", data)

    assert response.status_code == 422
    assert field in response.context["form"].errors
    assert db_state() == before


def test_revoking_asks_first_then_revokes(tenant, owner_client):
    url = f"/w/{tenant.workspace.slug}/keys/{tenant.api_key.pk}/revoke/"

    confirmation = owner_client.get(url)
    assert "Revoke ingest?" in confirmation.content.decode()
    assert ApiKey.objects.get(pk=tenant.api_key.pk).revoked_at is None

    response = owner_client.post(url, follow=True)

    assert ApiKey.objects.get(pk=tenant.api_key.pk).revoked_at is not None
    assert response.redirect_chain == [(f"/w/{tenant.workspace.slug}/keys/", 302)]
    assert '<span class="badge badge-revoked">revoked</span>' in response.content.decode()


def test_members_and_viewers_see_the_list_without_secrets(tenant, member_client):
    content = member_client.get(f"/w/{tenant.workspace.slug}/keys/").content.decode()

    assert tenant.api_key.prefix in content
    assert tenant.api_key.key_hash not in content
    assert "Only owners create and revoke keys." in content
