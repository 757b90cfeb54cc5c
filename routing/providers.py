"""Calling model targets: retries, fallbacks and cooldowns, and one shape for what came back. A target on an
OpenAI-compatible server (`openai/<model>` with an `api_base`) is called directly (routing/openai_compatible.py),
every other one through litellm.

A call tries its target up to `1 + max_retries` times on errors that may pass (timeouts, rate limits,
5xx, dropped connections), then each fallback alias in order with its own retries. A target that failed
`failure_threshold` times in a row rests for `cooldown_seconds` (skipped unless nothing else is left).
Errors that will not pass by retrying (a 400, bad credentials) stop at once. When every target failed,
`ProviderFailed` carries each attempt's error, and the gateway answers 502 with them.

litellm is imported on first use: it takes seconds to import and only processes that call models need it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from typing import Any, NamedTuple

import httpx
from django.conf import settings
from django.db.models import F
from django.utils import timezone
from openai import OpenAIError

from config import crypto, write_behind
from config.errors import KeelError
from config.process_cache import TtlCache
from config.redact import redact
from routing import demo_provider, openai_compatible
from routing.models import ModelTarget
from tracing import outbound, pricing
from tracing import selectors as tracing_selectors

logger = logging.getLogger("routing.providers")

# litellm maps every provider's errors onto openai's exception classes; a transport error can still
# escape as httpx's own.
_PROVIDER_ERRORS = (OpenAIError, httpx.HTTPError)

# Parameters of an OpenAI chat request that are passed on to the provider as they came.
PASSTHROUGH_PARAMETERS = (
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "n",
    "logit_bias",
    "user",
    "parallel_tool_calls",
)


class ProviderAnswerEmpty(Exception):
    """The provider answered 200 with no choice in it: a failed attempt like a 5xx, retried and fallen back from."""


class ProviderFailed(KeelError):
    """Every target (with retries and fallbacks) failed; `attempts` says how each one did."""

    status = 502
    code = "provider_error"


@dataclass(frozen=True, slots=True)
class Attempt:
    alias: str
    model: str
    error: str
    status_code: int | None
    retryable: bool


class Reply(NamedTuple):
    """One attempt's answer: its first choice's message (OpenAI's assistant message) and what it used."""

    message: dict[str, Any]
    finish_reason: str
    model: str | None
    input_tokens: int | None
    output_tokens: int | None


class Answered(NamedTuple):
    """The answer to one attempt, and when the attempt started and ended (ns)."""

    reply: Reply
    started_ns: int
    ended_ns: int


@dataclass(slots=True)
class Completion:
    """One model answer in OpenAI's terms, and what it cost."""

    message: dict[str, Any]
    finish_reason: str
    model: str
    alias: str
    input_tokens: int | None
    output_tokens: int | None
    cost_usd: Decimal | None
    started_ns: int
    ended_ns: int
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def latency_ms(self) -> int:
        return max(0, (self.ended_ns - self.started_ns) // 1_000_000)

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        return list(self.message.get("tool_calls") or [])

    @property
    def text(self) -> str:
        content = self.message.get("content")
        return content if isinstance(content, str) else ""


def _status_code(error: Exception) -> int | None:
    code = getattr(error, "status_code", None)
    return code if isinstance(code, int) else None


def _retryable(error: Exception) -> bool:
    import litellm.exceptions as errors

    if isinstance(
        error,
        (
            errors.Timeout,
            errors.RateLimitError,
            errors.ServiceUnavailableError,
            errors.InternalServerError,
            errors.APIConnectionError,
        ),
    ):
        return True
    code = _status_code(error)
    return code is None or code >= 500 or code in (408, 409, 429)


class ApiBaseRefused(OpenAIError):
    """The target's server is at an address Keel does not send to (tracing/outbound.py,
    `OutboundPolicy.for_model_servers`). A provider error like any other: the attempt fails, is recorded on
    the target, and the fallbacks are tried."""


# How long a checked API base stays checked in this process: its host is resolved at most this often,
# not on every call. A name rebound to a forbidden address is caught within this many seconds.
API_BASE_CHECK_SECONDS = 30.0
_api_bases_checked: TtlCache[tuple[str, tuple[str, ...], str], str] = TtlCache(
    seconds=API_BASE_CHECK_SECONDS, size=1024
)


def api_base_check(api_base: str) -> None:
    """Raise ApiBaseRefused when `api_base` is at a forbidden address now. A target saved with a good one
    can still reach here with a bad one: its name may resolve elsewhere since, or it was stored before the
    rule, or it came from the environment."""
    key = (api_base, tuple(settings.KEEL_OUTBOUND_ALLOWED_HOSTS), settings.KEEL_OUTBOUND_RESOLVER)
    verdict = _api_bases_checked.get(key)
    if verdict is None:
        verdict = outbound.OutboundPolicy.for_model_servers().url_refusal(api_base) or ""
        _api_bases_checked.put(key, verdict)
    if verdict:
        raise ApiBaseRefused(f"the model server's address is refused: {verdict}")


def call_arguments(target: ModelTarget) -> dict[str, Any]:
    """What litellm needs to reach the target, its key decrypted. Raises ApiBaseRefused."""
    arguments: dict[str, Any] = {"model": target.model, "timeout": target.timeout_seconds}
    if target.api_base:
        api_base_check(target.api_base)
        arguments["api_base"] = target.api_base
    if target.api_key_encrypted:
        arguments["api_key"] = crypto.decrypt(target.api_key_encrypted)
    return arguments


def _in_cooldown(target: ModelTarget, now: Any) -> bool:
    return target.cooldown_until is not None and target.cooldown_until > now


def targets_in_order(target: ModelTarget) -> list[ModelTarget]:
    """The target and its fallbacks (by alias, same workspace, enabled), those in cooldown last."""
    chain = [target]
    if target.fallbacks:
        by_alias = {
            fallback.alias: fallback
            for fallback in ModelTarget.objects.filter(
                workspace_id=target.workspace_id, alias__in=target.fallbacks, enabled=True
            )
        }
        chain += [by_alias[alias] for alias in target.fallbacks if alias in by_alias and alias != target.alias]
    now = timezone.now()
    return sorted(chain, key=lambda candidate: _in_cooldown(candidate, now))


def _failure_record(target: ModelTarget, error: str) -> None:
    ModelTarget.objects.filter(pk=target.pk).update(
        consecutive_failures=F("consecutive_failures") + 1, last_error=error[:2000]
    )
    target.refresh_from_db(fields=["consecutive_failures"])
    if target.consecutive_failures >= target.failure_threshold:
        until = timezone.now() + timedelta(seconds=target.cooldown_seconds)
        ModelTarget.objects.filter(pk=target.pk).update(cooldown_until=until)
        target.cooldown_until = until
        logger.warning("routing.target_cooldown", extra={"alias": target.alias, "until": until.isoformat()})


def _success_record(target: ModelTarget) -> None:
    # Only a target that had failed is written to: a healthy one costs no query per request.
    if target.consecutive_failures or target.cooldown_until is not None:
        ModelTarget.objects.filter(pk=target.pk).update(consecutive_failures=0, cooldown_until=None)
        target.consecutive_failures = 0
        target.cooldown_until = None


def _assistant_message(content: Any, calls: Sequence[tuple[str, str, str | None]]) -> dict[str, Any]:
    """OpenAI's assistant message from its content and its tool calls as (id, name, arguments)."""
    result: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        result["tool_calls"] = [
            {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments or "{}"}}
            for id_, name, arguments in calls
        ]
    return result


def _litellm_reply(response: Any) -> Reply:
    """litellm's ModelResponse as a Reply. Raises ProviderAnswerEmpty."""
    if not response.choices:
        raise ProviderAnswerEmpty("the provider answered with no choices")
    choice = response.choices[0]
    message = choice.message
    calls = [
        (call.id, call.function.name, call.function.arguments) for call in getattr(message, "tool_calls", None) or ()
    ]
    usage = getattr(response, "usage", None)
    return Reply(
        message=_assistant_message(getattr(message, "content", None), calls),
        finish_reason=choice.finish_reason or "stop",
        model=getattr(response, "model", None),
        input_tokens=getattr(usage, "prompt_tokens", None) if usage is not None else None,
        output_tokens=getattr(usage, "completion_tokens", None) if usage is not None else None,
    )


def _json_reply(answer: Mapping[str, Any]) -> Reply:
    """An OpenAI-compatible server's chat completion JSON as a Reply. Raises ProviderAnswerEmpty."""
    if not answer.get("choices"):
        raise ProviderAnswerEmpty("the provider answered with no choices")
    choice = answer["choices"][0]
    message = choice["message"]
    calls = []
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        calls.append((call.get("id") or "", function.get("name") or "", function.get("arguments")))
    usage = answer.get("usage") or {}
    return Reply(
        message=_assistant_message(message.get("content"), calls),
        finish_reason=choice.get("finish_reason") or "stop",
        model=answer.get("model"),
        input_tokens=usage.get("prompt_tokens"),
        output_tokens=usage.get("completion_tokens"),
    )


def cost_of(
    target: ModelTarget, model: str | None, input_tokens: int | None, output_tokens: int | None
) -> Decimal | None:
    """USD for one call to the target: the workspace's price for the model if it set one, else litellm's."""
    prices = tracing_selectors.model_price_overrides_kept(workspace_id=target.workspace_id)
    for name in (target.model, model):
        if name:
            cost = pricing.generation_cost(name, input_tokens, output_tokens, None, prices)
            if cost is not None:
                return cost
    return None


def _request(
    target: ModelTarget, messages: Sequence[Mapping[str, Any]], parameters: Mapping[str, Any]
) -> dict[str, Any]:
    if target.model.startswith(f"{demo_provider.PROVIDER}/") and settings.KEEL_DEMO_PROVIDER:
        demo_provider.register()
    # Keel retries and falls back itself (num_retries=0). With tools, litellm 1.106 otherwise imports its
    # proxy's MCP gateway, which needs the `mcp` package that only litellm[proxy] installs; Keel never
    # sends MCP tools.
    return {
        **call_arguments(target),
        "messages": list(messages),
        "num_retries": 0,
        "_skip_mcp_handler": True,
        **parameters,
    }


def _attempts_detail(attempts: Sequence[Attempt]) -> str:
    return "; ".join(f"{a.alias}: {a.error}" for a in attempts[-3:])


def _tries(
    target: ModelTarget, *, single_attempt: bool = False, order: Sequence[ModelTarget] | None = None
) -> Iterator[ModelTarget]:
    """The target, then each fallback, each as many times as its retries allow (or the first once). `order`
    is `targets_in_order(target)` when the caller has read it already."""
    if single_attempt:
        yield order[0] if order else target
        return
    for candidate in targets_in_order(target) if order is None else order:
        for _ in range(1 + candidate.max_retries):
            yield candidate


def _target_key(target: ModelTarget | None) -> str:
    if target is None or not target.api_key_encrypted:
        return ""
    try:
        return crypto.decrypt(target.api_key_encrypted)
    except crypto.DecryptionFailed:
        return ""


def _error_text(error: Exception, target: ModelTarget | None) -> str:
    # litellm puts a Python traceback of its own (file paths, source lines) into some errors, after the
    # provider's words; the caller and the trajectory get the words. A provider that refuses a key may
    # quote it (or the Authorization header) in those words: the text goes to the client, the trajectory,
    # the target's health and the logs, so the key is taken out first.
    # A stream that fails is wrapped by litellm in MidStreamFallbackError (for its router's fallbacks), with
    # the provider's error inside, said twice; before the first chunk nothing was mid-stream at all.
    inner = getattr(error, "original_exception", None)
    if type(error).__name__ == "MidStreamFallbackError" and isinstance(inner, Exception):
        error = inner
    text = str(error).split("Traceback (most recent call last)", 1)[0].strip()
    return redact(f"{type(error).__name__}: {text}", _target_key(target))[:1000]


def _attempt_failed(candidate: ModelTarget, error: Exception, attempts: list[Attempt]) -> None:
    """Record a failed attempt; raise ProviderFailed at once when retrying cannot help."""
    retryable = _retryable(error)
    text = _error_text(error, candidate)
    attempts.append(Attempt(candidate.alias, candidate.model, text, _status_code(error), retryable))
    _failure_record(candidate, text)
    if not retryable:
        raise ProviderFailed(
            f"the model provider refused the request: {text}", attempts=[_attempt_json(a) for a in attempts]
        ) from None


def _all_failed(attempts: Sequence[Attempt]) -> ProviderFailed:
    return ProviderFailed(
        f"every model target failed ({len(attempts)} attempts): {_attempts_detail(attempts)}",
        attempts=[_attempt_json(a) for a in attempts],
    )


@contextlib.contextmanager
def _without_litellm_logging() -> Iterator[None]:
    """litellm hands each finished call to a thread of its own that builds its logging payload and prices
    the call again for success callbacks, which Keel has none of: Keel prices and records every call
    itself. That thread then competes with the request for the interpreter lock, so the call is marked
    as litellm marks its own nested calls, which skips the hand-over. With a litellm that lacks the
    marker (the version is pinned in constraints.txt), its logging runs as before."""
    try:
        from litellm._internal_context import is_internal_call
    except ImportError:
        yield
        return
    token = is_internal_call.set(True)
    try:
        yield
    finally:
        is_internal_call.reset(token)


def attempt(candidate: ModelTarget, messages: Sequence[Mapping[str, Any]], parameters: Mapping[str, Any]) -> Answered:
    """One call to one candidate: no retry, no fallback and no database (a speculative call makes it in a
    thread of its own). Raises what litellm raises (or, for an OpenAI-compatible server called directly,
    the same openai errors) and ProviderAnswerEmpty."""
    started = time.time_ns()
    if openai_compatible.serves(candidate.model, candidate.api_base):
        arguments = call_arguments(candidate)
        with write_behind.writer.waiting_on_io():
            answer = openai_compatible.chat(arguments, messages, parameters)
        return Answered(_json_reply(answer), started, time.time_ns())
    import litellm

    with write_behind.writer.waiting_on_io(), _without_litellm_logging():
        response = litellm.completion(**_request(candidate, messages, parameters))
    return Answered(_litellm_reply(response), started, time.time_ns())


@dataclass(slots=True)
class Started:
    """A first attempt already under way (a speculative single call, routing/speculation.py): the order of
    candidates it was made in (`targets_in_order`), and its outcome, which waits for it to end and raises
    what it raised. `taken` once a `completion` has taken the outcome."""

    order: Sequence[ModelTarget]
    outcome: Callable[[], Answered]
    taken: bool = False


def completion(
    *,
    target: ModelTarget,
    messages: Sequence[Mapping[str, Any]],
    parameters: Mapping[str, Any] | None = None,
    single_attempt: bool = False,
    started: Started | None = None,
) -> Completion:
    """One chat completion from the target or its fallbacks (with `single_attempt`, one try on the target
    alone, so its timeout bounds the wall time). With `started`, the first try is the one already under
    way. Raises ProviderFailed."""
    parameters = dict(parameters or {})
    attempts: list[Attempt] = []
    order = started.order if started is not None else None
    for index, candidate in enumerate(_tries(target, single_attempt=single_attempt, order=order)):
        try:
            if index == 0 and started is not None:
                started.taken = True
                reply, started_ns, ended_ns = started.outcome()
            else:
                reply, started_ns, ended_ns = attempt(candidate, messages, parameters)
        except (*_PROVIDER_ERRORS, ProviderAnswerEmpty) as error:
            _attempt_failed(candidate, error, attempts)
            continue
        _success_record(candidate)
        return Completion(
            message=reply.message,
            finish_reason=reply.finish_reason,
            model=candidate.model,
            alias=candidate.alias,
            input_tokens=reply.input_tokens,
            output_tokens=reply.output_tokens,
            cost_usd=cost_of(candidate, reply.model or candidate.model, reply.input_tokens, reply.output_tokens),
            started_ns=started_ns,
            ended_ns=ended_ns,
            attempts=attempts,
        )
    raise _all_failed(attempts)


def _attempt_json(attempt: Attempt) -> dict[str, Any]:
    return {"target": attempt.alias, "error": attempt.error, "status_code": attempt.status_code}


@dataclass(slots=True)
class StreamState:
    """What a stream delivered so far, for the trajectory once it ends."""

    content: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish_reason: str = ""
    model: str = ""
    alias: str = ""
    input_tokens: int | None = None
    output_tokens: int | None = None
    started_ns: int = 0
    ended_ns: int = 0
    error: str = ""
    attempts: list[Attempt] = field(default_factory=list)
    target: ModelTarget | None = None

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.content) or None}
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[index] for index in sorted(self.tool_calls)]
        return message

    def completion(self) -> Completion:
        return Completion(
            message=self.message(),
            finish_reason=self.finish_reason or ("error" if self.error else "stop"),
            model=self.model,
            alias=self.alias,
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            cost_usd=None
            if self.target is None
            else cost_of(self.target, self.model, self.input_tokens, self.output_tokens),
            started_ns=self.started_ns,
            ended_ns=self.ended_ns or time.time_ns(),
            attempts=self.attempts,
        )


