"""Management commands of the registry."""

import io

import pytest
from django.core.management import CommandError, call_command

from agent_registry import services
from agent_registry.models import ApiKey
from agent_registry.tests.factories import AgentFactory

pytestmark = pytest.mark.django_db


def apikey_create(*args: str) -> tuple[str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    call_command("apikey_create", *args, stdout=stdout, stderr=stderr)
    return stdout.getvalue(), stderr.getvalue()


def test_a_key_for_one_agent_with_the_default_scopes(workspace, other_workspace):
    agent = AgentFactory.create(workspace=workspace, slug="support")
    AgentFactory.create(workspace=other_workspace, slug="billing")

    stdout, stderr = apikey_create("--agent", "support")

    raw_key = stdout.removesuffix("\n")
    assert "\n" not in raw_key
    api_key = ApiKey.objects.get()
    assert services.apikey_authenticate(raw_key=raw_key) == api_key
    assert (api_key.workspace, api_key.name, api_key.scopes) == (
        workspace,
        "CLI key for support",
        ["gateway", "ingest", "read"],
    )
    assert list(api_key.agents.all()) == [agent]
    assert stderr == (
        f"Created API key 'CLI key for support' ({api_key.prefix}...) in workspace 'acme', scopes gateway ingest "
        "read, limited to agent 'support'. It is shown once, below on stdout.\n"
    )
    assert raw_key not in stderr


def test_scopes_and_name(workspace):
    AgentFactory.create(workspace=workspace, slug="support")

    stdout, _ = apikey_create("--agent", "support", "--scopes", "read", "write", "--name", "deploy bot")

    api_key = ApiKey.objects.get()
    assert (api_key.name, api_key.scopes) == ("deploy bot", ["read", "write"])
    assert services.apikey_authenticate(raw_key=stdout.strip()) == api_key


def test_comma_separated_scopes(workspace):
    AgentFactory.create(workspace=workspace, slug="support")

    apikey_create("--agent", "support", "--scopes", "read,write", "ingest")

    assert ApiKey.objects.get().scopes == ["ingest", "read", "write"]


def test_a_workspace_key_serves_every_agent(workspace, other_workspace):
    AgentFactory.create(workspace=workspace, slug="support")

    stdout, stderr = apikey_create("--workspace", "globex", "--scopes", "ingest")

    api_key = ApiKey.objects.get()
    assert (api_key.workspace, api_key.scopes, list(api_key.agents.all())) == (other_workspace, ["ingest"], [])
    assert api_key.name == "CLI key for globex"
    assert "for every agent" in stderr
    assert services.apikey_authenticate(raw_key=stdout.strip()) == api_key


def test_an_agent_slug_in_several_workspaces_needs_the_workspace(workspace, other_workspace):
    AgentFactory.create(workspace=workspace, slug="support")
    theirs = AgentFactory.create(workspace=other_workspace, slug="support")

    with pytest.raises(CommandError) as raised:
        apikey_create("--agent", "support")

    assert str(raised.value) == "agent 'support' exists in several workspaces (acme, globex); pass --workspace"
    assert ApiKey.objects.count() == 0

    apikey_create("--agent", "support", "--workspace", "globex")

    api_key = ApiKey.objects.get()
    assert (api_key.workspace, list(api_key.agents.all())) == (other_workspace, [theirs])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--agent", "nobody"), "no agent with slug 'nobody'"),
        (("--agent", "support", "--workspace", "globex"), "no agent with slug 'support' in workspace 'globex'"),
        (("--workspace", "nowhere"), "no workspace with slug 'nowhere'"),
        (("--agent", "support", "--workspace", "nowhere"), "no workspace with slug 'nowhere'"),
        ((), "pass --agent <slug>, or --workspace <slug> for a key that serves every agent"),
        (
            ("--agent", "support", "--scopes", "read", "admin"),
            "scopes must be a non-empty subset of ingest, gateway, read, write, train (scopes: unknown: admin)",
        ),
        (
            ("--agent", "support", "--scopes", ","),
            "scopes must be a non-empty subset of ingest, gateway, read, write, train (scopes: empty)",
        ),
        (("--agent", "support", "--name", "  "), "a key needs a name (name: required)"),
    ],
)
def test_bad_arguments_create_nothing(workspace, other_workspace, args, message):
    AgentFactory.create(workspace=workspace, slug="support")

    with pytest.raises(CommandError) as raised:
        apikey_create(*args)

    assert str(raised.value) == message
    assert ApiKey.objects.count() == 0
