"""The prompt endpoints: list, create, versions, labels, diff, render, resolve. Names may hold '/'."""

import pytest

from agent_registry.models import ApiKey, Prompt, PromptLabel, PromptLabelMove, PromptVersion
from agent_registry.tests.factories import prompt_with_versions

pytestmark = pytest.mark.django_db

VERSION_KEYS = [
    "name",
    "version",
    "type",
    "template",
    "config",
    "variables",
    "labels",
    "commit_message",
    "author",
    "created_at",
]


def _labels():
    return sorted(PromptLabel.objects.values_list("prompt__name", "name", "version__version"))


# --- List and create --------------------------------------------------------------------------


def test_prompt_list(workspace, registry, api_client_for):
    response = api_client_for(workspace, scopes=["read"]).get("/api/v1/prompts")

    assert response.status_code == 200
    body = response.json()
    assert [
        {key: prompt[key] for key in ("name", "agent", "tags", "latest_version", "description")} for prompt in body
    ] == [
        {"name": "billing/intro", "agent": "billing", "tags": [], "latest_version": 1, "description": ""},
        {"name": "ride-support/system", "agent": "support", "tags": [], "latest_version": 2, "description": ""},
    ]
    assert [(label["name"], label["version"]) for label in body[1]["labels"]] == [("production", 1), ("staging", 2)]


def test_prompt_list_of_one_agent(workspace, registry, api_client_for):
    response = api_client_for(workspace, scopes=["read"]).get("/api/v1/prompts?agent=billing")

    assert [prompt["name"] for prompt in response.json()] == ["billing/intro"]


def test_prompt_create(workspace, registry, api_client_for):
    client = api_client_for(workspace)
    key = ApiKey.objects.get(name="test key")

    response = client.post(
        "/api/v1/prompts",
        data={
            "agent": "support",
            "name": "ride-support/refunds",
            "type": "chat",
            "template": [
                {"role": "system", "content": "Refund policy for {{city}}."},
                {"type": "placeholder", "name": "history"},
            ],
            "config": {"model": "small"},
            "tags": ["refunds"],
            "commit_message": "first draft",
            "labels": ["staging"],
        },
        content_type="application/json",
    )

    assert response.status_code == 201
    body = response.json()
    assert list(body) == VERSION_KEYS
    assert {key: value for key, value in body.items() if key != "created_at"} == {
        "name": "ride-support/refunds",
        "version": 1,
        "type": "chat",
        "template": [
            {"role": "system", "content": "Refund policy for {{city}}."},
            {"type": "placeholder", "name": "history"},
        ],
        "config": {"model": "small"},
        "variables": ["city"],
        "labels": ["staging", "latest"],
        "commit_message": "first draft",
        "author": f"API key {key.prefix}",
    }
    prompt = Prompt.objects.get(name="ride-support/refunds")
    assert (prompt.workspace, prompt.agent, prompt.tags) == (workspace, registry.support, ["refunds"])
    assert prompt.versions.get().created_via_key == key


def test_prompt_create_with_a_taken_name_is_409(workspace, registry, api_client_for, registry_state):
    client = api_client_for(workspace)
    before = registry_state()

    response = client.post(
        "/api/v1/prompts",
        data={"agent": "billing", "name": "ride-support/system", "template": "mine now"},
        content_type="application/json",
    )

    assert response.status_code == 409
    assert response.json() == {
        "detail": "a prompt named 'ride-support/system' already exists in this workspace",
        "code": "prompt_name_taken",
    }
    assert registry_state() == before


@pytest.mark.parametrize(
    ("payload", "errors"),
    [
        (
            {"name": "bad/versions", "template": "t"},
            [
                {
                    "field": "name",
                    "message": "must not contain a path segment named diff, labels, render, versions",
                }
            ],
        ),
        (
            {"name": "ok", "type": "chat", "template": "not a list"},
            [{"field": "template", "message": "a chat prompt's template must be a non-empty list of messages"}],
        ),
        (
            {"name": "ok", "template": "t", "labels": ["latest"]},
            [{"field": "label", "message": "reserved"}],
        ),
    ],
)
def test_prompt_create_with_invalid_input_is_422(workspace, registry, api_client_for, registry_state, payload, errors):
    client = api_client_for(workspace)
    before = registry_state()

    response = client.post("/api/v1/prompts", data={"agent": "support", **payload}, content_type="application/json")

    assert response.status_code == 422
    assert response.json()["errors"] == errors
    assert registry_state() == before


