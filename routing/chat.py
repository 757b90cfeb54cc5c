"""The OpenAI chat-completions request as the gateway accepts it, and the response shapes it returns.

Validation is pydantic's; the gateway answers a body that fails it with 400 and OpenAI's error JSON
(`{"error": {"message", "type", "param", "code"}}`), plus Keel's `detail` and `code`. Fields the gateway
does not know are ignored, as OpenAI-compatible servers do. Keel's one extension is `variables`: values
for the agent's production prompt (send it with the openai client's `extra_body`).
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1, max_length=64)
    arguments: str = "{}"


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str = Field(min_length=1, max_length=200)
    type: Literal["function"] = "function"
    function: FunctionCall


# The content part types a user message may hold: OpenAI's, and those litellm passes on to other providers.
# litellm refuses any other type with a bare Exception, which must be a 400 here rather than a 500 there
# (routing/tests/test_gateway.py holds this list within litellm's own).
USER_CONTENT_PART_TYPES = frozenset(
    {"text", "image_url", "input_audio", "audio_url", "document", "file", "video_url", "guarded_text"}
)
# OpenAI's part types carry their content under a key named as the type. litellm fails on an image part
# without one before anything is sent, as a 500 that is retried and counted against the target's health.
_PART_CONTENT_KEYS = frozenset({"text", "image_url", "input_audio", "file"})


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Role
    content: str | list[dict[str, Any]] | None = None
    name: str | None = Field(default=None, max_length=200)
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = Field(default=None, max_length=200)

    @field_validator("content")
    @classmethod
    def _parts_have_a_type(cls, value: Any) -> Any:
        if isinstance(value, list) and not all(isinstance(part.get("type"), str) for part in value):
            raise ValueError("each content part needs a 'type'")
        return value

    @model_validator(mode="after")
    def _user_parts_are_known(self) -> Message:
        if self.role == "user" and isinstance(self.content, list):
            for part in self.content:
                if part["type"] not in USER_CONTENT_PART_TYPES:
                    known = ", ".join(sorted(USER_CONTENT_PART_TYPES))
                    raise ValueError(f"unknown content part type {part['type']!r} in a user message (known: {known})")
                if part["type"] in _PART_CONTENT_KEYS and part.get(part["type"]) is None:
                    raise ValueError(f"a content part of type {part['type']!r} needs {part['type']!r}")
        return self


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["function"]
    function: FunctionDefinition


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str = Field(min_length=1, max_length=300)
    messages: list[Message] = Field(min_length=1, max_length=2000)
    tools: list[Tool] | None = Field(default=None, max_length=128)
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    max_tokens: int | None = Field(default=None, gt=0)
    max_completion_tokens: int | None = Field(default=None, gt=0)
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    n: int | None = Field(default=None, ge=1, le=1)
    # Strict: a string such as "yes" or "false" is a mistake to name, not a truth value to guess.
    stream: bool = Field(default=False, strict=True)
    stream_options: dict[str, Any] | None = None
    user: str | None = Field(default=None, max_length=200)
    parallel_tool_calls: bool | None = Field(default=None, strict=True)
    metadata: dict[str, Any] | None = None
    variables: dict[str, Any] | None = None

    @field_validator("stream_options")
    @classmethod
    def _include_usage_is_boolean(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and not isinstance(value.get("include_usage", False), bool):
            raise ValueError("stream_options.include_usage must be true or false")
        return value

    @field_validator("metadata")
    @classmethod
    def _conversation_id_is_an_id(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        # Taken as the trajectory's session: an object or a list would become its text, one session per shape.
        conversation = (value or {}).get("conversation_id")
        if conversation is not None and (isinstance(conversation, bool) or not isinstance(conversation, str | int)):
            raise ValueError("metadata.conversation_id must be a string")
        return value

    @property
    def usage_streamed(self) -> bool:
        """Whether a stream ends with a chunk of usage (`stream_options.include_usage`), as OpenAI sends it:
        `choices` empty. Unasked, no chunk carries usage: a client reading `choices[0]` of every chunk would
        fail on that one."""
        return bool(self.stream_options and self.stream_options.get("include_usage") is True)

    def messages_json(self) -> list[dict[str, Any]]:
        return [message.model_dump(exclude_none=True) for message in self.messages]

    def tools_json(self) -> list[dict[str, Any]]:
        return [tool.model_dump(exclude_none=True) for tool in self.tools or ()]

    def parameters(self) -> dict[str, Any]:
        """What is passed on to the model as given."""
        names = (
            "tool_choice",
            "response_format",
            "temperature",
            "top_p",
            "max_tokens",
            "max_completion_tokens",
            "stop",
            "seed",
            "presence_penalty",
            "frequency_penalty",
            "parallel_tool_calls",
        )
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}


def error_body(message: str, *, type_: str, code: str, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error JSON, with Keel's `detail` and `code` beside it."""
    return {
        "error": {"message": message, "type": type_, "param": param, "code": code},
        "detail": message,
        "code": code,
    }


def completion_body(
    *,
    completion_id: str,
    model: str,
    message: dict[str, Any],
    finish_reason: str,
    input_tokens: int,
    output_tokens: int,
    keel: dict[str, Any],
) -> dict[str, Any]:
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}],
        "usage": {
            "prompt_tokens": input_tokens,
            "completion_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens,
        },
        "keel": keel,
    }


def chunk_body(*, completion_id: str, model: str, delta: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
    return {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


def usage_chunk_body(*, completion_id: str, model: str, usage: dict[str, Any]) -> dict[str, Any]:
    """The last chunk of a stream whose client asked for usage: no choices, the request's usage."""
    return {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [],
        "usage": usage,
    }
