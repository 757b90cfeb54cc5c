import pytest

from agent_registry import exceptions, selectors
from agent_registry.tests.factories import MembershipFactory, UserFactory

pytestmark = pytest.mark.django_db


def test_a_members_workspace_is_found_and_a_strangers_is_not(workspace, other_workspace):
    user = UserFactory.create()
    membership = MembershipFactory.create(workspace=workspace, user=user)

    assert selectors.membership_get(user=user, workspace_slug="acme") == membership
    assert [m.workspace.slug for m in selectors.membership_list_for_user(user=user)] == ["acme"]
    for slug in ("globex", "nowhere"):
        with pytest.raises(exceptions.WorkspaceNotFound) as raised:
            selectors.membership_get(user=user, workspace_slug=slug)
        assert raised.value.detail == f"no workspace {slug!r}"
