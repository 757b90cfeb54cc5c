"""The settings pages: an agent's settings (retention included), and the workspace's integrations: the
Langfuse mirror, whose secret key never leaves the server, and model price overrides. Every route's
role and tenancy checks are also in test_access.py."""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from agent_registry import services
from agent_registry.models import Agent, AuditEvent
from config import crypto
from frontend.tests.conftest import TENANT_LANGFUSE_SECRET, db_state
from tracing import langfuse_bridge
from tracing import services as tracing_services
from tracing.models import ExportStatus, LangfuseExport, LangfuseMirror, ModelPriceOverride

pytestmark = pytest.mark.django_db

NEW_SECRET = "sk-lf-do-not-show-me"


def _settings_url(tenant) -> str:
    return f"/w/{tenant.workspace.slug}/agents/{tenant.agent.slug}/settings/"


def _integrations_url(tenant) -> str:
    return f"/w/{tenant.workspace.slug}/integrations/"


def _agent_data(**changes: str) -> dict[str, str]:
    return {"name": "Ride support", "description": "", "status": "active", "trace_retention_days": "", **changes}


# --- Agent settings -----------------------------------------------------------------------------------------


def test_the_agent_settings_render_for_a_member(tenant, member_client):
    response = member_client.get(_settings_url(tenant))

    content = response.content.decode()
    assert response.status_code == 200
    assert response.context["form"].initial == {
        "name": "Ride support",
        "description": tenant.agent.description,
        "status": tenant.agent.status,
        "trace_retention_days": None,
    }
    assert 'aria-current="page">Settings</a>' in content
    assert "deleted nightly, in batches" in content
    assert "Trajectories are <strong>kept forever</strong>." in content
    assert "Save settings" in content


def test_a_viewer_reads_the_agent_settings_and_cannot_change_them(tenant, viewer_client):
    before = db_state()

    page = viewer_client.get(_settings_url(tenant))
    refused = viewer_client.post(_settings_url(tenant), _agent_data(name="Renamed", trace_retention_days="7"))

    assert page.status_code == 200
    assert '<fieldset class="stack" disabled>' in page.content.decode()
    assert "Save settings" not in page.content.decode()
    assert refused.status_code == 403
    assert db_state() == before


def test_a_member_saves_the_agent_settings(tenant, member_client):
    response = member_client.post(
        _settings_url(tenant),
        _agent_data(
            name="Rider support", description="Refunds and lost items", status="paused", trace_retention_days="30"
        ),
        follow=True,
    )

    agent = Agent.objects.get(pk=tenant.agent.pk)
    assert response.redirect_chain == [(_settings_url(tenant), 302)]
    assert (agent.name, agent.description, agent.status, agent.trace_retention_days) == (
        "Rider support",
        "Refunds and lost items",
        "paused",
        30,
    )
    content = response.content.decode()
    assert "Saved the settings of Rider support." in content
    assert "ended more than <strong>30 days</strong> ago are deleted" in content
    assert '<span class="badge badge-paused">Paused</span>' in content


def test_a_blank_retention_keeps_trajectories_forever(tenant, member_client):
    services.agent_update(agent=tenant.agent, fields={"trace_retention_days": 90})

    response = member_client.post(_settings_url(tenant), _agent_data(trace_retention_days=""), follow=True)

    assert Agent.objects.get(pk=tenant.agent.pk).trace_retention_days is None
    assert "Trajectories are <strong>kept forever</strong>." in response.content.decode()


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"trace_retention_days": "0"}, "trace_retention_days", "greater than or equal to 1"),
        ({"trace_retention_days": "3651"}, "trace_retention_days", "less than or equal to 3650"),
        ({"trace_retention_days": "a month"}, "trace_retention_days", "Enter a whole number."),
        ({"status": "deleted"}, "status", "Select a valid choice."),
        ({"name": "  "}, "name", "This field is required."),
        ({"name": "x" * 201}, "name", "at most 200 characters"),
    ],
)
def test_invalid_agent_settings_show_the_field_error_and_save_nothing(tenant, member_client, changes, field, message):
    before = db_state()

    response = member_client.post(_settings_url(tenant), _agent_data(**{"trace_retention_days": "14", **changes}))

    assert response.status_code == 422
    assert db_state() == before
    assert any(message in error for error in response.context["form"].errors[field])
    content = response.content.decode()
    assert message in content
    assert "Nothing was saved" in content
    # The header shows the agent as saved, not as posted.
    assert response.context["agent"].name == "Ride support"


def test_the_agent_settings_of_another_workspace_are_not_found(tenant, other_tenant, member_client):
    theirs = _settings_url(other_tenant)
    before = db_state()

    assert member_client.get(theirs).status_code == 404
    assert member_client.post(theirs, _agent_data(name="Taken over")).status_code == 404
    assert db_state() == before


