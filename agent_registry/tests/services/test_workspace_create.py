import pytest
from django.core.exceptions import ValidationError

from agent_registry import services
from agent_registry.models import Membership, Role, Workspace
from agent_registry.tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def test_the_creator_owns_the_new_workspace():
    owner = UserFactory.create()

    workspace = services.workspace_create(slug="initech", name="Initech", owner=owner)

    assert Workspace.objects.get(slug="initech") == workspace
    assert list(Membership.objects.values_list("workspace__slug", "user__username", "role")) == [
        ("initech", owner.username, Role.OWNER)
    ]


def test_an_invalid_slug_creates_nothing():
    owner = UserFactory.create()

    with pytest.raises(ValidationError) as raised:
        services.workspace_create(slug="not a slug!", name="Initech", owner=owner)

    assert list(raised.value.message_dict) == ["slug"]
    assert Workspace.objects.count() == 0
    assert Membership.objects.count() == 0
