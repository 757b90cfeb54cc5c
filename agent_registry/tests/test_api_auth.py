"""Authentication, scopes and request parsing, for every endpoint of agent_registry/api.py."""

import base64
import json
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from agent_registry import services
from agent_registry.tests.factories import requirements_answers

pytestmark = pytest.mark.django_db

READ_ENDPOINTS = [
    ("GET", "/api/v1/workspace", None),
    ("GET", "/api/v1/agents", None),
    ("GET", "/api/v1/agents/support", None),
    ("GET", "/api/v1/requirements/schema", None),
    ("POST", "/api/v1/requirements/check", {"answers": requirements_answers()}),
    ("GET", "/api/v1/agents/support/requirements", None),
    ("GET", "/api/v1/agents/support/requirements/current", None),
    ("GET", "/api/v1/agents/support/requirements/diff?from_version=1&to_version=2", None),
    ("GET", "/api/v1/agents/support/requirements/1", None),
    ("GET", "/api/v1/agents/support/feasibility", None),
    ("GET", "/api/v1/agents/support/configuration", None),
    ("GET", "/api/v1/prompts", None),
    ("GET", "/api/v1/prompts/ride-support/system", None),
    ("GET", "/api/v1/prompts/ride-support/system/versions", None),
    ("GET", "/api/v1/prompts/ride-support/system/versions/1", None),
    ("GET", "/api/v1/prompts/ride-support/system/labels", None),
    ("GET", "/api/v1/prompts/ride-support/system/diff?from_version=1&to_version=2", None),
    ("POST", "/api/v1/prompts/ride-support/system/render", {"variables": {"name": "Ada"}}),
    ("GET", "/api/v1/keys", None),
    ("GET", "/api/public/v2/prompts/ride-support%2Fsystem", None),
]
WRITE_ENDPOINTS = [
    ("POST", "/api/v1/agents", {"slug": "new", "name": "New"}),
    ("PATCH", "/api/v1/agents/support", {"name": "Renamed"}),
    ("DELETE", "/api/v1/agents/support", None),
    ("POST", "/api/v1/agents/support/requirements", {"answers": requirements_answers()}),
    ("POST", "/api/v1/agents/support/requirements/1/activate", None),
    ("POST", "/api/v1/prompts", {"agent": "support", "name": "new", "template": "t"}),
    ("PATCH", "/api/v1/prompts/ride-support/system", {"description": "changed", "tags": ["x"]}),
    ("DELETE", "/api/v1/prompts/billing/intro", None),
    ("POST", "/api/v1/prompts/ride-support/system/versions", {"template": "v3"}),
    ("PUT", "/api/v1/prompts/ride-support/system/versions/1", {"template": "edited"}),
    ("PATCH", "/api/v1/prompts/ride-support/system/versions/1", {"template": "edited"}),
    ("DELETE", "/api/v1/prompts/ride-support/system/versions/1", None),
    ("PUT", "/api/v1/prompts/ride-support/system/labels/production", {"version": 2}),
    ("DELETE", "/api/v1/prompts/ride-support/system/labels/staging", None),
    ("POST", "/api/v1/keys", {"name": "new", "scopes": ["read"]}),
    ("DELETE", "/api/v1/keys/{victim}", None),
    ("POST", "/api/public/v2/prompts", {"name": "ride-support/system", "prompt": "v3"}),
]
ALL_ENDPOINTS = READ_ENDPOINTS + WRITE_ENDPOINTS


def _ids(endpoints):
    return [f"{method} {path}" for method, path, _ in endpoints]


@pytest.fixture
def victim(workspace, registry):
    """A key that the key endpoints could revoke."""
    api_key, _ = services.apikey_create(workspace=workspace, name="victim", scopes=["read"])
    return api_key


def call(client, method, path, body=None, victim=None):
    if victim is not None:
        path = path.replace("{victim}", str(victim.pk))
    return client.generic(
        method, path, data=json.dumps(body) if body is not None else "", content_type="application/json"
    )


UNAUTHENTICATED = {"detail": "a valid API key is required: Authorization: Bearer <key>", "code": "unauthenticated"}


