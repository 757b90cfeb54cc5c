"""The real Langfuse SDK (5.x) against Keel's Langfuse-compatible endpoints, over HTTP to live_server.

No network: every request goes to the test server. The SDK keeps one client per public key, so each
client gets a fresh one; LANGFUSE_* variables are cleared because LANGFUSE_BASE_URL would win over
the base_url argument.
"""

import os
import uuid

import pytest
from django.db import connections
from langfuse import Langfuse
from langfuse.api import AccessDeniedError, NotFoundError, UnauthorizedError

from agent_registry import services
from agent_registry.models import Prompt, PromptLabel, PromptVersion
from agent_registry.tests.factories import AgentFactory, prompt_with_versions

pytestmark = pytest.mark.django_db(transaction=True)

CHAT = [
    {"role": "system", "content": "You help {{product}} riders."},
    {"type": "placeholder", "name": "history"},
    {"role": "user", "content": "{{question}}"},
]
FRESH = {"cache_ttl_seconds": 0, "max_retries": 0}


@pytest.fixture
def langfuse_for(live_server, monkeypatch):
    for name in list(os.environ):
        if name.startswith("LANGFUSE_"):
            monkeypatch.delenv(name)
    # The SDK keeps its HTTP connection alive, and so the server thread that serves it; with persistent
    # database connections that thread would hold one open past the test and block the test database's
    # teardown. Each request closes its database connection instead.
    monkeypatch.setitem(connections.settings["default"], "CONN_MAX_AGE", 0)
    clients = []

    def make(raw_key: str) -> Langfuse:
        client = Langfuse(
            base_url=live_server.url,
            public_key=f"pk-lf-{uuid.uuid4().hex}",
            secret_key=raw_key,
            tracing_enabled=False,
        )
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.shutdown()


@pytest.fixture
def support(workspace):
    agent = AgentFactory.create(workspace=workspace, slug="support")
    prompt_with_versions(
        agent=agent,
        name="ride-support/system",
        templates=["Hello {{name}}", "Hi {{name}}, about {{topic}}?"],
        labels={1: ["production"], 2: ["staging"]},
        config={"model": "small", "temperature": 0},
    )
    prompt_with_versions(
        agent=agent, name="ride-support/chat", type="chat", templates=[CHAT], labels={1: ["production"]}
    )
    return agent


@pytest.fixture
def read_key(workspace):
    return services.apikey_create(workspace=workspace, name="sdk", scopes=["read"])[1]


def test_get_prompt_by_label(support, read_key, langfuse_for):
    prompt = langfuse_for(read_key).get_prompt("ride-support/system", label="production", **FRESH)

    assert type(prompt).__name__ == "TextPromptClient"
    assert (prompt.name, prompt.version, prompt.prompt) == ("ride-support/system", 1, "Hello {{name}}")
    assert prompt.config == {"model": "small", "temperature": 0}
    assert prompt.labels == ["production"]
    assert prompt.compile(name="Ada") == "Hello Ada"


def test_get_prompt_by_version(support, read_key, langfuse_for):
    prompt = langfuse_for(read_key).get_prompt("ride-support/system", version=2, **FRESH)

    assert (prompt.version, prompt.labels) == (2, ["staging", "latest"])
    assert prompt.compile(name="Ada", topic="refunds") == "Hi Ada, about refunds?"


def test_get_prompt_defaults_to_production(support, read_key, langfuse_for):
    client = langfuse_for(read_key)

    prompt = client.get_prompt("ride-support/system", **FRESH)
    staging = client.get_prompt("ride-support/system", label="staging", **FRESH)

    assert prompt.version == 1
    assert staging.version == 2


