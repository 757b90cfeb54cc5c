"""A stub model provider for benchmarks: OpenAI-compatible, on the loopback interface, fixed latency.

    python -m bench.stub_model_server --port 8765 [--latency-ms 20] [--chunk-delay-ms 0]

Serves
- `POST /v1/chat/completions`: a short fixed answer after `--latency-ms`; with `"stream": true` the
  same answer as server-sent events (role, four content pieces, the finish reason, and usage when
  `stream_options.include_usage` asks for it), the first event after `--latency-ms` and each further
  one after `--chunk-delay-ms`;
- `POST /v1/embeddings`: a deterministic 1,536-wide unit vector per input (from a hash of the text),
  after `--latency-ms`;
- `GET /health`: `{"status": "ok"}`;
- `GET /_timings`: what the server saw of each request whose last message carries a marker
  `[bench:<id>]`, as `{"<id>": [received_ns, answered_ns], ...}` on CLOCK_MONOTONIC (which every
  process of the machine shares, and which `time.monotonic_ns`/`time.perf_counter_ns` read on Linux),
  and forgets them. A client that timed the same request subtracts the server's share
  (answered − received, i.e. the fixed latency) from its own time and is left with the time spent
  outside the provider: the caller's own work plus both hops over the loopback interface.

One asyncio event loop and HTTP/1.1 with keep-alive: hundreds of concurrent connections cost a
coroutine each, and the server's own CPU time per request stays in the tens of microseconds, so it
adds almost nothing to what a benchmark measures on a small machine. Only what the OpenAI client and
litellm send is understood (Content-Length or chunked bodies, no `Expect: 100-continue`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import math
import re
import signal
import struct
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

ANSWER_PIECES = ("Thanks for getting in touch. ", "I have looked at your account ", "and the issue ", "is resolved.")
ANSWER = "".join(ANSWER_PIECES)
EMBEDDING_WIDTH = 1536
MARKER = re.compile(r"\[bench:([A-Za-z0-9_.-]{1,64})\]")
# Timings of marked requests kept until read; a benchmark reads them after every phase, so this only
# bounds the memory of a run that never does.
MAX_TIMINGS = 1_000_000
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 413: "Payload Too Large"}
MAX_BODY = 16 * 2**20


@dataclass
class Settings:
    latency_seconds: float = 0.020
    chunk_delay_seconds: float = 0.0


@dataclass
class State:
    settings: Settings
    timings: dict[str, tuple[int, int]] = field(default_factory=dict)
    requests: int = 0


class BadRequest(Exception):
    pass


def _marker(messages: object) -> str | None:
    if not isinstance(messages, list) or not messages:
        return None
    content = messages[-1].get("content") if isinstance(messages[-1], dict) else None
    if isinstance(content, list):
        content = " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    found = MARKER.search(content) if isinstance(content, str) else None
    return found.group(1) if found else None


def _prompt_tokens(messages: object) -> int:
    # About four characters a token, as the OpenAI tokenizer averages on English.
    return max(1, len(json.dumps(messages)) // 4) if isinstance(messages, list) else 1


def _completion(payload: Mapping[str, Any]) -> dict[str, Any]:
    prompt_tokens = _prompt_tokens(payload.get("messages"))
    completion_tokens = len(ANSWER) // 4
    return {
        "id": f"chatcmpl-stub-{time.monotonic_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": str(payload.get("model") or "stub"),
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": ANSWER}, "finish_reason": "stop", "logprobs": None}
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def _chunks(payload: Mapping[str, Any]) -> list[dict[str, Any]]:
    base = {
        "id": f"chatcmpl-stub-{time.monotonic_ns()}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": str(payload.get("model") or "stub"),
    }

    def chunk(delta: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}]}

    chunks = [chunk({"role": "assistant", "content": ""}, None)]
    chunks += [chunk({"content": piece}, None) for piece in ANSWER_PIECES]
    chunks.append(chunk({}, "stop"))
    options = payload.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage"):
        usage = _completion(payload)["usage"]
        chunks.append({**base, "choices": [], "usage": usage})
    return chunks


def text_embedding(text: str) -> list[float]:
    """A unit vector that depends only on the text: SHA-512 in counter mode, as signed bytes."""
    values: list[float] = []
    counter = 0
    while len(values) < EMBEDDING_WIDTH:
        digest = hashlib.sha512(f"{counter}:{text}".encode()).digest()
        values.extend(float(byte) for byte in struct.unpack("64b", digest))
        counter += 1
    values = values[:EMBEDDING_WIDTH]
    norm = math.sqrt(sum(value * value for value in values)) or 1.0
    return [value / norm for value in values]


def _embeddings(payload: Mapping[str, Any]) -> dict[str, Any]:
    inputs = payload.get("input")
    texts = [inputs] if isinstance(inputs, str) else [str(item) for item in inputs or []]
    if not texts:
        raise BadRequest("input is required")
    tokens = sum(max(1, len(text) // 4) for text in texts)
    return {
        "object": "list",
        "model": str(payload.get("model") or "stub-embedding"),
        "data": [
            {"object": "embedding", "index": i, "embedding": text_embedding(text)} for i, text in enumerate(texts)
        ],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


async def _read_body(reader: asyncio.StreamReader, headers: Mapping[str, str]) -> bytes:
    if headers.get("transfer-encoding", "").lower() == "chunked":
        parts: list[bytes] = []
        size_total = 0
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0].strip(), 16)
            if size == 0:
                await reader.readuntil(b"\r\n")  # the empty trailer
                return b"".join(parts)
            size_total += size
            if size_total > MAX_BODY:
                raise BadRequest("body too large")
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
    length = int(headers.get("content-length") or 0)
    if length > MAX_BODY:
        raise BadRequest("body too large")
    return await reader.readexactly(length) if length else b""


def _head(status: int, content_type: str, *, length: int | None, keep_alive: bool) -> bytes:
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}", f"Content-Type: {content_type}"]
    lines.append(f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked")
    lines.append("Connection: keep-alive" if keep_alive else "Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _json_response(status: int, data: object, *, keep_alive: bool) -> bytes:
    body = json.dumps(data, separators=(",", ":")).encode()
    return _head(status, "application/json", length=len(body), keep_alive=keep_alive) + body


def _error(status: int, message: str, *, keep_alive: bool) -> bytes:
    return _json_response(
        status, {"error": {"message": message, "type": "invalid_request_error", "code": None}}, keep_alive=keep_alive
    )


def _payload(body: bytes) -> dict[str, Any]:
    try:
        payload = json.loads(body or b"{}")
    except ValueError as error:
        raise BadRequest(f"invalid JSON: {error}") from None
    if not isinstance(payload, dict):
        raise BadRequest("the body must be a JSON object")
    return payload


async def _chat(
    state: State, payload: dict[str, Any], writer: asyncio.StreamWriter, received_ns: int, keep_alive: bool
) -> None:
    settings = state.settings
    marker = _marker(payload.get("messages"))
    await asyncio.sleep(settings.latency_seconds)
    if not payload.get("stream"):
        response = _json_response(200, _completion(payload), keep_alive=keep_alive)
        answered_ns = time.monotonic_ns()
        writer.write(response)
        await writer.drain()
    else:
        writer.write(_head(200, "text/event-stream", length=None, keep_alive=keep_alive))
        for number, chunk in enumerate(_chunks(payload)):
            if number and settings.chunk_delay_seconds:
                await asyncio.sleep(settings.chunk_delay_seconds)
            event = b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
        done = b"data: [DONE]\n\n"
        answered_ns = time.monotonic_ns()
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
        await writer.drain()
    if marker is not None and len(state.timings) < MAX_TIMINGS:
        state.timings[marker] = (received_ns, answered_ns)


async def _serve_one(state: State, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    """Answer one request on the connection; returns whether the connection stays open."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        return False
    request_line, *header_lines = head.decode("latin-1").split("\r\n")
    try:
        method, target, version = request_line.split(" ", 2)
    except ValueError:
        writer.write(_error(400, "malformed request line", keep_alive=False))
        return False
    headers = {}
    for line in header_lines:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    connection_header = headers.get("connection", "").lower()
    keep_alive = connection_header != "close" if version == "HTTP/1.1" else connection_header == "keep-alive"
    try:
        body = await _read_body(reader, headers)
    except BadRequest as error:
        writer.write(_error(413, str(error), keep_alive=False))
        return False
    except (asyncio.IncompleteReadError, ValueError, ConnectionError):
        return False
    received_ns = time.monotonic_ns()
    state.requests += 1
    path = target.split("?", 1)[0].rstrip("/")
    try:
        if method == "POST" and path in ("/v1/chat/completions", "/chat/completions"):
            await _chat(state, _payload(body), writer, received_ns, keep_alive)
            return keep_alive
        if method == "POST" and path in ("/v1/embeddings", "/embeddings"):
            data = _embeddings(_payload(body))
            await asyncio.sleep(state.settings.latency_seconds)
            writer.write(_json_response(200, data, keep_alive=keep_alive))
        elif method == "GET" and path == "/health":
            writer.write(_json_response(200, {"status": "ok", "requests": state.requests}, keep_alive=keep_alive))
        elif method == "GET" and path == "/_timings":
            timings, state.timings = state.timings, {}
            writer.write(_json_response(200, timings, keep_alive=keep_alive))
        elif path in ("/v1/chat/completions", "/v1/embeddings", "/health", "/_timings"):
            writer.write(_error(405, f"{method} is not allowed on {path}", keep_alive=keep_alive))
        else:
            writer.write(_error(404, f"no route {path}", keep_alive=keep_alive))
    except BadRequest as error:
        writer.write(_error(400, str(error), keep_alive=keep_alive))
    await writer.drain()
    return keep_alive


async def _connection(state: State, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while await _serve_one(state, reader, writer):
            pass
        with contextlib.suppress(ConnectionError):
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def serve(host: str, port: int, settings: Settings, ready: asyncio.Event | None = None) -> None:
    state = State(settings)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _connection(state, reader, writer)

    server = await asyncio.start_server(handle, host, port, limit=MAX_BODY, backlog=1024)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for number in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(number, stop.set)
    bound = server.sockets[0].getsockname()[1]
    print(f"stub model server on http://{host}:{bound}/v1, latency {settings.latency_seconds * 1000:g} ms", flush=True)
    if ready is not None:
        ready.set()
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--latency-ms", type=float, default=20.0, help="time before the answer (the first event)")
    parser.add_argument("--chunk-delay-ms", type=float, default=0.0, help="streaming: time between events")
    arguments = parser.parse_args(argv)
    settings = Settings(arguments.latency_ms / 1000, arguments.chunk_delay_ms / 1000)
    asyncio.run(serve(arguments.host, arguments.port, settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
