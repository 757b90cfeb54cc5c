"""Strings that run script if a page ever treats them as markup, and the ingest documents that carry them
(tests/security/test_xss.py, tests/browser/test_xss.py)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django.utils import timezone

TEMPLATE_SYNTAX_RESULT = "42xss-tpl"


def payload(key: str) -> str:
    """Markup that runs script if it is ever parsed as HTML, closes a <script> or an attribute if it is
    pasted into one, and template syntax that shows 42 if anything ever renders data as a template."""
    return (
        f'<script>alert("xss:{key}")</script>"><img src=x id="xss-{key}" onerror="alert(1)">'
        f"'><svg onload=alert(1)></script>{{{{ 40|add:2 }}}}xss-tpl"
    )


def link_payload(key: str) -> str:
    """For values that could end up in a link."""
    return f"javascript:alert('xss:{key}')"


def hex_id(number: int, width: int) -> str:
    return f"{number:0{width}x}"


def otlp_document(trace_id: str, session: str) -> dict[str, Any]:
    """Spans as an OpenTelemetry SDK exports them as OTLP/JSON, with payloads where strings go."""
    now = timezone.now()
    start = int((now - timedelta(minutes=3)).timestamp() * 1e9)

    def attribute(key: str, value: str) -> dict[str, Any]:
        return {"key": key, "value": {"stringValue": value}}

    root, llm, tool = hex_id(1, 16), hex_id(2, 16), hex_id(3, 16)
    messages = [
        {"role": "system", "content": payload("otlp-system")},
        {"role": "user", "content": payload("otlp-input")},
    ]
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [attribute("service.name", "ride-support")]},
                "scopeSpans": [
                    {
                        "scope": {"name": "xss-test"},
                        "spans": [
                            {
                                "traceId": trace_id,
                                "spanId": root,
                                "name": payload("otlp-span-name"),
                                "kind": 1,
                                "startTimeUnixNano": str(start),
                                "endTimeUnixNano": str(start + 3_000_000_000),
                                "attributes": [
                                    attribute("gen_ai.operation.name", "invoke_agent"),
                                    attribute("gen_ai.agent.name", "ride-support"),
                                    attribute("session.id", session),
                                    attribute("user.id", link_payload("otlp-user")),
                                    attribute("langfuse.trace.tags", json.dumps([payload("otlp-tag")])),
                                    attribute("langfuse.trace.metadata.channel", payload("otlp-metadata")),
                                    attribute(payload("otlp-attribute-key"), payload("otlp-attribute-value")),
                                    attribute("input.value", payload("otlp-input-value")),
                                ],
                                "status": {"code": 2, "message": payload("otlp-status")},
                                "events": [
                                    {
                                        "name": "exception",
                                        "timeUnixNano": str(start + 2_000_000_000),
                                        "attributes": [
                                            attribute("exception.type", "RuntimeError"),
                                            attribute("exception.message", payload("otlp-exception")),
                                        ],
                                    }
                                ],
                            },
                            {
                                "traceId": trace_id,
                                "spanId": llm,
                                "parentSpanId": root,
                                "name": "chat gpt-4o",
                                "kind": 3,
                                "startTimeUnixNano": str(start + 100_000_000),
                                "endTimeUnixNano": str(start + 900_000_000),
                                "attributes": [
                                    attribute("gen_ai.operation.name", "chat"),
                                    attribute("gen_ai.request.model", payload("otlp-model")),
                                    attribute("gen_ai.input.messages", json.dumps(messages)),
                                    attribute(
                                        "gen_ai.output.messages",
                                        json.dumps([{"role": "assistant", "content": payload("otlp-output")}]),
                                    ),
                                ],
                            },
                            {
                                "traceId": trace_id,
                                "spanId": tool,
                                "parentSpanId": root,
                                "name": "execute_tool lookup_trip",
                                "kind": 1,
                                "startTimeUnixNano": str(start + 1_000_000_000),
                                "endTimeUnixNano": str(start + 1_500_000_000),
                                "attributes": [
                                    attribute("gen_ai.operation.name", "execute_tool"),
                                    attribute("gen_ai.tool.name", payload("otlp-tool-name")),
                                    attribute("gen_ai.tool.call.arguments", json.dumps({"trip": payload("otlp-args")})),
                                    attribute("gen_ai.tool.call.result", json.dumps({"note": payload("otlp-result")})),
                                ],
                                "status": {"code": 2, "message": payload("otlp-tool-error")},
                            },
                        ],
                    }
                ],
            }
        ]
    }


def json_trajectory(session: str) -> dict[str, Any]:
    """A plain JSON trajectory (tracing/trajectory_json.py) with payloads where strings go."""
    return {
        "name": payload("json-name"),
        "agent": "ride-support",
        "session_id": session,
        "user_id": payload("json-user"),
        "model": payload("json-model"),
        "tags": [payload("json-tag"), link_payload("json-tag-link")],
        "metadata": {"channel": payload("json-metadata"), payload("json-metadata-key"): 1},
        "task_id": payload("json-task"),
        "reward": 0.5,
        "tools": [{"type": "function", "function": {"name": "lookup_trip", "description": payload("json-tool-def")}}],
        "messages": [
            {"role": "system", "content": payload("json-system")},
            {"role": "user", "content": payload("json-user-message")},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call-1",
                        "type": "function",
                        "function": {
                            "name": payload("json-tool-name")[:300],
                            "arguments": json.dumps({"trip_id": payload("json-tool-args")}),
                        },
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call-1", "content": payload("json-tool-result")},
            {"role": "assistant", "content": payload("json-answer"), "error": payload("json-error")},
        ],
    }
