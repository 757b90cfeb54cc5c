"""A prompt's description and tags, its deletion (refused while in use) and the removal of a label, from
the prompt's page; the same rules as the API. Every route's role and tenancy checks are in test_access.py."""

from __future__ import annotations

import pytest

from agent_registry.models import Prompt, PromptLabel, PromptLabelMove, PromptVersion
from frontend.tests.conftest import db_state

pytestmark = pytest.mark.django_db


def _url(tenant, prompt=None, tail=""):
    return f"/w/{tenant.workspace.slug}/prompts/{(prompt or tenant.prompt).pk}/{tail}"


# --- Description and tags ------------------------------------------------------------------------------


def test_saving_description_and_tags(tenant, member_client):
    response = member_client.post(
        _url(tenant, tail="edit/"), {"description": "Sorts support tickets.", "tags": "support, refunds, support"}
    )

    assert response.status_code == 302
    assert response["Location"] == _url(tenant) + "#details"
    assert Prompt.objects.values_list("description", "tags").get(pk=tenant.prompt.pk) == (
        "Sorts support tickets.",
        ["refunds", "support"],
    )
    page = member_client.get(_url(tenant)).content.decode()
    assert "Sorts support tickets." in page
    assert '<span class="badge">refunds</span>' in page


def test_a_tag_too_long_is_shown_on_the_field_and_nothing_changes(tenant, member_client):
    before = db_state()

    response = member_client.post(_url(tenant, tail="edit/"), {"description": "x", "tags": "t" * 65})

    assert response.status_code == 422
    assert response.context["details_form"].errors["tags"] == ["at most 64 characters each"]
    assert db_state() == before


# --- Deleting a prompt ---------------------------------------------------------------------------------


def test_the_confirmation_says_what_goes(tenant, member_client):
    response = member_client.get(_url(tenant, tenant.draft_prompt, "delete/"))

    assert response.status_code == 200
    content = response.content.decode()
    assert "Its 1 version and its deployment history go with it" in content
    assert "Delete prompt</button>" in content


def test_deleting_a_prompt_nothing_uses(tenant, member_client):
    response = member_client.post(_url(tenant, tenant.draft_prompt, "delete/"))

    assert response.status_code == 302
    assert response["Location"] == f"/w/{tenant.workspace.slug}/agents/{tenant.agent.slug}/prompts/"
    assert not Prompt.objects.filter(pk=tenant.draft_prompt.pk).exists()
    assert not PromptVersion.objects.filter(prompt_id=tenant.draft_prompt.pk).exists()
    assert Prompt.objects.filter(pk=tenant.prompt.pk).exists()


def test_a_prompt_in_use_says_why_and_offers_no_delete(tenant, member_client):
    response = member_client.get(_url(tenant, tail="delete/"))

    content = response.content.decode()
    assert response.context["reasons"] == [
        "the production label points at v1; delete that label first",
        "1 trajectory recorded its versions",
    ]
    assert "data-prompt-in-use" in content
    assert "Delete prompt</button>" not in content


def test_deleting_a_prompt_in_use_is_409_and_changes_nothing(tenant, member_client):
    before = db_state()

    response = member_client.post(_url(tenant, tail="delete/"))

    assert response.status_code == 409
    assert "1 trajectory recorded its versions" in response.content.decode()
    assert db_state() == before


# --- Removing a label ----------------------------------------------------------------------------------


def test_removing_production_as_the_api_allows(tenant, member_client):
    confirmation = member_client.get(_url(tenant, tail="labels/production/delete/"))
    response = member_client.post(_url(tenant, tail="labels/production/delete/"))

    assert "they get 404 until a production label points at a version again" in confirmation.content.decode()
    assert response.status_code == 302
    assert response["Location"] == _url(tenant) + "#labels"
    assert not PromptLabel.objects.filter(prompt=tenant.prompt, name="production").exists()
    move = PromptLabelMove.objects.filter(prompt=tenant.prompt).order_by("-id").first()
    assert move is not None
    assert (move.label, move.from_version_id, move.to_version_id, move.moved_by_id) == (
        "production",
        tenant.prompt.versions.get(version=1).pk,
        None,
        response.wsgi_request.user.pk,
    )


@pytest.mark.parametrize("label", ["staging", "latest"])
def test_a_label_the_prompt_does_not_have_is_404(tenant, member_client, label):
    before = db_state()

    assert member_client.get(_url(tenant, tail=f"labels/{label}/delete/")).status_code == 404
    assert member_client.post(_url(tenant, tail=f"labels/{label}/delete/")).status_code == 404
    assert db_state() == before


# --- Who sees the controls -----------------------------------------------------------------------------


def test_a_viewer_sees_no_delete_or_edit_controls_and_no_confirmation(tenant, viewer_client):
    page = viewer_client.get(_url(tenant)).content.decode()

    assert "Delete prompt" not in page
    assert "Save details" not in page
    assert "/labels/production/delete/" not in page
    assert viewer_client.get(_url(tenant, tenant.draft_prompt, "delete/")).status_code == 403
    assert viewer_client.get(_url(tenant, tail="labels/production/delete/")).status_code == 403


def test_a_member_sees_them(tenant, member_client):
    page = member_client.get(_url(tenant)).content.decode()

    assert f'href="{_url(tenant, tail="delete/")}"' in page
    assert f'href="{_url(tenant, tail="labels/production/delete/")}"' in page
    assert "Save details" in page
