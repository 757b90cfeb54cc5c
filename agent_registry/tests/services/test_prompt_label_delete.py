import pytest

from agent_registry import exceptions, services
from agent_registry.models import PromptLabel, PromptLabelMove
from agent_registry.tests.factories import AgentFactory, prompt_with_versions

pytestmark = pytest.mark.django_db


def test_deleting_a_label_records_where_it_pointed(workspace):
    prompt = prompt_with_versions(
        agent=AgentFactory.create(workspace=workspace), templates=["v1"], labels={1: ["production", "staging"]}
    )
    v1 = prompt.versions.get()

    services.prompt_label_delete(prompt=prompt, label="staging")

    assert list(PromptLabel.objects.values_list("name", flat=True)) == ["production"]
    assert list(
        PromptLabelMove.objects.filter(label="staging").order_by("id").values_list("from_version", "to_version")
    ) == [
        (None, v1.pk),
        (v1.pk, None),
    ]


def test_deleting_an_unknown_label_changes_nothing(workspace):
    prompt = prompt_with_versions(
        agent=AgentFactory.create(workspace=workspace), templates=["v1"], labels={1: ["production"]}
    )

    with pytest.raises(exceptions.PromptLabelNotFound):
        services.prompt_label_delete(prompt=prompt, label="staging")

    assert list(PromptLabel.objects.values_list("name", flat=True)) == ["production"]
    assert PromptLabelMove.objects.count() == 1
