"""Fixtures of the registry's tests."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from agent_registry import services
from agent_registry.models import (
    Agent,
    ApiKey,
    Prompt,
    PromptLabel,
    PromptLabelMove,
    PromptVersion,
    RequirementsVersion,
    Workspace,
)
from agent_registry.tests.factories import agent_with_requirements, prompt_with_versions, requirements_answers


@pytest.fixture
def row_counts(db) -> Callable[[], dict[str, int]]:
    """Rows per registry table, so a denied path can assert that nothing was written."""

    def count() -> dict[str, int]:
        models = (Workspace, Agent, ApiKey, RequirementsVersion, Prompt, PromptVersion, PromptLabel, PromptLabelMove)
        return {model.__name__: model.objects.count() for model in models}

    return count


@pytest.fixture
def registry_state(row_counts) -> Callable[[], dict[str, Any]]:
    """Everything a write could change (but a key's last use), to compare before and after a denied call."""

    def state() -> dict[str, Any]:
        return {
            "counts": row_counts(),
            "agents": sorted(
                Agent.objects.values_list("workspace__slug", "slug", "name", "status", "current_requirements")
            ),
            "labels": sorted(PromptLabel.objects.values_list("prompt__name", "name", "version__version")),
            "prompts": sorted(
                Prompt.objects.values_list("workspace__slug", "name", "agent__slug", "description", "tags")
            ),
            "keys": sorted(ApiKey.objects.values_list("name", "revoked_at")),
        }

    return state


@dataclass
class Registry:
    """Two workspaces: Acme's agents `support` (two requirements versions, prompt `ride-support/system`
    with v1 on production and v2 on staging) and `billing` (prompt `billing/intro`); Globex's agent
    `theirs` with its prompt `globex/secret`."""

    support: Agent
    billing: Agent
    theirs: Agent
    system_prompt: Prompt
    billing_prompt: Prompt
    their_prompt: Prompt


@pytest.fixture
def registry(workspace, other_workspace) -> Registry:
    support = agent_with_requirements(workspace=workspace, slug="support", name="Ride support")
    services.requirements_version_create(
        agent=support, answers=requirements_answers(**{"io_gap.steps_p95": 4}), message="tighter"
    )
    billing = agent_with_requirements(workspace=workspace, slug="billing", name="Billing")
    theirs = agent_with_requirements(workspace=other_workspace, slug="theirs", name="Theirs")
    return Registry(
        support=support,
        billing=billing,
        theirs=theirs,
        system_prompt=prompt_with_versions(
            agent=support,
            name="ride-support/system",
            templates=["Hello {{name}}", "Hi {{name}}, how can I help with {{topic}}?"],
            labels={1: ["production"], 2: ["staging"]},
            config={"model": "small", "temperature": 0},
        ),
        billing_prompt=prompt_with_versions(
            agent=billing, name="billing/intro", templates=["Your bill"], labels={1: ["production"]}
        ),
        their_prompt=prompt_with_versions(
            agent=theirs, name="globex/secret", templates=["Secret {{x}}"], labels={1: ["production"]}
        ),
    )
