import pytest

pytestmark = pytest.mark.django_db


def test_agent_list_is_scoped_to_the_keys_workspace(workspace, other_workspace, api_client_for):
    from agent_registry.tests.factories import AgentFactory

    AgentFactory(workspace=workspace, slug="mine")
    AgentFactory(workspace=other_workspace, slug="theirs")

    response = api_client_for(workspace).get("/api/v1/agents")

    assert response.status_code == 200
    assert [agent["slug"] for agent in response.json()] == ["mine"]
