import pytest

from agent_registry import exceptions, services
from agent_registry.models import Prompt, PromptLabel, PromptLabelMove, PromptVersion
from agent_registry.tests.factories import AgentFactory, prompt_with_versions
from routing import services as routing_services
from tracing.tests.factories import TrajectoryFactory

pytestmark = pytest.mark.django_db


def _rows():
    return {
        "prompts": sorted(Prompt.objects.values_list("name", flat=True)),
        "versions": PromptVersion.objects.count(),
        "labels": sorted(PromptLabel.objects.values_list("prompt__name", "name")),
        "moves": PromptLabelMove.objects.count(),
    }


@pytest.fixture
def agent(workspace):
    return AgentFactory.create(workspace=workspace)


@pytest.fixture
def kept(agent):
    """A prompt beside the one deleted, which must stay whole."""
    return prompt_with_versions(agent=agent, name="kept", templates=["k1"], labels={1: ["production"]})


def test_a_prompt_goes_with_its_versions_labels_and_history(agent, kept):
    prompt = prompt_with_versions(agent=agent, name="draft", templates=["v1", "v2"], labels={1: ["staging"]})
    services.prompt_label_move(prompt=prompt, label="staging", version=prompt.versions.get(version=2))

    services.prompt_delete(prompt=prompt)

    assert _rows() == {"prompts": ["kept"], "versions": 1, "labels": [("kept", "production")], "moves": 1}


def test_a_prompt_whose_production_label_was_removed_can_go(agent, kept):
    prompt = prompt_with_versions(agent=agent, name="retired", templates=["v1"], labels={1: ["production"]})
    services.prompt_label_delete(prompt=prompt, label="production")

    services.prompt_delete(prompt=prompt)

    assert _rows()["prompts"] == ["kept"]


def test_the_production_label_keeps_a_prompt(agent, kept):
    before = _rows()

    with pytest.raises(exceptions.PromptInUse) as raised:
        services.prompt_delete(prompt=kept)

    assert raised.value.detail == (
        "prompt 'kept' is in use: the production label points at v1; delete that label first"
    )
    assert _rows() == before


def test_trajectories_that_recorded_a_version_keep_the_prompt(agent, kept):
    prompt = prompt_with_versions(agent=agent, name="recorded", templates=["v1", "v2"])
    for _ in range(2):
        TrajectoryFactory.create(workspace=agent.workspace, agent=agent).prompt_versions.add(
            prompt.versions.get(version=1), prompt.versions.get(version=2)
        )
    before = _rows()

    with pytest.raises(exceptions.PromptInUse) as raised:
        services.prompt_delete(prompt=prompt)

    assert raised.value.code == "prompt_in_use"
    assert raised.value.detail == "prompt 'recorded' is in use: 2 trajectories recorded its versions"
    assert _rows() == before


def test_a_chain_step_that_runs_a_version_keeps_the_prompt(agent, kept):
    prompt = prompt_with_versions(agent=agent, name="step", templates=["Classify: {{request}}"])
    routing_services.chain_steps_set(
        agent=agent, steps=[{"name": "classify", "prompt_version": prompt.versions.get().pk}]
    )
    before = _rows()

    with pytest.raises(exceptions.PromptInUse) as raised:
        services.prompt_delete(prompt=prompt)

    assert raised.value.detail == "prompt 'step' is in use: the router's chain runs its versions in 1 step"
    assert _rows() == before


def test_every_reason_is_named(agent):
    prompt = prompt_with_versions(agent=agent, name="busy", templates=["v1"], labels={1: ["production"]})
    TrajectoryFactory.create(workspace=agent.workspace, agent=agent).prompt_versions.add(prompt.versions.get())

    with pytest.raises(exceptions.PromptInUse) as raised:
        services.prompt_delete(prompt=prompt)

    assert [error["message"] for error in raised.value.extra["errors"]] == [
        "the production label points at v1; delete that label first",
        "1 trajectory recorded its versions",
    ]
