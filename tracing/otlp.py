"""OTLP/HTTP trace ingest: decode an export request, map each span to Keel's form. Pure module, no Django.

Two stages, both total functions of their input:

1. `decode_request` turns the HTTP body (protobuf or JSON, optionally gzip/deflate) into `RawSpan`s.
   Errors in the envelope raise an `OtlpError`; a span that breaks the OTLP rules (bad ids, no name,
   no start time, end before start) is rejected and counted, and the others are kept, so the API can
   answer with OTLP's `partial_success`. No other exception type escapes, whatever the bytes.
   `validate_request` gives the same counts and errors without building the spans (for protobuf,
   about ten times cheaper), for an API that stores the body and maps it later.
2. `map_span` reads the attributes of one `RawSpan` into a `Span`, trying for every field Keel's own
   `keel.*` attributes first, then Langfuse's `langfuse.*`, then OpenInference, then the OpenTelemetry
   GenAI semantic conventions (current names, then the older ones). Attributes that were read into a
   field leave `attributes` (but the finish-reason ones, which the exports pass on); everything else
   stays there, so nothing is lost.

Keel's own attributes, for agents that want to say exactly what they mean:

| attribute | field |
|---|---|
| `keel.span.type` | `span_type` (one of `SPAN_TYPES`) |
| `keel.session.id`, `keel.user.id`, `keel.agent.name` | `session_id`, `user_id`, `agent_name` |
| `keel.input`, `keel.output` | `input`, `output` (JSON text or structured) |
| `keel.prompt.name`, `keel.prompt.version` | `prompt_name`, `prompt_version` |
| `keel.tags` | `tags` (list of strings, JSON list, or comma-separated text) |
| `keel.metadata.<key>` | `metadata[<key>]` |
| `keel.tool.definitions` | `tool_definitions` (JSON list of tool schemas) |
| `keel.task.id`, `keel.reward` | `task_id`, `reward` |

Speed matters here (ingest runs at tens of thousands of spans a second): the protobuf walker reads the
upb message directly (four times faster than `MessageToDict`), and the mapper dispatches on exact keys
and a handful of prefixes instead of matching every attribute against patterns.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import importlib
import json
import math
import operator
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

import orjson
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest as _PbExportRequest,
)

from tracing import wire

# protobuf ships no type information and the project has no stubs for it; importing the module by name
# keeps mypy strict about everything else while still catching exactly the parser's own error.
DecodeError: type[Exception] = importlib.import_module("google.protobuf.message").DecodeError

# --- Public vocabulary -------------------------------------------------------------------------------

SpanType = Literal[
    "generation", "tool", "agent", "chain", "retriever", "embedding", "guardrail", "evaluator", "event", "other"
]
SPAN_TYPES: Final[frozenset[str]] = frozenset(
    ("generation", "tool", "agent", "chain", "retriever", "embedding", "guardrail", "evaluator", "event", "other")
)
SpanStatus = Literal["ok", "error", "unset"]

KEEL_SPAN_TYPE: Final = "keel.span.type"
KEEL_SESSION_ID: Final = "keel.session.id"
KEEL_USER_ID: Final = "keel.user.id"
KEEL_AGENT_NAME: Final = "keel.agent.name"
KEEL_INPUT: Final = "keel.input"
KEEL_OUTPUT: Final = "keel.output"
KEEL_PROMPT_NAME: Final = "keel.prompt.name"
KEEL_PROMPT_VERSION: Final = "keel.prompt.version"
KEEL_TAGS: Final = "keel.tags"
KEEL_METADATA_PREFIX: Final = "keel.metadata."
KEEL_TOOL_DEFINITIONS: Final = "keel.tool.definitions"
KEEL_TASK_ID: Final = "keel.task.id"
KEEL_REWARD: Final = "keel.reward"

CONTENT_TYPE_PROTOBUF: Final = "application/x-protobuf"
CONTENT_TYPE_JSON: Final = "application/json"

# OTLP times are unsigned 64-bit nanoseconds; Keel stores them signed (PostgreSQL's bigint), which ends in
# April 2262. A span that ends later is rejected: accepted, it would fail its whole batch in the worker.
LAST_STORABLE_TIME_NS: Final = 2**63 - 1
# Token counts above this (or below 0) are dropped; they are no real counts (see _token_count).
MAX_TOKEN_COUNT: Final = 2**31 - 1
TIME_NOT_STORABLE: Final = "time after 2262-04-11"

DEFAULT_MAX_DECOMPRESSED_BYTES: Final = 64 * 1024 * 1024
DEFAULT_MAX_ATTRIBUTE_LENGTH: Final = 1_000_000
TRUNCATION_MARKER: Final = "…[truncated by Keel; original length {length}]"

SPAN_KINDS: Final[tuple[str, ...]] = ("unspecified", "internal", "server", "client", "producer", "consumer")


# --- Errors -------------------------------------------------------------------------------------------


class OtlpError(Exception):
    """A request Keel cannot read at all; `message` is for the client, `code` for the error body."""

    code = "otlp_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UnsupportedContentType(OtlpError):
    """Neither OTLP protobuf nor OTLP JSON, or a content encoding other than gzip/deflate (HTTP 415)."""

    code = "unsupported_content_type"


class MalformedPayload(OtlpError):
    """The body does not decode as an export request (HTTP 400, not to be retried)."""

    code = "malformed_payload"


class PayloadTooLarge(OtlpError):
    """The body decompresses past the configured limit (HTTP 413)."""

    code = "payload_too_large"


class _Invalid(Exception):
    """Internal: a part of a JSON request breaks the format; `reason` names what, for the counts."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# --- Decoded, unmapped spans ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SpanEvent:
    name: str
    time_ns: int
    attributes: dict[str, Any]


# Not frozen, unlike Span: a frozen dataclass sets each field through object.__setattr__, which costs
# a quarter of the decoding time here. Treat it as read-only all the same.
@dataclass(slots=True)
class RawSpan:
    """One valid span as it arrived. `resource_attributes` is shared by the spans of one resource."""

    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    kind: int
    start_time_ns: int
    end_time_ns: int
    status_code: int
    status_message: str
    attributes: dict[str, Any]
    events: tuple[SpanEvent, ...]
    resource_attributes: dict[str, Any]
    scope_name: str
    scope_version: str
    truncated_attributes: dict[str, int]


def _rejection_message(rejected: int, reasons: Mapping[str, int]) -> str:
    if not rejected:
        return ""
    parts = ", ".join(f"{count} {reason}" for reason, count in sorted(reasons.items()))
    noun = "span" if rejected == 1 else "spans"
    return f"rejected {rejected} {noun}: {parts}"


@dataclass(frozen=True, slots=True)
class ExportRequest:
    spans: tuple[RawSpan, ...]
    rejected_spans: int
    rejection_reasons: dict[str, int]

    @property
    def error_message(self) -> str:
        """OTLP `partial_success.error_message`: empty when every span was accepted."""
        return _rejection_message(self.rejected_spans, self.rejection_reasons)

    @property
    def summary(self) -> ExportSummary:
        return ExportSummary(
            accepted_spans=len(self.spans), rejected_spans=self.rejected_spans, rejection_reasons=self.rejection_reasons
        )


@dataclass(frozen=True, slots=True)
class ExportSummary:
    """What `decode_request` would accept and reject, without the spans."""

    accepted_spans: int
    rejected_spans: int
    rejection_reasons: dict[str, int]

    @property
    def error_message(self) -> str:
        return _rejection_message(self.rejected_spans, self.rejection_reasons)


# --- Decoding: body -----------------------------------------------------------------------------------


def decode_request(
    body: bytes,
    content_type: str,
    content_encoding: str | None,
    *,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
    max_attribute_length: int = DEFAULT_MAX_ATTRIBUTE_LENGTH,
) -> ExportRequest:
    """Decode an OTLP/HTTP `ExportTraceServiceRequest`.

    Attribute strings longer than `max_attribute_length` characters are cut there and end with
    `TRUNCATION_MARKER`; the original length of each truncated span attribute is kept in
    `RawSpan.truncated_attributes`. NUL characters, which PostgreSQL text cannot hold, become U+FFFD.
    """
    media_type = _media_type(content_type)
    body = _decompress(body, content_encoding, max_decompressed_bytes)
    if len(body) > max_decompressed_bytes:
        raise PayloadTooLarge(f"the request body is larger than {max_decompressed_bytes} bytes")
    if media_type == CONTENT_TYPE_JSON:
        return _decode_json(body, max_attribute_length)
    return _decode_protobuf(body, max_attribute_length)


def validate_request(
    body: bytes,
    content_type: str,
    content_encoding: str | None,
    *,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
) -> ExportSummary:
    """The counts `decode_request` would give, and its errors, at a fraction of the cost for protobuf.

    For the ingest API, which answers (partial_success) before the spans are read in full: a protobuf
    request is parsed but its attributes are not turned into Python objects. A JSON request is decoded
    in full, since its attributes can be malformed.
    """
    media_type = _media_type(content_type)
    body = _decompress(body, content_encoding, max_decompressed_bytes)
    if len(body) > max_decompressed_bytes:
        raise PayloadTooLarge(f"the request body is larger than {max_decompressed_bytes} bytes")
    if media_type == CONTENT_TYPE_JSON:
        return _decode_json(body, DEFAULT_MAX_ATTRIBUTE_LENGTH).summary
    return _validate_protobuf(body)


def _media_type(content_type: str) -> str:
    media_type = content_type.split(";", 1)[0].strip().lower()
    if media_type not in (CONTENT_TYPE_PROTOBUF, "application/protobuf", CONTENT_TYPE_JSON):
        raise UnsupportedContentType(
            f"content type {content_type!r} is not supported; send {CONTENT_TYPE_PROTOBUF} or {CONTENT_TYPE_JSON}"
        )
    return media_type


def _decompress(body: bytes, content_encoding: str | None, limit: int) -> bytes:
    encoding = (content_encoding or "").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding in ("gzip", "x-gzip"):
        return _inflate(body, zlib.MAX_WBITS | 16, limit, "gzip")
    if encoding == "deflate":
        # HTTP's deflate is zlib-wrapped, but some clients send the raw stream.
        try:
            return _inflate(body, zlib.MAX_WBITS, limit, "deflate")
        except MalformedPayload:
            return _inflate(body, -zlib.MAX_WBITS, limit, "deflate")
    raise UnsupportedContentType(f"content encoding {content_encoding!r} is not supported; use gzip or deflate")


def _inflate(data: bytes, wbits: int, limit: int, name: str) -> bytes:
    # Bounded output per step: a small bomb expanding to gigabytes stops at limit + 1 bytes.
    chunks: list[bytes] = []
    size = 0
    try:
        while True:
            decompressor = zlib.decompressobj(wbits)
            chunk = decompressor.decompress(data, limit + 1 - size)
            size += len(chunk)
            chunks.append(chunk)
            if size > limit or decompressor.unconsumed_tail:
                raise PayloadTooLarge(f"the request body decompresses to more than {limit} bytes")
            if not decompressor.eof:
                raise MalformedPayload(f"the {name} stream is truncated")
            data = decompressor.unused_data
            # gzip allows several members back to back; deflate does not.
            if not data or name != "gzip":
                break
    except zlib.error as error:
        raise MalformedPayload(f"the body is not valid {name} data: {error}") from error
    return b"".join(chunks)