def _stream_absorb(state: StreamState, chunk: dict[str, Any]) -> None:
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") or {}
        if delta.get("content"):
            state.content.append(delta["content"])
        for call in delta.get("tool_calls") or ():
            index = call.get("index", 0)
            slot = state.tool_calls.setdefault(
                index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
            )
            slot["id"] = call.get("id") or slot["id"]
            function = call.get("function") or {}
            slot["function"]["name"] += function.get("name") or ""
            slot["function"]["arguments"] += function.get("arguments") or ""
        if choice.get("finish_reason"):
            state.finish_reason = choice["finish_reason"]
    usage = chunk.get("usage")
    if usage:
        state.input_tokens = usage.get("prompt_tokens", state.input_tokens)
        state.output_tokens = usage.get("completion_tokens", state.output_tokens)


def completion_stream(
    *,
    target: ModelTarget,
    messages: Sequence[Mapping[str, Any]],
    parameters: Mapping[str, Any] | None,
    state: StreamState,
) -> Generator[dict[str, Any]]:
    """Chunks of a streamed completion (OpenAI `chat.completion.chunk` dicts), recorded into `state`.

    Opening the stream is retried and falls back like `completion` (raising ProviderFailed before any
    chunk); once chunks flow, a provider error ends the stream: `state.error` says why, and the caller
    closes the stream with an error event.
    """
    request_parameters = {**(parameters or {}), "stream": True, "stream_options": {"include_usage": True}}
    for candidate in _tries(target):
        state.started_ns = time.time_ns()
        try:
            iterator = _stream_open(candidate, messages, request_parameters)
            first = next(iterator, None)
        except _PROVIDER_ERRORS as error:
            _attempt_failed(candidate, error, state.attempts)
            continue
        _success_record(candidate)
        state.model, state.alias, state.target = candidate.model, candidate.alias, candidate
        yield from _stream_chunks(state, first, iterator)
        return
    raise _all_failed(state.attempts)


