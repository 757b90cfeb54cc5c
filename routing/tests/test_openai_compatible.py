"""Targets on an OpenAI-compatible server, called without litellm (routing/openai_compatible.py).

The server here is a real HTTP server on the loopback interface that records each request (path, headers,
JSON body) and answers from a script. The central tests make the same call twice, once through litellm
(KEEL_OPENAI_COMPATIBLE_DIRECT off) and once directly, and compare what the server received and what the
caller got back.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

import pytest

from config import crypto
from routing import cache, openai_compatible, providers
from routing.models import ModelTarget
from tracing.models import ModelPriceOverride

KEY = "sk-compatible-server"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Where is my ride?"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "trip_status",
            "description": "The status of a trip.",
            "parameters": {"type": "object", "properties": {"trip": {"type": "string"}}, "required": ["trip"]},
        },
    }
]


@dataclass
class Received:
    path: str
    authorization: str | None
    body: dict[str, Any]


@dataclass
class Server:
    """What the server answers next (status, JSON or raw bytes), in order; then a plain answer."""

    url: str = ""
    script: list[tuple[int, Any]] = field(default_factory=list)
    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next(self, received: Received) -> tuple[int, Any]:
        with self.lock:
            self.received.append(received)
            if self.script:
                return self.script.pop(0)
        if received.path.endswith("/embeddings"):
            inputs = received.body["input"]
            return 200, {
                "object": "list",
                "data": [
                    {"object": "embedding", "index": index, "embedding": [float(len(text)), 1.0, 0.5]}
                    for index, text in enumerate(inputs)
                ],
                "model": received.body["model"],
                "usage": {"prompt_tokens": 3, "total_tokens": 3},
            }
        return 200, completion_json("On its way.")


def completion_json(content: str | None, *, tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "qwen2.5-7b-instruct",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop"}],
        "usage": {"prompt_tokens": 1000, "completion_tokens": 200, "total_tokens": 1200},
    }


@dataclass
class Events:
    """A streamed answer: each event's data (a chunk as JSON, or raw text), `[DONE]` after them unless
    `done` is off, `pause` seconds before each event after the first; `broken` is set once a write fails
    (the client closed the connection)."""

    data: list[Any]
    done: bool = True
    pause: float = 0.0
    broken: threading.Event = field(default_factory=threading.Event)


def chunk_json(
    delta: dict[str, Any], finish_reason: str | None = None, usage: dict[str, int] | None = None
) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "qwen2.5-7b-instruct",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}] if usage is None else [],
        **({"usage": usage} if usage else {}),
    }


TOOL_CALL_STREAM = [
    chunk_json({"role": "assistant", "content": "Let me "}),
    chunk_json({"content": "check."}),
    chunk_json(
        {
            "tool_calls": [
                {"index": 0, "id": "call_5", "type": "function", "function": {"name": "trip_status", "arguments": ""}}
            ]
        }
    ),
    chunk_json({"tool_calls": [{"index": 0, "function": {"arguments": '{"trip": '}}]}),
    chunk_json({"tool_calls": [{"index": 0, "function": {"arguments": '"T5"}'}}]}),
    chunk_json({}, finish_reason="tool_calls"),
    chunk_json({}, usage={"prompt_tokens": 30, "completion_tokens": 9, "total_tokens": 39}),
]


@pytest.fixture
def server() -> Iterator[Server]:
    state = Server()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            status, answer = state.next(Received(self.path, self.headers.get("Authorization"), body))
            if isinstance(answer, Events):
                self._stream(answer)
                return
            data = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _stream(self, events: Events) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            lines = [event if isinstance(event, str) else json.dumps(event) for event in events.data]
            for number, line in enumerate([*lines, "[DONE]"] if events.done else lines):
                if number and events.pause:
                    time.sleep(events.pause)
                try:
                    self.wfile.write(f"data: {line}\n\n".encode())
                    self.wfile.flush()
                except OSError:
                    events.broken.set()
                    return

        def log_message(self, *args: Any) -> None:
            pass

    http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    http.daemon_threads = True
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{http.server_address[1]}/v1"
    try:
        yield state
    finally:
        http.shutdown()
        http.server_close()


@pytest.fixture
def target(workspace, server) -> ModelTarget:
    return ModelTarget.objects.create(
        workspace=workspace,
        alias="local",
        model="openai/qwen2.5-7b-instruct",
        api_base=server.url,
        api_key_encrypted=crypto.encrypt(KEY),
        max_retries=1,
    )


@pytest.fixture
def litellm_refused(monkeypatch) -> None:
    """litellm's completion and embedding fail the test if they are called."""
    import litellm

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("litellm was called")

    monkeypatch.setattr(litellm, "completion", refuse)
    monkeypatch.setattr(litellm, "embedding", refuse)