def test_prompt_create_with_an_unknown_type_is_422(workspace, registry, api_client_for, registry_state):
    client = api_client_for(workspace)
    before = registry_state()

    response = client.post(
        "/api/v1/prompts",
        data={"agent": "support", "name": "x", "type": "audio", "template": "t"},
        content_type="application/json",
    )

    assert response.status_code == 422
    assert response.json()["errors"] == [{"field": "type", "message": "Input should be 'text' or 'chat'"}]
    assert registry_state() == before


# --- Versions ---------------------------------------------------------------------------------


def test_version_list(workspace, registry, api_client_for):
    response = api_client_for(workspace, scopes=["read"]).get("/api/v1/prompts/ride-support/system/versions")

    assert response.status_code == 200
    assert [(item["version"], item["labels"], item["variables"]) for item in response.json()] == [
        (2, ["staging", "latest"], ["name", "topic"]),
        (1, ["production"], ["name"]),
    ]


def test_version_create(workspace, registry, api_client_for):
    response = api_client_for(workspace).post(
        "/api/v1/prompts/ride-support/system/versions",
        data={"template": "Hey {{name}}", "commit_message": "shorter", "labels": ["production"]},
        content_type="application/json",
    )

    assert response.status_code == 201
    body = response.json()
    assert (body["name"], body["version"], body["type"], body["template"], body["config"]) == (
        "ride-support/system",
        3,
        "text",
        "Hey {{name}}",
        {},
    )
    assert body["labels"] == ["production", "latest"]
    assert _labels() == [
        ("billing/intro", "production", 1),
        ("globex/secret", "production", 1),
        ("ride-support/system", "production", 3),
        ("ride-support/system", "staging", 2),
    ]


def test_version_create_with_an_invalid_template_changes_nothing(workspace, registry, api_client_for, registry_state):
    client = api_client_for(workspace)
    before = registry_state()

    response = client.post(
        "/api/v1/prompts/ride-support/system/versions",
        data={"template": [{"role": "narrator", "content": "x"}], "type": "chat", "labels": ["production"]},
        content_type="application/json",
    )

    assert response.status_code == 422
    assert response.json() == {
        "detail": "message 0.role: Input should be 'system', 'developer', 'user', 'assistant' or 'tool'",
        "code": "prompt_invalid",
        "errors": [
            {
                "field": "template",
                "message": "message 0.role: Input should be 'system', 'developer', 'user', 'assistant' or 'tool'",
            }
        ],
    }
    assert registry_state() == before


def test_version_get(workspace, registry, api_client_for):
    client = api_client_for(workspace, scopes=["read"])

    found = client.get("/api/v1/prompts/ride-support/system/versions/2")
    missing = client.get("/api/v1/prompts/ride-support/system/versions/3")

    assert found.status_code == 200
    assert {key: value for key, value in found.json().items() if key != "created_at"} == {
        "name": "ride-support/system",
        "version": 2,
        "type": "text",
        "template": "Hi {{name}}, how can I help with {{topic}}?",
        "config": {"model": "small", "temperature": 0},
        "variables": ["name", "topic"],
        "labels": ["staging", "latest"],
        "commit_message": "",
        "author": None,
    }
    assert missing.status_code == 404
    assert missing.json() == {
        "detail": "prompt 'ride-support/system' has no version 3",
        "code": "prompt_version_not_found",
    }


