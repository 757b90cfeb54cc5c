"""OpenAI-compatible model servers, called without litellm: the chat completions (streamed or not) and the
embeddings of a target named `openai/<model>` with an `api_base` (vLLM, llama.cpp's server, Ollama, LM
Studio, a company's own proxy) go out through one pooled HTTP client per process.

Why: for such a target litellm adds nothing but the request's shape, and it costs about 3 ms of CPU per call
(its argument handling, the openai SDK's models, its own response objects) where an HTTP client and a JSON
parse cost about 0.5 ms; that was the largest part of what the gateway added to a model call
(bench/RESULTS.md, bench_gateway). Its stream wrapper costs more per chunk, and an embedding through it
builds an object per float.

What stays with litellm: every other provider (Anthropic, Bedrock, OpenAI itself when no `api_base` is
set, the demo's and the tests' fake providers), and everything when `KEEL_OPENAI_COMPATIBLE_DIRECT` is off.
The request is the one litellm sends to such a server: the model without its `openai/` prefix, the
messages and OpenAI's own parameters as given, the target's key (else `OPENAI_API_KEY`; with neither, no
Authorization header, where litellm refuses to call). Failures are OpenAIErrors named as litellm names
its exceptions, with the HTTP status, so that retries, fallbacks, the target's health and the
trajectory read the same whichever path a call took.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import httpx
import orjson
from django.conf import settings
from openai import OpenAIError

PREFIX = "openai/"
# The most of a provider's error answer kept in the error's text (the caller, the trajectory, the logs).
ERROR_TEXT_LIMIT = 1000


class ProviderError(OpenAIError):
    """A failed call to an OpenAI-compatible server; `status_code` is its HTTP status (None: no answer)."""

    status_code: int | None = None

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


# Named as litellm names them: the text "Timeout: ..." or "RateLimitError: ..." reads the same either way.
class Timeout(ProviderError):
    pass


class APIConnectionError(ProviderError):
    pass


class BadRequestError(ProviderError):
    pass


class AuthenticationError(ProviderError):
    pass


class PermissionDeniedError(ProviderError):
    pass


class NotFoundError(ProviderError):
    pass


class RateLimitError(ProviderError):
    pass


class ServiceUnavailableError(ProviderError):
    pass


class InternalServerError(ProviderError):
    pass


class APIError(ProviderError):
    """Any other error status, or a 200 whose body is not what the endpoint answers."""


_BY_STATUS: dict[int, type[ProviderError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    422: BadRequestError,
    429: RateLimitError,
    503: ServiceUnavailableError,
}


def serves(model: str, api_base: str | None) -> bool:
    """Whether a call to this litellm model string at this API base goes out here rather than through litellm."""
    return bool(api_base) and model.startswith(PREFIX) and settings.KEEL_OPENAI_COMPATIBLE_DIRECT


_lock = threading.Lock()
# One client (its pool of keep-alive connections) per process: a client made before a fork would share its
# sockets with the child.
_client: tuple[int, httpx.Client] | None = None


def _http() -> httpx.Client:
    global _client
    held = _client
    if held is not None and held[0] == os.getpid():
        return held[1]
    with _lock:
        if _client is None or _client[0] != os.getpid():
            limits = httpx.Limits(max_connections=200, max_keepalive_connections=50)
            _client = (os.getpid(), httpx.Client(limits=limits))
        return _client[1]


@contextlib.contextmanager
def _transport_errors(arguments: Mapping[str, Any]) -> Iterator[None]:
    """httpx's errors as ProviderErrors: a timeout, or a server that could not be reached or went away."""
    try:
        yield
    except httpx.TimeoutException as error:
        waited = arguments.get("timeout")
        raise Timeout(f"the model server did not answer in {waited} s ({type(error).__name__})") from None
    except httpx.HTTPError as error:
        raise APIConnectionError(f"the model server could not be reached: {type(error).__name__}: {error}") from None


@contextlib.contextmanager
def _opened(arguments: Mapping[str, Any], path: str, body: dict[str, Any]) -> Iterator[httpx.Response]:
    """POST `body` to the server's `path`, the answer's body not read yet; closed on leaving. Raises
    ProviderError, for an error status too, and turns httpx's errors while the caller reads the body into
    ProviderErrors as well (they are raised at the `yield`, inside `_transport_errors`)."""
    headers = {"Content-Type": "application/json"}
    key = arguments.get("api_key") or os.environ.get("OPENAI_API_KEY")
    if key:
        headers["Authorization"] = f"Bearer {key}"
    url = str(arguments["api_base"]).rstrip("/") + path
    timeout = float(arguments.get("timeout") or 600)
    with (
        _transport_errors(arguments),
        _http().stream("POST", url, content=orjson.dumps(body), headers=headers, timeout=timeout) as response,
    ):
        if response.status_code >= 400:
            response.read()
            raise _status_error(response)
        yield response


def _post(arguments: Mapping[str, Any], path: str, body: dict[str, Any]) -> Any:
    """POST `body` to the server's `path`; the answer's JSON. Raises ProviderError."""
    with _opened(arguments, path, body) as response:
        content = response.read()
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError:
        text = content.decode(errors="replace")
        raise APIError(f"the model server's answer is not JSON: {text[:ERROR_TEXT_LIMIT]}") from None


def _status_error(response: httpx.Response) -> ProviderError:
    text = response.text
    try:
        error = orjson.loads(text).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        error = None
    if isinstance(error, Mapping) and error.get("message"):
        text = str(error["message"])
    elif isinstance(error, str) and error:
        text = error
    status = response.status_code
    kind = _BY_STATUS.get(status) or (InternalServerError if status >= 500 else APIError)
    return kind(f"{status}: {text[:ERROR_TEXT_LIMIT]}", status_code=status)


