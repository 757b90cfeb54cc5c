"""The ride-support agent without OpenTelemetry: it keeps its chat messages and posts them to Keel as JSON.

`POST /api/v1/ingest/trajectories` takes a trajectory as OpenAI-style messages (assistant tool calls,
tool results), with optional per-message `usage` and `duration_ms`, the tools offered, a session, a
user, tags, metadata and a reward; Keel turns it into the same spans an instrumented agent sends.
This script uses nothing but the standard library (`urllib`); the model is `fake_chat_completion`
from `ride_support.py` (no network, no API key).

    KEEL_URL=http://127.0.0.1:8000 KEEL_API_KEY=$KEY python examples/json_trajectory.py

Prints the trace ids Keel gave the trajectories; exits with 1 when Keel did not accept them.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from datetime import UTC, datetime
from typing import Any

from ride_support import AGENT_NAME, MODEL, SYSTEM_PROMPT, TICKETS, TOOLS, USER_ID, fake_chat_completion, tool_run

INGEST_PATH = "/api/v1/ingest/trajectories"


def _elapsed_ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)


def ticket_handle(ticket: str, ticket_number: int, session_id: str) -> dict[str, Any]:
    """Run the agent on one ticket; returns the trajectory to send."""
    started_at = datetime.now(UTC)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": ticket},
    ]
    while True:
        clock = time.perf_counter()
        completion = fake_chat_completion(messages)
        # Keel reads usage and duration_ms on the message; the model sees only role, content and tool calls.
        messages.append(
            {
                **completion.message,
                "usage": {"input_tokens": completion.prompt_tokens, "output_tokens": completion.completion_tokens},
                "duration_ms": _elapsed_ms(clock),
            }
        )
        calls = completion.message.get("tool_calls") or []
        if not calls:
            break
        for call in calls:
            clock = time.perf_counter()
            result = tool_run(call["function"]["name"], json.loads(call["function"]["arguments"]))
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call["id"],
                    "content": json.dumps(result),
                    "duration_ms": _elapsed_ms(clock),
                }
            )
    return {
        "name": "ride support ticket",
        "agent": AGENT_NAME,
        "session_id": session_id,
        "user_id": USER_ID,
        "started_at": started_at.isoformat(),
        "model": MODEL,
        "tags": ["example", "json-ingest"],
        "metadata": {"channel": "in-app chat", "ticket": ticket_number},
        "reward": 1.0,  # e.g. the rider's thumbs-up
        "tools": TOOLS,
        "messages": messages,
    }


def _post(base: urllib.parse.SplitResult, path: str, body: bytes, headers: dict[str, str]) -> Any:
    """POST over http or https only (urllib would open a file: or ftp: URL just as readily); the JSON answer."""
    path = f"{base.path.rstrip('/')}{path}"
    if base.scheme == "https":
        response = urllib.request.urlopen(
            urllib.request.Request(f"https://{base.netloc}{path}", body, headers), timeout=30
        )
    elif base.scheme == "http":
        response = urllib.request.urlopen(
            urllib.request.Request(f"http://{base.netloc}{path}", body, headers), timeout=30
        )
    else:
        raise SystemExit(f"KEEL_URL must be an http or https URL, not {base.geturl()!r}")
    with response:
        return json.load(response)


def main() -> int:
    key = os.environ.get("KEEL_API_KEY", "")
    if not key:
        print("Set KEEL_API_KEY to a Keel API key with the ingest scope", file=sys.stderr)
        return 2
    base = urllib.parse.urlsplit(os.environ.get("KEEL_URL", "http://127.0.0.1:8000").rstrip("/"))
    url = f"{base.geturl()}{INGEST_PATH}"
    session_id = f"chat-{uuid.uuid4().hex[:12]}"
    trajectories = [ticket_handle(ticket, number, session_id) for number, ticket in enumerate(TICKETS, start=1)]
    body = json.dumps({"trajectories": trajectories}).encode()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    try:
        answer = _post(base, INGEST_PATH, body, headers)
    except urllib.error.HTTPError as error:
        print(f"Keel answered {error.code} to {url}: {error.read().decode(errors='replace')}", file=sys.stderr)
        return 1
    except urllib.error.URLError as error:
        print(f"could not reach Keel at {url}: {error.reason}", file=sys.stderr)
        return 1
    for trace_id in answer["trace_ids"]:
        print(f"sent trace {trace_id} (session {session_id})")
    print(f"Keel accepted {answer['accepted_spans']} spans")
    return 0


if __name__ == "__main__":
    sys.exit(main())