def _both_ways(settings, call) -> tuple[Any, Any]:
    settings.KEEL_OPENAI_COMPATIBLE_DIRECT = False
    through_litellm = call()
    settings.KEEL_OPENAI_COMPATIBLE_DIRECT = True
    direct = call()
    return through_litellm, direct


def _completion_fields(completion: providers.Completion) -> tuple[Any, ...]:
    return (
        completion.message,
        completion.finish_reason,
        completion.model,
        completion.alias,
        completion.input_tokens,
        completion.output_tokens,
        completion.cost_usd,
        [(attempt.alias, attempt.status_code, attempt.retryable) for attempt in completion.attempts],
    )


def test_the_server_receives_what_litellm_would_send_and_the_caller_gets_what_litellm_would_return(
    target, server, settings, workspace
):
    ModelPriceOverride.objects.create(
        workspace=workspace,
        model="openai/qwen2.5-7b-instruct",
        input_usd_per_million=Decimal("2"),
        output_usd_per_million=Decimal("10"),
    )
    calls = [{"id": "call_7", "type": "function", "function": {"name": "trip_status", "arguments": '{"trip": "T9"}'}}]
    server.script = [(200, completion_json(None, tool_calls=calls)), (200, completion_json(None, tool_calls=calls))]
    parameters = {"temperature": 0.2, "max_tokens": 64, "seed": 7, "tools": TOOLS, "tool_choice": "auto"}

    through_litellm, direct = _both_ways(
        settings, lambda: providers.completion(target=target, messages=MESSAGES, parameters=parameters)
    )

    assert _completion_fields(direct) == _completion_fields(through_litellm)
    assert direct.tool_calls == calls
    assert direct.cost_usd == Decimal("0.004")  # 1,000 in at $2/M + 200 out at $10/M
    sent_by_litellm, sent_directly = server.received
    assert sent_directly.path == sent_by_litellm.path == "/v1/chat/completions"
    assert sent_directly.authorization == sent_by_litellm.authorization == f"Bearer {KEY}"
    assert sent_directly.body == {
        "model": "qwen2.5-7b-instruct",
        "messages": MESSAGES,
        "temperature": 0.2,
        "max_tokens": 64,
        "seed": 7,
        "tools": TOOLS,
        "tool_choice": "auto",
    }
    # litellm may add fields of its own (none of them about the request's meaning); it sends no other values.
    assert {key: sent_by_litellm.body[key] for key in sent_directly.body} == sent_directly.body


def test_a_call_to_such_a_server_does_not_go_through_litellm(target, server, litellm_refused):
    completion = providers.completion(target=target, messages=MESSAGES)

    assert completion.text == "On its way."
    assert (completion.input_tokens, completion.output_tokens) == (1000, 200)
    assert len(server.received) == 1


def test_with_the_setting_off_litellm_calls_it(target, server, settings, litellm_refused):
    settings.KEEL_OPENAI_COMPATIBLE_DIRECT = False

    with pytest.raises(AssertionError, match="litellm was called"):
        providers.completion(target=target, messages=MESSAGES)

    assert server.received == []


def test_other_targets_stay_with_litellm(workspace, settings):
    assert openai_compatible.serves("openai/qwen", "http://127.0.0.1:8000/v1")
    assert not openai_compatible.serves("openai/gpt-4o", None)  # OpenAI itself, with litellm's settings
    assert not openai_compatible.serves("anthropic/claude-3-5-sonnet", "http://127.0.0.1:8000")
    assert not openai_compatible.serves("hosted_vllm/qwen", "http://127.0.0.1:8000/v1")
    settings.KEEL_OPENAI_COMPATIBLE_DIRECT = False
    assert not openai_compatible.serves("openai/qwen", "http://127.0.0.1:8000/v1")


