import pytest

from agent_registry import exceptions, requirements, selectors
from agent_registry.tests.factories import AgentFactory, agent_with_requirements, requirements_answers

pytestmark = pytest.mark.django_db


def test_the_current_answers_parsed(workspace):
    agent = agent_with_requirements(workspace=workspace)

    assert selectors.requirements_current(agent=agent) == requirements.Requirements.model_validate(
        requirements_answers()
    )


def test_none_before_the_first_save(workspace):
    assert selectors.requirements_current(agent=AgentFactory.create(workspace=workspace)) is None


def test_a_version_by_number(workspace):
    agent = agent_with_requirements(workspace=workspace)

    assert selectors.requirements_version_get(agent=agent, version=1) == agent.current_requirements
    with pytest.raises(exceptions.RequirementsVersionNotFound):
        selectors.requirements_version_get(agent=agent, version=2)