def test_a_chat_prompt_compiles_variables_and_placeholders(support, read_key, langfuse_for):
    prompt = langfuse_for(read_key).get_prompt("ride-support/chat", type="chat", **FRESH)

    assert type(prompt).__name__ == "ChatPromptClient"
    compiled = prompt.compile(
        product="Ride",
        question="Where is my refund?",
        history=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
    )
    assert compiled == [
        {"role": "system", "content": "You help Ride riders."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Where is my refund?"},
    ]


def test_a_name_with_a_slash_and_a_space(support, read_key, langfuse_for):
    prompt_with_versions(agent=support, name="ride-support/eu west", templates=["EU"], labels={1: ["production"]})

    prompt = langfuse_for(read_key).get_prompt("ride-support/eu west", **FRESH)

    assert (prompt.name, prompt.prompt) == ("ride-support/eu west", "EU")


def test_an_unknown_prompt_raises_not_found(support, read_key, langfuse_for):
    client = langfuse_for(read_key)

    with pytest.raises(NotFoundError):
        client.get_prompt("ride-support/nothing", **FRESH)
    with pytest.raises(NotFoundError):
        client.get_prompt("ride-support/system", label="canary", **FRESH)


def test_another_workspaces_key_does_not_find_the_prompt(support, other_workspace, langfuse_for):
    _, theirs = services.apikey_create(workspace=other_workspace, name="theirs", scopes=["read"])

    with pytest.raises(NotFoundError):
        langfuse_for(theirs).get_prompt("ride-support/system", **FRESH)


def test_a_revoked_key_is_unauthorized(support, workspace, langfuse_for):
    api_key, raw_key = services.apikey_create(workspace=workspace, name="old", scopes=["read"])
    services.apikey_revoke(api_key=api_key)

    with pytest.raises(UnauthorizedError):
        langfuse_for(raw_key).get_prompt("ride-support/system", **FRESH)


def test_create_prompt_adds_a_version_to_an_existing_prompt(support, workspace, langfuse_for):
    _, raw_key = services.apikey_create(workspace=workspace, name="ci", scopes=["read", "write"], agents=[support])
    client = langfuse_for(raw_key)

    created = client.create_prompt(
        name="ride-support/system",
        prompt="Howdy {{name}}",
        labels=["production"],
        config={"model": "large"},
        commit_message="friendlier",
    )

    assert (created.name, created.version, created.prompt, created.labels) == (
        "ride-support/system",
        3,
        "Howdy {{name}}",
        ["production", "latest"],
    )
    version = PromptVersion.objects.get(prompt__name="ride-support/system", version=3)
    assert (version.template, version.config, version.commit_message, version.type) == (
        "Howdy {{name}}",
        {"model": "large"},
        "friendlier",
        "text",
    )
    assert version.created_via_key is not None
    assert PromptLabel.objects.get(prompt__name="ride-support/system", name="production").version == version
    assert client.get_prompt("ride-support/system", **FRESH).version == 3


def test_create_prompt_with_a_key_limited_to_one_agent_creates_the_prompt(support, workspace, langfuse_for):
    _, raw_key = services.apikey_create(workspace=workspace, name="ci", scopes=["read", "write"], agents=[support])
    client = langfuse_for(raw_key)

    created = client.create_prompt(
        name="ride-support/new-chat",
        type="chat",
        prompt=[{"role": "system", "content": "New {{thing}}"}, {"type": "placeholder", "name": "history"}],
        labels=["staging"],
        tags=["sdk"],
    )

    assert (created.name, created.version, created.labels) == ("ride-support/new-chat", 1, ["staging", "latest"])
    prompt = Prompt.objects.get(name="ride-support/new-chat")
    assert (prompt.agent, prompt.workspace, prompt.tags) == (support, workspace, ["sdk"])
    fetched = client.get_prompt("ride-support/new-chat", label="staging", type="chat", **FRESH)
    assert fetched.compile(thing="bot", history=[]) == [{"role": "system", "content": "New bot"}]


def test_create_prompt_needs_the_write_scope(support, read_key, langfuse_for):
    with pytest.raises(AccessDeniedError) as raised:
        langfuse_for(read_key).create_prompt(name="ride-support/system", prompt="nope")

    assert raised.value.status_code == 403
    assert raised.value.body == {"detail": "this API key lacks the 'write' scope", "code": "insufficient_scope"}
    assert PromptVersion.objects.filter(prompt__name="ride-support/system").count() == 2
