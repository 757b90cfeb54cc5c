from datetime import timedelta

import pytest
from django.db.models import Model
from django.utils import timezone

from agent_registry import selectors, services
from agent_registry.models import ApiKey
from agent_registry.tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def _fields(instance: Model) -> dict[str, object]:
    return {field.attname: getattr(instance, field.attname) for field in type(instance)._meta.concrete_fields}


def test_apikey_live_by_prefix_reads_what_the_orm_reads(workspace, django_assert_num_queries):
    """The statement is written by hand; every field, of the key and of its workspace, must come back as the
    ORM would hydrate it (types included: the scopes list, aware datetimes)."""
    user = UserFactory.create()
    key, _ = services.apikey_create(
        workspace=workspace,
        name="all fields",
        scopes=["ingest", "read"],
        created_by=user,
        expires_at=timezone.now() + timedelta(days=3),
    )
    ApiKey.objects.filter(pk=key.pk).update(last_used_at=timezone.now())
    expected = ApiKey.objects.select_related("workspace").get(pk=key.pk)

    with django_assert_num_queries(1):
        found = selectors.apikey_live_by_prefix(prefix=key.prefix)
        assert found is not None
        assert found.workspace.slug == workspace.slug  # read with the key, as select_related does

    assert _fields(found) == _fields(expected)
    assert _fields(found.workspace) == _fields(expected.workspace)
    assert {name: type(value) for name, value in _fields(found).items()} == {
        name: type(value) for name, value in _fields(expected).items()
    }
    assert found._state.adding is False
    assert found._state.db == "default"


def test_a_revoked_or_unknown_prefix_finds_nothing(workspace):
    key, _ = services.apikey_create(workspace=workspace, name="gone", scopes=["read"])
    ApiKey.objects.filter(pk=key.pk).update(revoked_at=timezone.now())

    assert selectors.apikey_live_by_prefix(prefix=key.prefix) is None
    assert selectors.apikey_live_by_prefix(prefix="kl_nothing") is None
