"""The key endpoints: a key can list, create and revoke keys with no more power than its own."""

from datetime import UTC, datetime

import pytest

from agent_registry import services
from agent_registry.models import ApiKey

pytestmark = pytest.mark.django_db

KEY_KEYS = ["id", "name", "prefix", "scopes", "agents", "created_at", "last_used_at", "expires_at", "revoked_at"]


def test_key_list(workspace, other_workspace, registry, api_client_for):
    services.apikey_create(workspace=workspace, name="support only", scopes=["read"], agents=[registry.support])
    services.apikey_create(workspace=other_workspace, name="theirs", scopes=["read"])
    client = api_client_for(workspace, scopes=["read"])

    response = client.get("/api/v1/keys")

    assert response.status_code == 200
    body = response.json()
    assert [list(key) for key in body] == [KEY_KEYS] * 2
    assert sorted((key["name"], tuple(key["scopes"]), tuple(key["agents"])) for key in body) == [
        ("support only", ("read",), ("support",)),
        ("test key", ("read",), ()),
    ]
    assert all(key["prefix"].startswith("keel_") and "key" not in key for key in body)


def test_a_limited_key_lists_only_keys_within_its_agents(workspace, registry, api_client_for):
    services.apikey_create(workspace=workspace, name="billing only", scopes=["read"], agents=[registry.billing])
    services.apikey_create(
        workspace=workspace, name="both", scopes=["read"], agents=[registry.billing, registry.support]
    )
    client = api_client_for(workspace, scopes=["read"], agents=[registry.support])

    response = client.get("/api/v1/keys")

    assert [(key["name"], key["agents"]) for key in response.json()] == [("test key", ["support"])]


def test_key_create(workspace, registry, api_client_for):
    client = api_client_for(workspace)

    response = client.post(
        "/api/v1/keys",
        data={
            "name": "ci",
            "scopes": ["read", "write", "read"],
            "agents": ["support"],
            "expires_at": "2030-01-01T00:00:00Z",
        },
        content_type="application/json",
    )

    assert response.status_code == 201
    body = response.json()
    assert list(body) == [*KEY_KEYS, "key"]
    assert {key: body[key] for key in ("name", "scopes", "agents", "expires_at", "revoked_at", "last_used_at")} == {
        "name": "ci",
        "scopes": ["read", "write"],
        "agents": ["support"],
        "expires_at": "2030-01-01T00:00:00Z",
        "revoked_at": None,
        "last_used_at": None,
    }
    created = ApiKey.objects.get(name="ci")
    assert (body["id"], body["prefix"]) == (created.pk, created.prefix)
    assert created.expires_at == datetime(2030, 1, 1, tzinfo=UTC)
    assert services.apikey_authenticate(raw_key=body["key"]) == created
    assert list(created.agents.all()) == [registry.support]


def test_a_key_cannot_grant_scopes_it_lacks(workspace, registry, api_client_for, registry_state):
    client = api_client_for(workspace, scopes=["read", "write"])
    before = registry_state()

    response = client.post(
        "/api/v1/keys", data={"name": "root", "scopes": ["read", "ingest", "gateway"]}, content_type="application/json"
    )

    assert response.status_code == 403
    assert response.json() == {
        "detail": "a key cannot grant scopes it lacks: gateway, ingest",
        "code": "permission_denied",
        "errors": [{"field": "scopes", "message": "exceeds the calling key"}],
    }
    assert registry_state() == before


def test_a_limited_key_must_limit_the_keys_it_creates(workspace, registry, api_client_for, registry_state):
    client = api_client_for(workspace, agents=[registry.support])
    before = registry_state()

    widened = client.post("/api/v1/keys", data={"name": "all", "scopes": ["read"]}, content_type="application/json")
    elsewhere = client.post(
        "/api/v1/keys", data={"name": "b", "scopes": ["read"], "agents": ["billing"]}, content_type="application/json"
    )

    assert widened.status_code == 403
    assert widened.json() == {
        "detail": "a key limited to some agents can only create keys limited to them",
        "code": "permission_denied",
        "errors": [{"field": "agents", "message": "required"}],
    }
    assert elsewhere.status_code == 404
    assert elsewhere.json()["code"] == "agent_not_found"
    assert registry_state() == before


def test_a_limited_key_creates_a_key_for_its_agent(workspace, registry, api_client_for):
    client = api_client_for(workspace, agents=[registry.support])

    response = client.post(
        "/api/v1/keys", data={"name": "sub", "scopes": ["read"], "agents": ["support"]}, content_type="application/json"
    )

    assert response.status_code == 201
    assert list(ApiKey.objects.get(name="sub").agents.all()) == [registry.support]


def test_an_unknown_scope_is_422(workspace, registry, api_client_for, registry_state):
    client = api_client_for(workspace)
    before = registry_state()

    response = client.post(
        "/api/v1/keys", data={"name": "k", "scopes": ["read", "admin"]}, content_type="application/json"
    )

    assert response.status_code == 422
    assert response.json()["errors"] == [
        {"field": "scopes.1", "message": "Input should be 'ingest', 'gateway', 'read', 'write' or 'train'"}
    ]
    assert registry_state() == before


