"""Prompts: creating, publishing, moving labels (deploy and rollback), diffs and the try-it box."""

from __future__ import annotations

import json

import pytest

from agent_registry.models import Prompt, PromptLabel, PromptLabelMove, PromptVersion
from frontend.tests.conftest import db_state

pytestmark = pytest.mark.django_db


def _prompt_url(tenant, tail=""):
    return f"/w/{tenant.workspace.slug}/prompts/{tenant.prompt.pk}/{tail}"


def _label(prompt, name="production"):
    return PromptLabel.objects.select_related("version").get(prompt=prompt, name=name).version.version


def test_create_a_text_prompt_with_a_label(tenant, member_client):
    response = member_client.post(
        f"/w/{tenant.workspace.slug}/agents/{tenant.agent.slug}/prompts/",
        {
            "name": "support/greeting",
            "type": "text",
            "template": "Hi {{name}}",
            "config": '{"model": "gpt-4o-mini"}',
            "commit_message": "first",
            "labels": "production, staging",
        },
    )

    prompt = Prompt.objects.get(workspace=tenant.workspace, name="support/greeting")
    assert response.status_code == 302
    assert response["Location"] == f"/w/{tenant.workspace.slug}/prompts/{prompt.pk}/"
    version = prompt.versions.get()
    assert (version.template, version.config, version.commit_message) == (
        "Hi {{name}}",
        {"model": "gpt-4o-mini"},
        "first",
    )
    assert version.created_by is not None
    assert version.created_by.username == "mia"
    assert sorted(prompt.labels.values_list("name", flat=True)) == ["production", "staging"]


def test_create_a_chat_prompt_from_json(tenant, member_client):
    template = [
        {"role": "system", "content": "You help {{product}} users."},
        {"type": "placeholder", "name": "history"},
    ]

    response = member_client.post(
        f"/w/{tenant.workspace.slug}/agents/{tenant.agent.slug}/prompts/",
        {"name": "chat", "type": "chat", "template": json.dumps(template), "config": ""},
    )

    assert response.status_code == 302
    assert PromptVersion.objects.get(prompt__name="chat").template == template


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        ({"type": "chat", "template": "[{'role': 'user'}]"}, "template", "A chat template must be JSON"),
        ({"type": "chat", "template": '[{"role": "wizard", "content": "x"}]'}, "template", "message 0"),
        ({"type": "chat", "template": "[]"}, "template", "non-empty list of messages"),
        ({"config": "[1, 2]"}, "config", "The configuration must be a JSON object."),
        ({"config": "{"}, "config", "Not valid JSON"),
        ({"name": "support/triage"}, "name", "already exists in this workspace"),
        ({"name": "a//b"}, "name", "must not start or end with"),
        ({"labels": "latest"}, "labels", "latest always points at the newest version"),
        ({"labels": "Prod"}, "labels", "must be lowercase"),
        ({"template": ""}, "template", "This field is required."),
    ],
)
def test_an_invalid_prompt_creates_nothing_and_says_why(tenant, member_client, data, field, message):
    before = db_state()

    response = member_client.post(
        f"/w/{tenant.workspace.slug}/agents/{tenant.agent.slug}/prompts/",
        {"name": "new-prompt", "type": "text", "template": "Hi", "config": "{}", "labels": "", **data},
    )

    assert response.status_code == 422
    assert db_state() == before
    errors = response.context["form"].errors
    assert any(message in error for error in errors[field]), errors


def test_publish_a_version_prefilled_from_the_latest(tenant, member_client):
    page = member_client.get(_prompt_url(tenant))
    assert page.context["version_form"].initial["template"] == "Hi {{name}}! About {{topic}}:"

    response = member_client.post(
        _prompt_url(tenant, "versions/"),
        {"template": "Hey {{name}}", "config": '{"temperature": 0}', "commit_message": "shorter", "labels": "staging"},
        follow=True,
    )

    version = PromptVersion.objects.get(prompt=tenant.prompt, version=3)
    assert (version.template, version.config, version.commit_message) == ("Hey {{name}}", {"temperature": 0}, "shorter")
    assert _label(tenant.prompt, "staging") == 3
    assert _label(tenant.prompt) == 1
    assert "Published support/triage v3 with staging." in [str(m) for m in response.context["messages"]]


def test_publishing_an_invalid_version_shows_the_error_and_stores_nothing(tenant, member_client):
    before = db_state()

    response = member_client.post(_prompt_url(tenant, "versions/"), {"template": "x", "config": "nope"})

    assert response.status_code == 422
    assert db_state() == before
    assert response.context["version_form"].errors["config"][0].startswith("Not valid JSON")


