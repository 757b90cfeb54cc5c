import pytest

from agent_registry import exceptions, selectors, services
from agent_registry.tests.factories import AgentFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def keys(workspace, other_workspace):
    support = AgentFactory.create(workspace=workspace, slug="support")
    billing = AgentFactory.create(workspace=workspace, slug="billing")
    services.apikey_create(workspace=other_workspace, name="theirs", scopes=["read"])
    made = {
        "all": services.apikey_create(workspace=workspace, name="all", scopes=["read"])[0],
        "support": services.apikey_create(workspace=workspace, name="support", scopes=["read"], agents=[support])[0],
        "both": services.apikey_create(workspace=workspace, name="both", scopes=["read"], agents=[support, billing])[0],
        "billing": services.apikey_create(workspace=workspace, name="billing", scopes=["read"], agents=[billing])[0],
    }
    services.apikey_revoke(api_key=made["billing"])
    return support, billing, made


def test_a_workspace_lists_its_keys_live_first_newest_first(workspace, keys):
    assert [key.name for key in selectors.apikey_list(workspace=workspace)] == ["both", "support", "all", "billing"]


def test_a_key_limited_to_some_agents_lists_only_keys_within_them(workspace, keys):
    support, billing, _ = keys

    assert [key.name for key in selectors.apikey_list(workspace=workspace, agent_ids={support.pk})] == ["support"]
    assert [key.name for key in selectors.apikey_list(workspace=workspace, agent_ids={support.pk, billing.pk})] == [
        "both",
        "support",
        "billing",
    ]


def test_apikey_get_is_scoped_to_the_workspace_and_the_callers_agents(workspace, other_workspace, keys):
    support, _, made = keys

    assert selectors.apikey_get(workspace=workspace, key_id=made["all"].pk) == made["all"]
    assert (
        selectors.apikey_get(workspace=workspace, key_id=made["support"].pk, agent_ids={support.pk})
        == (made["support"])
    )
    for key_id, agent_ids in [(made["all"].pk, {support.pk}), (made["both"].pk, {support.pk})]:
        with pytest.raises(exceptions.ApiKeyNotFound):
            selectors.apikey_get(workspace=workspace, key_id=key_id, agent_ids=agent_ids)
    with pytest.raises(exceptions.ApiKeyNotFound):
        selectors.apikey_get(workspace=other_workspace, key_id=made["all"].pk)


def test_apikey_agent_ids(workspace, keys):
    support, billing, made = keys

    assert selectors.apikey_agent_ids(api_key=made["all"]) is None
    assert selectors.apikey_agent_ids(api_key=made["both"]) == frozenset({support.pk, billing.pk})