# --- Decoding: strings --------------------------------------------------------------------------------


def _clean(text: str, limit: int) -> str:
    """Cut an over-long string and replace NULs; callers test the cheap conditions first."""
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    if len(text) > limit:
        text = text[:limit] + TRUNCATION_MARKER.format(length=len(text))
    return text


def _clean_key(key: str) -> str:
    return key.replace("\x00", "\ufffd") if "\x00" in key else key


def _finite(number: float) -> float | str:
    # NaN and infinities are not JSON; PostgreSQL's jsonb refuses them, so they travel as text.
    return number if math.isfinite(number) else str(number)


# --- Decoding: protobuf -------------------------------------------------------------------------------

_ZERO_TRACE_ID: Final = bytes(16)
_ZERO_SPAN_ID: Final = bytes(8)


def _pb_value(value: Any, limit: int, which: str | None = None) -> Any:
    if which is None:
        which = value.WhichOneof("value")
    if which == "string_value":
        text: str = value.string_value
        return _clean(text, limit) if len(text) > limit or "\x00" in text else text
    if which == "int_value":
        return value.int_value
    if which == "bool_value":
        return value.bool_value
    if which == "double_value":
        return _finite(value.double_value)
    if which == "array_value":
        return [_pb_value(item, limit) for item in value.array_value.values]
    if which == "kvlist_value":
        return {_clean_key(item.key): _pb_value(item.value, limit) for item in value.kvlist_value.values}
    if which == "bytes_value":
        encoded = base64.b64encode(value.bytes_value).decode("ascii")
        return _clean(encoded, limit) if len(encoded) > limit else encoded
    return None


def _pb_attributes(items: Any, limit: int, truncated: dict[str, int] | None) -> dict[str, Any]:
    attributes: dict[str, Any] = {}
    for item in items:
        key: str = item.key
        if "\x00" in key:
            key = _clean_key(key)
        value = item.value
        # Most values are non-empty strings: read the string first and ask for the kind only when it
        # is empty (another kind, or an empty string).
        text: str = value.string_value
        if text:
            if len(text) > limit or "\x00" in text:
                if truncated is not None and len(text) > limit:
                    truncated[key] = len(text)
                text = _clean(text, limit)
            attributes[key] = text
        else:
            attributes[key] = _pb_value(value, limit)
    return attributes


def _parse_protobuf(body: bytes) -> Any:
    try:
        return _PbExportRequest.FromString(body)
    except DecodeError as error:
        raise MalformedPayload("the body is not a valid OTLP ExportTraceServiceRequest protobuf message") from error


# OTLP requires the resource that produced the spans; spans without one cannot be told apart by service.
MISSING_RESOURCE: Final = "missing resource"


def _missing_resource_count(reasons: Counter[str], spans: int) -> None:
    # A resource without spans rejects none: no reason with a count of 0.
    if spans:
        reasons[MISSING_RESOURCE] += spans


def _pb_rejection(trace_id: bytes, span_id: bytes, parent_id: bytes, name: str, start: int, end: int) -> str | None:
    """Why OTLP forbids this span, or None."""
    if len(trace_id) != 16 or trace_id == _ZERO_TRACE_ID:
        return "invalid trace id"
    if len(span_id) != 8 or span_id == _ZERO_SPAN_ID:
        return "invalid span id"
    if parent_id and len(parent_id) != 8:
        return "invalid parent span id"
    if not name:
        return "missing name"
    if not start:
        return "missing start time"
    if end < start:
        return "end time before start time"
    if end > LAST_STORABLE_TIME_NS:
        return TIME_NOT_STORABLE
    return None


def _validate_protobuf(body: bytes) -> ExportSummary:
    accepted = 0
    reasons: Counter[str] = Counter()
    for resource_spans in _parse_protobuf(body).resource_spans:
        if not resource_spans.HasField("resource"):
            _missing_resource_count(reasons, sum(len(scope_spans.spans) for scope_spans in resource_spans.scope_spans))
            continue
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                reason = _pb_rejection(
                    span.trace_id,
                    span.span_id,
                    span.parent_span_id,
                    span.name,
                    span.start_time_unix_nano,
                    span.end_time_unix_nano,
                )
                if reason is None:
                    accepted += 1
                else:
                    reasons[reason] += 1
    return ExportSummary(accepted_spans=accepted, rejected_spans=sum(reasons.values()), rejection_reasons=dict(reasons))


def _decode_protobuf(body: bytes, limit: int) -> ExportRequest:
    """The request's spans, read by tracing.wire when it runs compiled (it is then 2.7 times faster),
    else, and for what it leaves to it, through protobuf's runtime."""
    if wire.COMPILED:
        try:
            spans, reasons = wire.spans_read(body, limit)
        except wire.Unread:
            pass  # protobuf's runtime reads it, or refuses it with its own error
        else:
            return ExportRequest(
                spans=tuple(spans), rejected_spans=sum(reasons.values()), rejection_reasons=dict(reasons)
            )
    return decode_protobuf_runtime(body, limit)


def decode_protobuf_runtime(body: bytes, limit: int) -> ExportRequest:
    """The request's spans, read through protobuf's runtime (its message objects)."""
    request = _parse_protobuf(body)
    spans: list[RawSpan] = []
    reasons: Counter[str] = Counter()
    for resource_spans in request.resource_spans:
        if not resource_spans.HasField("resource"):
            _missing_resource_count(reasons, sum(len(scope_spans.spans) for scope_spans in resource_spans.scope_spans))
            continue
        resource_attributes = _pb_attributes(resource_spans.resource.attributes, limit, None)
        for scope_spans in resource_spans.scope_spans:
            scope = scope_spans.scope
            scope_name = _clean(scope.name, limit)
            scope_version = _clean(scope.version, limit)
            for span in scope_spans.spans:
                trace_id: bytes = span.trace_id
                span_id: bytes = span.span_id
                parent_id: bytes = span.parent_span_id
                name: str = span.name
                start: int = span.start_time_unix_nano
                end: int = span.end_time_unix_nano
                reason = _pb_rejection(trace_id, span_id, parent_id, name, start, end)
                if reason is not None:
                    reasons[reason] += 1
                    continue
                truncated: dict[str, int] = {}
                attributes = _pb_attributes(span.attributes, limit, truncated)
                events: tuple[SpanEvent, ...] = ()
                pb_events = span.events
                if pb_events:
                    events = tuple(
                        SpanEvent(
                            name=_clean(event.name, limit),
                            time_ns=event.time_unix_nano,
                            attributes=_pb_attributes(event.attributes, limit, None),
                        )
                        for event in pb_events
                    )
                status = span.status
                spans.append(
                    RawSpan(
                        trace_id=trace_id.hex(),
                        span_id=span_id.hex(),
                        parent_span_id=parent_id.hex() if parent_id and parent_id != _ZERO_SPAN_ID else None,
                        name=_clean(name, limit),
                        kind=span.kind,
                        start_time_ns=start,
                        end_time_ns=end,
                        status_code=status.code,
                        status_message=_clean(status.message, limit),
                        attributes=attributes,
                        events=events,
                        resource_attributes=resource_attributes,
                        scope_name=scope_name,
                        scope_version=scope_version,
                        truncated_attributes=truncated,
                    )
                )
    return ExportRequest(spans=tuple(spans), rejected_spans=sum(reasons.values()), rejection_reasons=dict(reasons))


# --- Decoding: JSON -----------------------------------------------------------------------------------

_SPAN_KIND_NAMES: Final = {
    "SPAN_KIND_UNSPECIFIED": 0,
    "SPAN_KIND_INTERNAL": 1,
    "SPAN_KIND_SERVER": 2,
    "SPAN_KIND_CLIENT": 3,
    "SPAN_KIND_PRODUCER": 4,
    "SPAN_KIND_CONSUMER": 5,
}
_STATUS_CODE_NAMES: Final = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}
# protobuf's JSON mapping accepts the original field names as well as lowerCamelCase.
_ANY_VALUE_FIELDS: Final = {
    "stringValue": "string",
    "string_value": "string",
    "intValue": "int",
    "int_value": "int",
    "doubleValue": "double",
    "double_value": "double",
    "boolValue": "bool",
    "bool_value": "bool",
    "bytesValue": "bytes",
    "bytes_value": "bytes",
    "arrayValue": "array",
    "array_value": "array",
    "kvlistValue": "kvlist",
    "kvlist_value": "kvlist",
}
_MAX_JSON_VALUE_DEPTH: Final = 32
_UINT64_MAX: Final = 2**64 - 1


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


def _get(obj: Mapping[str, Any], camel: str, snake: str) -> Any:
    value = obj.get(camel)
    return obj.get(snake) if value is None else value


def _default(value: Any, default: Any) -> Any:
    return default if value is None else value


