import pytest

from agent_registry import exceptions, services
from agent_registry.models import Prompt
from agent_registry.tests.factories import AgentFactory, prompt_with_versions

pytestmark = pytest.mark.django_db


@pytest.fixture
def prompt(workspace):
    found = prompt_with_versions(agent=AgentFactory.create(workspace=workspace), name="support/triage")
    services.prompt_update(prompt=found, description="Sorts tickets.", tags=["support"])
    return found


def test_description_and_tags_change_and_tags_are_cleaned(prompt):
    updated = services.prompt_update(prompt=prompt, description="Routes tickets.", tags=[" urgent ", "b2c", "b2c", ""])

    assert (updated.description, updated.tags) == ("Routes tickets.", ["b2c", "urgent"])
    assert Prompt.objects.values_list("description", "tags").get() == ("Routes tickets.", ["b2c", "urgent"])


def test_a_field_left_out_stays_as_it_was(prompt):
    services.prompt_update(prompt=prompt, tags=[])

    assert Prompt.objects.values_list("description", "tags").get() == ("Sorts tickets.", [])

    services.prompt_update(prompt=prompt, description="")

    assert Prompt.objects.values_list("description", "tags").get() == ("", [])


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"tags": ["x" * 65]}, "tags"),
        ({"tags": [f"tag-{n}" for n in range(51)]}, "tags"),
        ({"description": "x" * 10_001}, "description"),
    ],
)
def test_invalid_values_are_refused_and_nothing_changes(prompt, changes, field):
    with pytest.raises(exceptions.PromptInvalid) as raised:
        services.prompt_update(prompt=prompt, **changes)

    assert [error["field"] for error in raised.value.extra["errors"]] == [field]
    assert Prompt.objects.values_list("description", "tags").get() == ("Sorts tickets.", ["support"])