# --- The Langfuse mirror --------------------------------------------------------------------------------------


@pytest.mark.parametrize("client_fixture", ["member_client", "viewer_client"])
def test_members_and_viewers_read_the_mirror_status_but_not_its_form(request, tenant, client_fixture):
    client = request.getfixturevalue(client_fixture)

    response = client.get(_integrations_url(tenant))

    content = response.content.decode()
    assert response.status_code == 200
    assert f'<a href="{_integrations_url(tenant)}" aria-current="page">' in content
    assert "<code>https://langfuse.example.com</code>" in content
    assert "<code>pk-lf-tenant</code>" in content
    assert '<span class="badge badge-paused">paused</span>' in content
    assert (response.context["mirror_status"].pending, response.context["mirror_status"].failed) == (0, 1)
    assert "Only owners change, pause or stop the mirror." in content
    assert "Save mirror settings" not in content
    assert 'name="secret_key"' not in content
    assert TENANT_LANGFUSE_SECRET not in content
    assert tenant.mirror.secret_key_encrypted not in content


def test_an_owner_sees_the_mirror_form_without_the_secret_key(tenant, owner_client):
    response = owner_client.get(_integrations_url(tenant))

    content = response.content.decode()
    assert response.context["mirror_form"].initial == {
        "host": "https://langfuse.example.com",
        "public_key": "pk-lf-tenant",
        "enabled": False,
    }
    (secret_input,) = re.findall(r'<input type="password" name="secret_key"[^>]*>', content)
    assert "value=" not in secret_input
    assert 'autocomplete="new-password"' in secret_input
    assert "Leave this empty to keep it" in content
    assert "Retry failed deliveries</button>" in content
    assert "Stop mirroring…</a>" in content
    assert TENANT_LANGFUSE_SECRET not in content
    assert tenant.mirror.secret_key_encrypted not in content


def test_the_secret_key_is_never_shown_even_after_saving(tenant, owner_client):
    url = _integrations_url(tenant)
    data = {"host": "https://cloud.langfuse.com/", "public_key": "pk-lf-new", "secret_key": NEW_SECRET, "enabled": "on"}

    rejected = owner_client.post(url + "langfuse/", {**data, "host": "langfuse.internal"})
    saved = owner_client.post(url + "langfuse/", data, follow=True)
    kept = owner_client.post(url + "langfuse/", {**data, "secret_key": "", "public_key": "pk-lf-newer"}, follow=True)

    assert rejected.status_code == 422
    assert rejected.context["mirror_form"].errors == {"host": ["must be an http(s) URL"]}
    assert saved.redirect_chain == [(url, 302)]
    assert "Saved the Langfuse mirror: this workspace mirrors new spans and scores to https://cloud.langfuse.com." in (
        saved.content.decode()
    )
    mirror = LangfuseMirror.objects.get(workspace=tenant.workspace)
    assert (mirror.host, mirror.public_key, mirror.enabled) == ("https://cloud.langfuse.com", "pk-lf-newer", True)
    assert crypto.decrypt(mirror.secret_key_encrypted) == NEW_SECRET
    for response in (rejected, saved, kept, owner_client.get(url)):
        assert NEW_SECRET not in response.content.decode()
        assert mirror.secret_key_encrypted not in response.content.decode()


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"host": "ftp://langfuse.example.com"}, "host", "must be an http(s) URL"),
        ({"host": ""}, "host", "This field is required."),
        ({"host": "https://" + "x" * 500}, "host", "at most 500 characters"),
        ({"public_key": " "}, "public_key", "This field is required."),
    ],
)
def test_invalid_mirror_settings_show_the_field_error_and_save_nothing(tenant, owner_client, changes, field, message):
    data = {"host": "https://cloud.langfuse.com", "public_key": "pk-lf-new", "secret_key": NEW_SECRET, **changes}
    before = db_state()

    response = owner_client.post(_integrations_url(tenant) + "langfuse/", data)

    assert response.status_code == 422
    assert db_state() == before
    assert any(message in error for error in response.context["mirror_form"].errors[field])
    assert message in response.content.decode()
    assert NEW_SECRET not in response.content.decode()


