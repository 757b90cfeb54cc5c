"""Tenancy through the API: another workspace's agents and prompts, and keys limited to some agents.

Every endpoint that names an agent or a prompt answers 404 (the same as for a name that does not exist)
and writes nothing; list endpoints leave the others out."""

import json

import pytest

from agent_registry.tests.factories import prompt_with_versions, requirements_answers

pytestmark = pytest.mark.django_db

# (method, path, body, code); {agent} and {prompt} are filled with an agent and a prompt the key may not see.
NAMED_ENDPOINTS = [
    ("GET", "/api/v1/agents/{agent}", None, "agent_not_found"),
    ("PATCH", "/api/v1/agents/{agent}", {"name": "Mine now"}, "agent_not_found"),
    ("DELETE", "/api/v1/agents/{agent}", None, "agent_not_found"),
    ("GET", "/api/v1/agents/{agent}/requirements", None, "agent_not_found"),
    ("POST", "/api/v1/agents/{agent}/requirements", {"answers": requirements_answers()}, "agent_not_found"),
    ("GET", "/api/v1/agents/{agent}/requirements/current", None, "agent_not_found"),
    ("GET", "/api/v1/agents/{agent}/requirements/diff?from_version=1&to_version=1", None, "agent_not_found"),
    ("GET", "/api/v1/agents/{agent}/requirements/1", None, "agent_not_found"),
    ("POST", "/api/v1/agents/{agent}/requirements/1/activate", None, "agent_not_found"),
    ("GET", "/api/v1/agents/{agent}/feasibility", None, "agent_not_found"),
    ("GET", "/api/v1/agents/{agent}/configuration", None, "agent_not_found"),
    ("GET", "/api/v1/prompts?agent={agent}", None, "agent_not_found"),
    ("POST", "/api/v1/prompts", {"agent": "{agent}", "name": "planted", "template": "t"}, "agent_not_found"),
    ("POST", "/api/v1/keys", {"name": "sneaky", "scopes": ["read"], "agents": ["{agent}"]}, "agent_not_found"),
    ("GET", "/api/v1/prompts/{prompt}", None, "prompt_not_found"),
    ("GET", "/api/v1/prompts/{prompt}?version=1", None, "prompt_not_found"),
    ("PATCH", "/api/v1/prompts/{prompt}", {"description": "mine now", "tags": ["taken"]}, "prompt_not_found"),
    ("DELETE", "/api/v1/prompts/{prompt}", None, "prompt_not_found"),
    ("GET", "/api/v1/prompts/{prompt}/versions", None, "prompt_not_found"),
    (
        "POST",
        "/api/v1/prompts/{prompt}/versions",
        {"template": "hijacked", "labels": ["production"]},
        "prompt_not_found",
    ),
    ("GET", "/api/v1/prompts/{prompt}/versions/1", None, "prompt_not_found"),
    ("PUT", "/api/v1/prompts/{prompt}/versions/1", {"template": "x"}, "prompt_not_found"),
    ("DELETE", "/api/v1/prompts/{prompt}/versions/1", None, "prompt_not_found"),
    ("GET", "/api/v1/prompts/{prompt}/labels", None, "prompt_not_found"),
    ("PUT", "/api/v1/prompts/{prompt}/labels/production", {"version": 1}, "prompt_not_found"),
    ("DELETE", "/api/v1/prompts/{prompt}/labels/production", None, "prompt_not_found"),
    ("GET", "/api/v1/prompts/{prompt}/diff?from_version=1&to_version=1", None, "prompt_not_found"),
    ("POST", "/api/v1/prompts/{prompt}/render", {"variables": {"x": 1, "name": 1}}, "prompt_not_found"),
    ("GET", "/api/public/v2/prompts/{prompt}", None, "prompt_not_found"),
    ("GET", "/api/public/v2/prompts/{prompt}?version=1", None, "prompt_not_found"),
]
IDS = [f"{method} {path}" for method, path, _, _ in NAMED_ENDPOINTS]


def call(client, method, path, body, agent, prompt):
    fill = {"{agent}": agent, "{prompt}": prompt}
    for placeholder, value in fill.items():
        path = path.replace(placeholder, value)
    data = json.dumps(body) if body is not None else ""
    for placeholder, value in fill.items():
        data = data.replace(placeholder, value)
    return client.generic(method, path, data=data, content_type="application/json")


@pytest.mark.parametrize(("method", "path", "body", "code"), NAMED_ENDPOINTS, ids=IDS)
def test_another_workspaces_agent_or_prompt_is_404_and_untouched(
    workspace, registry, api_client_for, registry_state, method, path, body, code
):
    client = api_client_for(workspace, scopes=["read", "write"])
    before = registry_state()

    response = call(client, method, path, body, agent="theirs", prompt="globex/secret")

    assert response.status_code == 404
    assert response.json()["code"] == code
    assert "globex" not in response.json()["detail"].replace("globex/secret", "")
    assert registry_state() == before


@pytest.mark.parametrize(("method", "path", "body", "code"), NAMED_ENDPOINTS, ids=IDS)
def test_a_key_limited_to_one_agent_cannot_reach_another(
    workspace, registry, api_client_for, registry_state, method, path, body, code
):
    client = api_client_for(workspace, scopes=["read", "write"], agents=[registry.billing])
    before = registry_state()

    response = call(client, method, path, body, agent="support", prompt="ride-support/system")

    assert response.status_code == 404
    assert response.json()["code"] == code
    assert registry_state() == before


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/api/v1/agents", ["billing"]),
        ("/api/v1/prompts", ["billing/intro"]),
    ],
)
def test_lists_show_only_the_keys_agents(workspace, registry, api_client_for, path, expected):
    limited = api_client_for(workspace, scopes=["read"], agents=[registry.billing])
    everything = api_client_for(workspace, scopes=["read"])

    names = [item.get("slug", item["name"]) for item in limited.get(path).json()]
    all_names = sorted(item.get("slug", item["name"]) for item in everything.get(path).json())

    assert names == expected
    assert (
        all_names
        == {"/api/v1/agents": ["billing", "support"], "/api/v1/prompts": ["billing/intro", "ride-support/system"]}[path]
    )


def test_the_workspace_endpoint_shows_the_keys_own_workspace(workspace, other_workspace, api_client_for):
    assert api_client_for(workspace, scopes=["read"]).get("/api/v1/workspace").json() == {
        "slug": "acme",
        "name": "Acme",
    }
    assert api_client_for(other_workspace, scopes=["read"]).get("/api/v1/workspace").json() == {
        "slug": "globex",
        "name": "Globex",
    }


def test_a_prompt_name_resolves_in_the_keys_own_workspace(workspace, other_workspace, registry, api_client_for):
    prompt_with_versions(agent=registry.theirs, name="shared/name", templates=["theirs"], labels={1: ["production"]})
    prompt_with_versions(agent=registry.support, name="shared/name", templates=["ours"], labels={1: ["production"]})

    mine = api_client_for(workspace, scopes=["read"]).get("/api/v1/prompts/shared/name").json()
    theirs = api_client_for(other_workspace, scopes=["read"]).get("/api/v1/prompts/shared/name").json()

    assert (mine["template"], theirs["template"]) == ("ours", "theirs")