def _chat_body(
    arguments: Mapping[str, Any], messages: Sequence[Mapping[str, Any]], parameters: Mapping[str, Any]
) -> dict[str, Any]:
    return {**parameters, "model": _model(arguments), "messages": list(messages)}


def _model(arguments: Mapping[str, Any]) -> str:
    return str(arguments["model"]).removeprefix(PREFIX)


def chat(
    arguments: Mapping[str, Any], messages: Sequence[Mapping[str, Any]], parameters: Mapping[str, Any]
) -> dict[str, Any]:
    """One chat completion: the server's answer as JSON, each of its choices with a message (there may be
    none). `arguments` are `providers.call_arguments` of the target. Raises ProviderError."""
    answer = _post(arguments, "/chat/completions", _chat_body(arguments, messages, parameters))
    if not isinstance(answer, Mapping) or not isinstance(answer.get("choices", []), list):
        raise APIError(f"Invalid response object: not a chat completion: {str(answer)[:ERROR_TEXT_LIMIT]}")
    for choice in answer.get("choices") or ():
        if not isinstance(choice, Mapping) or not isinstance(choice.get("message"), Mapping):
            raise APIError(f"Invalid response object: a choice without a message: {str(choice)[:ERROR_TEXT_LIMIT]}")
        calls = choice["message"].get("tool_calls")
        if not _tool_calls_valid(calls):
            raise APIError(f"Invalid response object: malformed tool calls: {str(calls)[:ERROR_TEXT_LIMIT]}")
    usage = answer.get("usage")
    if not _usage_valid(usage):
        raise APIError(f"Invalid response object: malformed usage: {str(usage)[:ERROR_TEXT_LIMIT]}")
    return dict(answer)


def chat_stream(
    arguments: Mapping[str, Any], messages: Sequence[Mapping[str, Any]], parameters: Mapping[str, Any]
) -> Iterator[dict[str, Any]]:
    """The chunks of a streamed chat completion (`chat.completion.chunk` JSON, as the server sends them) until
    the server's `[DONE]`. Nothing is sent before the first chunk is asked for; then a failure to open the
    stream raises ProviderError before any chunk, and a stream cut or garbled later raises it mid-way.
    Closing the iterator closes the connection. `parameters` carry `stream` (and `stream_options`)."""
    body = _chat_body(arguments, messages, parameters)
    with _opened(arguments, "/chat/completions", body) as response:
        for line in response.iter_lines():
            if not line.startswith("data:"):
                continue  # blank separators, comments (": keep-alive") and event names
            data = line[len("data:") :].strip()
            if data == "[DONE]":
                return
            yield _stream_chunk(data)


def _stream_chunk(data: str) -> dict[str, Any]:
    try:
        chunk = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise APIError(f"the model server's stream is not JSON: {data[:ERROR_TEXT_LIMIT]}") from None
    if isinstance(chunk, dict) and chunk.get("error"):
        error = chunk["error"]
        said = error.get("message") if isinstance(error, Mapping) else error
        raise APIError(f"the model server's stream ended with an error: {str(said)[:ERROR_TEXT_LIMIT]}")
    choices = chunk.get("choices") if isinstance(chunk, dict) else None
    if not isinstance(chunk, dict) or not isinstance(choices or [], list) or not _usage_valid(chunk.get("usage")):
        raise APIError(f"Invalid response object: not a chat completion chunk: {data[:ERROR_TEXT_LIMIT]}")
    if not all(_delta_valid(choice) for choice in choices or ()):
        raise APIError(f"Invalid response object: a malformed chunk choice: {data[:ERROR_TEXT_LIMIT]}")
    return chunk


def _usage_valid(usage: Any) -> bool:
    """No usage, or token counts that are whole numbers where given."""
    if usage is None:
        return True
    return isinstance(usage, Mapping) and all(
        isinstance(usage.get(name), int | None) for name in ("prompt_tokens", "completion_tokens")
    )


def _tool_calls_valid(calls: Any) -> bool:
    """No tool calls, or a list of them (or of their streamed pieces) whose function's name and arguments
    are text where given."""
    if calls is None:
        return True
    if not isinstance(calls, list):
        return False
    for call in calls:
        if not isinstance(call, Mapping):
            return False
        function = call.get("function") or {}
        if not isinstance(function, Mapping) or not all(
            isinstance(function.get(name), str | None) for name in ("name", "arguments")
        ):
            return False
    return True


def _delta_valid(choice: Any) -> bool:
    """Whether a streamed choice has the shape the stream's reader takes apart: text pieces and tool call
    pieces."""
    delta = choice.get("delta") if isinstance(choice, Mapping) else None
    if delta is None:
        return isinstance(choice, Mapping)
    return (
        isinstance(delta, Mapping)
        and isinstance(delta.get("content"), str | None)
        and _tool_calls_valid(delta.get("tool_calls"))
    )


def embed(arguments: Mapping[str, Any], texts: Sequence[str]) -> list[list[float]]:
    """One vector per text. Raises ProviderError, also for an answer without them."""
    body = {"model": _model(arguments), "input": list(texts)}
    answer = _post(arguments, "/embeddings", body)
    data = answer.get("data") if isinstance(answer, Mapping) else None
    if not isinstance(data, list) or len(data) != len(texts):
        raise APIError(f"Invalid response object: not {len(texts)} embeddings: {str(answer)[:ERROR_TEXT_LIMIT]}")
    vectors = []
    for item in sorted(data, key=lambda entry: entry.get("index", 0) if isinstance(entry, Mapping) else 0):
        values = item.get("embedding") if isinstance(item, Mapping) else None
        if not isinstance(values, list) or not values:
            raise APIError("Invalid response object: an embedding without a vector")
        vectors.append([float(value) for value in values])
    return vectors
