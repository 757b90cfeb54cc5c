"""OpenAI-compatible model servers, called without litellm: the chat completions and embeddings of a target
named `openai/<model>` with an `api_base` (vLLM, llama.cpp's server, Ollama, LM Studio, a company's own
proxy) go out through one pooled HTTP client per process.

Why: for such a target litellm adds nothing but the request's shape, and it costs about 3 ms of CPU per call
(its argument handling, the openai SDK's models, its own response objects) where an HTTP client and a JSON
parse cost about 0.5 ms; with 2 cores under load that is the gateway's largest share of its own time
(bench/RESULTS.md, bench_gateway). An embedding through litellm also builds an object per float.

What stays with litellm: every other provider (Anthropic, Bedrock, OpenAI itself when no `api_base` is
set, the demo's and the tests' fake providers), every stream, and everything when
`KEEL_OPENAI_COMPATIBLE_DIRECT` is off. The request is the one litellm would send to such a server (the
model without its `openai/` prefix, the messages and OpenAI's own parameters as given), and failures are
raised as the openai exceptions litellm raises, under litellm's class names, so that retries, fallbacks,
the target's health and the trajectory read the same whichever path a call took.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
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


def _post(arguments: Mapping[str, Any], path: str, body: dict[str, Any]) -> Any:
    """POST `body` to the server's `path`; the answer's JSON. Raises ProviderError."""
    headers = {"Content-Type": "application/json"}
    key = arguments.get("api_key") or os.environ.get("OPENAI_API_KEY")
    if key:
        headers["Authorization"] = f"Bearer {key}"
    url = str(arguments["api_base"]).rstrip("/") + path
    try:
        response = _http().post(
            url, content=orjson.dumps(body), headers=headers, timeout=float(arguments.get("timeout") or 600)
        )
    except httpx.TimeoutException as error:
        waited = arguments.get("timeout")
        raise Timeout(f"the model server did not answer in {waited} s ({type(error).__name__})") from None
    except httpx.HTTPError as error:
        raise APIConnectionError(f"the model server could not be reached: {type(error).__name__}: {error}") from None
    if response.status_code >= 400:
        raise _status_error(response)
    try:
        return orjson.loads(response.content)
    except orjson.JSONDecodeError:
        raise APIError(f"the model server's answer is not JSON: {response.text[:ERROR_TEXT_LIMIT]}") from None


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


def chat(
    arguments: Mapping[str, Any], messages: Sequence[Mapping[str, Any]], parameters: Mapping[str, Any]
) -> dict[str, Any]:
    """One chat completion: the server's answer as JSON, each of its choices with a message (there may be
    none). `arguments` are `providers.call_arguments` of the target. Raises ProviderError."""
    body = {**parameters, "model": str(arguments["model"]).removeprefix(PREFIX), "messages": list(messages)}
    answer = _post(arguments, "/chat/completions", body)
    if not isinstance(answer, Mapping) or not isinstance(answer.get("choices", []), list):
        raise APIError(f"Invalid response object: not a chat completion: {str(answer)[:ERROR_TEXT_LIMIT]}")
    for choice in answer.get("choices") or ():
        if not isinstance(choice, Mapping) or not isinstance(choice.get("message"), Mapping):
            raise APIError(f"Invalid response object: a choice without a message: {str(choice)[:ERROR_TEXT_LIMIT]}")
        calls = choice["message"].get("tool_calls") or []
        if not isinstance(calls, list) or not all(
            isinstance(call, Mapping) and isinstance(call.get("function") or {}, Mapping) for call in calls
        ):
            raise APIError(f"Invalid response object: malformed tool calls: {str(calls)[:ERROR_TEXT_LIMIT]}")
    usage = answer.get("usage") or {}
    if not isinstance(usage, Mapping) or not all(
        isinstance(usage.get(name), int | None) for name in ("prompt_tokens", "completion_tokens")
    ):
        raise APIError(f"Invalid response object: malformed usage: {str(usage)[:ERROR_TEXT_LIMIT]}")
    return dict(answer)


def embed(arguments: Mapping[str, Any], texts: Sequence[str]) -> list[list[float]]:
    """One vector per text. Raises ProviderError, also for an answer without them."""
    body = {"model": str(arguments["model"]).removeprefix(PREFIX), "input": list(texts)}
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
