import pytest

from agent_registry import exceptions, services
from agent_registry.models import Agent, AuditAction, AuditEvent, RequirementsVersion
from agent_registry.tests.factories import UserFactory, agent_with_requirements, requirements_answers

pytestmark = pytest.mark.django_db


def test_activating_an_earlier_version_rolls_back_without_rewriting(workspace):
    agent = agent_with_requirements(workspace=workspace)
    first = agent.current_requirements
    assert first is not None
    services.requirements_version_create(agent=agent, answers=requirements_answers(**{"io_gap.steps_p95": 4}))

    services.requirements_version_activate(agent=agent, version=first)

    assert Agent.objects.get(pk=agent.pk).current_requirements == first
    assert agent.current_requirements == first
    assert list(RequirementsVersion.objects.filter(agent=agent).values_list("version", flat=True)) == [2, 1]


def test_a_version_of_another_agent_cannot_be_activated(workspace, other_workspace):
    agent = agent_with_requirements(workspace=workspace)
    current = agent.current_requirements
    foreign = agent_with_requirements(workspace=other_workspace).current_requirements
    assert foreign is not None

    with pytest.raises(exceptions.RequirementsVersionNotFound):
        services.requirements_version_activate(agent=agent, version=foreign)

    assert Agent.objects.get(pk=agent.pk).current_requirements == current


def test_activating_records_who_moved_the_pointer(workspace):
    owner = UserFactory.create()
    agent = agent_with_requirements(workspace=workspace)
    first = agent.current_requirements
    assert first is not None
    services.requirements_version_create(agent=agent, answers=requirements_answers(**{"io_gap.steps_p95": 4}))

    services.requirements_version_activate(agent=agent, version=first, user=owner)
    services.requirements_version_activate(agent=agent, version=first, user=owner)  # already current: no event

    events = AuditEvent.objects.filter(action=AuditAction.REQUIREMENTS_ACTIVATED)
    assert [(event.actor_user, event.target_id, event.details) for event in events] == [
        (owner, str(agent.pk), {"from_version": 2, "to_version": 1})
    ]
