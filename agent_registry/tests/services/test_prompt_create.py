import pytest

from agent_registry import exceptions, services
from agent_registry.models import Prompt, PromptLabel, PromptLabelMove, PromptVersion
from agent_registry.tests.factories import AgentFactory, UserFactory, prompt_with_versions

pytestmark = pytest.mark.django_db


def test_a_prompt_is_created_with_version_1_and_its_labels(workspace):
    agent = AgentFactory.create(workspace=workspace)
    user = UserFactory.create()

    version = services.prompt_create(
        agent=agent,
        name="ride-support/system",
        type="text",
        template="You help {{product}} riders.",
        config={"model": "small", "temperature": 0},
        description="The system prompt.",
        tags=["support", "rides", "support"],
        commit_message="first",
        labels=["production", "staging"],
        created_by=user,
    )

    prompt = Prompt.objects.get()
    assert (prompt.workspace, prompt.agent, prompt.name, prompt.description, prompt.tags) == (
        workspace,
        agent,
        "ride-support/system",
        "The system prompt.",
        ["rides", "support"],
    )
    assert PromptVersion.objects.get() == version
    assert (version.prompt, version.version, version.type, version.template, version.config) == (
        prompt,
        1,
        "text",
        "You help {{product}} riders.",
        {"model": "small", "temperature": 0},
    )
    assert (version.commit_message, version.created_by) == ("first", user)
    assert sorted(PromptLabel.objects.values_list("name", "version__version")) == [("production", 1), ("staging", 1)]
    moves = PromptLabelMove.objects.order_by("label")
    assert [(move.label, move.from_version, move.to_version_id, move.moved_by_id) for move in moves] == [
        ("production", None, version.pk, user.pk),
        ("staging", None, version.pk, user.pk),
    ]


def test_a_chat_prompt_keeps_its_messages(workspace):
    agent = AgentFactory.create(workspace=workspace)
    template = [{"role": "system", "content": "Be kind."}, {"type": "placeholder", "name": "history"}]

    version = services.prompt_create(agent=agent, name="chat", type="chat", template=template)

    assert PromptVersion.objects.get(pk=version.pk).template == template


def test_names_are_unique_in_a_workspace_but_not_across(workspace, other_workspace):
    prompt_with_versions(agent=AgentFactory.create(workspace=workspace), name="greeting", templates=["v1"])
    second_agent = AgentFactory.create(workspace=workspace)

    with pytest.raises(exceptions.PromptNameTaken):
        services.prompt_create(agent=second_agent, name="greeting", type="text", template="again")

    services.prompt_create(
        agent=AgentFactory.create(workspace=other_workspace), name="greeting", type="text", template="theirs"
    )
    assert sorted(Prompt.objects.values_list("workspace__slug", "agent__workspace__slug")) == [
        ("acme", "acme"),
        ("globex", "globex"),
    ]
    assert PromptVersion.objects.filter(prompt__agent=second_agent).count() == 0


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "must be 1 to 200 characters"),
        ("x" * 201, "must be 1 to 200 characters"),
        ("/greeting", "must not start or end with '/' or contain '//'"),
        ("greeting/", "must not start or end with '/' or contain '//'"),
        ("a//b", "must not start or end with '/' or contain '//'"),
        ("greeting/versions", "must not contain a path segment named diff, labels, render, versions"),
        ("labels", "must not contain a path segment named diff, labels, render, versions"),
        ("why?", "must not contain ?, #, %, \\ or control characters"),
        ("100%", "must not contain ?, #, %, \\ or control characters"),
        ("tab\there", "must not contain ?, #, %, \\ or control characters"),
    ],
)
def test_names_that_would_break_urls_are_refused(workspace, name, message):
    agent = AgentFactory.create(workspace=workspace)

    with pytest.raises(exceptions.PromptInvalid) as raised:
        services.prompt_create(agent=agent, name=name, type="text", template="t")

    assert raised.value.body() == {
        "detail": f"prompt name {message}",
        "code": "prompt_invalid",
        "errors": [{"field": "name", "message": message}],
    }
    assert Prompt.objects.count() == 0


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"type": "audio", "template": "t"}, "type"),
        ({"type": "text", "template": ["not text"]}, "template"),
        ({"type": "chat", "template": "not a list"}, "template"),
    ],
)
def test_an_invalid_template_creates_nothing(workspace, kwargs, field):
    agent = AgentFactory.create(workspace=workspace)

    with pytest.raises(exceptions.PromptInvalid) as raised:
        services.prompt_create(agent=agent, name="greeting", **kwargs)

    assert [error["field"] for error in raised.value.extra["errors"]] == [field]
    assert (Prompt.objects.count(), PromptVersion.objects.count()) == (0, 0)


@pytest.mark.parametrize(("label", "code"), [("latest", "label_invalid"), ("Production", "label_invalid")])
def test_an_invalid_label_creates_nothing(workspace, label, code):
    agent = AgentFactory.create(workspace=workspace)

    with pytest.raises(exceptions.PromptLabelInvalid) as raised:
        services.prompt_create(agent=agent, name="greeting", type="text", template="t", labels=[label])

    assert raised.value.code == code
    assert (Prompt.objects.count(), PromptVersion.objects.count(), PromptLabel.objects.count()) == (0, 0, 0)
