"""Where a model target may send the gateway's requests (tracing/outbound.py, `for_model_servers`): a model
server on this machine or a closed network is fine, a cloud's metadata service is not, when the target is
saved and again when it is called."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from routing import cache, exceptions, providers, services
from routing.models import ModelTarget
from routing.tests.fakes import FAKE_PROVIDER
from tracing.tests import fake_dns

pytestmark = pytest.mark.django_db

MESSAGES = [{"role": "user", "content": "ping"}]


@pytest.fixture
def dns() -> Iterator[dict[str, list[str]]]:
    fake_dns.HOSTS.clear()
    yield fake_dns.HOSTS
    fake_dns.HOSTS.clear()


@pytest.fixture(autouse=True)
def checked_afresh(monkeypatch) -> None:
    """Each test starts with no API base checked (the process keeps verdicts for 30 s)."""
    monkeypatch.setattr(
        providers, "_api_bases_checked", type(providers._api_bases_checked)(seconds=30, size=16, clock=lambda: 0.0)
    )


@pytest.mark.parametrize(
    "api_base",
    [
        "http://169.254.169.254/latest",
        "http://[fd00:ec2::254]/v1",
        "http://[::ffff:169.254.169.254]/v1",  # the same host, IPv4-mapped
        "http://0xa9fea9fe/v1",  # the same host, as inet_aton reads it
        "http://100.100.100.200/v1",
    ],
)
def test_a_metadata_service_is_refused_when_the_target_is_saved(workspace, api_base):
    with pytest.raises(exceptions.ModelTargetInvalid) as refused:
        services.model_target_create(workspace=workspace, alias="local", model="openai/qwen", api_base=api_base)

    (error,) = refused.value.extra["errors"]
    assert error["field"] == "api_base"
    assert "a cloud metadata address" in error["message"]
    assert "KEEL_OUTBOUND_ALLOWED_HOSTS" in error["message"]
    assert not ModelTarget.objects.exists()


def test_a_name_that_resolves_to_the_metadata_service_is_refused(workspace, dns):
    dns["models.internal"] = ["10.0.0.5", "169.254.169.254"]

    with pytest.raises(exceptions.ModelTargetInvalid) as refused:
        services.model_target_create(
            workspace=workspace, alias="local", model="openai/qwen", api_base="http://models.internal:8000/v1"
        )

    assert "models.internal resolves to 169.254.169.254" in refused.value.extra["errors"][0]["message"]


@pytest.mark.parametrize(
    "api_base", ["http://127.0.0.1:8000/v1", "http://10.0.0.7:11434", "http://localhost:8000/v1", "http://[::1]:8000"]
)
def test_loopback_and_private_model_servers_need_no_permission(workspace, api_base, settings):
    settings.KEEL_OUTBOUND_ALLOW_PRIVATE = False  # the rule for webhooks; model servers have their own

    target = services.model_target_create(workspace=workspace, alias="local", model="openai/qwen", api_base=api_base)

    assert ModelTarget.objects.get(pk=target.pk).api_base == api_base


def test_an_operator_may_name_the_address(workspace, settings):
    settings.KEEL_OUTBOUND_ALLOWED_HOSTS = ["169.254.169.254"]

    target = services.model_target_create(
        workspace=workspace, alias="local", model="openai/qwen", api_base="http://169.254.169.254/v1"
    )

    assert target.api_base == "http://169.254.169.254/v1"


def test_a_target_stored_before_the_rule_is_refused_when_called_and_its_fallback_answers(workspace, fake):
    fallback = ModelTarget.objects.create(workspace=workspace, alias="fast", model=f"{FAKE_PROVIDER}/fast")
    stored = ModelTarget.objects.create(
        workspace=workspace,
        alias="old",
        model=f"{FAKE_PROVIDER}/strong",
        api_base="http://169.254.169.254/latest",
        fallbacks=[fallback.alias],
        max_retries=0,
    )

    completion = providers.completion(target=stored, messages=MESSAGES)

    assert completion.message["content"] == "fast answers: ping"
    assert [call.model for call in fake.received] == ["fast"]  # the refused target was never called
    stored.refresh_from_db()
    assert stored.consecutive_failures == 1
    assert "ApiBaseRefused" in stored.last_error
    assert "169.254.169.254 is a cloud metadata address" in stored.last_error


def test_a_name_rebound_to_the_metadata_service_is_refused_once_the_check_expires(workspace, fake, dns, monkeypatch):
    now = [0.0]
    monkeypatch.setattr(
        providers, "_api_bases_checked", type(providers._api_bases_checked)(seconds=30, size=16, clock=lambda: now[0])
    )
    dns["models.internal"] = ["10.0.0.5"]
    target = services.model_target_create(
        workspace=workspace,
        alias="local",
        model=f"{FAKE_PROVIDER}/fast",
        api_base="http://models.internal:8000/v1",
        max_retries=0,
    )
    assert providers.completion(target=target, messages=MESSAGES).message["content"] == "fast answers: ping"

    dns["models.internal"] = ["169.254.169.254"]
    assert providers.completion(target=target, messages=MESSAGES).message["content"] == "fast answers: ping"
    now[0] = providers.API_BASE_CHECK_SECONDS + 1

    with pytest.raises(providers.ProviderFailed) as failed:
        providers.completion(target=target, messages=MESSAGES)

    assert "models.internal resolves to 169.254.169.254" in str(failed.value)
    assert len(fake.received) == 2


def test_an_embedding_target_at_the_metadata_service_falls_back_to_the_offline_embedder(workspace):
    stored = ModelTarget.objects.create(
        workspace=workspace, alias="embed", model="openai/text-embedding-3-small", api_base="http://169.254.169.254/"
    )

    embedding = cache.request_embed(text="Where is my receipt?", target=stored)

    assert embedding.source == "offline_fallback"