def _stream_open(
    candidate: ModelTarget, messages: Sequence[Mapping[str, Any]], parameters: Mapping[str, Any]
) -> Iterator[Any]:
    """The candidate's stream of chunks, nothing read yet (litellm's may have sent the request already)."""
    if openai_compatible.serves(candidate.model, candidate.api_base):
        return openai_compatible.chat_stream(call_arguments(candidate), messages, parameters)
    import litellm

    return iter(litellm.completion(**_request(candidate, messages, parameters)))


def _chunk_dict(chunk: Any) -> dict[str, Any]:
    if isinstance(chunk, dict):
        return chunk
    data: dict[str, Any] = json.loads(chunk.model_dump_json(exclude_none=True))
    return data


def _stream_chunks(state: StreamState, first: Any, iterator: Iterator[Any]) -> Iterator[dict[str, Any]]:
    chunk = first
    try:
        while chunk is not None:
            data = _chunk_dict(chunk)
            _stream_absorb(state, data)
            yield data
            chunk = next(iterator, None)
    except _PROVIDER_ERRORS as error:  # a stream cut by the provider
        state.error = _error_text(error, state.target)
        logger.warning("routing.stream_cut", extra={"alias": state.alias, "error": state.error})
    except GeneratorExit:
        # Closed before the end (the client left): close the provider's response, so its connection stops
        # the answer now rather than when it is collected. litellm's synchronous wrapper has no close() of
        # its own but its `completion_stream` has; the direct stream is a generator.
        close = getattr(iterator, "close", None) or getattr(getattr(iterator, "completion_stream", None), "close", None)
        if callable(close):
            with contextlib.suppress(*_PROVIDER_ERRORS, OSError):
                close()
        raise
    finally:
        state.ended_ns = time.time_ns()
