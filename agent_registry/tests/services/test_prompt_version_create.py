import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

from agent_registry import exceptions, services
from agent_registry.models import PromptLabel, PromptLabelMove, PromptVersion
from agent_registry.tests.factories import AgentFactory, PromptFactory, prompt_with_versions

pytestmark = pytest.mark.django_db


def test_each_publish_takes_the_next_version(workspace):
    prompt = prompt_with_versions(agent=AgentFactory.create(workspace=workspace), templates=["v1"])

    version = services.prompt_version_create(
        prompt=prompt, template="v2 {{name}}", config={"model": "large"}, commit_message="louder"
    )

    assert (version.version, version.type, version.template, version.config, version.commit_message) == (
        2,
        "text",
        "v2 {{name}}",
        {"model": "large"},
        "louder",
    )
    assert list(prompt.versions.values_list("version", "template")) == [(2, "v2 {{name}}"), (1, "v1")]


def test_the_type_carries_over_from_the_last_version(workspace):
    chat = [{"role": "system", "content": "Hi"}]
    prompt = prompt_with_versions(agent=AgentFactory.create(workspace=workspace), type="chat", templates=[chat])

    version = services.prompt_version_create(prompt=prompt, template=[{"role": "user", "content": "Yo"}])

    assert version.type == "chat"


def test_labels_move_to_the_new_version_and_the_move_is_recorded(workspace):
    prompt = prompt_with_versions(
        agent=AgentFactory.create(workspace=workspace), templates=["v1"], labels={1: ["production", "staging"]}
    )
    first = prompt.versions.get()

    second = services.prompt_version_create(prompt=prompt, template="v2", labels=["staging", "staging"])

    assert sorted(PromptLabel.objects.values_list("name", "version__version")) == [("production", 1), ("staging", 2)]
    assert list(PromptLabelMove.objects.values_list("label", "from_version", "to_version")[:1]) == [
        ("staging", first.pk, second.pk)
    ]
    assert PromptLabelMove.objects.count() == 3


def test_an_invalid_template_publishes_nothing(workspace):
    prompt = prompt_with_versions(agent=AgentFactory.create(workspace=workspace), templates=["v1"])

    with pytest.raises(exceptions.PromptInvalid):
        services.prompt_version_create(prompt=prompt, template=["not", "text"], labels=["production"])

    assert list(PromptVersion.objects.values_list("version", flat=True)) == [1]
    assert PromptLabel.objects.count() == 0


def test_the_latest_label_cannot_be_set(workspace):
    prompt = prompt_with_versions(agent=AgentFactory.create(workspace=workspace), templates=["v1"])

    with pytest.raises(exceptions.PromptLabelInvalid):
        services.prompt_version_create(prompt=prompt, template="v2", labels=["latest"])

    assert list(PromptVersion.objects.values_list("version", flat=True)) == [1]


@pytest.mark.django_db(transaction=True)
def test_concurrent_publishes_take_versions_1_to_8(workspace):
    prompt = PromptFactory.create(agent=AgentFactory.create(workspace=workspace), name="busy")
    start = threading.Barrier(8)

    def publish(number: int) -> PromptVersion:
        try:
            start.wait(timeout=10)
            return services.prompt_version_create(prompt=prompt, template=f"from thread {number}")
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=8) as pool:
        # result() re-raises here whatever a thread raised.
        published = [future.result() for future in [pool.submit(publish, number) for number in range(8)]]

    assert sorted(version.version for version in published) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert sorted(prompt.versions.values_list("version", flat=True)) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert sorted(prompt.versions.values_list("template", flat=True)) == [f"from thread {n}" for n in range(8)]