def _json_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _json_id(value: Any, size: int) -> bytes | None:
    """OTLP JSON ids are hex; base64 (protobuf's generic JSON mapping) is accepted when unambiguous."""
    if not isinstance(value, str):
        return None
    if len(value) == 2 * size:
        try:
            raw = bytes.fromhex(value)
        except ValueError:
            return None
    elif len(value) == 4 * ((size + 2) // 3):
        try:
            raw = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            return None
    else:
        return None
    return raw if len(raw) == size else None


def _json_value(value: Any, limit: int, depth: int) -> Any:
    if not isinstance(value, dict):
        if value is None:
            return None
        raise _Invalid("malformed attribute value")
    for field, item in value.items():
        kind = _ANY_VALUE_FIELDS.get(field)
        if kind is None:
            continue
        if kind == "string":
            if not isinstance(item, str):
                raise _Invalid("malformed attribute value")
            return _clean(item, limit) if len(item) > limit or "\x00" in item else item
        if kind == "int":
            number = _json_int(item)
            if number is None:
                raise _Invalid("malformed attribute value")
            return number
        if kind == "double":
            if isinstance(item, (int, float)) and not isinstance(item, bool):
                return _finite(float(item))
            if item in ("NaN", "Infinity", "-Infinity"):
                return {"NaN": "nan", "Infinity": "inf", "-Infinity": "-inf"}[item]
            raise _Invalid("malformed attribute value")
        if kind == "bool":
            if not isinstance(item, bool):
                raise _Invalid("malformed attribute value")
            return item
        if kind == "bytes":
            if not isinstance(item, str):
                raise _Invalid("malformed attribute value")
            try:
                base64.b64decode(item, validate=True)
            except (binascii.Error, ValueError) as error:
                raise _Invalid("malformed attribute value") from error
            return _clean(item, limit) if len(item) > limit else item
        if depth >= _MAX_JSON_VALUE_DEPTH:
            raise _Invalid("attribute value nested too deeply")
        if not isinstance(item, dict):
            raise _Invalid("malformed attribute value")
        values = item.get("values")
        if values is None:
            values = []
        if not isinstance(values, list):
            raise _Invalid("malformed attribute value")
        if kind == "array":
            return [_json_value(element, limit, depth + 1) for element in values]
        return _json_attributes(values, limit, None, depth + 1)
    return None


def _json_attributes(items: Any, limit: int, truncated: dict[str, int] | None, depth: int = 0) -> dict[str, Any]:
    if items is None:
        return {}
    if not isinstance(items, list):
        raise _Invalid("attributes are not a list of key-value pairs")
    attributes: dict[str, Any] = {}
    for item in items:
        if not isinstance(item, dict):
            raise _Invalid("attributes are not a list of key-value pairs")
        key = item.get("key")
        if not isinstance(key, str):
            raise _Invalid("attribute without a key")
        if "\x00" in key:
            key = _clean_key(key)
        value = item.get("value")
        if type(value) is dict and len(value) == 1:
            # Most values are a plain stringValue.
            text = value.get("stringValue")
            if type(text) is str:
                if len(text) > limit or "\x00" in text:
                    if truncated is not None and len(text) > limit:
                        truncated[key] = len(text)
                    text = _clean(text, limit)
                attributes[key] = text
                continue
        if truncated is not None and isinstance(value, dict):
            text = _get(value, "stringValue", "string_value")
            if isinstance(text, str) and len(text) > limit:
                truncated[key] = len(text)
        attributes[key] = _json_value(value, limit, depth)
    return attributes


def _json_text(value: Any, limit: int) -> str:
    if not isinstance(value, str):
        return ""
    return _clean(value, limit) if len(value) > limit or "\x00" in value else value


def _json_span(
    span: Any, limit: int, resource_attributes: dict[str, Any], scope_name: str, scope_version: str
) -> RawSpan:
    if not isinstance(span, dict):
        raise _Invalid("malformed span")
    trace_id = _json_id(_get(span, "traceId", "trace_id"), 16)
    if trace_id is None or trace_id == _ZERO_TRACE_ID:
        raise _Invalid("invalid trace id")
    span_id = _json_id(_get(span, "spanId", "span_id"), 8)
    if span_id is None or span_id == _ZERO_SPAN_ID:
        raise _Invalid("invalid span id")
    parent_value = _get(span, "parentSpanId", "parent_span_id")
    parent_id: bytes | None = None
    if parent_value:
        parent_id = _json_id(parent_value, 8)
        if parent_id is None:
            raise _Invalid("invalid parent span id")
        if parent_id == _ZERO_SPAN_ID:
            parent_id = None
    name = span.get("name")
    if not isinstance(name, str) or not name:
        raise _Invalid("missing name")
    start = _json_int(_get(span, "startTimeUnixNano", "start_time_unix_nano"))
    if not start or start < 0 or start > _UINT64_MAX:
        raise _Invalid("missing start time")
    end = _json_int(_get(span, "endTimeUnixNano", "end_time_unix_nano"))
    if end is None or end < start or end > _UINT64_MAX:
        raise _Invalid("end time before start time")
    if end > LAST_STORABLE_TIME_NS:
        raise _Invalid(TIME_NOT_STORABLE)
    kind = span.get("kind")
    kind_number = _SPAN_KIND_NAMES.get(kind, 0) if isinstance(kind, str) else _json_int(kind)
    if kind_number is None or not 0 <= kind_number < len(SPAN_KINDS):
        kind_number = 0
    status = span.get("status")
    status_code = 0
    status_message = ""
    if isinstance(status, dict):
        code = status.get("code")
        status_code = (_STATUS_CODE_NAMES.get(code, 0) if isinstance(code, str) else _json_int(code)) or 0
        if not 0 <= status_code <= 2:
            status_code = 0
        status_message = _json_text(status.get("message"), limit)
    truncated: dict[str, int] = {}
    attributes = _json_attributes(span.get("attributes"), limit, truncated)
    raw_events = span.get("events")
    events: tuple[SpanEvent, ...] = ()
    if raw_events:
        if not isinstance(raw_events, list):
            raise _Invalid("malformed event")
        parsed: list[SpanEvent] = []
        for event in raw_events:
            if not isinstance(event, dict):
                raise _Invalid("malformed event")
            time_ns = _json_int(_get(event, "timeUnixNano", "time_unix_nano")) or 0
            parsed.append(
                SpanEvent(
                    name=_json_text(event.get("name"), limit),
                    time_ns=min(max(time_ns, 0), _UINT64_MAX),
                    attributes=_json_attributes(event.get("attributes"), limit, None),
                )
            )
        events = tuple(parsed)
    return RawSpan(
        trace_id=trace_id.hex(),
        span_id=span_id.hex(),
        parent_span_id=parent_id.hex() if parent_id else None,
        name=_clean(name, limit) if len(name) > limit or "\x00" in name else name,
        kind=kind_number,
        start_time_ns=start,
        end_time_ns=end,
        status_code=status_code,
        status_message=status_message,
        attributes=attributes,
        events=events,
        resource_attributes=resource_attributes,
        scope_name=scope_name,
        scope_version=scope_version,
        truncated_attributes=truncated,
    )


def _replace_lone_surrogates(value: Any) -> Any:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-8", "replace").decode("utf-8")
        return value
    if isinstance(value, list):
        return [_replace_lone_surrogates(item) for item in value]
    if isinstance(value, dict):
        return {_replace_lone_surrogates(key): _replace_lone_surrogates(item) for key, item in value.items()}
    return value


def _load_json_body(body: bytes) -> Any:
    try:
        # orjson reads UTF-8 JSON twice as fast, and refuses lone surrogates, NaN and deep nesting.
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        pass
    # What orjson refused may still be JSON (UTF-16, a lone surrogate escape, an integer past 64 bits);
    # the standard library decides, and words the error when it is not.
    try:
        document = json.loads(body, parse_constant=_reject_constant)
        # A lone surrogate decodes to a str that cannot be stored (nor encoded back to UTF-8).
        return _replace_lone_surrogates(document)
    except RecursionError as error:
        raise MalformedPayload("the JSON body is nested too deeply") from error
    except ValueError as error:
        raise MalformedPayload(f"the body is not valid JSON: {error}") from error


def _decode_json(body: bytes, limit: int) -> ExportRequest:
    document = _load_json_body(body)
    if not isinstance(document, dict):
        raise MalformedPayload("the JSON body must be an object with resourceSpans")
    resource_spans_list = _get(document, "resourceSpans", "resource_spans")
    if resource_spans_list is None:
        resource_spans_list = []
    if not isinstance(resource_spans_list, list):
        raise MalformedPayload("resourceSpans must be a list")
    spans: list[RawSpan] = []
    reasons: Counter[str] = Counter()
    for resource_spans in resource_spans_list:
        if not isinstance(resource_spans, dict):
            raise MalformedPayload("each resourceSpans item must be an object")
        missing_resource = resource_spans.get("resource") is None
        resource = _default(resource_spans.get("resource"), {})
        if not isinstance(resource, dict):
            raise MalformedPayload("resource must be an object")
        try:
            resource_attributes = _json_attributes(resource.get("attributes"), limit, None)
        except _Invalid as error:
            raise MalformedPayload(f"resource: {error.reason}") from error
        scope_spans_list = _default(_get(resource_spans, "scopeSpans", "scope_spans"), [])
        if not isinstance(scope_spans_list, list):
            raise MalformedPayload("scopeSpans must be a list")
        for scope_spans in scope_spans_list:
            if not isinstance(scope_spans, dict):
                raise MalformedPayload("each scopeSpans item must be an object")
            scope = _default(scope_spans.get("scope"), {})
            if not isinstance(scope, dict):
                raise MalformedPayload("scope must be an object")
            scope_name = _json_text(scope.get("name"), limit)
            scope_version = _json_text(scope.get("version"), limit)
            span_list = _default(scope_spans.get("spans"), [])
            if not isinstance(span_list, list):
                raise MalformedPayload("spans must be a list")
            if missing_resource:
                _missing_resource_count(reasons, len(span_list))
                continue
            for span in span_list:
                try:
                    spans.append(_json_span(span, limit, resource_attributes, scope_name, scope_version))
                except _Invalid as rejection:
                    reasons[rejection.reason] += 1
    return ExportRequest(spans=tuple(spans), rejected_spans=sum(reasons.values()), rejection_reasons=dict(reasons))


# --- Mapped spans ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Usage:
    input_tokens: int | None = None
    output_tokens: int | None = None
    total_tokens: int | None = None
    # Of input_tokens, which count every token of the prompt (as OTel's GenAI conventions and OpenAI count
    # them): those read from the provider's cache, and those written to it (Anthropic bills writes above
    # plain input).
    cache_read_tokens: int | None = None
    reasoning_tokens: int | None = None
    cache_write_tokens: int | None = None

    @property
    def is_empty(self) -> bool:
        return (
            self.input_tokens is None
            and self.output_tokens is None
            and self.total_tokens is None
            and self.cache_read_tokens is None
            and self.reasoning_tokens is None
            and self.cache_write_tokens is None
        )


EMPTY_USAGE: Final = Usage()


# Not frozen, as RawSpan is not: a frozen dataclass sets each of its 41 fields through object.__setattr__,
# a fifth of the mapping's time. Treat a span as read-only all the same (`with_cost` copies one). `_map`
# sets every field itself, without __init__ (defaults included): a field added here is to be set there too.
@dataclass(slots=True)
class Span:
    """A span in Keel's normalized form.

    For generation spans `input` and `output` are lists of OpenAI-style messages
    (`{"role", "content", "tool_calls"?, "tool_call_id"?, "name"?}`) whenever the source carries messages;
    otherwise they hold the JSON value or the text that was sent. An output message's `finish_reason`
    is not kept in the message but in `finish_reasons`, with the span's own finish-reason attributes.
    """

    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    kind: str
    start_time_ns: int
    end_time_ns: int
    status: SpanStatus
    status_message: str
    span_type: SpanType
    session_id: str | None
    user_id: str | None
    agent_name: str | None
    service_name: str | None
    trace_name: str | None
    request_model: str | None
    response_model: str | None
    input: Any
    output: Any
    tool_name: str | None
    tool_call_id: str | None
    tool_arguments: Any
    tool_result: Any
    tool_definitions: tuple[dict[str, Any], ...]
    usage: Usage
    cost_usd: float | None
    prompt_name: str | None
    prompt_version: str | None
    task_id: str | None
    reward: float | None
    tags: tuple[str, ...]
    metadata: dict[str, Any]
    error_type: str | None
    error_message: str | None
    events: tuple[SpanEvent, ...]
    resource_attributes: dict[str, Any]
    scope_name: str
    scope_version: str
    attributes: dict[str, Any]
    truncated_attributes: dict[str, int]
    # Why the model stopped, one reason per choice ("stop", "length", "tool_calls", Anthropic's
    # "max_tokens"...), as the provider words it. Last, with a default: spans are built by name elsewhere.
    finish_reasons: tuple[str, ...] = ()

    def with_cost(self, cost_usd: float | None) -> Span:
        """A copy with another cost: the constructor given every field in order, a fifth of the time of
        `dataclasses.replace`, which looks each field up by name (ingest prices every generation span)."""
        copy = Span(*_span_values(self))
        copy.cost_usd = cost_usd
        return copy

    @property
    def model(self) -> str | None:
        return self.response_model or self.request_model

    @property
    def duration_ns(self) -> int:
        return self.end_time_ns - self.start_time_ns


_span_values: Final = operator.attrgetter(*(field.name for field in dataclasses.fields(Span)))


# Priority lists: Keel, then Langfuse, then OpenInference, then the GenAI conventions (current, older).
_SESSION_KEYS: Final = (KEEL_SESSION_ID, "langfuse.session.id", "session.id", "gen_ai.conversation.id")
_USER_KEYS: Final = (KEEL_USER_ID, "langfuse.user.id", "user.id", "enduser.id")
_AGENT_KEYS: Final = (KEEL_AGENT_NAME, "agent.name", "gen_ai.agent.name")
_PROMPT_NAME_KEYS: Final = (
    KEEL_PROMPT_NAME,
    "langfuse.observation.prompt.name",
    "langfuse.prompt.name",
    "gen_ai.prompt.name",
)
_PROMPT_VERSION_KEYS: Final = (
    KEEL_PROMPT_VERSION,
    "langfuse.observation.prompt.version",
    "langfuse.prompt.version",
    "llm.prompt_template.version",
)
_TAGS_KEYS: Final = (KEEL_TAGS, "langfuse.trace.tags", "tag.tags")
_REQUEST_MODEL_KEYS: Final = (
    "langfuse.observation.model.name",
    "llm.request.model_name",
    "llm.model_name",
    "gen_ai.request.model",
    "embedding.model_name",
)
_RESPONSE_MODEL_KEYS: Final = (
    "langfuse.observation.model.name",
    "llm.response.model_name",
    "llm.model_name",
    "gen_ai.response.model",
)
_COST_KEYS: Final = ("llm.cost.total", "gen_ai.usage.cost")
_TOOL_NAME_KEYS: Final = ("tool.name", "gen_ai.tool.name")
_TOOL_CALL_ID_KEYS: Final = ("tool_call.id", "tool.id", "gen_ai.tool.call.id")
# OpenInference-style, then the GenAI conventions, then OpenLLMetry's older name, then what Langfuse's OpenAI
# integration puts in the observation's metadata.
_FINISH_REASON_KEYS: Final = (
    "llm.finish_reason",
    "gen_ai.response.finish_reasons",
    "llm.response.finish_reason",
    "langfuse.observation.metadata.finish_reason",
)
_USAGE_ATTRIBUTE_KEYS: Final = {
    "input_tokens": ("llm.token_count.prompt", "gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens"),
    "output_tokens": (
        "llm.token_count.completion",
        "gen_ai.usage.output_tokens",
        "gen_ai.usage.completion_tokens",
    ),
    "total_tokens": ("llm.token_count.total", "gen_ai.usage.total_tokens"),
    "cache_read_tokens": (
        "llm.token_count.prompt_details.cache_read",
        "gen_ai.usage.cache_read.input_tokens",
        "gen_ai.usage.cache_read_input_tokens",
    ),
    "reasoning_tokens": (
        "llm.token_count.completion_details.reasoning",
        "gen_ai.usage.reasoning.output_tokens",
        "gen_ai.usage.reasoning_tokens",
    ),
    "cache_write_tokens": (
        "llm.token_count.prompt_details.cache_write",
        "gen_ai.usage.cache_creation.input_tokens",
        "gen_ai.usage.cache_creation_input_tokens",
    ),
}
# Keys Langfuse's SDKs and integrations use inside `langfuse.observation.usage_details`.
_LANGFUSE_USAGE_KEYS: Final = {
    "input_tokens": ("input", "input_tokens", "prompt_tokens", "promptTokens", "inputTokens"),
    "output_tokens": ("output", "output_tokens", "completion_tokens", "completionTokens", "outputTokens"),
    "total_tokens": ("total", "total_tokens", "totalTokens"),
    "cache_read_tokens": (
        "input_cached_tokens",
        "cache_read_input_tokens",
        "input_cache_read",
        "cached_tokens",
        "cache_read",
    ),
    "reasoning_tokens": ("output_reasoning_tokens", "reasoning_tokens", "output_reasoning", "reasoning"),
    "cache_write_tokens": (
        "input_cache_creation",
        "cache_creation_input_tokens",
        "input_cache_write",
        "cache_write_input_tokens",
        "cache_creation",
    ),
}
# Langfuse's own usage_details (as its SDKs and integrations write them, and as a provider's usage object
# without OpenAI's nested details reads, Anthropic's among them) are buckets that do not overlap: `input` is
# the prompt's tokens not read from or written to a cache, each `input_*` key and the cache counts another
# part of the prompt, and `output_*` keys parts of the output (Langfuse prices each bucket).
_LANGFUSE_INPUT_BUCKETS: Final = ("cache_read_input_tokens", "cache_creation_input_tokens", "cache_write_input_tokens")
_LANGFUSE_BASE_KEYS: Final = frozenset({"input_tokens", "output_tokens"})
# Langfuse's OpenAI integration passes OpenAI's usage object on as it is, with the cache and reasoning
# counts nested (Chat Completions' `prompt_tokens_details`, the Responses API's `input_tokens_details`).
_NESTED_USAGE_KEYS: Final = {
    "cache_read_tokens": (("prompt_tokens_details", "input_tokens_details"), "cached_tokens"),
    "reasoning_tokens": (("completion_tokens_details", "output_tokens_details"), "reasoning_tokens"),
}

_NESTED_PARENTS: Final = frozenset(parent for parents, _ in _NESTED_USAGE_KEYS.values() for parent in parents)

_LANGFUSE_TYPES: Final[dict[str, SpanType]] = {
    "generation": "generation",
    "event": "event",
    "agent": "agent",
    "tool": "tool",
    "chain": "chain",
    "retriever": "retriever",
    "embedding": "embedding",
    "guardrail": "guardrail",
    "evaluator": "evaluator",
}
_KEEL_TYPES: Final[dict[str, SpanType]] = {**_LANGFUSE_TYPES, "other": "other"}
_OPENINFERENCE_KINDS: Final[dict[str, SpanType]] = {
    "LLM": "generation",
    "EMBEDDING": "embedding",
    "CHAIN": "chain",
    "RETRIEVER": "retriever",
    "RERANKER": "retriever",
    "TOOL": "tool",
    "AGENT": "agent",
    "GUARDRAIL": "guardrail",
    "EVALUATOR": "evaluator",
}
_GEN_AI_OPERATIONS: Final[dict[str, SpanType]] = {
    "chat": "generation",
    "text_completion": "generation",
    "generate_content": "generation",
    "completion": "generation",
    "generate": "generation",
    "embeddings": "embedding",
    "execute_tool": "tool",
    "invoke_agent": "agent",
    "create_agent": "agent",
    "invoke_workflow": "chain",
    "plan": "chain",
    "retrieval": "retriever",
    "search_memory": "retriever",
    "apply_guardrail": "guardrail",
}
_GENERATION_HINT_KEYS: Final = (
    "langfuse.observation.model.name",
    "llm.model_name",
    "gen_ai.request.model",
    "gen_ai.response.model",
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.prompt_tokens",
    "llm.token_count.prompt",
)
_TOOL_HINT_KEYS: Final = ("gen_ai.tool.name", "gen_ai.tool.call.id", "gen_ai.tool.call.arguments")

_ROLE_ALIASES: Final = {
    "human": "user",
    "ai": "assistant",
    "model": "assistant",
    "bot": "assistant",
    "function": "tool",
    "developer": "system",
}
_TEXT_PART_TYPES: Final = frozenset(("text", "input_text", "output_text"))

# Prefixes whose keys carry an index or a sub-key; collected in one pass over the attributes.
_PREFIXES: Final = (
    "llm.input_messages.",
    "llm.output_messages.",
    "llm.tools.",
    "llm.request.functions.",  # OpenLLMetry's tool definitions
    "llm.prompts.",
    "llm.choices.",
    "gen_ai.prompt.",
    "gen_ai.completion.",
    KEEL_METADATA_PREFIX,
    "langfuse.trace.metadata.",
    "langfuse.observation.metadata.",
)

_METADATA_PREFIXES: Final = frozenset(
    (KEEL_METADATA_PREFIX, "langfuse.trace.metadata.", "langfuse.observation.metadata.")
)
_METADATA_KEYS: Final = frozenset(("metadata", "langfuse.trace.metadata", "langfuse.observation.metadata"))
# Attributes that `_Content` reads; a span with none of them (and no events) skips it.
_CONTENT_KEYS: Final = frozenset(
    (
        KEEL_INPUT,
        KEEL_OUTPUT,
        KEEL_TOOL_DEFINITIONS,
        "langfuse.observation.input",
        "langfuse.observation.output",
        "langfuse.trace.input",
        "langfuse.trace.output",
        "input.value",
        "output.value",
        "tool.parameters",
        "gen_ai.input.messages",
        "gen_ai.output.messages",
        "gen_ai.system_instructions",
        "gen_ai.tool.call.arguments",
        "gen_ai.tool.call.result",
        "gen_ai.tool.definitions",
        "gen_ai.retrieval.query.text",
        "gen_ai.retrieval.documents",
    )
)
_USAGE_FIELDS: Final = (
    "input_tokens",
    "output_tokens",
    "total_tokens",
    "cache_read_tokens",
    "reasoning_tokens",
    "cache_write_tokens",
)


_MESSAGE_EVENT_ROLES: Final = {
    "gen_ai.system.message": "system",
    "gen_ai.user.message": "user",
    "gen_ai.assistant.message": "assistant",
    "gen_ai.tool.message": "tool",
}
_EVENT_ENVELOPE_KEYS: Final = frozenset(("gen_ai.system", "gen_ai.provider.name", "event.name"))
# The current conventions' one event for a whole call, with the same message attributes as the span.
_INFERENCE_DETAILS_EVENT: Final = "gen_ai.client.inference.operation.details"


_SPAN_DEFAULTS: Final[dict[str, Any]] = {
    "kind": "internal",
    "status": "ok",
    "status_message": "",
    "session_id": None,
    "user_id": None,
    "agent_name": None,
    "service_name": None,
    "trace_name": None,
    "request_model": None,
    "response_model": None,
    "input": None,
    "output": None,
    "tool_name": None,
    "tool_call_id": None,
    "tool_arguments": None,
    "tool_result": None,
    "tool_definitions": (),
    "usage": EMPTY_USAGE,
    "cost_usd": None,
    "prompt_name": None,
    "prompt_version": None,
    "task_id": None,
    "reward": None,
    "tags": (),
    "metadata": {},
    "error_type": None,
    "error_message": None,
    "events": (),
    "resource_attributes": {},
    "scope_version": "1",
    "attributes": {},
    "truncated_attributes": {},
}


def span_build(**fields: Any) -> Span:
    """A span Keel produces itself (replays, the gateway): the given fields, the rest empty. Needs at
    least trace_id, span_id, parent_span_id, name, start_time_ns, end_time_ns, span_type, scope_name."""
    return Span(**{**_SPAN_DEFAULTS, **fields})


def map_spans(spans: Iterable[RawSpan]) -> list[Span]:
    """Map the decoded spans of one request; never raises. Each span maps to what `map_span` gives it,
    while a model call's history is read on from the previous call of its trace (`_Histories`)."""
    histories = _Histories()
    return [_map_span(raw, histories) for raw in spans]


def map_span(raw: RawSpan) -> Span:
    """Map one decoded span; never raises."""
    return _map_span(raw, None)


def _map_span(raw: RawSpan, histories: _Histories | None) -> Span:
    try:
        return _map(raw, with_content=True, histories=histories)
    except RecursionError:
        # Content nested past the interpreter's limit (a hostile JSON attribute): keep the span and
        # its raw attributes, without the content fields.
        return _map(raw, with_content=False, histories=None)


def _map(raw: RawSpan, *, with_content: bool, histories: _Histories | None) -> Span:
    attributes = raw.attributes
    resource = raw.resource_attributes
    used: set[str] = set()

    # One pass over the span's own attributes; the cost follows what the span carries, not how many
    # names Keel knows.
    candidates: dict[str, list[tuple[int, str]]] = {}
    groups: dict[str, list[tuple[str, str]]] = {}
    reads_content = bool(raw.events)
    reads_metadata = False
    for key in attributes:
        fields = _KEY_FIELDS.get(key)
        if fields is not None:
            for field, priority in fields:
                found = candidates.get(field)
                if found is None:
                    candidates[field] = [(priority, key)]
                else:
                    found.append((priority, key))
            if key in _CONTENT_KEYS:
                reads_content = True
        elif key in _CONTENT_KEYS:
            reads_content = True
        elif key in _METADATA_KEYS:
            reads_metadata = True
        elif key.startswith(_PREFIXES):
            for prefix in _PREFIXES:
                if key.startswith(prefix):
                    groups.setdefault(prefix, []).append((key[len(prefix) :], key))
                    if prefix in _METADATA_PREFIXES:
                        reads_metadata = True
                    else:
                        reads_content = True
                    break
    values = _resolve_fields(candidates, attributes, used) if candidates else {}

    span_type = _span_type(attributes, groups, used)
    status, status_message = _status(raw, attributes, used)
    error_type, error_message = _error(raw, attributes, status, status_message, used)
    usage = _usage(attributes, values, used)
    finish_reasons: tuple[str, ...] | None = values.get("finish_reasons")
    if finish_reasons is not None:
        # Read, yet left in `attributes`: the Langfuse and OTLP exports pass the unmapped attributes on and
        # have no name of their own for this field.
        used.difference_update(_FINISH_REASON_KEYS)
    content = (
        _Content(raw, groups, span_type, used, finish_reasons is None, histories)
        if with_content and reads_content
        else None
    )
    tool_name = values.get("tool_name")
    if tool_name is None and span_type == "tool":
        tool_name = raw.name.removeprefix("execute_tool ").strip() or None
    session_id = values.get("session_id")
    if session_id is None and resource:
        session_id = _text(_first(resource, _SESSION_KEYS, None))
    user_id = values.get("user_id")
    if user_id is None and resource:
        user_id = _text(_first(resource, _USER_KEYS, None))
    agent_name = values.get("agent_name")
    if agent_name is None and resource:
        agent_name = _text(_first(resource, _AGENT_KEYS, None))

    # Set field by field, not through the dataclass's __init__: that is generated as Python, which runs as
    # such even when this module is compiled, and a call with 41 keywords first builds a dict of them. The
    # two made up about a third of this function's own time (perf, the ingest benchmark's requests).
    span: Span = object.__new__(Span)
    span.trace_id = raw.trace_id
    span.span_id = raw.span_id
    span.parent_span_id = raw.parent_span_id
    span.name = raw.name
    span.kind = SPAN_KINDS[raw.kind] if 0 <= raw.kind < len(SPAN_KINDS) else "unspecified"
    span.start_time_ns = raw.start_time_ns
    span.end_time_ns = raw.end_time_ns
    span.status = status
    span.status_message = status_message
    span.span_type = span_type
    span.session_id = session_id
    span.user_id = user_id
    span.agent_name = agent_name
    span.service_name = _text(resource.get("service.name"))
    span.trace_name = values.get("trace_name")
    span.request_model = values.get("request_model")
    span.response_model = values.get("response_model")
    span.input = content.input if content else None
    span.output = content.output if content else None
    span.tool_name = tool_name
    span.tool_call_id = values.get("tool_call_id")
    span.tool_arguments = content.tool_arguments if content else None
    span.tool_result = content.tool_result if content else None
    span.tool_definitions = content.tool_definitions if content else ()
    span.usage = usage
    span.cost_usd = _cost(attributes, values, used)
    span.prompt_name = values.get("prompt_name")
    span.prompt_version = values.get("prompt_version")
    span.task_id = values.get("task_id")
    span.reward = values.get("reward")
    span.tags = values.get("tags", ())
    span.metadata = _metadata(attributes, groups, used) if reads_metadata else {}
    span.error_type = error_type
    span.error_message = error_message
    span.events = raw.events
    span.resource_attributes = resource
    span.scope_name = raw.scope_name
    span.scope_version = raw.scope_version
    span.attributes = {key: value for key, value in attributes.items() if key not in used} if used else attributes
    span.truncated_attributes = raw.truncated_attributes
    span.finish_reasons = finish_reasons or (content.finish_reasons if content else ())
    return span


def _resolve_fields(
    candidates: dict[str, list[tuple[int, str]]], attributes: Mapping[str, Any], used: set[str]
) -> dict[str, Any]:
    """For each field the span carries, the highest-priority attribute whose value reads as that field."""
    values: dict[str, Any] = {}
    for field, keys in candidates.items():
        if len(keys) > 1:
            keys.sort()
        convert = _FIELD_CONVERTERS[field]
        for _, key in keys:
            value = convert(attributes[key])
            if value is not None:
                values[field] = value
                used.add(key)
                break
    return values


# --- Mapping: scalar helpers ---------------------------------------------------------------------------


def _first(attributes: Mapping[str, Any], keys: Iterable[str], used: set[str] | None) -> Any:
    for key in keys:
        value = attributes.get(key)
        if value is not None and value != "":
            if used is not None:
                used.add(key)
            return value
    return None


def _text(value: Any) -> str | None:
    if type(value) is str:
        return value or None
    if value is None:
        return None
    if isinstance(value, str):
        return value or None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return _dumps(value)


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            number = _float(value)
            return int(number) if number is not None and number.is_integer() else None
    return None


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return None
    else:
        return None
    return number if math.isfinite(number) else None


# Built once: json.dumps with non-default options constructs an encoder on every call.
_ENCODER: Final = json.JSONEncoder(ensure_ascii=False)


def _dumps(value: Any) -> str:
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        pass
    # orjson refuses integers past 64 bits and non-string keys; the standard library takes them.
    try:
        return _ENCODER.encode(value)
    except (TypeError, ValueError, RecursionError):
        return str(value)


def _maybe_json(value: Any) -> Any:
    """Parse text that looks like a JSON object or array; anything else comes back unchanged."""
    if isinstance(value, str) and value and value[0] in "[{":
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    return value


def _langfuse_metadata_value(value: Any) -> Any:
    """Langfuse's SDKs (v3 on) JSON-encode every metadata value, strings included (`"chat"` arrives as
    `"\"chat\""`); other clients send plain text. Decode what decodes, keep the rest."""
    if isinstance(value, str) and value:
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    return value


def _json_object(value: Any) -> dict[str, Any] | None:
    value = _maybe_json(value)
    return value if isinstance(value, dict) else None


def _unflatten(entries: list[tuple[str, str]], attributes: Mapping[str, Any]) -> dict[int, dict[Any, Any]]:
    """`0.message.tool_calls.1.tool_call.id` style keys into {0: {"message": {"tool_calls": {1: ...}}}}."""
    items: dict[int, dict[Any, Any]] = {}
    for rest, key in entries:
        index_text, _, path = rest.partition(".")
        if not index_text.isdigit() or not path:
            continue
        node = items.setdefault(int(index_text), {})
        segments = path.split(".")
        for segment in segments[:-1]:
            slot: Any = int(segment) if segment.isdigit() else segment
            child = node.get(slot)
            if not isinstance(child, dict):
                child = {}
                node[slot] = child
            node = child
        last = segments[-1]
        node[int(last) if last.isdigit() else last] = attributes[key]
    return items


def _ordered(mapping: Any) -> list[Any]:
    """The values of an index-keyed dict in index order; lists come back as they are."""
    if isinstance(mapping, list):
        return mapping
    if isinstance(mapping, dict):
        return [mapping[index] for index in sorted(key for key in mapping if isinstance(key, int))]
    return []


def _indexed_keys(entries: list[tuple[str, str]]) -> set[str]:
    return {key for rest, key in entries if rest.partition(".")[0].isdigit()}


# --- Mapping: type, status, errors, usage, cost, tags, metadata ----------------------------------------


def _span_type(attributes: Mapping[str, Any], groups: Mapping[str, list[tuple[str, str]]], used: set[str]) -> SpanType:
    value = attributes.get(KEEL_SPAN_TYPE)
    if isinstance(value, str) and (found := _KEEL_TYPES.get(value.strip().lower())):
        used.add(KEEL_SPAN_TYPE)
        return found
    # A generic value ("span", "UNKNOWN", "PROMPT") does not stop a more specific one further down.
    value = attributes.get("langfuse.observation.type")
    if isinstance(value, str) and (found := _LANGFUSE_TYPES.get(value.strip().lower())):
        return found
    value = attributes.get("openinference.span.kind")
    if isinstance(value, str) and (found := _OPENINFERENCE_KINDS.get(value.strip().upper())):
        return found
    value = attributes.get("gen_ai.operation.name")
    if isinstance(value, str) and (found := _GEN_AI_OPERATIONS.get(value.strip().lower())):
        return found
    if any(key in attributes for key in _TOOL_HINT_KEYS):
        return "tool"
    if (
        any(key in attributes for key in _GENERATION_HINT_KEYS)
        or "llm.input_messages." in groups
        or "llm.output_messages." in groups
    ):
        return "generation"
    return "other"


def _status(raw: RawSpan, attributes: Mapping[str, Any], used: set[str]) -> tuple[SpanStatus, str]:
    status: SpanStatus = "error" if raw.status_code == 2 else "ok" if raw.status_code == 1 else "unset"
    message = raw.status_message
    level = attributes.get("langfuse.observation.level")
    langfuse_message = attributes.get("langfuse.observation.status_message")
    if not message and isinstance(langfuse_message, str) and langfuse_message:
        message = langfuse_message
        used.add("langfuse.observation.status_message")
    if status == "unset" and (
        (isinstance(level, str) and level.upper() == "ERROR") or attributes.get("error.type") not in (None, "")
    ):
        status = "error"
    return status, message


def _error(
    raw: RawSpan, attributes: Mapping[str, Any], status: SpanStatus, status_message: str, used: set[str]
) -> tuple[str | None, str | None]:
    error_type: str | None = None
    error_message: str | None = None
    for event in raw.events:
        if event.name == "exception":
            error_type = _text(event.attributes.get("exception.type")) or error_type
            error_message = _text(event.attributes.get("exception.message")) or error_message
    if error_type is None:
        error_type = _text(attributes.get("error.type"))
        if error_type is not None:
            used.add("error.type")
    if error_message is None and status == "error" and status_message:
        error_message = status_message
    return error_type, error_message


def _token_count(value: Any) -> int | None:
    # Counts are stored in int4 columns (tracing/records.py) and summed into a trajectory's bigint totals:
    # a count outside 0..2^31-1 is no real count, and a few of them would overflow the totals.
    return value if isinstance(value, int) and 0 <= value <= MAX_TOKEN_COUNT else None


def _langfuse_usage(details: Mapping[str, Any], values: dict[str, Any]) -> bool:
    """Read the counts of a Langfuse `usage_details` object into `values`; True when it held nothing else.

    OpenAI's usage object passed on as it is (`prompt_tokens`, or nested details) counts the cache's tokens
    within the prompt's, as Keel does; any other object is Langfuse's buckets, added up into Keel's counts."""
    if "prompt_tokens" in details or any(isinstance(details.get(parent), dict) for parent in _NESTED_PARENTS):
        read = _langfuse_fields(details, values)
        return bool(read) and read.issuperset(details)
    read = _langfuse_fields(details, values, exclude=("input_tokens", "output_tokens"))
    parts: dict[str, dict[str, int]] = {"input_tokens": {}, "output_tokens": {}}
    for key, raw in details.items():
        count = _int(raw)
        if count is None or key in _LANGFUSE_BASE_KEYS or "priority" in key:
            continue
        if key.startswith("input_") or key in _LANGFUSE_INPUT_BUCKETS:
            parts["input_tokens"][key] = count
        elif key.startswith("output_"):
            parts["output_tokens"][key] = count
    for field, found in parts.items():
        named = next((name for name in _LANGFUSE_USAGE_KEYS[field] if details.get(name) not in (None, "")), None)
        base = _int(details[named]) if named is not None else None
        if base is not None or found:
            values[field] = (base or 0) + sum(found.values())
            read.update(found, () if named is None else (named,))
    return bool(read) and read.issuperset(details)


def _langfuse_fields(details: Mapping[str, Any], values: dict[str, Any], exclude: tuple[str, ...] = ()) -> set[str]:
    """Each of Keel's counts that `details` names (by `_LANGFUSE_USAGE_KEYS`, or nested as OpenAI nests
    them) into `values`, but those in `exclude`; returns the keys read."""
    read: set[str] = set()
    for field in _USAGE_FIELDS:
        if field in exclude:
            continue
        key = next((key for key in _LANGFUSE_USAGE_KEYS[field] if details.get(key) not in (None, "")), None)
        value = _int(details[key]) if key is not None else None
        if value is None and field in _NESTED_USAGE_KEYS:
            parents, nested_key = _NESTED_USAGE_KEYS[field]
            for parent in parents:
                nested = details.get(parent)
                if isinstance(nested, dict) and (value := _int(nested.get(nested_key))) is not None:
                    # The parent counts as read only when the count was all it held.
                    key = parent if len(nested) == 1 else None
                    break
        if value is not None:
            values[field] = value
            if key is not None:
                read.add(key)
    return read


def _usage(attributes: Mapping[str, Any], values: dict[str, Any], used: set[str]) -> Usage:
    raw_details = attributes.get("langfuse.observation.usage_details")
    if raw_details is not None:
        details = _json_object(raw_details)
        # Counts Keel has no field for (audio tokens, cache writes by duration) keep the attribute as sent.
        if details is not None and _langfuse_usage(details, values):
            used.add("langfuse.observation.usage_details")
    input_tokens = _token_count(values.get("input_tokens"))
    output_tokens = _token_count(values.get("output_tokens"))
    total_tokens = _token_count(values.get("total_tokens"))
    cache_read_tokens = _token_count(values.get("cache_read_tokens"))
    reasoning_tokens = _token_count(values.get("reasoning_tokens"))
    cache_write_tokens = _token_count(values.get("cache_write_tokens"))
    if (
        input_tokens is None
        and output_tokens is None
        and total_tokens is None
        and cache_read_tokens is None
        and reasoning_tokens is None
        and cache_write_tokens is None
    ):
        return EMPTY_USAGE
    if total_tokens is None and input_tokens is not None and output_tokens is not None:
        total_tokens = input_tokens + output_tokens
    return Usage(input_tokens, output_tokens, total_tokens, cache_read_tokens, reasoning_tokens, cache_write_tokens)


def _cost(attributes: Mapping[str, Any], values: Mapping[str, Any], used: set[str]) -> float | None:
    raw_details = attributes.get("langfuse.observation.cost_details")
    if raw_details is not None:
        details = _json_object(raw_details)
        if details is not None:
            total = _float(details.get("total"))
            if total is None:
                parts = [number for number in map(_float, details.values()) if number is not None]
                total = sum(parts) if parts else None
            if total is not None:
                used.add("langfuse.observation.cost_details")
                return total
    cost: float | None = values.get("cost_usd")
    return cost


def _tags(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    value = _maybe_json(value)
    if isinstance(value, str):
        return tuple(tag for tag in (part.strip() for part in value.split(",")) if tag)
    if isinstance(value, list):
        return tuple(tag for tag in (_text(item) for item in value) if tag)
    return ()


def _metadata(
    attributes: Mapping[str, Any], groups: Mapping[str, list[tuple[str, str]]], used: set[str]
) -> dict[str, Any]:
    metadata: dict[str, Any] = {}
    # Lowest priority first, so that higher-priority families overwrite a shared key.
    openinference = _json_object(attributes.get("metadata"))
    if openinference is not None:
        metadata.update(openinference)
        used.add("metadata")
    for whole, prefix in (
        ("langfuse.trace.metadata", "langfuse.trace.metadata."),
        ("langfuse.observation.metadata", "langfuse.observation.metadata."),
    ):
        whole_value = _json_object(attributes.get(whole))
        if whole_value is not None:
            metadata.update(whole_value)
            used.add(whole)
        for rest, key in groups.get(prefix, ()):
            metadata[rest] = _langfuse_metadata_value(attributes[key])
            used.add(key)
    for rest, key in groups.get(KEEL_METADATA_PREFIX, ()):
        metadata[rest] = attributes[key]
        used.add(key)
    return metadata


def _tags_or_none(value: Any) -> tuple[str, ...] | None:
    return _tags(value) or None


def _finish_reasons(value: Any) -> tuple[str, ...] | None:
    """A finish-reason attribute: a list of strings (JSON text too) or one string."""
    if isinstance(value, str):
        value = _maybe_json(value)
        if isinstance(value, str):
            return (value,) if value else None
    if isinstance(value, list):
        return tuple([item for item in value if isinstance(item, str) and item]) or None
    return None


def _output_finish_reasons(value: Any) -> list[str]:
    """The finish reasons inside an output as sent: OpenAI's choices and GenAI output messages carry
    `finish_reason`, Anthropic's message `stop_reason`."""
    items: Any
    if isinstance(value, dict):
        choices = value.get("choices")
        items = choices if isinstance(choices, list) else (value,)
    elif isinstance(value, list):
        items = value
    else:
        return []
    reasons: list[str] = []
    for item in items:
        if isinstance(item, dict):
            reason = item.get("finish_reason") or item.get("stop_reason")
            if isinstance(reason, str) and reason:
                reasons.append(reason)
    return reasons


# Field -> (attribute names in priority order, how the value is read). An attribute that does not read
# as the field (a token count of "many") gives way to the next one.
_FIELD_SOURCES: Final[dict[str, tuple[tuple[str, ...], Callable[[Any], Any]]]] = {
    "session_id": (_SESSION_KEYS, _text),
    "user_id": (_USER_KEYS, _text),
    "agent_name": (_AGENT_KEYS, _text),
    "trace_name": (("langfuse.trace.name",), _text),
    "request_model": (_REQUEST_MODEL_KEYS, _text),
    "response_model": (_RESPONSE_MODEL_KEYS, _text),
    "tool_name": (_TOOL_NAME_KEYS, _text),
    "tool_call_id": (_TOOL_CALL_ID_KEYS, _text),
    "prompt_name": (_PROMPT_NAME_KEYS, _text),
    "prompt_version": (_PROMPT_VERSION_KEYS, _text),
    "task_id": ((KEEL_TASK_ID,), _text),
    "reward": ((KEEL_REWARD,), _float),
    "tags": (_TAGS_KEYS, _tags_or_none),
    "cost_usd": (_COST_KEYS, _float),
    "finish_reasons": (_FINISH_REASON_KEYS, _finish_reasons),
    **{field: (keys, _int) for field, keys in _USAGE_ATTRIBUTE_KEYS.items()},
}
_FIELD_CONVERTERS: Final = {field: convert for field, (_, convert) in _FIELD_SOURCES.items()}


def _key_fields() -> dict[str, tuple[tuple[str, int], ...]]:
    """Attribute name -> the fields it can feed, with its priority in each (model names feed two)."""
    index: dict[str, tuple[tuple[str, int], ...]] = {}
    for field, (keys, _) in _FIELD_SOURCES.items():
        for priority, key in enumerate(keys):
            index[key] = (*index.get(key, ()), (field, priority))
    return index


_KEY_FIELDS: Final = _key_fields()

# --- Mapping: messages ---------------------------------------------------------------------------------


_ROLES: Final = frozenset(("system", "user", "assistant", "tool"))


def _role(value: Any, default: str) -> str:
    if not isinstance(value, str) or not value:
        return default
    if value in _ROLES:
        return value
    role = value.strip().lower()
    return _ROLE_ALIASES.get(role, role)


def _arguments_text(value: Any) -> str:
    if value is None:
        return "{}"
    if isinstance(value, str):
        return value
    return _dumps(value)


def _result_text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return _dumps(value)


def _tool_call(call: Any) -> dict[str, Any] | None:
    if not isinstance(call, dict):
        return None
    # OpenInference nests under "tool_call"; OpenAI under "function"; the older GenAI keys are flat.
    inner = call.get("tool_call")
    if isinstance(inner, dict):
        call = inner
    function = call.get("function")
    if not isinstance(function, dict):
        function = {}
    name = function.get("name", call.get("name"))
    # Anthropic's tool_use blocks call the arguments "input".
    arguments = function["arguments"] if "arguments" in function else call.get("arguments", call.get("input"))
    call_id = call.get("id")
    return {
        "id": _text(call_id),
        "type": "function",
        "function": {"name": _text(name) or "", "arguments": _arguments_text(arguments)},
    }


def _message(role: str, content: Any, tool_calls: list[dict[str, Any]], extra: Mapping[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": role, "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    tool_call_id = extra.get("tool_call_id")
    if tool_call_id is not None:
        message["tool_call_id"] = tool_call_id
    name = extra.get("name")
    if name is not None:
        message["name"] = name
    reasoning = extra.get("reasoning_content")
    if reasoning:
        message["reasoning_content"] = reasoning
    return message


def _from_parts(role: str, parts: list[Any], name: Any) -> list[dict[str, Any]]:
    """GenAI conventions' `{role, parts: [...]}` into OpenAI-style messages (one per tool response)."""
    if len(parts) == 1 and name is None:
        # The common case, one text part, without the general bookkeeping.
        part = parts[0]
        if type(part) is dict and part.get("type") == "text":
            text = part.get("content")
            return [{"role": role, "content": text if type(text) is str else _text(text) or ""}]
    texts: list[str] = []
    others: list[Any] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    messages: list[dict[str, Any]] = []
    for part in parts:
        if isinstance(part, str):
            texts.append(part)
            continue
        if not isinstance(part, dict):
            continue
        part_type = part.get("type")
        if part_type == "text":
            text = part.get("content")
            texts.append(text if type(text) is str else _text(text) or "")
        elif part_type == "tool_call":
            call_id = part.get("id")
            name_text = part.get("name")
            calls.append(
                {
                    "id": call_id if type(call_id) is str else _text(call_id),
                    "type": "function",
                    "function": {
                        "name": name_text if type(name_text) is str else _text(name_text) or "",
                        "arguments": _arguments_text(part.get("arguments")),
                    },
                }
            )
        elif part_type == "tool_call_response":
            # The schema names it "response"; the registry's example says "result".
            response = part["response"] if "response" in part else part.get("result")
            call_id = part.get("id")
            messages.append(
                {
                    "role": "tool",
                    "content": response if response is None or type(response) is str else _dumps(response),
                    "tool_call_id": call_id if type(call_id) is str else _text(call_id),
                }
            )
        elif part_type == "reasoning":
            reasoning.append(_text(part.get("content")) or "")
        else:
            others.append(part)
    if texts or calls or others or reasoning or not messages:
        content: Any
        if others:
            content = [{"type": "text", "text": text} for text in texts] + others
        else:
            content = "\n".join(texts) if texts else None
        extra = {"name": _text(name), "reasoning_content": "\n".join(reasoning)}
        messages.insert(0, _message(role, content, calls, extra))
    return messages


_PLAIN_MESSAGE_KEYS: Final = frozenset(("role", "content"))


def _normalize_message(message: dict[str, Any], default_role: str) -> list[dict[str, Any]]:
    role = _role(message.get("role"), default_role)
    parts = message.get("parts")
    if type(parts) is list:
        return _from_parts(role, parts, message.get("name"))
    content = message.get("content")
    if type(content) is str and message.keys() <= _PLAIN_MESSAGE_KEYS:
        return [{"role": role, "content": content}]
    calls: list[dict[str, Any]] = []
    tool_messages: list[dict[str, Any]] = []
    if isinstance(content, list):
        # Content blocks: OpenAI parts, or Anthropic's tool_use / tool_result blocks.
        texts: list[str] = []
        others: list[Any] = []
        for block in content:
            if isinstance(block, str):
                texts.append(block)
                continue
            if not isinstance(block, dict):
                continue
            block_type = block.get("type")
            if isinstance(block_type, str) and block_type in _TEXT_PART_TYPES and isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif block_type == "tool_use":
                call = _tool_call(block)
                if call is not None:
                    calls.append(call)
            elif block_type == "tool_result":
                result = block.get("content")
                if isinstance(result, list):
                    result = "\n".join(
                        item["text"] for item in result if isinstance(item, dict) and isinstance(item.get("text"), str)
                    )
                tool_messages.append(
                    _message("tool", _result_text(result), [], {"tool_call_id": _text(block.get("tool_use_id"))})
                )
            else:
                others.append(block)
        if others:
            content = [{"type": "text", "text": text} for text in texts] + others
        else:
            content = "\n".join(texts) if texts else None
    elif content is not None and not isinstance(content, str):
        content = _dumps(content)
    for call in _ordered(message.get("tool_calls")):
        normalized = _tool_call(call)
        if normalized is not None:
            calls.append(normalized)
    function_call = message.get("function_call")
    if isinstance(function_call, dict):
        normalized = _tool_call(function_call)
        if normalized is not None:
            calls.append(normalized)
    elif message.get("function_call_name"):
        normalized = _tool_call(
            {"name": message.get("function_call_name"), "arguments": message.get("function_call_arguments_json")}
        )
        if normalized is not None:
            calls.append(normalized)
    tool_call_id = message.get("tool_call_id")
    if tool_call_id is None and role == "tool":
        tool_call_id = message.get("id")
    extra = {
        "tool_call_id": _text(tool_call_id),
        "name": _text(message.get("name")),
        "reasoning_content": _text(message.get("reasoning_content")),
    }
    normalized_messages = []
    if content is not None or calls or not tool_messages:
        normalized_messages.append(_message(role, content, calls, extra))
    return normalized_messages + tool_messages


def _looks_like_message(item: Any) -> bool:
    return isinstance(item, dict) and ("role" in item or "parts" in item)


def _to_messages(value: Any, default_role: str) -> list[dict[str, Any]] | None:
    """Any of the usual message shapes into OpenAI-style messages; None when it is not messages."""
    value = _maybe_json(value)
    if isinstance(value, dict):
        if isinstance(value.get("messages"), list):
            value = value["messages"]
        elif isinstance(value.get("choices"), list):
            value = [choice.get("message") for choice in value["choices"] if isinstance(choice, dict)]
        elif _looks_like_message(value):
            value = [value]
        else:
            return None
    if not isinstance(value, list):
        return None
    messages: list[dict[str, Any]] = []
    for item in value:
        if not _looks_like_message(item):
            return None
        messages.extend(_normalize_message(item, default_role))
    return messages


class _Histories:
    """What the model calls of one request said before, so that the next call of a trace reads only
    what it adds.

    Each call of an agent's loop sends the whole history in `gen_ai.input.messages`: the last call's
    messages, then the ones since (its answer, the tool results). When the text of a call's history
    goes on from the text of the trace's previous one, `[a, b` then `, c]`, its messages are those of
    the previous history followed by the ones parsed from `[c]`: a trajectory of n calls is parsed in
    one pass rather than n²/2 messages. Anything else (another trace's history, calls out of order,
    different spacing) is parsed whole, so a span maps to the same value either way. The same system
    instructions, sent with every call, are read once.
    """

    __slots__ = ("_last", "_systems")

    def __init__(self) -> None:
        # trace id -> (the text of its latest history without the closing bracket, its messages)
        self._last: dict[str, tuple[str, list[dict[str, Any]]]] = {}
        self._systems: dict[str, dict[str, Any] | None] = {}

    def messages(self, trace_id: str, value: Any, default_role: str) -> list[dict[str, Any]] | None:
        """`_to_messages(value, default_role)`, from the trace's previous history when `value` goes on
        from its text."""
        if type(value) is not str:
            return _to_messages(value, default_role)
        messages = None
        last = self._last.get(trace_id)
        if last is not None:
            start, known = last
            size = len(start)
            if len(value) > size and value[size] == "," and value.startswith(start):
                # The items up to `size` are the previous history's, whole: each of its values ended
                # before its closing bracket. What follows the comma must hold an item: `[a,]` is no
                # JSON, though `[]` is.
                added = _to_messages("[" + value[size + 1 :], default_role)
                if added:
                    messages = [*known, *added]
        if messages is None:
            messages = _to_messages(value, default_role)
        if messages:
            text = value.rstrip()
            if text.endswith("]"):
                self._last[trace_id] = (text[:-1], messages)
        return messages

    def system_message(self, value: Any) -> dict[str, Any] | None:
        if type(value) is not str:
            return _system_message(value)
        if value not in self._systems:
            self._systems[value] = _system_message(value)
        return self._systems[value]


def _system_message(value: Any) -> dict[str, Any] | None:
    value = _maybe_json(value)
    if isinstance(value, str):
        return {"role": "system", "content": value} if value else None
    if isinstance(value, dict):
        value = [value]
    if isinstance(value, list):
        texts = [(_text(part.get("content")) or "") if isinstance(part, dict) else _text(part) or "" for part in value]
        return {"role": "system", "content": "\n".join(texts)} if texts else None
    return None


def _event_body(event: SpanEvent) -> dict[str, Any]:
    for key in ("body", "gen_ai.event.content"):
        body = _json_object(event.attributes.get(key))
        if body is not None:
            return body
    return {key: value for key, value in event.attributes.items() if key not in _EVENT_ENVELOPE_KEYS}


@dataclass(slots=True)
class _EventMessages:
    inputs: list[dict[str, Any]] | None
    outputs: list[dict[str, Any]] | None
    finish_reasons: list[str]


def _event_messages(events: tuple[SpanEvent, ...]) -> _EventMessages:
    """The older conventions' message events (gen_ai.user.message, gen_ai.choice, ...)."""
    inputs: list[dict[str, Any]] = []
    choices: list[tuple[int, dict[str, Any]]] = []
    reasons: list[tuple[int, str]] = []
    prompt: list[dict[str, Any]] | None = None
    completion: list[dict[str, Any]] | None = None
    for event in events:
        role = _MESSAGE_EVENT_ROLES.get(event.name)
        if role is not None:
            body = dict(_event_body(event))
            body["tool_calls"] = _maybe_json(body.get("tool_calls"))
            inputs.extend(_normalize_message({**body, "role": body.get("role") or role}, role))
        elif event.name == "gen_ai.choice":
            body = _event_body(event)
            message = dict(_json_object(body.get("message")) or {})
            message["tool_calls"] = _maybe_json(message.get("tool_calls"))
            if "content" not in message and "content" in body:
                message["content"] = body["content"]
            index = _int(body.get("index")) or 0
            for normalized in _normalize_message(message, "assistant"):
                choices.append((index, normalized))
            reason = body.get("finish_reason")
            if isinstance(reason, str) and reason:
                reasons.append((index, reason))
        elif event.name == "gen_ai.content.prompt" and prompt is None:
            prompt = _to_messages(event.attributes.get("gen_ai.prompt"), "user")
        elif event.name == "gen_ai.content.completion" and completion is None:
            completion = _to_messages(event.attributes.get("gen_ai.completion"), "assistant")
        elif event.name == _INFERENCE_DETAILS_EVENT and prompt is None and completion is None:
            details = event.attributes
            prompt = _to_messages(details.get("gen_ai.input.messages"), "user")
            system = _system_message(details.get("gen_ai.system_instructions"))
            if system is not None and (not prompt or prompt[0] != system):
                prompt = [system, *(prompt or ())]
            output = _maybe_json(details.get("gen_ai.output.messages"))
            completion = _to_messages(output, "assistant")
            if completion is not None:
                reasons.extend((0, reason) for reason in _output_finish_reasons(output))
    choices.sort(key=lambda item: item[0])
    reasons.sort(key=lambda item: item[0])
    return _EventMessages(
        inputs=inputs or prompt,
        outputs=[message for _, message in choices] or completion,
        finish_reasons=[reason for _, reason in reasons],
    )


def _indexed_messages(
    entries: list[tuple[str, str]],
    attributes: Mapping[str, Any],
    default_role: str,
    nested: bool,
    finish_reasons: list[str] | None = None,
) -> list[dict[str, Any]] | None:
    """OpenInference `llm.input_messages.N.message.*` (nested) or older `gen_ai.prompt.N.*` (flat).

    The items' finish reasons (`gen_ai.completion.N.finish_reason`) go to `finish_reasons` when given.
    """
    items = _unflatten(entries, attributes)
    if not items:
        return None
    messages: list[dict[str, Any]] = []
    for index in sorted(items):
        item: Any = items[index]
        if finish_reasons is not None:
            finish_reasons.extend(_output_finish_reasons([item, item.get("message")]))
        if nested:
            item = item.get("message")
            if not isinstance(item, dict):
                continue
            contents = item.get("contents")
            if "content" not in item and contents is not None:
                blocks = [entry.get("message_content") for entry in _ordered(contents) if isinstance(entry, dict)]
                item["content"] = [_content_block(block) for block in blocks if isinstance(block, dict)]
        messages.extend(_normalize_message(item, default_role))
    return messages


def _content_block(block: dict[Any, Any]) -> dict[str, Any]:
    """An OpenInference `message_content` object as an OpenAI-style content part."""
    block_type = block.get("type") or "text"
    image = block.get("image")
    if block_type == "image" and isinstance(image, dict) and isinstance(image.get("image"), dict):
        return {"type": "image_url", "image_url": {"url": image["image"].get("url")}}
    if "text" in block:
        return {"type": "text" if block_type == "text" else block_type, "text": block.get("text")}
    return {key: value for key, value in block.items() if isinstance(key, str)}


def _texts_as_messages(
    entries: list[tuple[str, str]], attributes: Mapping[str, Any], field: str, role: str
) -> list[dict[str, Any]] | None:
    """OpenInference completions API: `llm.prompts.N.prompt.text`, `llm.choices.N.completion.text`."""
    items = _unflatten(entries, attributes)
    messages = []
    for index in sorted(items):
        block = items[index].get(field)
        if isinstance(block, dict) and block.get("text") is not None:
            messages.append({"role": role, "content": _text(block.get("text"))})
    return messages or None


def _tool_definition(value: Any) -> dict[str, Any] | None:
    value = _maybe_json(value)
    if not isinstance(value, dict):
        return None
    function = value.get("function")
    if isinstance(function, dict):
        definition = dict(function)
    elif isinstance(value.get("name"), str):
        definition = {key: item for key, item in value.items() if key != "type"}
        # Anthropic names the schema input_schema.
        if "parameters" not in definition and "input_schema" in definition:
            definition["parameters"] = definition.pop("input_schema")
    else:
        return None
    if not isinstance(definition.get("name"), str):
        return None
    definition["parameters"] = _maybe_json(definition.get("parameters"))
    return {"type": "function", "function": definition}


def _tool_definitions(value: Any) -> tuple[dict[str, Any], ...]:
    value = _maybe_json(value)
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list):
        return ()
    return tuple(definition for definition in map(_tool_definition, value) if definition is not None)


class _Content:
    """Resolves input, output, tool arguments/result and tool definitions for one span."""

    __slots__ = (
        "finish_reasons",
        "input",
        "output",
        "raw_input",
        "tool_arguments",
        "tool_definitions",
        "tool_result",
    )

    input: Any
    raw_input: Any
    output: Any
    finish_reasons: tuple[str, ...]
    tool_arguments: Any
    tool_result: Any
    tool_definitions: tuple[dict[str, Any], ...]

    def __init__(
        self,
        raw: RawSpan,
        groups: Mapping[str, list[tuple[str, str]]],
        span_type: SpanType,
        used: set[str],
        reads_finish_reasons: bool,
        histories: _Histories | None,
    ) -> None:
        attributes = raw.attributes
        self._resolve_messages_and_values(raw, attributes, groups, span_type, used, reads_finish_reasons, histories)
        self._resolve_tools(attributes, groups, span_type, used)

    def _resolve_messages_and_values(
        self,
        raw: RawSpan,
        attributes: Mapping[str, Any],
        groups: Mapping[str, list[tuple[str, str]]],
        span_type: SpanType,
        used: set[str],
        reads_finish_reasons: bool,
        histories: _Histories | None,
    ) -> None:
        # Agent spans often carry the dialogue too (invoke_agent with gen_ai.input.messages).
        reads_messages = span_type in ("generation", "agent")
        # The values as sent, before messages were read out of them: they may also list the tools.
        raw_values: dict[str, Any] = {}
        self.raw_input = None
        events = _event_messages(raw.events) if raw.events else None
        # The output's finish reasons, read from the value the output messages come from, unless the
        # span's own attributes gave them.
        output_reasons: list[str] | None = [] if reads_finish_reasons else None

        def generic(keys: tuple[str, ...], default_role: str) -> tuple[bool, Any]:
            for key in keys:
                value = attributes.get(key)
                if value is None or value == "":
                    continue
                used.add(key)
                value = _maybe_json(value)
                if reads_messages:
                    raw_values[default_role] = value
                    messages = _to_messages(value, default_role)
                    if messages is not None:
                        return True, messages
                    if isinstance(value, str) and span_type == "generation":
                        return True, [{"role": default_role, "content": value}]
                return True, value
            return False, None

        def indexed(prefix: str, default_role: str, reasons: list[str] | None = None) -> list[dict[str, Any]] | None:
            entries = groups.get(prefix)
            if not entries:
                return None
            messages = _indexed_messages(entries, attributes, default_role, prefix.startswith("llm."), reasons)
            if messages:
                used.update(_indexed_keys(entries))
            return messages

        def gen_ai_messages(
            key: str, default_role: str, reasons: list[str] | None = None, *, history: _Histories | None = None
        ) -> list[dict[str, Any]] | None:
            value = attributes.get(key)
            if value is None:
                return None
            if reasons is not None:
                value = _maybe_json(value)
            if history is not None:
                messages = history.messages(raw.trace_id, value, default_role)
            else:
                messages = _to_messages(value, default_role)
            if messages is not None:
                used.add(key)
                if reasons is not None:
                    reasons.extend(_output_finish_reasons(value))
            return messages

        # Input -------------------------------------------------------------------------------------
        found, value = generic((KEEL_INPUT, "langfuse.observation.input", "langfuse.trace.input"), "user")
        if not found:
            value = indexed("llm.input_messages.", "user")
            if value is None and "llm.prompts." in groups:
                value = _texts_as_messages(groups["llm.prompts."], attributes, "prompt", "user")
                if value is not None:
                    used.update(_indexed_keys(groups["llm.prompts."]))
            found = value is not None
        if not found:
            found, value = generic(("input.value",), "user")
            if found:
                used.add("input.mime_type")
        if not found:
            value = gen_ai_messages("gen_ai.input.messages", "user", history=histories)
            if value is not None:
                instructions = attributes.get("gen_ai.system_instructions")
                system = (
                    histories.system_message(instructions) if histories is not None else _system_message(instructions)
                )
                if system is not None:
                    used.add("gen_ai.system_instructions")
                    if not value or value[0] != system:
                        value = [system, *value]
            if value is None:
                value = indexed("gen_ai.prompt.", "user")
            if value is None and events is not None:
                value = events.inputs
            found = value is not None
        if not found and span_type == "tool":
            found, value = generic(("gen_ai.tool.call.arguments",), "user")
        elif not found and span_type == "retriever":
            found, value = generic(("gen_ai.retrieval.query.text",), "user")
        self.input = value if found else None
        self.raw_input = raw_values.get("user", self.input)

        # Output ------------------------------------------------------------------------------------
        found, value = generic((KEEL_OUTPUT, "langfuse.observation.output", "langfuse.trace.output"), "assistant")
        if not found:
            value = indexed("llm.output_messages.", "assistant", output_reasons)
            if value is None and "llm.choices." in groups:
                value = _texts_as_messages(groups["llm.choices."], attributes, "completion", "assistant")
                if value is not None:
                    used.update(_indexed_keys(groups["llm.choices."]))
            found = value is not None
            if found and output_reasons is not None and not output_reasons:
                # OpenInference keeps the response as sent in output.value; only its choices say why the
                # model stopped. The text test spares a parse when it cannot tell.
                response = attributes.get("output.value")
                if isinstance(response, str) and '"finish_reason"' in response:
                    output_reasons.extend(_output_finish_reasons(_maybe_json(response)))
        if not found:
            found, value = generic(("output.value",), "assistant")
            if found:
                used.add("output.mime_type")
        if not found:
            value = gen_ai_messages("gen_ai.output.messages", "assistant", output_reasons)
            if value is None:
                value = indexed("gen_ai.completion.", "assistant", output_reasons)
            if value is None and events is not None:
                value = events.outputs
                if output_reasons is not None:
                    output_reasons.extend(events.finish_reasons)
            found = value is not None
        if not found and span_type == "tool":
            found, value = generic(("gen_ai.tool.call.result",), "assistant")
        elif not found and span_type == "retriever":
            found, value = generic(("gen_ai.retrieval.documents",), "assistant")
        self.output = value if found else None
        if output_reasons is not None and reads_messages and "assistant" in raw_values:
            output_reasons.extend(_output_finish_reasons(raw_values["assistant"]))
        self.finish_reasons = tuple(output_reasons) if output_reasons else ()

    def _resolve_tools(
        self,
        attributes: Mapping[str, Any],
        groups: Mapping[str, list[tuple[str, str]]],
        span_type: SpanType,
        used: set[str],
    ) -> None:
        if span_type == "tool":
            arguments = self.input
            # Langfuse's @observe records a call as {"args": [...], "kwargs": {...}}; a tool called with
            # keyword arguments only (as agents call them, from the model's JSON) got exactly the kwargs.
            if (
                type(arguments) is dict
                and len(arguments) == 2
                and arguments.get("args") == []
                and type(arguments.get("kwargs")) is dict
                and "langfuse.observation.input" in used
            ):
                arguments = arguments["kwargs"]
            self.tool_arguments = arguments
            self.tool_result = self.output
        else:
            arguments = attributes.get("gen_ai.tool.call.arguments")
            result = attributes.get("gen_ai.tool.call.result")
            self.tool_arguments = _maybe_json(arguments)
            self.tool_result = _maybe_json(result)
            if arguments is not None:
                used.add("gen_ai.tool.call.arguments")
            if result is not None:
                used.add("gen_ai.tool.call.result")

        definitions: tuple[dict[str, Any], ...] = ()
        value = attributes.get(KEEL_TOOL_DEFINITIONS)
        if value is not None:
            definitions = _tool_definitions(value)
            if definitions:
                used.add(KEEL_TOOL_DEFINITIONS)
        if not definitions and "llm.tools." in groups:
            entries = groups["llm.tools."]
            items = _unflatten(entries, attributes)
            collected = []
            for index in sorted(items):
                tool = items[index].get("tool")
                if not isinstance(tool, dict):
                    continue
                definition = _tool_definition(tool.get("json_schema"))
                if definition is None and isinstance(tool.get("name"), str):
                    described = {
                        "name": tool["name"],
                        "description": tool.get("description"),
                        "parameters": tool.get("parameters"),
                    }
                    definition = _tool_definition(described)
                if definition is not None:
                    collected.append(definition)
            definitions = tuple(collected)
            if definitions:
                used.update(_indexed_keys(entries))
        if not definitions and "llm.request.functions." in groups:
            # OpenLLMetry: llm.request.functions.N.name / .description / .parameters (JSON text).
            entries = groups["llm.request.functions."]
            functions = _unflatten(entries, attributes)
            definitions = tuple(
                definition
                for index in sorted(functions)
                if (definition := _tool_definition(functions[index])) is not None
            )
            if definitions:
                used.update(_indexed_keys(entries))
        if not definitions:
            value = attributes.get("gen_ai.tool.definitions")
            if value is not None:
                definitions = _tool_definitions(value)
                if definitions:
                    used.add("gen_ai.tool.definitions")
        if not definitions:
            # Tools sent along with the request body (Langfuse and OpenInference inputs often carry them).
            for source in (self.raw_input, _maybe_json(attributes.get("input.value"))):
                if isinstance(source, dict) and "tools" in source:
                    definitions = _tool_definitions(source.get("tools"))
                    if definitions:
                        break
        if not definitions and span_type == "tool" and isinstance(attributes.get("tool.parameters"), (str, dict)):
            # OpenInference describes the invoked tool's schema on the TOOL span itself.
            definition = _tool_definition(
                {
                    "name": attributes.get("tool.name"),
                    "description": attributes.get("tool.description"),
                    "parameters": attributes.get("tool.parameters"),
                }
            )
            if definition is not None:
                definitions = (definition,)
                used.update(("tool.parameters", "tool.description"))
        self.tool_definitions = definitions


def decode_and_map(
    body: bytes,
    content_type: str,
    content_encoding: str | None,
    *,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
    max_attribute_length: int = DEFAULT_MAX_ATTRIBUTE_LENGTH,
) -> tuple[list[Span], ExportRequest]:
    """`decode_request`, then `map_span` on every accepted span."""
    request = decode_request(
        body,
        content_type,
        content_encoding,
        max_decompressed_bytes=max_decompressed_bytes,
        max_attribute_length=max_attribute_length,
    )
    return map_spans(request.spans), request