def test_without_a_mirror_the_page_explains_it_and_a_first_setup_needs_the_secret_key(
    tenant, member_client, owner_client
):
    langfuse_bridge.langfuse_mirror_delete(workspace=tenant.workspace)
    url = _integrations_url(tenant)

    member = member_client.get(url).content.decode()
    owner = owner_client.get(url).content.decode()
    before = db_state()
    missing = owner_client.post(url + "langfuse/", {"host": "https://cloud.langfuse.com", "public_key": "pk-lf-1"})

    assert "Not mirroring to Langfuse" in member
    assert "every span and score Keel stores is also sent to a Langfuse project" in member
    assert "An owner of this workspace can set it up." in member
    assert 'href="#langfuse-settings">Set up mirroring</a>' in owner
    assert "Stored encrypted and never shown again." in owner
    assert missing.status_code == 422
    assert missing.context["mirror_form"].errors == {"secret_key": ["This field is required."]}
    assert db_state() == before


def test_the_last_error_is_red_when_it_is_newer_than_the_last_success(tenant, member_client):
    now = timezone.now()
    url = _integrations_url(tenant)
    LangfuseMirror.objects.filter(pk=tenant.mirror.pk).update(
        last_success_at=now - timedelta(hours=2),
        last_error="ConnectError: [Errno 111] Connection refused",
        last_error_at=now - timedelta(minutes=5),
    )

    failing = member_client.get(url).content.decode()
    LangfuseMirror.objects.filter(pk=tenant.mirror.pk).update(last_success_at=now - timedelta(minutes=1))
    recovered = member_client.get(url).content.decode()

    assert 'class="alert alert-error" role="alert" data-mirror-error="current"' in failing
    assert "ConnectError: [Errno 111] Connection refused" in failing
    assert 'data-mirror-error="past"' in recovered
    assert 'data-mirror-error="current"' not in recovered
    assert "ConnectError: [Errno 111] Connection refused" in recovered


def test_an_owner_retries_the_failed_deliveries(tenant, owner_client):
    url = _integrations_url(tenant)

    first = owner_client.post(url + "langfuse/retry/", follow=True)
    second = owner_client.post(url + "langfuse/retry/", follow=True)

    assert first.redirect_chain == [(url, 302)]
    assert "Sending 1 failed delivery again." in first.content.decode()
    assert (first.context["mirror_status"].pending, first.context["mirror_status"].failed) == (1, 0)
    assert "No failed deliveries to send again." in second.content.decode()
    assert list(LangfuseExport.objects.filter(workspace=tenant.workspace).values_list("status", "attempts")) == [
        (ExportStatus.PENDING, 0)
    ]


def test_stopping_the_mirror_asks_first_then_stops(tenant, other_tenant, owner_client):
    url = _integrations_url(tenant) + "langfuse/delete/"

    confirmation = owner_client.get(url)
    assert "Stop mirroring to https://langfuse.example.com?" in confirmation.content.decode()
    assert LangfuseMirror.objects.filter(workspace=tenant.workspace).exists()

    response = owner_client.post(url, follow=True)

    assert response.redirect_chain == [(_integrations_url(tenant), 302)]
    assert "Stopped mirroring to https://langfuse.example.com." in response.content.decode()
    assert "Not mirroring to Langfuse" in response.content.decode()
    assert not LangfuseMirror.objects.filter(workspace=tenant.workspace).exists()
    assert LangfuseMirror.objects.filter(workspace=other_tenant.workspace).exists()
    # A delivery that failed for good stays on record; only unsent ones go with the mirror.
    assert list(LangfuseExport.objects.filter(workspace=tenant.workspace).values_list("status", flat=True)) == [
        ExportStatus.FAILED
    ]


@pytest.mark.parametrize(
    ("path", "data"),
    [
        ("langfuse/", {"host": "https://cloud.langfuse.com", "public_key": "pk", "secret_key": NEW_SECRET}),
        ("langfuse/retry/", {}),
        ("langfuse/delete/", {}),
    ],
)
def test_only_owners_manage_the_mirror(tenant, member_client, viewer_client, path, data):
    url = _integrations_url(tenant) + path
    before = db_state()

    assert member_client.post(url, data).status_code == 403
    assert viewer_client.post(url, data).status_code == 403
    assert db_state() == before


# --- Model prices ---------------------------------------------------------------------------------------------


def test_a_member_adds_and_changes_a_model_price(tenant, member_client):
    url = _integrations_url(tenant)
    data = {
        "model": " gpt-4o-mini ",
        "input_usd_per_million": "0.15",
        "output_usd_per_million": "0.6",
        "cache_read_usd_per_million": "0.075",
    }

    added = member_client.post(url + "model-prices/", data, follow=True)
    changed = member_client.post(url + "model-prices/", {**data, "output_usd_per_million": "0.5"}, follow=True)

    assert added.redirect_chain == [(url, 302)]
    assert "Saved the price of gpt-4o-mini" in added.content.decode()
    prices = ModelPriceOverride.objects.filter(workspace=tenant.workspace).order_by("model")
    assert [
        (p.model, p.input_usd_per_million, p.output_usd_per_million, p.cache_read_usd_per_million) for p in prices
    ] == [
        ("acme-large", Decimal("2.5"), Decimal("10"), None),
        ("gpt-4o-mini", Decimal("0.15"), Decimal("0.5"), Decimal("0.075")),
    ]
    content = changed.content.decode()
    assert '<td class="num">$0.15</td>' in content
    assert '<td class="num">$0.5</td>' in content
    assert '<td class="num">$0.075</td>' in content
    assert "win over litellm's price map for the cost of new generation spans" in content