def test_moving_a_label_deploys_and_moving_it_back_rolls_back(tenant, member_client):
    deploy = member_client.post(_prompt_url(tenant, "labels/"), {"label": "production", "version": "2"})
    assert deploy.status_code == 302
    assert deploy["Location"].endswith("#labels")
    assert _label(tenant.prompt) == 2

    member_client.post(_prompt_url(tenant, "labels/"), {"label": "production", "version": "1"})

    assert _label(tenant.prompt) == 1
    moves = PromptLabelMove.objects.filter(prompt=tenant.prompt, label="production").order_by("id")
    assert list(moves.values_list("from_version__version", "to_version__version", "moved_by__username")) == [
        (None, 1, "author"),
        (1, 2, "mia"),
        (2, 1, "mia"),
    ]
    page = member_client.get(_prompt_url(tenant)).content.decode()
    assert "Roll back to v2" in page


def test_moving_a_label_to_an_unknown_version_is_404(tenant, member_client):
    before = db_state()

    assert (
        member_client.post(_prompt_url(tenant, "labels/"), {"label": "production", "version": "9"}).status_code == 404
    )
    assert db_state() == before


def test_an_invalid_label_name_is_refused_with_its_reason(tenant, member_client):
    before = db_state()

    response = member_client.post(_prompt_url(tenant, "labels/"), {"label": "latest", "version": "1"})

    assert response.status_code == 422
    assert db_state() == before
    assert "latest always points at the newest version" in response.content.decode()


def test_the_prompt_page_diffs_two_versions(tenant, member_client):
    response = member_client.get(_prompt_url(tenant, "?from=1&to=2"))

    diff = response.context["diff"]
    assert "-Hello {{name}}, you asked about {{topic}}." in diff.template
    assert "+Hi {{name}}! About {{topic}}:" in diff.template
    content = response.content.decode()
    assert '<span class="diff-line diff-add">+Hi {{name}}! About {{topic}}:</span>' in content
    assert '<span class="diff-line diff-del">-Hello {{name}}, you asked about {{topic}}.</span>' in content


def test_the_prompt_page_with_a_version_that_is_a_digit_but_no_number_shows_no_diff(tenant, member_client):
    # str.isdigit() takes '²', which int() refuses: it was a 500.
    response = member_client.get(_prompt_url(tenant, "?from=²&to=2"))

    assert response.status_code == 200
    assert response.context["diff"] is None


def test_try_it_with_a_version_that_is_a_digit_but_no_number_uses_the_default(tenant, member_client):
    response = member_client.get(_prompt_url(tenant, "render/?version=²&var.name=Ada&var.topic=refunds"))

    assert response.status_code == 200
    assert response.context["output"] == "Hello Ada, you asked about refunds."


def test_the_prompt_page_shows_versions_labels_and_history(tenant, member_client):
    response = member_client.get(_prompt_url(tenant))

    versions = response.context["versions"]
    assert [(v.version.version, v.labels, v.is_latest, v.variables) for v in versions] == [
        (2, [], True, ["name", "topic"]),
        (1, ["production"], False, ["name", "topic"]),
    ]
    assert [(m.label, m.to_version.version) for m in response.context["moves"]] == [("production", 1)]


def test_try_it_renders_a_version(tenant, member_client):
    response = member_client.get(
        _prompt_url(tenant, "render/?version=2&var.name=Ada&var.topic=refunds"), headers={"HX-Request": "true"}
    )

    assert response.status_code == 200
    assert response.context["output"] == "Hi Ada! About refunds:"
    assert b"<html" not in response.content


def test_try_it_names_the_missing_variables(tenant, member_client):
    response = member_client.get(_prompt_url(tenant, "render/?version=1&var.name=Ada&var.topic="))

    assert response.status_code == 200
    assert response.context["missing"] == ["topic"]
    assert "Missing value for <code>topic</code>" in response.content.decode()
    assert b"<html" in response.content


def test_try_it_defaults_to_the_production_version_and_redraws_for_another(tenant, member_client):
    page = member_client.get(_prompt_url(tenant))
    assert page.context["try_it"].version.version.version == 1

    panel = member_client.get(_prompt_url(tenant, "render/?panel=1&version=2"), headers={"HX-Request": "true"})

    assert panel.context["try_it"].version.version.version == 2
    assert "output" not in panel.context
    assert b'id="try-it"' in panel.content


def test_try_it_fills_chat_placeholders(tenant, member_client):
    from agent_registry import services

    version = services.prompt_create(
        agent=tenant.agent,
        name="chat",
        type="chat",
        template=[{"role": "system", "content": "Help {{who}}."}, {"type": "placeholder", "name": "history"}],
    )
    history = json.dumps([{"role": "user", "content": "hello"}])

    response = member_client.get(
        f"/w/{tenant.workspace.slug}/prompts/{version.prompt_id}/render/",
        {"var.who": "riders", "placeholder.history": history},
    )

    assert json.loads(response.context["output"]) == [
        {"role": "system", "content": "Help riders."},
        {"role": "user", "content": "hello"},
    ]
