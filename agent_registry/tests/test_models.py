"""What the database itself enforces: constraints, and the immutability of versions."""

import pytest
from django.db import IntegrityError, transaction
from django.db.models import ProtectedError

from agent_registry import services
from agent_registry.models import (
    Agent,
    ApiKey,
    PromptLabel,
    PromptVersion,
    RequirementsVersion,
    User,
)
from agent_registry.tests.factories import (
    AgentFactory,
    MembershipFactory,
    UserFactory,
    agent_with_requirements,
    prompt_with_versions,
    requirements_answers,
)

pytestmark = pytest.mark.django_db


def _refused(update) -> None:
    with pytest.raises(IntegrityError), transaction.atomic():
        update()


# --- Immutable versions -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [{"template": "rewritten"}, {"config": {"model": "other"}}, {"version": 9}, {"commit_message": "oops"}],
)
def test_a_prompt_version_cannot_be_updated(workspace, change):
    prompt = prompt_with_versions(agent=AgentFactory.create(workspace=workspace), templates=["original"])
    version = prompt.versions.get()

    with pytest.raises(IntegrityError) as raised, transaction.atomic():
        PromptVersion.objects.filter(pk=version.pk).update(**change)

    assert "rows of agent_registry_promptversion are immutable" in str(raised.value)
    stored = PromptVersion.objects.get(pk=version.pk)
    assert (stored.version, stored.template, stored.config, stored.commit_message) == (1, "original", {}, "")


def test_saving_a_changed_prompt_version_is_refused(workspace):
    prompt = prompt_with_versions(agent=AgentFactory.create(workspace=workspace), templates=["original"])
    version = prompt.versions.get()
    version.template = "rewritten"

    _refused(version.save)

    assert PromptVersion.objects.get(pk=version.pk).template == "original"


def test_a_requirements_version_cannot_be_updated(workspace):
    agent = agent_with_requirements(workspace=workspace)
    version = RequirementsVersion.objects.get(agent=agent)
    original = version.answers

    _refused(lambda: RequirementsVersion.objects.filter(pk=version.pk).update(answers={}, message="edited"))

    stored = RequirementsVersion.objects.get(pk=version.pk)
    assert (stored.answers, stored.message) == (original, "initial")


def test_a_version_may_lose_its_author_when_the_user_is_deleted(workspace):
    user = UserFactory.create()
    agent = AgentFactory.create(workspace=workspace)
    version = services.prompt_create(agent=agent, name="p", type="text", template="t", created_by=user)
    services.requirements_version_create(agent=agent, answers=requirements_answers(), created_by=user)

    user.delete()

    stored = PromptVersion.objects.get(pk=version.pk)
    assert (stored.created_by, stored.template, stored.version) == (None, "t", 1)
    requirements_version = RequirementsVersion.objects.get()
    assert (requirements_version.created_by, requirements_version.version) == (None, 1)
    assert User.objects.count() == 0


def test_a_version_may_lose_its_key_when_the_key_is_deleted(workspace):
    agent = AgentFactory.create(workspace=workspace)
    api_key, _ = services.apikey_create(workspace=workspace, name="ci", scopes=["write"])
    version = services.prompt_create(agent=agent, name="p", type="text", template="t", created_via_key=api_key)

    api_key.delete()

    assert PromptVersion.objects.get(pk=version.pk).created_via_key is None


def test_clearing_the_author_is_the_only_change_allowed(workspace):
    user, other = UserFactory.create(), UserFactory.create()
    agent = AgentFactory.create(workspace=workspace)
    version = services.prompt_create(agent=agent, name="p", type="text", template="t", created_by=user)

    _refused(lambda: PromptVersion.objects.filter(pk=version.pk).update(created_by=other))
    _refused(lambda: PromptVersion.objects.filter(pk=version.pk).update(created_by=None, template="x"))

    stored = PromptVersion.objects.get(pk=version.pk)
    assert (stored.created_by, stored.template) == (user, "t")


# --- Constraints ------------------------------------------------------------------------------


def test_a_membership_role_must_be_known(workspace):
    with pytest.raises(IntegrityError), transaction.atomic():
        MembershipFactory.create(workspace=workspace, role="emperor")


def test_one_membership_per_user_and_workspace(workspace):
    membership = MembershipFactory.create(workspace=workspace)

    with pytest.raises(IntegrityError), transaction.atomic():
        MembershipFactory.create(workspace=workspace, user=membership.user)


def test_an_agent_slug_is_unique_per_workspace(workspace, other_workspace):
    AgentFactory.create(workspace=workspace, slug="bot")
    AgentFactory.create(workspace=other_workspace, slug="bot")

    with pytest.raises(IntegrityError), transaction.atomic():
        AgentFactory.create(workspace=workspace, slug="bot")

    assert Agent.objects.filter(slug="bot").count() == 2


def test_an_agent_status_must_be_known(workspace):
    agent = AgentFactory.create(workspace=workspace)

    _refused(lambda: Agent.objects.filter(pk=agent.pk).update(status="sleeping"))


@pytest.mark.parametrize("scopes", [[], ["read", "admin"]])
def test_key_scopes_must_be_known_and_not_empty(workspace, scopes):
    api_key, _ = services.apikey_create(workspace=workspace, name="k", scopes=["read"])

    _refused(lambda: ApiKey.objects.filter(pk=api_key.pk).update(scopes=scopes))

    assert ApiKey.objects.get(pk=api_key.pk).scopes == ["read"]


@pytest.mark.parametrize("name", ["latest", "Production", "_private"])
def test_a_label_name_is_checked_by_the_database_too(workspace, name):
    prompt = prompt_with_versions(agent=AgentFactory.create(workspace=workspace), labels={1: ["production"]})

    _refused(lambda: PromptLabel.objects.filter(prompt=prompt).update(name=name))

    assert list(PromptLabel.objects.values_list("name", flat=True)) == ["production"]


def test_a_label_protects_its_version(workspace):
    prompt = prompt_with_versions(agent=AgentFactory.create(workspace=workspace), labels={1: ["production"]})

    with pytest.raises(ProtectedError), transaction.atomic():
        prompt.versions.get().delete()

    assert PromptVersion.objects.count() == 1


def test_readable_names(workspace):
    user = UserFactory.create(username="ada")
    membership = MembershipFactory.create(workspace=workspace, user=user, role="owner")
    agent = agent_with_requirements(workspace=workspace, name="Ride support")
    prompt = prompt_with_versions(agent=agent, name="ride-support/system", labels={1: ["production"]})
    api_key, _ = services.apikey_create(workspace=workspace, name="ci", scopes=["read"])

    assert str(workspace) == "Acme"
    assert str(membership) == "ada in Acme (owner)"
    assert str(agent) == "Ride support"
    assert str(agent.current_requirements) == "Ride support requirements v1"
    assert str(prompt) == "ride-support/system"
    assert str(prompt.versions.get()) == "ride-support/system v1"
    assert str(prompt.labels.get()) == "ride-support/system@production"
    assert str(api_key) == f"ci ({api_key.prefix}…)"