def test_change_fills_the_form_with_a_price_of_the_workspace_only(tenant, other_tenant, member_client):
    tracing_services.model_price_set(
        workspace=other_tenant.workspace,
        model="globex-only",
        input_usd_per_million=Decimal(1),
        output_usd_per_million=Decimal(2),
    )
    url = _integrations_url(tenant)

    mine = member_client.get(url, {"price": "acme-large"})
    theirs = member_client.get(url, {"price": "globex-only"})

    assert mine.context["price_form"].initial == {
        "model": "acme-large",
        "input_usd_per_million": "2.5",
        "output_usd_per_million": "10",
        "cache_read_usd_per_million": "",
    }
    assert theirs.context["price_form"].initial == {}
    assert "globex-only" not in theirs.content.decode()


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"model": " "}, "model", "This field is required."),
        ({"input_usd_per_million": "-1"}, "input_usd_per_million", "greater than or equal to 0"),
        ({"output_usd_per_million": "cheap"}, "output_usd_per_million", "Enter a number."),
        ({"cache_read_usd_per_million": "-0.5"}, "cache_read_usd_per_million", "greater than or equal to 0"),
        ({"input_usd_per_million": "1234567"}, "input_usd_per_million", "no more than 6 digits before"),
        ({"output_usd_per_million": "0.0000001"}, "output_usd_per_million", "no more than 6 decimal places"),
    ],
)
def test_an_invalid_model_price_shows_the_field_error_and_saves_nothing(tenant, member_client, changes, field, message):
    data = {"model": "acme-large", "input_usd_per_million": "3", "output_usd_per_million": "12", **changes}
    before = db_state()

    response = member_client.post(_integrations_url(tenant) + "model-prices/", data)

    assert response.status_code == 422
    assert db_state() == before
    assert any(message in error for error in response.context["price_form"].errors[field])
    assert message in response.content.decode()


def test_a_member_removes_a_price_and_it_is_audited(tenant, member_client):
    url = _integrations_url(tenant)

    page = member_client.get(url).content.decode()
    removed = member_client.post(url + "model-prices/delete/", {"model": "acme-large"}, follow=True)
    missing = member_client.post(url + "model-prices/delete/", {"model": "acme-large"}, follow=True)

    assert 'aria-label="Remove the price of acme-large"' in page
    assert "Removed the price of acme-large" in removed.content.decode()
    assert "acme-large had no price of this workspace&#x27;s own" in missing.content.decode()
    assert not ModelPriceOverride.objects.filter(workspace=tenant.workspace).exists()
    event = AuditEvent.objects.get(workspace=tenant.workspace, action="model_price.deleted")
    assert (event.target_name, event.details["input_usd_per_million"]) == ("acme-large", "2.500000")


def test_a_viewer_reads_the_prices_and_cannot_set_one(tenant, viewer_client):
    before = db_state()

    page = viewer_client.get(_integrations_url(tenant))
    refused = viewer_client.post(
        _integrations_url(tenant) + "model-prices/",
        {"model": "acme-large", "input_usd_per_million": "0", "output_usd_per_million": "0"},
    )

    assert '<td class="num">$2.5</td>' in page.content.decode()
    assert "Members set prices." in page.content.decode()
    assert "Save price" not in page.content.decode()
    assert "Remove the price" not in page.content.decode()
    assert refused.status_code == 403
    removal = viewer_client.post(_integrations_url(tenant) + "model-prices/delete/", {"model": "acme-large"})
    assert removal.status_code == 403
    assert db_state() == before


def test_the_integrations_of_another_workspace_are_not_found(tenant, other_tenant, member_client, owner_client):
    theirs = _integrations_url(other_tenant)
    before = db_state()

    assert member_client.get(theirs).status_code == 404
    assert owner_client.get(theirs + "langfuse/delete/").status_code == 404
    assert owner_client.post(theirs + "langfuse/delete/").status_code == 404
    assert owner_client.post(theirs + "langfuse/retry/").status_code == 404
    assert (
        member_client.post(
            theirs + "model-prices/",
            {"model": "acme-large", "input_usd_per_million": "0", "output_usd_per_million": "0"},
        ).status_code
        == 404
    )
    assert db_state() == before
