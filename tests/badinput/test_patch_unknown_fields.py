"""A PATCH body with a field the endpoint does not know is a 422 naming the field, and changes nothing:
answering 200 would tell a caller who misspelt a field that the change was made."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from agent_registry import services as registry_services
from agent_registry.models import Agent, Prompt, Workspace
from evals.models import OnlineRule, Suite
from tests.badinput.conftest import all_scopes, assert_refused, row_counts
from trainer_bridge.models import Curation

pytestmark = pytest.mark.django_db


def _paths(workspace: Workspace) -> dict[str, str]:
    prompt = Prompt.objects.filter(workspace=workspace).order_by("pk").first()
    suite = Suite.objects.filter(workspace=workspace).order_by("pk").first()
    rule = OnlineRule.objects.filter(workspace=workspace).order_by("pk").first()
    curation = Curation.objects.filter(workspace=workspace).order_by("pk").first()
    agent = Agent.objects.filter(workspace=workspace).order_by("pk").first()
    assert prompt is not None
    assert suite is not None
    assert rule is not None
    assert curation is not None
    assert agent is not None
    return {
        "agent": f"/api/v1/agents/{agent.slug}",
        "prompt": f"/api/v1/prompts/{prompt.name}",
        "suite": f"/api/v1/suites/{suite.name}",
        "online rule": f"/api/v1/online-rules/{rule.name}",
        "curation": f"/api/v1/curations/{curation.name}",
    }


@pytest.mark.parametrize("what", ["agent", "prompt", "suite", "online rule", "curation"])
def test_an_unknown_field_is_422_and_changes_nothing(demo_workspace: Workspace, what: str) -> None:
    _, raw = registry_services.apikey_create(workspace=demo_workspace, name="patcher", scopes=all_scopes())
    client = Client(headers={"Authorization": f"Bearer {raw}"})
    path = _paths(demo_workspace)[what]
    before_body = client.get(path).json()
    before = row_counts()

    response = client.patch(path, data={"descripton": "misspelt"}, content_type="application/json")

    body: dict[str, Any] = assert_refused(response, 422)
    assert body["code"] == "validation_error"
    assert body["errors"] == [{"field": "descripton", "message": "Extra inputs are not permitted"}]
    assert row_counts() == before
    assert client.get(path).json() == before_body


def test_a_known_field_still_changes(demo_workspace: Workspace) -> None:
    _, raw = registry_services.apikey_create(workspace=demo_workspace, name="patcher", scopes=all_scopes())
    client = Client(headers={"Authorization": f"Bearer {raw}"})
    path = _paths(demo_workspace)["agent"]

    response = client.patch(path, data={"description": "spelt right"}, content_type="application/json")

    assert response.status_code == 200, response.content
    assert client.get(path).json()["description"] == "spelt right"