@pytest.mark.parametrize(
    ("status", "error", "kind", "retried"),
    [
        pytest.param(429, {"error": {"message": "slow down"}}, "RateLimitError", True, id="429"),
        pytest.param(500, {"error": {"message": "worker crashed"}}, "InternalServerError", True, id="500"),
        pytest.param(503, {"error": {"message": "overloaded"}}, "ServiceUnavailableError", True, id="503"),
        pytest.param(422, {"error": {"message": "unknown field"}}, "BadRequestError", False, id="422"),
        pytest.param(400, {"error": {"message": "max_tokens is too large"}}, "BadRequestError", False, id="400"),
        pytest.param(401, {"error": {"message": "bad key"}}, "AuthenticationError", False, id="401"),
        pytest.param(404, {"detail": "Not Found"}, "NotFoundError", False, id="404-not-openai-shaped"),
    ],
)
def test_error_answers_are_retried_or_refused_as_through_litellm(
    target, server, settings, status, error, kind, retried
):
    server.script = [(status, error)] * 4  # two calls of up to two attempts each

    def call() -> tuple[str, list[Any]]:
        try:
            providers.completion(target=target, messages=MESSAGES)
        except providers.ProviderFailed as failed:
            return failed.detail, failed.extra["attempts"]
        raise AssertionError("the call did not fail")

    (litellm_detail, litellm_attempts), (detail, attempts) = _both_ways(settings, call)

    assert [a["status_code"] for a in attempts] == [a["status_code"] for a in litellm_attempts]
    assert [a["status_code"] for a in attempts] == [status] * (2 if retried else 1)
    assert attempts[0]["error"].startswith(f"{kind}: ")
    assert litellm_attempts[0]["error"].startswith(f"{kind}: ")
    said = str(error.get("error", {}).get("message") or error["detail"])
    assert said in detail
    assert said in litellm_detail
    target.refresh_from_db()
    assert target.consecutive_failures == 2 * len(attempts)


def test_a_key_the_server_quotes_back_is_taken_out_of_the_error(target, server):
    server.script = [(401, {"error": {"message": f"Incorrect API key provided: {KEY}"}})]

    with pytest.raises(providers.ProviderFailed) as failed:
        providers.completion(target=target, messages=MESSAGES)

    assert KEY not in json.dumps(failed.value.extra)
    assert KEY not in failed.value.detail
    target.refresh_from_db()
    assert KEY not in target.last_error


def test_a_server_that_is_down_is_a_retryable_connection_error(workspace):
    down = ModelTarget.objects.create(
        workspace=workspace, alias="down", model="openai/qwen", api_base="http://127.0.0.1:9/v1", max_retries=1
    )

    with pytest.raises(providers.ProviderFailed) as failed:
        providers.completion(target=down, messages=MESSAGES)

    attempts = failed.value.extra["attempts"]
    assert len(attempts) == 2
    assert all(attempt["error"].startswith("APIConnectionError: ") for attempt in attempts)


def test_an_answer_that_is_not_json_or_has_no_choices_fails_the_attempt_and_the_retry_answers(target, server):
    server.script = [(200, b"<html>502 Bad Gateway</html>")]

    completion = providers.completion(target=target, messages=MESSAGES)

    assert completion.text == "On its way."
    (failed,) = completion.attempts
    assert failed.error.startswith("APIError: ")
    assert "502 Bad Gateway" in failed.error
    assert failed.retryable

    server.script = [(200, {**completion_json("x"), "choices": []})]
    completion = providers.completion(target=target, messages=MESSAGES)
    assert completion.attempts[0].error == "ProviderAnswerEmpty: the provider answered with no choices"


@pytest.mark.parametrize(
    "malformed",
    [
        pytest.param({"tool_calls": ["not a call"]}, id="tool-call-not-an-object"),
        pytest.param({"tool_calls": [{"id": "c", "function": "trip_status"}]}, id="function-not-an-object"),
        pytest.param({"usage": {"prompt_tokens": "many"}}, id="tokens-not-a-number"),
        pytest.param({"usage": ["tokens"]}, id="usage-not-an-object"),
    ],
)
def test_a_malformed_answer_is_a_failed_attempt_not_a_crash(target, server, malformed):
    answer = completion_json("x")
    if "tool_calls" in malformed:
        answer["choices"][0]["message"]["tool_calls"] = malformed["tool_calls"]
    else:
        answer["usage"] = malformed["usage"]
    server.script = [(200, answer)]

    completion = providers.completion(target=target, messages=MESSAGES)

    assert completion.text == "On its way."  # the retry's
    (failed,) = completion.attempts
    assert failed.error.startswith("APIError: Invalid response object: malformed ")