@pytest.mark.parametrize("method", ["PUT", "PATCH", "DELETE"])
def test_a_version_cannot_be_edited(workspace, registry, api_client_for, registry_state, method):
    client = api_client_for(workspace)
    before = registry_state()
    template_before = PromptVersion.objects.get(prompt=registry.system_prompt, version=1).template

    response = client.generic(
        method,
        "/api/v1/prompts/ride-support/system/versions/1",
        data='{"template": "edited"}',
        content_type="application/json",
    )

    assert response.status_code == 405
    assert response.json() == {
        "detail": "prompt versions are immutable; publish a new version and move a label to it",
        "code": "prompt_version_immutable",
    }
    assert registry_state() == before
    assert PromptVersion.objects.get(prompt=registry.system_prompt, version=1).template == template_before


# --- Resolve ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "version"),
    [("", 1), ("?label=production", 1), ("?label=staging", 2), ("?label=latest", 2), ("?version=2", 2)],
)
def test_resolve_by_label_or_version_defaulting_to_production(workspace, registry, api_client_for, query, version):
    response = api_client_for(workspace, scopes=["read"]).get(f"/api/v1/prompts/ride-support/system{query}")

    assert response.status_code == 200
    assert (response.json()["name"], response.json()["version"]) == ("ride-support/system", version)


@pytest.mark.parametrize("path", ["/api/v1/prompts/ride-support/system", "/api/v1/prompts/ride-support/system/render"])
def test_asking_for_a_label_and_a_version_at_once_is_422(workspace, registry, api_client_for, path):
    # Before, the version silently won: `?label=production&version=2` answered v2, which is not in production.
    client = api_client_for(workspace, scopes=["read"])
    if path.endswith("/render"):
        response = client.post(
            path,
            data={"label": "production", "version": 2, "variables": {"name": "Ada"}},
            content_type="application/json",
        )
    else:
        response = client.get(f"{path}?label=production&version=2")

    assert response.status_code == 422
    assert response.json() == {
        "detail": "pass either label or version, not both",
        "code": "prompt_resolve_invalid",
        "errors": [
            {"field": "label", "message": "pass either label or version"},
            {"field": "version", "message": "pass either label or version"},
        ],
    }


def test_resolve_an_unknown_label_is_404(workspace, registry, api_client_for):
    response = api_client_for(workspace, scopes=["read"]).get("/api/v1/prompts/ride-support/system?label=canary")

    assert response.status_code == 404
    assert response.json() == {
        "detail": "prompt 'ride-support/system' has no label 'canary'",
        "code": "label_not_found",
    }


def test_resolve_an_unknown_prompt_is_404(workspace, registry, api_client_for):
    response = api_client_for(workspace, scopes=["read"]).get("/api/v1/prompts/ride-support/nothing")

    assert response.status_code == 404
    assert response.json() == {"detail": "no prompt named 'ride-support/nothing'", "code": "prompt_not_found"}


def test_a_name_with_several_folders(workspace, registry, api_client_for):
    prompt_with_versions(agent=registry.support, name="a/b/c d", templates=["deep"], labels={1: ["production"]})
    client = api_client_for(workspace, scopes=["read"])

    assert client.get("/api/v1/prompts/a/b/c%20d").json()["template"] == "deep"
    assert [item["version"] for item in client.get("/api/v1/prompts/a/b/c%20d/versions").json()] == [1]


# --- Labels -----------------------------------------------------------------------------------


def test_label_move_deploys_and_rolls_back(workspace, registry, api_client_for):
    client = api_client_for(workspace)

    deploy = client.put(
        "/api/v1/prompts/ride-support/system/labels/production", data={"version": 2}, content_type="application/json"
    )
    rollback = client.put(
        "/api/v1/prompts/ride-support/system/labels/production", data={"version": 1}, content_type="application/json"
    )

    assert deploy.status_code == 200
    assert (deploy.json()["name"], deploy.json()["version"]) == ("production", 2)
    assert (rollback.json()["name"], rollback.json()["version"]) == ("production", 1)
    history = client.get("/api/v1/prompts/ride-support/system/labels").json()
    assert [(move["label"], move["from_version"], move["to_version"]) for move in history] == [
        ("production", 2, 1),
        ("production", 1, 2),
        ("staging", None, 2),
        ("production", None, 1),
    ]
    key = ApiKey.objects.get(name="test key")
    assert [move["moved_by"] for move in history[:2]] == [f"API key {key.prefix}"] * 2