def test_key_revoke(workspace, registry, api_client_for):
    victim, raw_victim = services.apikey_create(workspace=workspace, name="victim", scopes=["read"])
    client = api_client_for(workspace)

    response = client.delete(f"/api/v1/keys/{victim.pk}")

    assert response.status_code == 200
    assert (response.json()["id"], response.json()["name"]) == (victim.pk, "victim")
    assert response.json()["revoked_at"] is not None
    assert ApiKey.objects.get(pk=victim.pk).revoked_at is not None
    assert services.apikey_authenticate(raw_key=raw_victim) is None


def test_a_key_can_revoke_itself(workspace, registry, api_client_for):
    client = api_client_for(workspace)
    own = ApiKey.objects.get(name="test key")

    assert client.delete(f"/api/v1/keys/{own.pk}").status_code == 200
    assert client.get("/api/v1/workspace").status_code == 401


def test_another_workspaces_key_cannot_be_revoked(workspace, other_workspace, registry, api_client_for):
    theirs, _ = services.apikey_create(workspace=other_workspace, name="theirs", scopes=["read"])
    client = api_client_for(workspace)

    response = client.delete(f"/api/v1/keys/{theirs.pk}")

    assert response.status_code == 404
    assert response.json() == {"detail": f"no API key {theirs.pk}", "code": "api_key_not_found"}
    assert ApiKey.objects.get(pk=theirs.pk).revoked_at is None


def test_a_limited_key_cannot_revoke_a_wider_key(workspace, registry, api_client_for):
    everything, _ = services.apikey_create(workspace=workspace, name="admin", scopes=["read", "write"])
    both, _ = services.apikey_create(
        workspace=workspace, name="both", scopes=["read"], agents=[registry.support, registry.billing]
    )
    client = api_client_for(workspace, agents=[registry.support])

    responses = [client.delete(f"/api/v1/keys/{key.pk}") for key in (everything, both)]

    assert [(response.status_code, response.json()["code"]) for response in responses] == [
        (404, "api_key_not_found"),
        (404, "api_key_not_found"),
    ]
    assert list(ApiKey.objects.filter(revoked_at__isnull=False)) == []


def test_a_key_cannot_revoke_a_key_with_scopes_it_lacks(workspace, registry, api_client_for):
    trainer, _ = services.apikey_create(workspace=workspace, name="gpu worker", scopes=["train"])
    wider, _ = services.apikey_create(workspace=workspace, name="wider", scopes=["read", "write", "gateway"])
    narrower, _ = services.apikey_create(workspace=workspace, name="narrower", scopes=["read"])
    client = api_client_for(workspace, scopes=["read", "write"])

    refused = [client.delete(f"/api/v1/keys/{key.pk}") for key in (trainer, wider)]
    allowed = client.delete(f"/api/v1/keys/{narrower.pk}")

    assert [(response.status_code, response.json()["detail"]) for response in refused] == [
        (403, "a key cannot revoke a key with scopes it lacks: train"),
        (403, "a key cannot revoke a key with scopes it lacks: gateway"),
    ]
    assert allowed.status_code == 200
    assert list(ApiKey.objects.filter(revoked_at__isnull=False)) == [narrower]


def test_an_expiring_key_cannot_create_a_key_that_outlives_it(workspace, registry, registry_state):
    from datetime import timedelta

    from django.test import Client
    from django.utils import timezone

    expires = timezone.now() + timedelta(days=1)
    _, raw_key = services.apikey_create(workspace=workspace, name="temp", scopes=["read", "write"], expires_at=expires)
    client = Client(headers={"Authorization": f"Bearer {raw_key}"})
    before = registry_state()

    forever = client.post("/api/v1/keys", data={"name": "forever", "scopes": ["read"]}, content_type="application/json")
    later = client.post(
        "/api/v1/keys",
        data={"name": "later", "scopes": ["read"], "expires_at": (expires + timedelta(days=1)).isoformat()},
        content_type="application/json",
    )
    assert (forever.status_code, later.status_code) == (403, 403)
    assert forever.json()["errors"] == [{"field": "expires_at", "message": "exceeds the calling key"}]
    assert registry_state() == before

    sooner = client.post(
        "/api/v1/keys",
        data={"name": "sooner", "scopes": ["read"], "expires_at": (expires - timedelta(hours=1)).isoformat()},
        content_type="application/json",
    )
    assert sooner.status_code == 201


def test_a_key_that_would_expire_in_the_past_is_422_and_not_created(
    workspace, registry, api_client_for, registry_state
):
    # It was created (201) and shown once, and never worked.
    from datetime import timedelta

    from django.utils import timezone

    client = api_client_for(workspace)
    before = registry_state()

    response = client.post(
        "/api/v1/keys",
        data={"name": "dead", "scopes": ["read"], "expires_at": (timezone.now() - timedelta(days=1)).isoformat()},
        content_type="application/json",
    )

    assert response.status_code == 422
    assert response.json()["errors"] == [{"field": "expires_at", "message": "in the past"}]
    assert registry_state() == before


def test_an_expiry_without_a_time_zone_is_422_and_creates_no_key(workspace, registry, api_client_for, registry_state):
    # A naive time cannot be compared with now: it answered 500 before.
    client = api_client_for(workspace)
    before = registry_state()

    response = client.post(
        "/api/v1/keys",
        data={"name": "naive", "scopes": ["read"], "expires_at": "2030-01-01T00:00:00"},
        content_type="application/json",
    )

    assert response.status_code == 422
    assert response.json()["code"] == "validation_error"
    assert [error["field"] for error in response.json()["errors"]] == ["expires_at"]
    assert registry_state() == before