def test_without_a_key_of_its_own_the_target_sends_none(workspace, server, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    keyless = ModelTarget.objects.create(
        workspace=workspace, alias="ollama", model="openai/llama3", api_base=server.url
    )

    providers.completion(target=keyless, messages=MESSAGES)

    (received,) = server.received
    assert received.authorization is None
    assert received.body["model"] == "llama3"


def test_a_request_embedding_comes_from_the_server_without_litellm(target, server, settings, litellm_refused):
    embedding = cache.request_embed(text="where is my ride", target=target)

    assert embedding.source == "provider"
    assert len(embedding.vector) == 256
    (received,) = server.received
    assert received.path == "/v1/embeddings"
    assert received.body == {"model": "qwen2.5-7b-instruct", "input": ["where is my ride"]}
    assert received.authorization == f"Bearer {KEY}"


def test_a_request_embedding_is_the_same_vector_either_way(target, server, settings):
    through_litellm, direct = _both_ways(settings, lambda: cache.request_embed(text="where is my ride", target=target))

    assert direct == through_litellm
    assert [received.body for received in server.received][1] == {
        "model": "qwen2.5-7b-instruct",
        "input": ["where is my ride"],
    }


def test_an_embedding_answer_without_vectors_falls_back_to_the_offline_embedder(target, server):
    server.script = [(200, {"object": "list", "data": []})]

    embedding = cache.request_embed(text="where is my ride", target=target)

    assert embedding.source == "offline_fallback"


@pytest.mark.django_db(transaction=True)
def test_the_openai_client_through_a_live_gateway_to_such_a_server_gets_its_tool_calls(
    live_server, workspace, target, server, litellm_refused
):
    import openai
    from openai.types.chat import ChatCompletionToolParam

    from agent_registry import services as registry_services
    from tracing.models import Span

    calls = [{"id": "call_3", "type": "function", "function": {"name": "trip_status", "arguments": '{"trip": "T3"}'}}]
    server.script = [(200, completion_json(None, tool_calls=calls))]
    _, raw = registry_services.apikey_create(workspace=workspace, name="openai", scopes=["gateway"])
    client = openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=raw, max_retries=0)

    with client:
        raw_response = client.chat.completions.with_raw_response.create(
            model="local",
            messages=[{"role": "user", "content": "Where is trip T3?"}],
            tools=cast("list[ChatCompletionToolParam]", TOOLS),
            temperature=0,
        )
    completion = raw_response.parse()

    (call,) = completion.choices[0].message.tool_calls or []
    assert call.type == "function"
    assert (call.id, call.function.name, call.function.arguments) == ("call_3", "trip_status", '{"trip": "T3"}')
    assert completion.choices[0].finish_reason == "tool_calls"
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (1000, 200)
    (received,) = server.received
    assert received.body["model"] == "qwen2.5-7b-instruct"
    assert received.body["tools"] == TOOLS
    assert received.authorization == f"Bearer {KEY}"
    trace_id = raw_response.headers["X-Keel-Trace-Id"]
    generation = Span.objects.get(workspace=workspace, trace_id=trace_id, span_type="generation")
    assert (generation.input_tokens, generation.output_tokens) == (1000, 200)


def _streamed(target: ModelTarget, **parameters: Any) -> tuple[list[dict[str, Any]], providers.StreamState]:
    state = providers.StreamState()
    chunks = list(providers.completion_stream(target=target, messages=MESSAGES, parameters=parameters, state=state))
    return chunks, state


