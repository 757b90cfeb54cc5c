import pytest

from agent_registry import exceptions, services
from agent_registry.tests.factories import AgentFactory, prompt_with_versions

pytestmark = pytest.mark.django_db


def test_a_version_renders_with_its_variables(workspace):
    prompt = prompt_with_versions(agent=AgentFactory.create(workspace=workspace), templates=["Hi {{name}}"])

    assert services.prompt_version_render(version=prompt.versions.get(), variables={"name": "Ada"}) == "Hi Ada"


def test_missing_variables_are_named_as_fields(workspace):
    template = [{"role": "system", "content": "{{tone}} {{product}}"}, {"type": "placeholder", "name": "history"}]
    prompt = prompt_with_versions(agent=AgentFactory.create(workspace=workspace), type="chat", templates=[template])

    with pytest.raises(exceptions.PromptVariablesMissing) as raised:
        services.prompt_version_render(version=prompt.versions.get(), variables={"tone": "warm"})

    assert raised.value.body() == {
        "detail": "missing values for: history, product",
        "code": "missing_variables",
        "errors": [
            {"field": "variables.history", "message": "required"},
            {"field": "variables.product", "message": "required"},
        ],
    }
