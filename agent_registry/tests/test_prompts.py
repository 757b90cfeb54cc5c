"""The pure prompts module: variables, rendering, validation, diffs."""

from __future__ import annotations

import pytest

from agent_registry.prompts import (
    MissingVariables,
    PromptDiff,
    TemplateError,
    prompt_diff,
    template_placeholders,
    template_render,
    template_validate,
    template_variables,
)

CHAT = [
    {"role": "system", "content": "You help {{product}} users in {{ language }}."},
    {"type": "placeholder", "name": "history"},
    {"role": "user", "content": "{{question}} ({{product}})"},
]


# --- Variables --------------------------------------------------------------------------------


def test_variables_of_a_text_template_in_order_of_first_appearance():
    assert template_variables("Hi {{name}}, your {{ order.id }} ships {{when}}; bye {{name}}.") == [
        "name",
        "order.id",
        "when",
    ]


def test_variables_of_a_chat_template_skip_placeholders():
    assert template_variables(CHAT) == ["product", "language", "question"]


def test_text_without_variables_has_none():
    assert template_variables("No {braces} or { {spaced} } here, nor {{1digit}}.") == []


def test_placeholders_of_a_chat_template():
    assert template_placeholders(CHAT) == ["history"]
    assert template_placeholders("{{history}}") == []


# --- Rendering --------------------------------------------------------------------------------


def test_render_text():
    assert template_render("Hello {{name}}, you are {{ age }}.", {"name": "Ada", "age": 36}) == (
        "Hello Ada, you are 36."
    )


def test_render_text_writes_structured_values_as_json():
    assert template_render("Order: {{order}}", {"order": {"id": 7, "items": ["é"]}}) == (
        'Order: {"id": 7, "items": ["é"]}'
    )


def test_render_text_ignores_extra_variables():
    assert template_render("Hi {{name}}", {"name": "Ada", "unused": 1}) == "Hi Ada"


def test_render_chat_fills_variables_and_placeholders():
    history = [{"role": "user", "content": "Where is my driver?"}, {"role": "assistant", "content": "On the way."}]

    rendered = template_render(
        CHAT, {"product": "Ride", "language": "English", "question": "Refund?"}, {"history": history}
    )

    assert rendered == [
        {"role": "system", "content": "You help Ride users in English."},
        {"role": "user", "content": "Where is my driver?"},
        {"role": "assistant", "content": "On the way."},
        {"role": "user", "content": "Refund? (Ride)"},
    ]


def test_render_chat_with_an_empty_placeholder_drops_it():
    rendered = template_render(CHAT, {"product": "Ride", "language": "Welsh", "question": "Hi"}, {"history": []})

    assert rendered == [
        {"role": "system", "content": "You help Ride users in Welsh."},
        {"role": "user", "content": "Hi (Ride)"},
    ]


def test_render_does_not_change_the_template():
    template = [dict(item) for item in CHAT]

    template_render(template, {"product": "Ride", "language": "English", "question": "Q"}, {"history": []})

    assert template == CHAT


def test_missing_variables_are_all_named():
    with pytest.raises(MissingVariables) as raised:
        template_render(CHAT, {"language": "English"})

    assert raised.value.names == ["history", "product", "question"]
    assert str(raised.value) == "'history, product, question'"


def test_a_value_substituted_in_is_not_rendered_again():
    assert template_render("{{a}} and {{b}}", {"a": "{{b}}", "b": "B"}) == "{{b}} and B"


# --- Validation -------------------------------------------------------------------------------


def test_a_valid_text_template_is_returned_as_is():
    assert template_validate("text", "Hi {{name}}") == "Hi {{name}}"


def test_a_chat_template_is_returned_in_canonical_form():
    template = [
        # Extra keys on a message are kept (Langfuse clients send "type": "chatmessage").
        {"role": "system", "content": "Be brief.", "type": "chatmessage"},
        {"type": "placeholder", "name": "history"},
    ]

    assert template_validate("chat", template) == template


@pytest.mark.parametrize(
    ("prompt_type", "template", "message"),
    [
        ("text", ["not", "a", "string"], "a text prompt's template must be a string"),
        ("text", "x" * 200_001, "a template may hold at most 200,000 characters"),
        ("chat", "a string", "a chat prompt's template must be a non-empty list of messages"),
        ("chat", [], "a chat prompt's template must be a non-empty list of messages"),
        (
            "chat",
            [{"role": "narrator", "content": "Once upon a time"}],
            "message 0.role: Input should be 'system', 'developer', 'user', 'assistant' or 'tool'",
        ),
        (
            "chat",
            [{"role": "user", "content": "ok"}, {"role": "user"}],
            "message 1.content: Field required",
        ),
        (
            "chat",
            [{"type": "placeholder", "name": "has space"}],
            "message 0.name: String should match pattern '^[A-Za-z_][A-Za-z0-9_\\-]*$'",
        ),
        ("chat", ["Hello"], "message 0: Input should be a valid dictionary or instance of ChatMessage"),
        (
            "chat",
            [{"type": "placeholder", "name": "history", "role": "user"}],
            "message 0.role: Extra inputs are not permitted",
        ),
    ],
)
def test_invalid_templates_are_refused_with_a_reason(prompt_type, template, message):
    with pytest.raises(TemplateError) as raised:
        template_validate(prompt_type, template)

    assert str(raised.value) == message


# --- Diff -------------------------------------------------------------------------------------


def test_identical_versions_have_an_empty_diff():
    diff = prompt_diff("Hi {{name}}", {"model": "m"}, "Hi {{name}}", {"model": "m"})

    assert diff == PromptDiff(template=[], config=[])
    assert diff.identical


def test_diff_of_text_and_config():
    diff = prompt_diff(
        "Hello {{name}}.\nBye.",
        {"model": "small", "temperature": 0},
        "Hello {{name}}!\nBye.",
        {"model": "large", "temperature": 0},
        "v1",
        "v2",
    )

    assert diff.template == ["--- v1", "+++ v2", "@@ -1,2 +1,2 @@", "-Hello {{name}}.", "+Hello {{name}}!", " Bye."]
    assert diff.config == [
        "--- v1",
        "+++ v2",
        "@@ -1,4 +1,4 @@",
        " {",
        '-  "model": "small",',
        '+  "model": "large",',
        '   "temperature": 0',
        " }",
    ]
    assert not diff.identical


def test_diff_of_chat_shows_roles_and_placeholders():
    before = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "{{q}}"}]
    after = [
        {"role": "system", "content": "Be brief."},
        {"type": "placeholder", "name": "history"},
        {"role": "user", "content": "{{q}}"},
    ]

    diff = prompt_diff(before, {}, after, {})

    assert diff.template == [
        "--- before",
        "+++ after",
        "@@ -1,4 +1,5 @@",
        " [system]",
        " Be brief.",
        "+[placeholder: history]",
        " [user]",
        " {{q}}",
    ]
    assert diff.config == []
