import pytest

from agent_registry import exceptions, selectors
from agent_registry.tests.factories import AgentFactory, prompt_with_versions

pytestmark = pytest.mark.django_db


@pytest.fixture
def prompt(workspace):
    return prompt_with_versions(
        agent=AgentFactory.create(workspace=workspace),
        name="ride-support/system",
        templates=["v1", "v2", "v3"],
        labels={1: ["production"], 2: ["staging"]},
    )


@pytest.mark.parametrize(
    ("label", "version", "expected"),
    [(None, None, 1), ("production", None, 1), ("staging", None, 2), ("latest", None, 3), (None, 2, 2)],
)
def test_a_version_by_label_or_number_defaulting_to_production(workspace, prompt, label, version, expected):
    resolved = selectors.prompt_version_resolve(
        workspace=workspace, name="ride-support/system", label=label, version=version
    )

    assert (resolved.prompt, resolved.version) == (prompt, expected)


def test_an_unknown_label_or_version(workspace, prompt):
    with pytest.raises(exceptions.PromptLabelNotFound):
        selectors.prompt_version_resolve(workspace=workspace, name=prompt.name, label="canary")
    with pytest.raises(exceptions.PromptVersionNotFound):
        selectors.prompt_version_resolve(workspace=workspace, name=prompt.name, version=4)


def test_without_a_production_label_there_is_no_default(workspace):
    prompt_with_versions(agent=AgentFactory.create(workspace=workspace), name="draft", labels={1: ["staging"]})

    with pytest.raises(exceptions.PromptLabelNotFound):
        selectors.prompt_version_resolve(workspace=workspace, name="draft")


def test_another_workspace_or_agent_does_not_resolve(workspace, other_workspace, prompt):
    with pytest.raises(exceptions.PromptNotFound):
        selectors.prompt_version_resolve(workspace=other_workspace, name=prompt.name)
    other_agent = AgentFactory.create(workspace=workspace)
    with pytest.raises(exceptions.PromptNotFound):
        selectors.prompt_version_resolve(workspace=workspace, name=prompt.name, agent_ids={other_agent.pk})
