from datetime import timedelta

import pytest
from django.utils import timezone

from agent_registry import services
from agent_registry.models import ApiKey

pytestmark = pytest.mark.django_db


@pytest.fixture
def key(workspace):
    return services.apikey_create(workspace=workspace, name="k", scopes=["read"])


def test_the_key_authenticates_and_brings_its_workspace(key, django_assert_num_queries):
    api_key, raw_key = key

    with django_assert_num_queries(2):  # the lookup, and the first last-used write
        found = services.apikey_authenticate(raw_key=raw_key)

    assert found == api_key
    assert found is not None
    assert found.workspace.slug == "acme"


@pytest.mark.parametrize(
    "mangle",
    [
        pytest.param(lambda raw: raw[:-1] + ("A" if raw[-1] != "A" else "B"), id="wrong secret"),
        pytest.param(lambda raw: "other" + raw[4:], id="wrong product prefix"),
        pytest.param(lambda raw: raw.split("_")[0] + "_" + raw.split("_")[1], id="no secret"),
        pytest.param(lambda raw: "", id="empty"),
        pytest.param(lambda raw: "keel_000000000000_" + raw.split("_", 2)[2], id="unknown prefix"),
    ],
)
def test_a_wrong_key_does_not_authenticate(key, mangle):
    api_key, raw_key = key

    assert services.apikey_authenticate(raw_key=mangle(raw_key)) is None
    api_key.refresh_from_db()
    assert api_key.last_used_at is None


def test_a_revoked_key_does_not_authenticate(key):
    api_key, raw_key = key
    services.apikey_revoke(api_key=api_key)

    assert services.apikey_authenticate(raw_key=raw_key) is None


def test_an_expired_key_does_not_authenticate(workspace):
    api_key, raw_key = services.apikey_create(
        workspace=workspace, name="k", scopes=["read"], expires_at=timezone.now() - timedelta(seconds=1)
    )

    assert services.apikey_authenticate(raw_key=raw_key) is None
    api_key.refresh_from_db()
    assert api_key.last_used_at is None


def test_a_key_that_expires_later_authenticates(workspace):
    api_key, raw_key = services.apikey_create(
        workspace=workspace, name="k", scopes=["read"], expires_at=timezone.now() + timedelta(hours=1)
    )

    assert services.apikey_authenticate(raw_key=raw_key) == api_key


def test_last_use_is_written_at_most_once_a_minute(key, django_assert_num_queries):
    api_key, raw_key = key
    before = timezone.now()
    services.apikey_authenticate(raw_key=raw_key)
    first_use = ApiKey.objects.get(pk=api_key.pk).last_used_at
    assert first_use is not None
    assert first_use >= before

    with django_assert_num_queries(1):  # the lookup only: no write within the minute
        services.apikey_authenticate(raw_key=raw_key)

    assert ApiKey.objects.get(pk=api_key.pk).last_used_at == first_use


def test_last_use_is_written_again_after_a_minute(key):
    api_key, raw_key = key
    long_ago = timezone.now() - timedelta(seconds=61)
    ApiKey.objects.filter(pk=api_key.pk).update(last_used_at=long_ago)

    found = services.apikey_authenticate(raw_key=raw_key)

    stored = ApiKey.objects.get(pk=api_key.pk).last_used_at
    assert found is not None
    assert stored is not None
    assert stored > long_ago + timedelta(seconds=60)
    assert found.last_used_at == stored


def test_use_within_the_minute_is_not_written(key):
    api_key, raw_key = key
    recently = timezone.now() - timedelta(seconds=30)
    ApiKey.objects.filter(pk=api_key.pk).update(last_used_at=recently)

    services.apikey_authenticate(raw_key=raw_key)

    assert ApiKey.objects.get(pk=api_key.pk).last_used_at == recently
