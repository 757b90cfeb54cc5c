import hashlib

import pytest

from agent_registry import exceptions, services
from agent_registry.models import ApiKey
from agent_registry.tests.factories import AgentFactory, UserFactory

pytestmark = pytest.mark.django_db


def test_the_key_is_returned_once_and_only_its_hash_is_stored(workspace):
    user = UserFactory.create()

    api_key, raw_key = services.apikey_create(
        workspace=workspace, name="  ingest  ", scopes=["read", "ingest", "read"], created_by=user
    )

    stored = ApiKey.objects.get()
    assert stored == api_key
    assert raw_key.startswith(f"{stored.prefix}_")
    assert stored.prefix.startswith("keel_")
    assert len(stored.prefix) == len("keel_") + 12
    assert stored.key_hash == hashlib.sha256(raw_key.encode()).hexdigest()
    assert raw_key not in {stored.key_hash, stored.prefix, stored.name}
    assert stored.name == "ingest"
    assert stored.scopes == ["ingest", "read"]
    assert stored.created_by == user
    assert list(stored.agents.all()) == []
    assert (stored.last_used_at, stored.expires_at, stored.revoked_at) == (None, None, None)


def test_two_keys_differ(workspace):
    _, first = services.apikey_create(workspace=workspace, name="a", scopes=["read"])
    _, second = services.apikey_create(workspace=workspace, name="b", scopes=["read"])

    assert first != second
    assert ApiKey.objects.values("prefix").distinct().count() == 2


def test_a_key_can_be_limited_to_agents_of_its_workspace(workspace):
    support, billing = AgentFactory.create(workspace=workspace), AgentFactory.create(workspace=workspace)
    AgentFactory.create(workspace=workspace)

    api_key, _ = services.apikey_create(workspace=workspace, name="k", scopes=["read"], agents=[support, billing])

    assert set(api_key.agents.all()) == {support, billing}


def test_a_key_cannot_be_limited_to_an_agent_of_another_workspace(workspace, other_workspace):
    mine = AgentFactory.create(workspace=workspace)
    theirs = AgentFactory.create(workspace=other_workspace)

    with pytest.raises(exceptions.AgentNotFound):
        services.apikey_create(workspace=workspace, name="k", scopes=["read"], agents=[mine, theirs])

    assert ApiKey.objects.count() == 0


@pytest.mark.parametrize(
    ("scopes", "message"),
    [(["read", "admin", "root"], "unknown: admin, root"), ([], "empty")],
)
def test_scopes_must_be_known_and_not_empty(workspace, scopes, message):
    with pytest.raises(exceptions.ApiKeyInvalid) as raised:
        services.apikey_create(workspace=workspace, name="k", scopes=scopes)

    assert raised.value.body() == {
        "detail": "scopes must be a non-empty subset of ingest, gateway, read, write, train",
        "code": "api_key_invalid",
        "errors": [{"field": "scopes", "message": message}],
    }
    assert ApiKey.objects.count() == 0


def test_a_key_needs_a_name(workspace):
    with pytest.raises(exceptions.ApiKeyInvalid) as raised:
        services.apikey_create(workspace=workspace, name="   ", scopes=["read"])

    assert raised.value.extra == {"errors": [{"field": "name", "message": "required"}]}
    assert ApiKey.objects.count() == 0
