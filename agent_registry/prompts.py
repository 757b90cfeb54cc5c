"""Prompt templates: variables, rendering and diffs. Pure module, no Django.

A template is either text or chat (a list of messages). Variables are written `{{name}}`, as in
Langfuse, so a prompt moves between the two unchanged. Chat templates may hold placeholders,
`{"type": "placeholder", "name": "history"}`, which rendering replaces with a list of messages.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, TypeAdapter, ValidationError

PromptType = Literal["text", "chat"]

VARIABLE = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_.\-]*)\s*\}\}")


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str = Field(max_length=200_000)


class ChatPlaceholder(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["placeholder"]
    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_\-]*$")


def _chat_item_kind(item: Any) -> str:
    kind = item.get("type") if isinstance(item, dict) else getattr(item, "type", None)
    return "placeholder" if kind == "placeholder" else "message"


# Tagged, so that a bad message is reported as a message, not as a placeholder that lacks its type.
ChatItem = Annotated[
    Annotated[ChatPlaceholder, Tag("placeholder")] | Annotated[ChatMessage, Tag("message")],
    Discriminator(_chat_item_kind),
]
_chat_adapter: TypeAdapter[list[ChatItem]] = TypeAdapter(list[ChatItem])


class TemplateError(ValueError):
    """A template that is not valid for its type."""


class MissingVariables(KeyError):
    """Rendering was asked without values for some variables."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = sorted(set(names))
        super().__init__(", ".join(self.names))


def template_validate(prompt_type: PromptType, template: Any) -> str | list[dict[str, Any]]:
    """Check a template against its type and return it in canonical form."""
    if prompt_type == "text":
        if not isinstance(template, str):
            raise TemplateError("a text prompt's template must be a string")
        if len(template) > 200_000:
            raise TemplateError("a template may hold at most 200,000 characters")
        return template
    if not isinstance(template, list) or not template:
        raise TemplateError("a chat prompt's template must be a non-empty list of messages")
    try:
        items = _chat_adapter.validate_python(template)
    except ValidationError as error:
        first = error.errors()[0]
        # loc is (index, tag, field...); the tag says which kind the item was taken for.
        where = ".".join(str(part) for part in (*first["loc"][:1], *first["loc"][2:]))
        raise TemplateError(f"message {where}: {first['msg']}") from error
    return [item.model_dump(exclude_none=True) for item in items]


def _texts(template: str | list[dict[str, Any]]) -> list[str]:
    if isinstance(template, str):
        return [template]
    return [str(item["content"]) for item in template if "content" in item]


def template_variables(template: str | list[dict[str, Any]]) -> list[str]:
    """Variable names in order of first appearance."""
    seen: dict[str, None] = {}
    for text in _texts(template):
        for match in VARIABLE.finditer(text):
            seen.setdefault(match.group(1), None)
    return list(seen)


def template_placeholders(template: str | list[dict[str, Any]]) -> list[str]:
    if isinstance(template, str):
        return []
    return [str(item["name"]) for item in template if item.get("type") == "placeholder"]


def _substitute(text: str, variables: Mapping[str, Any]) -> str:
    def value(match: re.Match[str]) -> str:
        raw = variables[match.group(1)]
        return raw if isinstance(raw, str) else json.dumps(raw, ensure_ascii=False)

    return VARIABLE.sub(value, text)


def template_render(
    template: str | list[dict[str, Any]],
    variables: Mapping[str, Any],
    placeholders: Mapping[str, list[dict[str, Any]]] | None = None,
) -> str | list[dict[str, Any]]:
    """Fill every variable (and placeholder); missing ones raise MissingVariables, naming them all."""
    placeholders = placeholders or {}
    missing = [name for name in template_variables(template) if name not in variables]
    missing += [name for name in template_placeholders(template) if name not in placeholders]
    if missing:
        raise MissingVariables(missing)
    if isinstance(template, str):
        return _substitute(template, variables)
    rendered: list[dict[str, Any]] = []
    for item in template:
        if item.get("type") == "placeholder":
            rendered.extend(placeholders[str(item["name"])])
        else:
            rendered.append({**item, "content": _substitute(str(item["content"]), variables)})
    return rendered


def _template_lines(template: str | list[dict[str, Any]]) -> list[str]:
    if isinstance(template, str):
        return template.splitlines()
    lines: list[str] = []
    for item in template:
        if item.get("type") == "placeholder":
            lines.append(f"[placeholder: {item['name']}]")
        else:
            lines.append(f"[{item['role']}]")
            lines.extend(str(item["content"]).splitlines())
    return lines


def _config_lines(config: Mapping[str, Any]) -> list[str]:
    return json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False).splitlines()


class PromptDiff(BaseModel):
    template: list[str]
    config: list[str]

    @property
    def identical(self) -> bool:
        return not self.template and not self.config


def prompt_diff(
    before_template: str | list[dict[str, Any]],
    before_config: Mapping[str, Any],
    after_template: str | list[dict[str, Any]],
    after_config: Mapping[str, Any],
    before_name: str = "before",
    after_name: str = "after",
) -> PromptDiff:
    """Unified diffs of the template and of the model configuration."""
    template = difflib.unified_diff(
        _template_lines(before_template),
        _template_lines(after_template),
        before_name,
        after_name,
        lineterm="",
    )
    config = difflib.unified_diff(
        _config_lines(before_config), _config_lines(after_config), before_name, after_name, lineterm=""
    )
    return PromptDiff(template=list(template), config=list(config))
