"""Langfuse's prompt endpoints (/api/public/v2/prompts), through the Django test client.

test_langfuse_compat.py drives the same endpoints with the real SDK; these pin the exact shapes."""

import base64

import pytest
from django.test import Client

from agent_registry import services
from agent_registry.models import Prompt, PromptVersion

pytestmark = pytest.mark.django_db


def _basic(raw_key, public_key="pk-lf-test"):
    token = base64.b64encode(f"{public_key}:{raw_key}".encode()).decode()
    return Client(headers={"Authorization": f"Basic {token}"})


@pytest.fixture
def reader(workspace, registry):
    return _basic(services.apikey_create(workspace=workspace, name="sdk", scopes=["read"])[1])


def test_get_returns_langfuses_shape(reader):
    response = reader.get("/api/public/v2/prompts/ride-support%2Fsystem?label=production")

    assert response.status_code == 200
    assert response.json() == {
        "type": "text",
        "name": "ride-support/system",
        "version": 1,
        "prompt": "Hello {{name}}",
        "config": {"model": "small", "temperature": 0},
        "labels": ["production"],
        "tags": [],
        "commitMessage": None,
    }


@pytest.mark.parametrize(
    ("query", "version"), [("", 1), ("?version=2", 2), ("?label=staging", 2), ("?label=latest", 2)]
)
def test_get_by_version_or_label(reader, query, version):
    response = reader.get(f"/api/public/v2/prompts/ride-support/system{query}")

    assert (response.status_code, response.json()["version"]) == (200, version)


def test_get_with_both_label_and_version_is_refused(reader):
    response = reader.get("/api/public/v2/prompts/ride-support/system?label=production&version=1")

    assert response.status_code == 400
    assert response.json() == {"detail": "pass either label or version, not both", "code": "bad_request"}


def test_get_an_unknown_label_is_404(reader):
    response = reader.get("/api/public/v2/prompts/ride-support/system?label=canary")

    assert response.status_code == 404
    assert response.json()["code"] == "label_not_found"


def test_a_bearer_key_works_too(workspace, registry, api_client_for):
    response = api_client_for(workspace, scopes=["read"]).get("/api/public/v2/prompts/billing/intro")

    assert (response.status_code, response.json()["prompt"]) == (200, "Your bill")


@pytest.mark.parametrize(
    "authorization",
    [
        "Basic " + base64.b64encode(b"pk-lf-test:keel_000000000000_wrong").decode(),
        "Basic " + base64.b64encode(b"no-colon-here").decode(),
        "Basic not-base64!",
        "Basic",
    ],
)
def test_a_bad_basic_header_is_401(registry, authorization):
    response = Client(headers={"Authorization": authorization}).get("/api/public/v2/prompts/billing/intro")

    assert response.status_code == 401
    assert response.json()["code"] == "unauthenticated"


def test_create_a_version_of_an_existing_prompt(workspace, registry):
    writer = _basic(services.apikey_create(workspace=workspace, name="sdk", scopes=["read", "write"])[1])

    response = writer.post(
        "/api/public/v2/prompts",
        data={
            "name": "ride-support/system",
            "type": "text",
            "prompt": "v3",
            "config": None,
            "labels": ["production"],
            "tags": None,
            "commitMessage": "from langfuse",
        },
        content_type="application/json",
    )

    assert response.status_code == 201
    assert response.json() == {
        "type": "text",
        "name": "ride-support/system",
        "version": 3,
        "prompt": "v3",
        "config": {},
        "labels": ["production", "latest"],
        "tags": [],
        "commitMessage": "from langfuse",
    }
    assert PromptVersion.objects.get(prompt=registry.system_prompt, version=3).commit_message == "from langfuse"


def test_create_with_tags_sets_the_tags_of_an_existing_prompt(workspace, registry):
    # Langfuse's `tags`: "List of tags to apply to all versions of this prompt"; they were ignored.
    writer = _basic(services.apikey_create(workspace=workspace, name="sdk", scopes=["read", "write"])[1])

    response = writer.post(
        "/api/public/v2/prompts",
        data={"name": "ride-support/system", "type": "text", "prompt": "v3", "labels": [], "tags": ["rides", "v3"]},
        content_type="application/json",
    )

    assert response.status_code == 201
    assert response.json()["tags"] == ["rides", "v3"]
    assert Prompt.objects.get(pk=registry.system_prompt.pk).tags == ["rides", "v3"]


def test_create_with_a_bad_tag_adds_no_version(workspace, registry, registry_state):
    writer = _basic(services.apikey_create(workspace=workspace, name="sdk", scopes=["read", "write"])[1])
    before = registry_state()

    response = writer.post(
        "/api/public/v2/prompts",
        data={"name": "ride-support/system", "type": "text", "prompt": "v3", "labels": [], "tags": ["x" * 65]},
        content_type="application/json",
    )

    assert response.status_code == 422
    assert response.json()["code"] == "prompt_invalid"
    assert registry_state() == before


def test_a_new_prompt_needs_a_key_limited_to_exactly_one_agent(workspace, registry, registry_state):
    unlimited = _basic(services.apikey_create(workspace=workspace, name="all", scopes=["write"])[1])
    two_agents = _basic(
        services.apikey_create(
            workspace=workspace, name="two", scopes=["write"], agents=[registry.support, registry.billing]
        )[1]
    )
    before = registry_state()

    responses = [
        client.post(
            "/api/public/v2/prompts", data={"name": "brand/new", "prompt": "x"}, content_type="application/json"
        )
        for client in (unlimited, two_agents)
    ]

    for response in responses:
        assert response.status_code == 404
        assert response.json() == {
            "detail": "no prompt named 'brand/new'; to create one from a Langfuse client, use a key limited to "
            "exactly one agent (or create it in Keel first)",
            "code": "prompt_not_found",
        }
    assert registry_state() == before


def test_a_key_limited_to_one_agent_creates_a_new_prompt_for_it(workspace, registry):
    writer = _basic(
        services.apikey_create(workspace=workspace, name="one", scopes=["write"], agents=[registry.billing])[1]
    )

    response = writer.post(
        "/api/public/v2/prompts",
        data={"name": "billing/reminder", "prompt": "Pay {{amount}}", "labels": ["production"], "tags": ["dunning"]},
        content_type="application/json",
    )

    assert response.status_code == 201
    assert (response.json()["version"], response.json()["tags"]) == (1, ["dunning"])
    prompt = Prompt.objects.get(name="billing/reminder")
    assert (prompt.workspace, prompt.agent, prompt.tags) == (workspace, registry.billing, ["dunning"])


def test_a_limited_key_cannot_add_a_version_to_another_agents_prompt(workspace, registry, registry_state):
    writer = _basic(
        services.apikey_create(workspace=workspace, name="one", scopes=["write"], agents=[registry.billing])[1]
    )
    before = registry_state()

    response = writer.post(
        "/api/public/v2/prompts",
        data={"name": "ride-support/system", "prompt": "hijacked", "labels": ["production"]},
        content_type="application/json",
    )

    # Names are unique in the workspace, so the name is taken even though this key cannot see the prompt.
    assert response.status_code == 409
    assert response.json()["code"] == "prompt_name_taken"
    assert registry_state() == before
