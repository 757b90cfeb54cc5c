"""A fake litellm provider for gateway tests, registered as `fake-gateway/<name>`: scripted answers per
model name (text, tool calls, errors, a stream cut after N chunks), or an echo of the last user message
when nothing is scripted. It keeps every request it received. Nothing here reaches a network."""

from __future__ import annotations

import copy
import json
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from litellm.llms.custom_llm import CustomLLM
from litellm.types.llms.openai import ChatCompletionToolCallChunk, ChatCompletionToolCallFunctionChunk
from litellm.types.utils import (
    ChatCompletionMessageToolCall,
    Choices,
    Function,
    GenericStreamingChunk,
    Message,
    ModelResponse,
    Usage,
)

FAKE_PROVIDER = "fake-gateway"


@dataclass(frozen=True)
class Reply:
    content: str | None = None
    tool_calls: tuple[tuple[str, str, str], ...] = ()  # (id, name, arguments JSON)
    input_tokens: int = 40
    output_tokens: int = 8


@dataclass(frozen=True)
class Cut:
    """A stream that delivers `after` chunks of `content` and then breaks."""

    content: str
    after: int


def say(text: str, **kwargs: Any) -> Reply:
    return Reply(content=text, **kwargs)


def call(name: str, arguments: dict[str, Any], call_id: str = "call-1") -> Reply:
    return Reply(tool_calls=((call_id, name, json.dumps(arguments)),))


@dataclass
class Received:
    model: str
    messages: list[dict[str, Any]]
    params: dict[str, Any]
    stream: bool


def _last_user(messages: list[Any]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else json.dumps(content)
    return ""


class FakeGatewayLLM(CustomLLM):
    def __init__(self) -> None:
        super().__init__()
        self.scripts: dict[str, list[Reply | Cut | Exception]] = defaultdict(list)
        self.received: list[Received] = []
        self.streams_abandoned = 0  # streams closed by the caller before their end

    def script(self, model: str, *replies: Reply | Cut | Exception) -> None:
        self.scripts[model.removeprefix(f"{FAKE_PROVIDER}/")].extend(replies)

    def _next(self, model: str, messages: list[Any], kwargs: dict[str, Any], stream: bool) -> Reply | Cut | Exception:
        name = model.removeprefix(f"{FAKE_PROVIDER}/")
        params = dict(kwargs.get("optional_params") or {})
        self.received.append(Received(model=name, messages=copy.deepcopy(messages), params=params, stream=stream))
        if self.scripts[name]:
            return self.scripts[name].pop(0)
        return Reply(content=f"{name} answers: {_last_user(messages)}")

    def completion(self, model: str, messages: list[Any], *args: Any, **kwargs: Any) -> ModelResponse:
        reply = self._next(model, messages, kwargs, stream=False)
        if isinstance(reply, Exception):
            raise reply
        if isinstance(reply, Cut):
            reply = Reply(content=reply.content)
        calls = [
            ChatCompletionMessageToolCall(id=call_id, type="function", function=Function(name=name, arguments=text))
            for call_id, name, text in reply.tool_calls
        ]
        return ModelResponse(
            model=model,
            choices=[
                Choices(
                    index=0,
                    finish_reason="tool_calls" if calls else "stop",
                    message=Message(role="assistant", content=reply.content, tool_calls=calls or None),
                )
            ],
            usage=Usage(
                prompt_tokens=reply.input_tokens,
                completion_tokens=reply.output_tokens,
                total_tokens=reply.input_tokens + reply.output_tokens,
            ),
        )

    def streaming(self, model: str, messages: list[Any], *args: Any, **kwargs: Any) -> Iterator[GenericStreamingChunk]:
        reply = self._next(model, messages, kwargs, stream=True)
        if isinstance(reply, Exception):
            raise reply
        try:
            yield from self._chunks(reply)
        except GeneratorExit:
            self.streams_abandoned += 1
            raise

    def _chunks(self, reply: Reply | Cut) -> Iterator[GenericStreamingChunk]:
        text = reply.content or ""
        words = text.split(" ")
        limit = reply.after if isinstance(reply, Cut) else len(words)
        for index, word in enumerate(words[:limit]):
            yield GenericStreamingChunk(
                text=word if index == 0 else f" {word}",
                tool_use=None,
                is_finished=False,
                finish_reason="",
                usage=None,
                index=0,
            )
        if isinstance(reply, Cut):
            raise ConnectionResetError("the fake provider cut the stream")
        calls = reply.tool_calls
        # Each call as providers stream it: the id and name first, then the arguments in two pieces.
        for position, (call_id, name, arguments) in enumerate(calls):
            half = len(arguments) // 2
            for piece in (
                ChatCompletionToolCallChunk(
                    id=call_id,
                    type="function",
                    function=ChatCompletionToolCallFunctionChunk(name=name, arguments=arguments[:half]),
                    index=position,
                ),
                ChatCompletionToolCallChunk(
                    id=None,
                    type="function",
                    function=ChatCompletionToolCallFunctionChunk(name=None, arguments=arguments[half:]),
                    index=position,
                ),
            ):
                yield GenericStreamingChunk(
                    text="",
                    tool_use=piece,
                    is_finished=False,
                    finish_reason="",
                    usage=None,
                    index=0,
                )
        yield GenericStreamingChunk(
            text="",
            tool_use=None,
            is_finished=True,
            finish_reason="tool_calls" if calls else "stop",
            usage={"prompt_tokens": 40, "completion_tokens": len(words), "total_tokens": 40 + len(words)},
            index=0,
        )


@contextmanager
def fake_gateway_provider() -> Iterator[FakeGatewayLLM]:
    import litellm

    fake = FakeGatewayLLM()
    previous = litellm.custom_provider_map
    litellm.custom_provider_map = [*previous, {"provider": FAKE_PROVIDER, "custom_handler": fake}]
    try:
        yield fake
    finally:
        litellm.custom_provider_map = previous
