import pytest

from agent_registry import services
from agent_registry.models import Agent, ApiKey, Prompt, PromptLabel, PromptVersion, RequirementsVersion
from agent_registry.tests.factories import AgentFactory, agent_with_requirements, prompt_with_versions
from routing import services as routing_services
from routing.models import ChainStep

pytestmark = pytest.mark.django_db


def test_an_agent_goes_with_its_requirements_prompts_versions_and_labels(workspace, other_workspace):
    agent = agent_with_requirements(workspace=workspace)
    prompt_with_versions(agent=agent, templates=["v1", "v2"], labels={1: ["production"], 2: ["staging"]})
    kept = agent_with_requirements(workspace=other_workspace, slug=agent.slug)
    prompt_with_versions(agent=kept, templates=["v1"], labels={1: ["production"]})

    services.agent_delete(agent=agent)

    assert list(Agent.objects.all()) == [kept]
    assert list(RequirementsVersion.objects.values_list("agent", flat=True)) == [kept.pk]
    assert list(Prompt.objects.values_list("agent", flat=True)) == [kept.pk]
    assert list(PromptVersion.objects.values_list("prompt__agent", flat=True)) == [kept.pk]
    assert list(PromptLabel.objects.values_list("prompt__agent", "name")) == [(kept.pk, "production")]


def test_a_key_limited_to_the_agent_alone_is_revoked_not_widened(workspace):
    agent = AgentFactory.create(workspace=workspace)
    other = AgentFactory.create(workspace=workspace)
    only_this, _ = services.apikey_create(workspace=workspace, name="only", scopes=["read"], agents=[agent])
    both, _ = services.apikey_create(workspace=workspace, name="both", scopes=["read"], agents=[agent, other])
    only_other, _ = services.apikey_create(workspace=workspace, name="other", scopes=["read"], agents=[other])
    everyone, _ = services.apikey_create(workspace=workspace, name="all", scopes=["read"])

    services.agent_delete(agent=agent)

    # Without its agent a key would be limited to none, which means every agent: it must stop working.
    assert ApiKey.objects.get(pk=only_this.pk).revoked_at is not None
    assert {key.name: key.revoked_at is None for key in ApiKey.objects.all()} == {
        "only": False,
        "both": True,
        "other": True,
        "all": True,
    }
    assert list(ApiKey.objects.get(pk=both.pk).agents.all()) == [other]
    assert list(ApiKey.objects.get(pk=only_other.pk).agents.all()) == [other]
    assert list(ApiKey.objects.get(pk=everyone.pk).agents.all()) == []


def test_an_agent_whose_chain_runs_its_prompt_versions_goes_with_its_chain(workspace):
    agent = AgentFactory.create(workspace=workspace)
    prompt = prompt_with_versions(agent=agent, name="step", templates=["Classify the request."])
    routing_services.chain_steps_set(
        agent=agent, steps=[{"name": "classify", "prompt_version": prompt.versions.get().pk}]
    )

    services.agent_delete(agent=agent)

    assert not Agent.objects.exists()
    assert not ChainStep.objects.exists()
    assert not PromptVersion.objects.exists()
