from typing import Any

import pytest

from agent_registry import selectors
from agent_registry.tests.factories import AgentFactory, prompt_with_versions

pytestmark = pytest.mark.django_db


def test_prompts_of_the_workspace_with_latest_version_and_labels(workspace, other_workspace):
    support = AgentFactory.create(workspace=workspace)
    billing = AgentFactory.create(workspace=workspace)
    prompt_with_versions(agent=support, name="b-support", templates=["1", "2"], labels={1: ["production"]})
    prompt_with_versions(agent=billing, name="a-billing", templates=["1"])
    prompt_with_versions(agent=AgentFactory.create(workspace=other_workspace), name="theirs")

    # Any: latest_version is an annotation, unknown to the model's type.
    prompts: list[Any] = list(selectors.prompt_list(workspace=workspace))

    assert [
        (prompt.name, prompt.latest_version, [(label.name, label.version.version) for label in prompt.labels.all()])
        for prompt in prompts
    ] == [("a-billing", 1, []), ("b-support", 2, [("production", 1)])]
    assert [prompt.name for prompt in selectors.prompt_list(workspace=workspace, agent=support)] == ["b-support"]
    assert [prompt.name for prompt in selectors.prompt_list(workspace=workspace, agent_ids={billing.pk})] == [
        "a-billing"
    ]
