import pytest

from agent_registry import exceptions, selectors
from agent_registry.tests.factories import AgentFactory

pytestmark = pytest.mark.django_db


def test_an_agent_is_found_by_slug_in_its_workspace(workspace, other_workspace):
    mine = AgentFactory.create(workspace=workspace, slug="bot")
    AgentFactory.create(workspace=other_workspace, slug="bot")

    assert selectors.agent_get(workspace=workspace, slug="bot") == mine


def test_another_workspaces_agent_is_not_found(workspace, other_workspace):
    AgentFactory.create(workspace=other_workspace, slug="theirs")

    with pytest.raises(exceptions.AgentNotFound):
        selectors.agent_get(workspace=workspace, slug="theirs")


def test_a_key_limited_to_other_agents_does_not_find_it(workspace):
    allowed = AgentFactory.create(workspace=workspace, slug="allowed")
    AgentFactory.create(workspace=workspace, slug="hidden")

    assert selectors.agent_get(workspace=workspace, slug="allowed", agent_ids={allowed.pk}) == allowed
    with pytest.raises(exceptions.AgentNotFound):
        selectors.agent_get(workspace=workspace, slug="hidden", agent_ids={allowed.pk})
