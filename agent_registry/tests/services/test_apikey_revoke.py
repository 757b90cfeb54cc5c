import pytest
from django.utils import timezone

from agent_registry import services
from agent_registry.models import ApiKey

pytestmark = pytest.mark.django_db


def test_revoking_records_the_time(workspace):
    api_key, _ = services.apikey_create(workspace=workspace, name="k", scopes=["read"])
    other, _ = services.apikey_create(workspace=workspace, name="other", scopes=["read"])
    before = timezone.now()

    revoked = services.apikey_revoke(api_key=api_key)

    assert revoked.revoked_at is not None
    assert revoked.revoked_at >= before
    assert revoked.is_revoked
    assert ApiKey.objects.get(pk=api_key.pk).revoked_at == revoked.revoked_at
    assert ApiKey.objects.get(pk=other.pk).revoked_at is None


def test_revoking_twice_keeps_the_first_time(workspace):
    api_key, _ = services.apikey_create(workspace=workspace, name="k", scopes=["read"])
    first = services.apikey_revoke(api_key=api_key).revoked_at

    again = services.apikey_revoke(api_key=ApiKey.objects.get(pk=api_key.pk))

    assert again.revoked_at == first