def test_a_new_label(workspace, registry, api_client_for):
    response = api_client_for(workspace).put(
        "/api/v1/prompts/ride-support/system/labels/canary", data={"version": 2}, content_type="application/json"
    )

    assert response.status_code == 200
    assert ("ride-support/system", "canary", 2) in _labels()


def test_the_latest_label_cannot_be_moved(workspace, registry, api_client_for, registry_state):
    client = api_client_for(workspace)
    before = registry_state()

    response = client.put(
        "/api/v1/prompts/ride-support/system/labels/latest", data={"version": 1}, content_type="application/json"
    )

    assert response.status_code == 422
    assert response.json() == {
        "detail": "latest always points at the newest version and cannot be moved",
        "code": "label_invalid",
        "errors": [{"field": "label", "message": "reserved"}],
    }
    assert registry_state() == before


def test_moving_a_label_to_an_unknown_version_is_404(workspace, registry, api_client_for, registry_state):
    client = api_client_for(workspace)
    before = registry_state()

    response = client.put(
        "/api/v1/prompts/ride-support/system/labels/production", data={"version": 9}, content_type="application/json"
    )

    assert response.status_code == 404
    assert response.json()["code"] == "prompt_version_not_found"
    assert registry_state() == before


def test_label_delete(workspace, registry, api_client_for):
    response = api_client_for(workspace).delete("/api/v1/prompts/ride-support/system/labels/staging")

    assert response.status_code == 204
    assert [label for label in _labels() if label[0] == "ride-support/system"] == [
        ("ride-support/system", "production", 1)
    ]
    assert list(
        PromptLabelMove.objects.filter(prompt=registry.system_prompt, label="staging")
        .order_by("id")
        .values_list("from_version__version", "to_version__version")
    ) == [(None, 2), (2, None)]


def test_deleting_an_unknown_label_is_404(workspace, registry, api_client_for, registry_state):
    client = api_client_for(workspace)
    before = registry_state()

    response = client.delete("/api/v1/prompts/ride-support/system/labels/canary")

    assert response.status_code == 404
    assert response.json() == {
        "detail": "prompt 'ride-support/system' has no label 'canary'",
        "code": "label_not_found",
    }
    assert registry_state() == before


# --- Update and delete ------------------------------------------------------------------------


def test_prompt_update_changes_description_and_tags(workspace, registry, api_client_for):
    response = api_client_for(workspace).patch(
        "/api/v1/prompts/ride-support/system",
        data={"description": "Greets riders.", "tags": ["rides", "greeting", "rides"]},
        content_type="application/json",
    )

    assert response.status_code == 200
    body = response.json()
    assert {key: body[key] for key in ("name", "agent", "description", "tags", "latest_version")} == {
        "name": "ride-support/system",
        "agent": "support",
        "description": "Greets riders.",
        "tags": ["greeting", "rides"],
        "latest_version": 2,
    }
    assert [(label["name"], label["version"]) for label in body["labels"]] == [("production", 1), ("staging", 2)]
    assert Prompt.objects.values_list("description", "tags").get(name="ride-support/system") == (
        "Greets riders.",
        ["greeting", "rides"],
    )


def test_prompt_update_leaves_out_what_is_not_sent(workspace, registry, api_client_for):
    client = api_client_for(workspace)
    client.patch("/api/v1/prompts/billing/intro", data={"tags": ["money"]}, content_type="application/json")

    response = client.patch(
        "/api/v1/prompts/billing/intro", data={"description": "Explains bills."}, content_type="application/json"
    )

    assert (response.json()["description"], response.json()["tags"]) == ("Explains bills.", ["money"])


