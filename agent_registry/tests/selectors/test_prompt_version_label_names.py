import pytest

from agent_registry import selectors
from agent_registry.tests.factories import AgentFactory, prompt_with_versions

pytestmark = pytest.mark.django_db


def test_labels_of_a_version_with_latest_on_the_newest(workspace):
    prompt = prompt_with_versions(
        agent=AgentFactory.create(workspace=workspace),
        templates=["1", "2"],
        labels={1: ["staging", "production"], 2: ["canary"]},
    )

    assert selectors.prompt_version_label_names(version=prompt.versions.get(version=1)) == ["production", "staging"]
    assert selectors.prompt_version_label_names(version=prompt.versions.get(version=2)) == ["canary", "latest"]
