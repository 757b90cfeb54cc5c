import pytest

from agent_registry import exceptions, services
from agent_registry.models import PromptLabel, PromptLabelMove
from agent_registry.tests.factories import AgentFactory, UserFactory, prompt_with_versions

pytestmark = pytest.mark.django_db


@pytest.fixture
def prompt(workspace):
    return prompt_with_versions(agent=AgentFactory.create(workspace=workspace), templates=["v1", "v2", "v3"])


def _history(prompt):
    return [
        (move.label, getattr(move.from_version, "version", None), getattr(move.to_version, "version", None))
        for move in PromptLabelMove.objects.filter(prompt=prompt).order_by("id")
    ]


def test_deploy_then_roll_back_records_every_move(prompt):
    user = UserFactory.create()
    v1, v2 = prompt.versions.get(version=1), prompt.versions.get(version=2)

    services.prompt_label_move(prompt=prompt, label="production", version=v1, moved_by=user)
    services.prompt_label_move(prompt=prompt, label="production", version=v2, moved_by=user)
    label = services.prompt_label_move(prompt=prompt, label="production", version=v1, moved_by=user)

    assert label.version == v1
    assert list(PromptLabel.objects.values_list("name", "version__version")) == [("production", 1)]
    assert _history(prompt) == [("production", None, 1), ("production", 1, 2), ("production", 2, 1)]
    assert set(PromptLabelMove.objects.values_list("moved_by", flat=True)) == {user.pk}


def test_moving_a_label_to_where_it_is_records_nothing(prompt):
    v2 = prompt.versions.get(version=2)
    services.prompt_label_move(prompt=prompt, label="staging", version=v2)

    services.prompt_label_move(prompt=prompt, label="staging", version=v2)

    assert _history(prompt) == [("staging", None, 2)]


@pytest.mark.parametrize("label", ["latest", "Production", "-dash", "has space", "x" * 65])
def test_reserved_and_malformed_labels_are_refused(prompt, label):
    with pytest.raises(exceptions.PromptLabelInvalid):
        services.prompt_label_move(prompt=prompt, label=label, version=prompt.versions.get(version=1))

    assert (PromptLabel.objects.count(), PromptLabelMove.objects.count()) == (0, 0)


def test_a_version_of_another_prompt_is_refused(workspace, other_workspace, prompt):
    services.prompt_label_move(prompt=prompt, label="production", version=prompt.versions.get(version=1))
    foreign = prompt_with_versions(agent=AgentFactory.create(workspace=other_workspace), templates=["theirs"])

    with pytest.raises(exceptions.PromptVersionNotFound):
        services.prompt_label_move(prompt=prompt, label="production", version=foreign.versions.get())

    assert list(PromptLabel.objects.values_list("prompt", "name", "version__version")) == [(prompt.pk, "production", 1)]
    assert _history(prompt) == [("production", None, 1)]
    assert _history(foreign) == []
