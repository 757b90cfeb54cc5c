import pytest
from django.core.exceptions import ValidationError

from agent_registry import exceptions, services
from agent_registry.models import Agent, AgentStatus
from agent_registry.tests.factories import AgentFactory, UserFactory

pytestmark = pytest.mark.django_db


def test_an_agent_is_created_as_a_draft(workspace):
    owner = UserFactory.create()

    agent = services.agent_create(
        workspace=workspace, slug="ride-support", name="Ride support", description="Helps riders.", owner=owner
    )

    stored = Agent.objects.get()
    assert stored == agent
    assert (stored.workspace, stored.slug, stored.name, stored.description, stored.owner, stored.status) == (
        workspace,
        "ride-support",
        "Ride support",
        "Helps riders.",
        owner,
        AgentStatus.DRAFT,
    )
    assert stored.current_requirements is None


def test_a_slug_is_unique_within_a_workspace(workspace):
    AgentFactory.create(workspace=workspace, slug="ride-support", name="First")

    with pytest.raises(exceptions.AgentSlugTaken):
        services.agent_create(workspace=workspace, slug="ride-support", name="Second")

    assert list(Agent.objects.values_list("name", flat=True)) == ["First"]


def test_the_same_slug_may_exist_in_another_workspace(workspace, other_workspace):
    AgentFactory.create(workspace=other_workspace, slug="ride-support")

    services.agent_create(workspace=workspace, slug="ride-support", name="Ride support")

    assert sorted(Agent.objects.values_list("workspace__slug", "slug")) == [
        ("acme", "ride-support"),
        ("globex", "ride-support"),
    ]


@pytest.mark.parametrize(
    ("fields", "invalid"),
    [({"slug": "not a slug"}, "slug"), ({"status": "sleeping"}, "status"), ({"name": ""}, "name")],
)
def test_invalid_fields_create_nothing(workspace, fields, invalid):
    with pytest.raises(ValidationError) as raised:
        services.agent_create(workspace=workspace, **{"slug": "ok", "name": "OK", **fields})

    assert list(raised.value.message_dict) == [invalid]
    assert Agent.objects.count() == 0