def test_prompt_update_with_a_tag_too_long_is_422(workspace, registry, api_client_for, registry_state):
    client = api_client_for(workspace)
    before = registry_state()

    response = client.patch("/api/v1/prompts/billing/intro", data={"tags": ["x" * 65]}, content_type="application/json")

    assert response.status_code == 422
    assert response.json() == {
        "detail": "tag 'xxxxxxxxxxxxxxxxxxxx'… is longer than 64 characters",
        "code": "prompt_invalid",
        "errors": [{"field": "tags", "message": "at most 64 characters each"}],
    }
    assert registry_state() == before


def test_prompt_create_with_a_tag_too_long_is_422_not_cut_short(workspace, registry, api_client_for, registry_state):
    client = api_client_for(workspace)
    before = registry_state()

    response = client.post(
        "/api/v1/prompts",
        data={"agent": "support", "name": "ride-support/tagged", "template": "Hi", "tags": ["x" * 65]},
        content_type="application/json",
    )

    assert response.status_code == 422
    assert response.json()["code"] == "prompt_invalid"
    assert response.json()["errors"] == [{"field": "tags", "message": "at most 64 characters each"}]
    assert registry_state() == before


def test_prompt_delete_takes_versions_labels_and_history(workspace, registry, api_client_for):
    client = api_client_for(workspace)
    assert client.delete("/api/v1/prompts/ride-support/system/labels/production").status_code == 204

    response = client.delete("/api/v1/prompts/ride-support/system")

    assert response.status_code == 204
    assert sorted(Prompt.objects.values_list("name", flat=True)) == ["billing/intro", "globex/secret"]
    assert not PromptVersion.objects.filter(prompt__name="ride-support/system").exists()
    assert not PromptLabelMove.objects.filter(prompt__name="ride-support/system").exists()
    assert client.get("/api/v1/prompts/ride-support/system").json()["code"] == "prompt_not_found"


def test_prompt_delete_while_production_points_at_it_is_409(workspace, registry, api_client_for, registry_state):
    client = api_client_for(workspace)
    before = registry_state()

    response = client.delete("/api/v1/prompts/ride-support/system")

    assert response.status_code == 409
    assert response.json() == {
        "detail": "prompt 'ride-support/system' is in use: the production label points at v1; delete that label first",
        "code": "prompt_in_use",
        "errors": [{"field": "prompt", "message": "the production label points at v1; delete that label first"}],
    }
    assert registry_state() == before


def test_prompt_delete_of_a_version_path_is_still_405(workspace, registry, api_client_for, registry_state):
    """The new `DELETE /prompts/{name}` must not swallow the paths under a prompt."""
    client = api_client_for(workspace)
    before = registry_state()

    version = client.delete("/api/v1/prompts/ride-support/system/versions/1")
    label = client.delete("/api/v1/prompts/ride-support/system/labels/staging")

    assert (version.status_code, version.json()["code"]) == (405, "prompt_version_immutable")
    assert label.status_code == 204
    assert registry_state() != before
    assert Prompt.objects.filter(name="ride-support/system").exists()


def test_a_key_limited_to_the_agent_updates_and_deletes_its_prompt(workspace, registry, api_client_for):
    client = api_client_for(workspace, agents=[registry.billing])
    client.delete("/api/v1/prompts/billing/intro/labels/production")

    updated = client.patch("/api/v1/prompts/billing/intro", data={"tags": ["a"]}, content_type="application/json")
    deleted = client.delete("/api/v1/prompts/billing/intro")

    assert (updated.status_code, deleted.status_code) == (200, 204)
    assert not Prompt.objects.filter(name="billing/intro").exists()


# --- Diff and render --------------------------------------------------------------------------


def test_diff(workspace, registry, api_client_for):
    response = api_client_for(workspace, scopes=["read"]).get(
        "/api/v1/prompts/ride-support/system/diff?from_version=1&to_version=2"
    )

    assert response.status_code == 200
    assert response.json() == {
        "from_version": 1,
        "to_version": 2,
        "template": [
            "--- v1",
            "+++ v2",
            "@@ -1 +1 @@",
            "-Hello {{name}}",
            "+Hi {{name}}, how can I help with {{topic}}?",
        ],
        "config": [],
    }


