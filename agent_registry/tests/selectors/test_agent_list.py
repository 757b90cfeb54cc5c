from typing import Any

import pytest

from agent_registry import selectors
from agent_registry.models import AgentStatus
from agent_registry.tests.factories import AgentFactory, prompt_with_versions

pytestmark = pytest.mark.django_db


def test_agents_of_the_workspace_by_name_with_their_prompt_count(workspace, other_workspace):
    billing = AgentFactory.create(workspace=workspace, name="Billing")
    AgentFactory.create(workspace=workspace, name="Ads")
    AgentFactory.create(workspace=other_workspace, name="Theirs")
    prompt_with_versions(agent=billing, name="one")
    prompt_with_versions(agent=billing, name="two", templates=["a", "b"])

    # Any: prompt_count is an annotation, unknown to the model's type.
    agents: list[Any] = list(selectors.agent_list(workspace=workspace))

    assert [(agent.name, agent.prompt_count) for agent in agents] == [("Ads", 0), ("Billing", 2)]


def test_filter_by_status_and_by_the_keys_agents(workspace):
    active = AgentFactory.create(workspace=workspace, name="A", status=AgentStatus.ACTIVE)
    AgentFactory.create(workspace=workspace, name="B", status=AgentStatus.ACTIVE)
    draft = AgentFactory.create(workspace=workspace, name="C")

    assert [agent.name for agent in selectors.agent_list(workspace=workspace, status=AgentStatus.ACTIVE)] == [
        "A",
        "B",
    ]
    assert [agent.name for agent in selectors.agent_list(workspace=workspace, agent_ids={active.pk, draft.pk})] == [
        "A",
        "C",
    ]
    assert list(selectors.agent_list(workspace=workspace, agent_ids=set())) == []
