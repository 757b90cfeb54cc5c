"""A webhook receiver for the alert delivery tests."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


class Receiver:
    """A webhook receiver on 127.0.0.1: records each request; answers the next status in `statuses` (then
    200), with a `Location` header when `location` is set."""

    def __init__(self) -> None:
        self.requests: list[dict[str, object]] = []
        self.statuses: list[int] = []
        self.location = ""
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.requests.append(
                    {"path": self.path, "host": self.headers.get("Host"), "headers": dict(self.headers), "body": body}
                )
                self.send_response(receiver.statuses.pop(0) if receiver.statuses else 200)
                if receiver.location:
                    self.send_header("Location", receiver.location)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/keel-hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    server.thread.start()
    yield server
    server.server.shutdown()
    server.server.server_close()
