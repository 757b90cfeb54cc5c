"""The demo workspace's registry: seeded once however often `demo_seed` runs (`make run` seeds at every
start), with the agents, requirements, prompts and deployments of the framework's worked examples."""

from __future__ import annotations

from typing import Any

import pytest

from agent_registry import demo
from agent_registry.models import (
    Agent,
    Membership,
    Prompt,
    PromptLabel,
    PromptLabelMove,
    PromptVersion,
    RequirementsVersion,
    User,
    Workspace,
)

pytestmark = pytest.mark.django_db


def registry_rows() -> dict[str, list[Any]]:
    """Every registry row the seed writes, by primary key, so that a second run that rewrote a row, or
    deleted and re-created it, shows as well as one that added a row."""
    return {
        "workspaces": list(Workspace.objects.order_by("pk").values_list("pk", "slug", "name")),
        "users": list(User.objects.order_by("pk").values_list("pk", "username")),
        "memberships": list(Membership.objects.order_by("pk").values_list("pk", "workspace_id", "user_id", "role")),
        "agents": list(
            Agent.objects.order_by("pk").values_list(
                "pk", "workspace_id", "slug", "name", "description", "status", "owner_id", "current_requirements_id"
            )
        ),
        "requirements_versions": list(
            RequirementsVersion.objects.order_by("pk").values_list("pk", "agent_id", "version", "answers", "message")
        ),
        "prompts": list(Prompt.objects.order_by("pk").values_list("pk", "agent_id", "name", "description", "tags")),
        "prompt_versions": list(
            PromptVersion.objects.order_by("pk").values_list(
                "pk", "prompt_id", "version", "type", "template", "config", "commit_message"
            )
        ),
        "labels": list(PromptLabel.objects.order_by("pk").values_list("pk", "prompt_id", "name", "version_id")),
        "label_moves": list(
            PromptLabelMove.objects.order_by("pk").values_list(
                "pk", "prompt_id", "label", "from_version_id", "to_version_id"
            )
        ),
    }


def test_seeding_twice_leaves_the_registry_unchanged(demo_workspace):
    first = registry_rows()

    demo.demo_seed()

    assert registry_rows() == first


def test_the_seed_has_two_agents_with_two_requirements_versions_and_deployed_prompts(demo_workspace):
    workspace = demo_workspace

    agents = Agent.objects.filter(workspace=workspace).select_related("current_requirements").order_by("slug")
    assert [(agent.slug, agent.requirements_versions.count(), agent.current_requirements) for agent in agents] == [
        ("ride-support", 2, agents[0].requirements_versions.get(version=2)),
        ("shopping-assistant", 2, agents[1].requirements_versions.get(version=2)),
    ]
    prompts = Prompt.objects.filter(workspace=workspace).select_related("agent").order_by("name")
    assert [
        (
            prompt.agent.slug,
            prompt.name,
            prompt.versions.count(),
            sorted(prompt.labels.values_list("name", "version__version")),
        )
        for prompt in prompts
    ] == [
        ("ride-support", "ride-support/refund-policy", 1, [("production", 1)]),
        ("ride-support", "ride-support/system", 2, [("production", 2), ("staging", 2)]),
        ("shopping-assistant", "shopping-assistant/system", 2, [("production", 2), ("staging", 2)]),
    ]