def test_render(workspace, registry, api_client_for):
    client = api_client_for(workspace, scopes=["read"])

    production = client.post(
        "/api/v1/prompts/ride-support/system/render",
        data={"variables": {"name": "Ada"}},
        content_type="application/json",
    )
    staging = client.post(
        "/api/v1/prompts/ride-support/system/render",
        data={"label": "staging", "variables": {"name": "Ada", "topic": "refunds"}},
        content_type="application/json",
    )

    assert production.status_code == 200
    assert production.json() == {
        "name": "ride-support/system",
        "version": 1,
        "type": "text",
        "prompt": "Hello Ada",
        "config": {"model": "small", "temperature": 0},
    }
    assert staging.json()["prompt"] == "Hi Ada, how can I help with refunds?"


def test_render_a_chat_prompt_with_a_placeholder(workspace, registry, api_client_for):
    template = [
        {"role": "system", "content": "You help {{product}} users."},
        {"type": "placeholder", "name": "history"},
        {"role": "user", "content": "{{question}}"},
    ]
    prompt_with_versions(agent=registry.support, name="ride-support/chat", type="chat", templates=[template])

    response = api_client_for(workspace, scopes=["read"]).post(
        "/api/v1/prompts/ride-support/chat/render",
        data={
            "version": 1,
            "variables": {"product": "Ride", "question": "Where is my refund?"},
            "placeholders": {"history": [{"role": "user", "content": "Hi"}]},
        },
        content_type="application/json",
    )

    assert response.status_code == 200
    assert response.json()["prompt"] == [
        {"role": "system", "content": "You help Ride users."},
        {"role": "user", "content": "Hi"},
        {"role": "user", "content": "Where is my refund?"},
    ]


def test_render_fills_the_versions_default_variables_as_the_gateway_does(workspace, registry, api_client_for):
    # The gateway takes defaults from the version's `config.variables`; render answered 422 for them before.
    prompt_with_versions(
        agent=registry.support,
        name="ride-support/defaults",
        templates=["{{company}} support, {{region}} desk: {{question}}"],
        config={"variables": {"company": "Ride", "region": "EU"}},
    )
    client = api_client_for(workspace, scopes=["read"])

    response = client.post(
        "/api/v1/prompts/ride-support/defaults/render",
        data={"version": 1, "variables": {"region": "US", "question": "Where is my refund?"}},
        content_type="application/json",
    )
    missing = client.post(
        "/api/v1/prompts/ride-support/defaults/render",
        data={"version": 1, "variables": {}},
        content_type="application/json",
    )

    assert response.status_code == 200
    assert response.json()["prompt"] == "Ride support, US desk: Where is my refund?"
    assert missing.status_code == 422
    assert missing.json()["errors"] == [{"field": "variables.question", "message": "required"}]


def test_render_with_a_missing_variable_is_422(workspace, registry, api_client_for):
    response = api_client_for(workspace, scopes=["read"]).post(
        "/api/v1/prompts/ride-support/system/render",
        data={"label": "staging", "variables": {}},
        content_type="application/json",
    )

    assert response.status_code == 422
    assert response.json() == {
        "detail": "missing values for: name, topic",
        "code": "missing_variables",
        "errors": [
            {"field": "variables.name", "message": "required"},
            {"field": "variables.topic", "message": "required"},
        ],
    }


def test_a_new_version_cannot_change_the_prompt_type(workspace, registry, api_client_for, registry_state):
    client = api_client_for(workspace)
    before = registry_state()

    response = client.post(
        "/api/v1/prompts/ride-support/system/versions",
        data={"template": [{"role": "system", "content": "Hi"}], "type": "chat", "labels": ["production"]},
        content_type="application/json",
    )

    assert response.status_code == 409
    body = response.json()
    assert body["code"] == "prompt_type_changed"
    assert body["errors"] == [{"field": "type", "message": "must be text, as the earlier versions"}]
    assert registry_state() == before