@pytest.mark.parametrize(("method", "path", "body"), ALL_ENDPOINTS, ids=_ids(ALL_ENDPOINTS))
def test_no_key_is_401_and_changes_nothing(registry_state, victim, method, path, body):
    before = registry_state()

    response = call(Client(), method, path, body, victim)

    assert response.status_code == 401
    assert response.json() == UNAUTHENTICATED
    assert response.headers["WWW-Authenticate"] == 'Bearer realm="keel"'
    assert registry_state() == before


@pytest.mark.parametrize(
    "authorization",
    [
        "Bearer keel_000000000000_not-a-real-key",
        "Bearer not-even-shaped-like-a-key",
        "Bearer ",
        "Token something",
    ],
)
@pytest.mark.parametrize(("method", "path", "body"), ALL_ENDPOINTS, ids=_ids(ALL_ENDPOINTS))
def test_a_bad_key_is_401_and_changes_nothing(registry_state, victim, authorization, method, path, body):
    before = registry_state()

    response = call(Client(headers={"Authorization": authorization}), method, path, body, victim)

    assert (response.status_code, response.json()) == (401, UNAUTHENTICATED)
    assert registry_state() == before


def _client(raw_key):
    return Client(headers={"Authorization": f"Bearer {raw_key}"})


@pytest.mark.parametrize(("method", "path", "body"), ALL_ENDPOINTS, ids=_ids(ALL_ENDPOINTS))
def test_a_revoked_key_is_401_and_changes_nothing(workspace, registry_state, victim, method, path, body):
    api_key, raw_key = services.apikey_create(workspace=workspace, name="gone", scopes=["read", "write"])
    services.apikey_revoke(api_key=api_key)
    before = registry_state()

    response = call(_client(raw_key), method, path, body, victim)

    assert (response.status_code, response.json()) == (401, UNAUTHENTICATED)
    assert registry_state() == before


@pytest.mark.parametrize(("method", "path", "body"), ALL_ENDPOINTS, ids=_ids(ALL_ENDPOINTS))
def test_an_expired_key_is_401_and_changes_nothing(workspace, registry_state, victim, method, path, body):
    _, raw_key = services.apikey_create(
        workspace=workspace, name="old", scopes=["read", "write"], expires_at=timezone.now() - timedelta(minutes=1)
    )
    before = registry_state()

    response = call(_client(raw_key), method, path, body, victim)

    assert (response.status_code, response.json()) == (401, UNAUTHENTICATED)
    assert registry_state() == before


@pytest.mark.parametrize(("method", "path", "body"), WRITE_ENDPOINTS, ids=_ids(WRITE_ENDPOINTS))
def test_a_read_key_on_a_write_endpoint_is_403_and_changes_nothing(
    workspace, api_client_for, registry_state, victim, method, path, body
):
    client = api_client_for(workspace, scopes=["read", "ingest", "gateway"])
    before = registry_state()

    response = call(client, method, path, body, victim)

    assert response.status_code == 403
    assert response.json() == {"detail": "this API key lacks the 'write' scope", "code": "insufficient_scope"}
    assert registry_state() == before


@pytest.mark.parametrize(("method", "path", "body"), READ_ENDPOINTS, ids=_ids(READ_ENDPOINTS))
def test_a_key_without_read_scope_cannot_read(workspace, api_client_for, victim, method, path, body):
    client = api_client_for(workspace, scopes=["ingest", "write"])

    response = call(client, method, path, body, victim)

    assert response.status_code == 403
    assert response.json() == {"detail": "this API key lacks the 'read' scope", "code": "insufficient_scope"}


def test_the_registry_api_takes_bearer_keys_only(workspace, registry):
    _, raw_key = services.apikey_create(workspace=workspace, name="k", scopes=["read"])
    basic = base64.b64encode(f"pk-lf-anything:{raw_key}".encode()).decode()

    assert _client(raw_key).get("/api/v1/workspace").status_code == 200
    assert Client(headers={"Authorization": f"Basic {basic}"}).get("/api/v1/workspace").status_code == 401


