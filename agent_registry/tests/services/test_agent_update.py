import pytest
from django.core.exceptions import ValidationError

from agent_registry import exceptions, services
from agent_registry.models import Agent, AgentStatus
from agent_registry.tests.factories import AgentFactory

pytestmark = pytest.mark.django_db


def test_name_description_and_status_can_change(workspace):
    agent = AgentFactory.create(workspace=workspace, slug="bot", name="Bot")

    services.agent_update(
        agent=agent, fields={"name": "Support bot", "description": "New.", "status": AgentStatus.ACTIVE}
    )

    stored = Agent.objects.get(pk=agent.pk)
    assert (stored.slug, stored.name, stored.description, stored.status) == (
        "bot",
        "Support bot",
        "New.",
        AgentStatus.ACTIVE,
    )


@pytest.mark.parametrize("field", ["slug", "workspace", "current_requirements"])
def test_other_fields_are_read_only(workspace, other_workspace, field):
    agent = AgentFactory.create(workspace=workspace, slug="bot", name="Bot")
    value = {"slug": "renamed", "workspace": other_workspace, "current_requirements": None}[field]

    with pytest.raises(exceptions.AgentInvalid) as raised:
        services.agent_update(agent=agent, fields={"name": "Changed", field: value})

    assert raised.value.extra == {"errors": [{"field": field, "message": "read-only"}]}
    stored = Agent.objects.get(pk=agent.pk)
    assert (stored.workspace, stored.slug, stored.name) == (workspace, "bot", "Bot")


def test_an_invalid_status_is_not_saved(workspace):
    agent = AgentFactory.create(workspace=workspace, status=AgentStatus.DRAFT)

    with pytest.raises(ValidationError):
        services.agent_update(agent=agent, fields={"status": "sleeping"})

    assert Agent.objects.get(pk=agent.pk).status == AgentStatus.DRAFT
