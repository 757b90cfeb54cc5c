"""Keel's normalized spans as Langfuse reads them: OTLP spans with `langfuse.*` attributes. Pure module.

Whatever the agent sent (OTLP in any convention, or Keel's JSON trajectories), Langfuse receives one
vocabulary, the one its OTLP endpoint gives top priority: the observation type, input and output,
model, usage and cost details, level and status message, prompt link, session, user, trace name and
tags. Attributes Keel did not map travel unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from tracing.otlp import SPAN_KINDS, Span

_OBSERVATION_TYPES: Final = {
    "generation": "generation",
    "tool": "tool",
    "agent": "agent",
    "chain": "chain",
    "retriever": "retriever",
    "embedding": "embedding",
    "guardrail": "guardrail",
    "evaluator": "evaluator",
    "event": "event",
    "other": "span",
}
_STATUS_CODES: Final = {"unset": 0, "ok": 1, "error": 2}

Scalar = str | int | float | bool


@dataclass(frozen=True, slots=True)
class EncodedSpan:
    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    kind: int
    start_time_unix_nano: int
    end_time_unix_nano: int
    attributes: dict[str, Scalar]
    status_code: int
    status_message: str


@dataclass(frozen=True, slots=True)
class EncodedResource:
    attributes: dict[str, Scalar]
    scope_name: str
    spans: list[EncodedSpan] = field(default_factory=list)


def _json(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def _scalar(value: Any) -> Scalar:
    if isinstance(value, (str, bool, int, float)):
        return value
    return _json(value)


def langfuse_attributes(span: Span) -> dict[str, Scalar]:
    """The span's attributes for Langfuse: its unmapped ones plus Langfuse's names for the mapped fields."""
    attributes: dict[str, Scalar] = {key: _scalar(value) for key, value in span.attributes.items()}
    attributes["langfuse.observation.type"] = _OBSERVATION_TYPES.get(span.span_type, "span")
    if span.input is not None:
        attributes["langfuse.observation.input"] = _json(span.input)
    if span.output is not None:
        attributes["langfuse.observation.output"] = _json(span.output)
    if span.model:
        attributes["langfuse.observation.model.name"] = span.model
    counts = span.usage
    # Langfuse's buckets do not overlap: its `input` is the prompt less what was read from or written to a
    # cache, which Keel counts within the prompt.
    cache = (counts.cache_read_tokens or 0) + (counts.cache_write_tokens or 0)
    usage = {
        name: value
        for name, value in (
            ("input", None if counts.input_tokens is None else max(0, counts.input_tokens - cache)),
            ("output", counts.output_tokens),
            ("total", counts.total_tokens),
            ("cache_read_input_tokens", counts.cache_read_tokens),
            ("cache_creation_input_tokens", counts.cache_write_tokens),
        )
        if value is not None
    }
    if usage:
        attributes["langfuse.observation.usage_details"] = json.dumps(usage)
    if span.cost_usd is not None:
        attributes["langfuse.observation.cost_details"] = json.dumps({"total": span.cost_usd})
    if span.status == "error":
        attributes["langfuse.observation.level"] = "ERROR"
        message = span.error_message or span.status_message
        if message:
            attributes["langfuse.observation.status_message"] = message
    if span.prompt_name:
        attributes["langfuse.observation.prompt.name"] = span.prompt_name
        if span.prompt_version and span.prompt_version.isdigit():
            attributes["langfuse.observation.prompt.version"] = int(span.prompt_version)
    if span.session_id:
        attributes["langfuse.session.id"] = span.session_id
    if span.user_id:
        attributes["langfuse.user.id"] = span.user_id
    if span.agent_name:
        attributes["langfuse.observation.metadata.keel_agent"] = span.agent_name
    for key, value in span.metadata.items():
        attributes[f"langfuse.observation.metadata.{key}"] = _scalar(value)
    if span.parent_span_id is None:
        attributes["langfuse.trace.name"] = span.trace_name or span.name
        if span.tags:
            attributes["langfuse.trace.tags"] = json.dumps(list(span.tags))
    return attributes


def encode_spans(spans: Iterable[Span]) -> list[EncodedResource]:
    """Spans grouped by resource (as OTLP groups them), each with its Langfuse attributes."""
    groups: dict[tuple[str, str], EncodedResource] = {}
    for span in spans:
        resource = {key: _scalar(value) for key, value in span.resource_attributes.items()}
        key = (json.dumps(resource, sort_keys=True, default=str), span.scope_name)
        group = groups.setdefault(key, EncodedResource(attributes=resource, scope_name=span.scope_name))
        group.spans.append(
            EncodedSpan(
                trace_id=span.trace_id,
                span_id=span.span_id,
                parent_span_id=span.parent_span_id,
                name=span.name,
                kind=SPAN_KINDS.index(span.kind) if span.kind in SPAN_KINDS else 1,
                start_time_unix_nano=span.start_time_ns,
                end_time_unix_nano=span.end_time_ns,
                attributes=langfuse_attributes(span),
                status_code=_STATUS_CODES.get(span.status, 0),
                status_message=span.status_message,
            )
        )
    return list(groups.values())


def encoded_to_json(resources: Iterable[EncodedResource]) -> list[dict[str, Any]]:
    """A JSON-able form, to keep in the outbox until delivery."""
    return [
        {
            "attributes": resource.attributes,
            "scope_name": resource.scope_name,
            "spans": [
                {
                    "trace_id": span.trace_id,
                    "span_id": span.span_id,
                    "parent_span_id": span.parent_span_id,
                    "name": span.name,
                    "kind": span.kind,
                    "start_time_unix_nano": span.start_time_unix_nano,
                    "end_time_unix_nano": span.end_time_unix_nano,
                    "attributes": span.attributes,
                    "status_code": span.status_code,
                    "status_message": span.status_message,
                }
                for span in resource.spans
            ],
        }
        for resource in resources
    ]


def encoded_from_json(document: Iterable[Mapping[str, Any]]) -> list[EncodedResource]:
    return [
        EncodedResource(
            attributes=dict(resource["attributes"]),
            scope_name=resource["scope_name"],
            spans=[EncodedSpan(**span) for span in resource["spans"]],
        )
        for resource in document
    ]
