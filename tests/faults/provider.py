"""A fake model provider for the fault tests: an OpenAI-compatible HTTP server on the loopback interface
whose answers are scripted per model name, so litellm and the openai client go through their real HTTP,
parsing and timeout paths. Nothing here reaches a network.

Each request to a model takes the next scripted fault (or answers normally when none is left):
- `Fault.SLOW`: holds the answer until the server closes (the client's timeout fires first);
- `Fault.ERROR_500`: `500` with an OpenAI-style error body;
- `Fault.GARBAGE`: `200` with a body that is not JSON;
- `Fault.NO_CHOICES`: `200` with a well-formed completion whose `choices` list is empty;
- `Fault.NULL_MESSAGE`: `200` with a choice whose `message` is null;
- `Fault.STREAM_GARBAGE`: a streamed answer whose second event is not JSON.
"""

from __future__ import annotations

import enum
import json
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Fault(enum.Enum):
    SLOW = "slow"
    ERROR_500 = "500"
    GARBAGE = "garbage"
    NO_CHOICES = "no_choices"
    NULL_MESSAGE = "null_message"
    STREAM_GARBAGE = "stream_garbage"


@dataclass
class Request:
    model: str
    messages: list[dict[str, Any]]
    stream: bool
    fault: Fault | None


def _completion(model: str, text: str, *, choices: bool = True) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1,
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]
        if choices
        else [],
        "usage": {"prompt_tokens": 12, "completion_tokens": 4, "total_tokens": 16},
    }


def _chunk(model: str, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
    body = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


@dataclass
class FaultyProvider:
    """The fake provider's script and what it received; `answer(model)` is what a healthy call says."""

    scripts: dict[str, list[Fault]] = field(default_factory=lambda: defaultdict(list))
    received: list[Request] = field(default_factory=list)
    closing: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    url: str = ""

    def script(self, model: str, *faults: Fault) -> None:
        with self.lock:
            self.scripts[model].extend(faults)

    @staticmethod
    def answer(model: str) -> str:
        return f"{model} says hello"

    def calls(self, model: str) -> list[Fault | None]:
        with self.lock:
            return [request.fault for request in self.received if request.model == model]

    def take(self, model: str, messages: list[dict[str, Any]], stream: bool) -> Fault | None:
        with self.lock:
            fault = self.scripts[model].pop(0) if self.scripts[model] else None
            self.received.append(Request(model, messages, stream, fault))
        return fault


def _handler(provider: FaultyProvider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            model = str(request.get("model", ""))
            stream = bool(request.get("stream"))
            fault = provider.take(model, list(request.get("messages") or []), stream)
            if fault is Fault.SLOW:
                provider.closing.wait(60)  # past any client's timeout; released when the test ends
                self.close_connection = True
                return
            if fault is Fault.ERROR_500:
                error = {"error": {"message": "the fake provider failed", "type": "server_error", "code": None}}
                self._send(500, json.dumps(error).encode())
                return
            if fault is Fault.GARBAGE:
                self._send(200, b"<html><body>502 Bad Gateway from a proxy</body></html>", "text/html")
                return
            if fault is Fault.NO_CHOICES:
                self._send(200, json.dumps(_completion(model, "", choices=False)).encode())
                return
            if fault is Fault.NULL_MESSAGE:
                body = _completion(model, "")
                body["choices"][0]["message"] = None
                self._send(200, json.dumps(body).encode())
                return
            if stream:
                self._stream(model, fault)
                return
            self._send(200, json.dumps(_completion(model, provider.answer(model))).encode())

        def _stream(self, model: str, fault: Fault | None) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(_chunk(model, {"role": "assistant", "content": ""}))
            if fault is Fault.STREAM_GARBAGE:
                self.wfile.write(b'data: {"choices": [{"delta": \n\n')
            else:
                for word in provider.answer(model).split(" "):
                    self.wfile.write(_chunk(model, {"content": word + " "}))
                self.wfile.write(_chunk(model, {}, "stop"))
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


class FaultyProviderServer:
    """Serves a FaultyProvider on 127.0.0.1 (a port of its own) for the length of a `with` block."""

    def __init__(self) -> None:
        self.provider = FaultyProvider()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self.provider))
        self.httpd.daemon_threads = True
        self.provider.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FaultyProvider:
        self.thread.start()
        return self.provider

    def __exit__(self, *exc: object) -> None:
        self.provider.closing.set()
        self.httpd.shutdown()
        self.httpd.server_close()