def test_a_good_key_records_its_last_use(workspace, registry):
    api_key, raw_key = services.apikey_create(workspace=workspace, name="k", scopes=["read"])

    _client(raw_key).get("/api/v1/workspace")

    api_key.refresh_from_db()
    assert api_key.last_used_at is not None


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/api/v1/agents"),
        ("PATCH", "/api/v1/agents/support"),
        ("POST", "/api/v1/agents/support/requirements"),
        ("POST", "/api/v1/prompts"),
        ("PATCH", "/api/v1/prompts/ride-support/system"),
        ("PUT", "/api/v1/prompts/ride-support/system/labels/production"),
        ("POST", "/api/v1/keys"),
        ("POST", "/api/public/v2/prompts"),
    ],
)
def test_a_malformed_json_body_is_400_and_changes_nothing(
    workspace, api_client_for, registry, registry_state, method, path
):
    client = api_client_for(workspace)
    before = registry_state()

    response = client.generic(method, path, data='{"name": "unterminated', content_type="application/json")

    assert response.status_code == 400
    assert response.json() == {
        "detail": "the body is not valid JSON: unexpected end of data: line 1 column 23 (char 22)",
        "code": "invalid_json",
    }
    assert registry_state() == before


def test_a_body_of_the_wrong_shape_is_422_naming_the_fields(workspace, api_client_for, registry, registry_state):
    client = api_client_for(workspace)
    before = registry_state()

    response = client.post("/api/v1/agents", data={"slug": "Bad Slug", "name": ""}, content_type="application/json")

    assert response.status_code == 422
    assert response.json() == {
        "detail": "invalid request: slug: String should match pattern '^[a-z0-9][a-z0-9\\-]{0,63}$'; "
        "name: String should have at least 1 character",
        "code": "validation_error",
        "errors": [
            {"field": "slug", "message": "String should match pattern '^[a-z0-9][a-z0-9\\-]{0,63}$'"},
            {"field": "name", "message": "String should have at least 1 character"},
        ],
    }
    assert registry_state() == before


def test_the_openapi_document_lists_every_path(db):
    response = Client().get("/api/v1/openapi.json")

    assert response.status_code == 200
    document = response.json()
    assert document["info"]["title"] == "Keel API"
    # Other apps add their routers to the same API; the registry's operations carry its tag.
    registry_paths = [
        path
        for path, operations in document["paths"].items()
        if any("registry" in operation["tags"] for operation in operations.values())
    ]
    assert sorted(registry_paths) == [
        "/api/v1/agents",
        "/api/v1/agents/{slug}",
        "/api/v1/agents/{slug}/configuration",
        "/api/v1/agents/{slug}/feasibility",
        "/api/v1/agents/{slug}/requirements",
        "/api/v1/agents/{slug}/requirements/current",
        "/api/v1/agents/{slug}/requirements/diff",
        "/api/v1/agents/{slug}/requirements/{version}",
        "/api/v1/agents/{slug}/requirements/{version}/activate",
        "/api/v1/audit-events",
        "/api/v1/keys",
        "/api/v1/keys/{key_id}",
        "/api/v1/prompts",
        "/api/v1/prompts/{name}",
        "/api/v1/prompts/{name}/diff",
        "/api/v1/prompts/{name}/labels",
        "/api/v1/prompts/{name}/labels/{label}",
        "/api/v1/prompts/{name}/render",
        "/api/v1/prompts/{name}/versions",
        "/api/v1/prompts/{name}/versions/{version}",
        "/api/v1/requirements/check",
        "/api/v1/requirements/schema",
        "/api/v1/workspace",
    ]
    assert sorted(document["paths"]["/api/v1/prompts/{name}/versions/{version}"]) == [
        "delete",
        "get",
        "patch",
        "put",
    ]
    assert sorted(document["paths"]["/api/v1/prompts/{name}"]) == ["delete", "get", "patch"]
    assert document["components"]["securitySchemes"]["ApiKeyBearer"] == {"type": "http", "scheme": "bearer"}