def test_a_stream_reads_the_same_either_way(target, server, settings):
    server.script = [(200, Events(TOOL_CALL_STREAM)), (200, Events(TOOL_CALL_STREAM))]

    (litellm_chunks, through_litellm), (chunks, direct) = _both_ways(settings, lambda: _streamed(target, temperature=0))

    assert _completion_fields(direct.completion()) == _completion_fields(through_litellm.completion())
    assert direct.message() == {
        "role": "assistant",
        "content": "Let me check.",
        "tool_calls": [
            {"id": "call_5", "type": "function", "function": {"name": "trip_status", "arguments": '{"trip": "T5"}'}}
        ],
    }
    assert (direct.finish_reason, direct.input_tokens, direct.output_tokens) == ("tool_calls", 30, 9)
    assert chunks == TOOL_CALL_STREAM  # as the server sent them; the gateway takes its fields from there

    def text(streamed: list[dict[str, Any]]) -> str:
        return "".join(choice["delta"].get("content") or "" for chunk in streamed for choice in chunk["choices"])

    assert text(chunks) == text(litellm_chunks) == "Let me check."
    sent_by_litellm, sent_directly = server.received
    assert sent_directly.body == {
        "model": "qwen2.5-7b-instruct",
        "messages": MESSAGES,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    assert {key: sent_by_litellm.body[key] for key in sent_directly.body} == sent_directly.body


def test_a_stream_does_not_go_through_litellm(target, server, litellm_refused):
    server.script = [(200, Events(TOOL_CALL_STREAM))]

    chunks, state = _streamed(target)

    assert len(chunks) == len(TOOL_CALL_STREAM)
    assert state.error == ""


def test_a_stream_that_fails_to_open_is_retried_before_any_chunk(target, server):
    server.script = [(503, {"error": {"message": "overloaded"}}), (200, Events(TOOL_CALL_STREAM))]

    chunks, state = _streamed(target)

    assert len(chunks) == len(TOOL_CALL_STREAM)
    (failed,) = state.attempts
    assert (failed.status_code, failed.retryable) == (503, True)
    assert failed.error == "ServiceUnavailableError: 503: overloaded"


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param("{not json", id="not-json"),
        pytest.param(json.dumps({"error": {"message": "the engine died"}}), id="error-event"),
        pytest.param(json.dumps({"choices": [{"delta": {"tool_calls": "call"}}]}), id="malformed-tool-calls"),
        pytest.param(json.dumps({"choices": [{"delta": {"content": ["a", "b"]}}]}), id="content-not-text"),
        pytest.param(json.dumps({"choices": [], "usage": {"prompt_tokens": "30"}}), id="usage-not-counts"),
    ],
)
def test_a_stream_garbled_mid_way_ends_with_what_came_and_says_why(target, server, bad):
    server.script = [(200, Events([*TOOL_CALL_STREAM[:2], bad]))]

    chunks, state = _streamed(target)

    assert chunks == TOOL_CALL_STREAM[:2]
    assert state.content == ["Let me ", "check."]
    assert state.error.startswith("APIError: ")
    assert "Traceback" not in state.error


def test_a_stream_cut_without_done_ends_without_an_error_as_through_litellm(target, server, settings):
    events = TOOL_CALL_STREAM[:2]
    server.script = [(200, Events(events, done=False)), (200, Events(events, done=False))]

    (_, through_litellm), (chunks, direct) = _both_ways(settings, lambda: _streamed(target))

    assert chunks == events
    assert (direct.error, through_litellm.error) == ("", "")
    assert direct.message() == through_litellm.message()


def test_closing_a_stream_early_closes_the_connection_to_the_server(target, server):
    events = Events([chunk_json({"content": f"part {number} "}) for number in range(50)], pause=0.05)
    server.script = [(200, events)]
    state = providers.StreamState()
    chunks = providers.completion_stream(target=target, messages=MESSAGES, parameters={}, state=state)

    assert next(chunks)["choices"][0]["delta"]["content"] == "part 0 "
    chunks.close()

    assert events.broken.wait(5)  # the server's next writes fail: nobody reads the answer any more


def test_a_stream_that_stalls_past_the_timeout_ends_with_a_timeout(target, server):
    target.timeout_seconds = 0.3
    target.save(update_fields=["timeout_seconds"])
    server.script = [(200, Events(TOOL_CALL_STREAM[:3], pause=1.0))]

    chunks, state = _streamed(target)

    assert chunks == TOOL_CALL_STREAM[:1]
    assert state.error.startswith("Timeout: the model server did not answer in 0.3 s (ReadTimeout)")
