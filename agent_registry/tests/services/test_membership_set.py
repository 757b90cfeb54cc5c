import pytest

from agent_registry import services
from agent_registry.models import Membership, Role
from agent_registry.tests.factories import MembershipFactory, UserFactory

pytestmark = pytest.mark.django_db


def test_a_new_member_gets_the_role(workspace):
    user = UserFactory.create()

    services.membership_set(workspace=workspace, user=user, role=Role.VIEWER)

    assert list(Membership.objects.values_list("workspace__slug", "user__username", "role")) == [
        ("acme", user.username, Role.VIEWER)
    ]


def test_an_existing_member_changes_role_in_that_workspace_only(workspace, other_workspace):
    user = UserFactory.create()
    MembershipFactory.create(workspace=workspace, user=user, role=Role.VIEWER)
    MembershipFactory.create(workspace=other_workspace, user=user, role=Role.VIEWER)

    services.membership_set(workspace=workspace, user=user, role=Role.OWNER)

    assert sorted(Membership.objects.values_list("workspace__slug", "role")) == [
        ("acme", Role.OWNER),
        ("globex", Role.VIEWER),
    ]
