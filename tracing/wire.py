"""OTLP/protobuf trace requests read straight from the wire format, into tracing.otlp's RawSpans.

protobuf's runtime parses a request quickly, but reading it back is slow: every field read from Python
makes an object (a message wrapper, a new string), whether RawSpan keeps it or not. This reader makes
only the objects a RawSpan keeps. It is meant to run compiled, with the types
`wire.pxd` declares, and `tracing.otlp` uses it only then (`COMPILED`); as Python it gives the same
spans, more slowly than protobuf's runtime.

It reads the common case and leaves every other one to protobuf's runtime by raising `Unread`: a field
of the schema it does not read (links, a scope's attributes, the string-table indexes of profiles), a
singular message or a oneof sent twice (which protobuf merges), a field with another wire type than the
schema's, values nested past `MAX_VALUE_DEPTH`, and anything malformed (a truncated field, a bad varint,
invalid UTF-8 in a string field). So what it returns is what `tracing.otlp` builds through protobuf, and
a body protobuf refuses is refused with protobuf's own error. tracing/tests/test_wire.py holds it to that.
"""

from __future__ import annotations

import base64
import struct
import sys
from collections import Counter
from typing import Any, Final

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tracing import compiled

COMPILED: Final = compiled.loaded_compiled(sys.modules[__name__])

MAX_VALUE_DEPTH: Final = 16
_MAX_FIELD_NUMBER: Final = 2**29 - 1

_VARINT: Final = 0
_I64: Final = 1
_LEN: Final = 2
_I32: Final = 5
_DOUBLE: Final = struct.Struct("<d")

_REQUEST: Final = "opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest"
_RESOURCE_SPANS: Final = "opentelemetry.proto.trace.v1.ResourceSpans"
_RESOURCE: Final = "opentelemetry.proto.resource.v1.Resource"
_SCOPE_SPANS: Final = "opentelemetry.proto.trace.v1.ScopeSpans"
_SCOPE: Final = "opentelemetry.proto.common.v1.InstrumentationScope"
_SPAN: Final = "opentelemetry.proto.trace.v1.Span"
_EVENT: Final = "opentelemetry.proto.trace.v1.Span.Event"
_STATUS: Final = "opentelemetry.proto.trace.v1.Status"
_KEY_VALUE: Final = "opentelemetry.proto.common.v1.KeyValue"
_ANY_VALUE: Final = "opentelemetry.proto.common.v1.AnyValue"
_ARRAY: Final = "opentelemetry.proto.common.v1.ArrayValue"
_KV_LIST: Final = "opentelemetry.proto.common.v1.KeyValueList"

# The fields of each message this reader reads (number: wire type). A field of the schema missing here
# is left to protobuf; test_wire.py checks these against the descriptors of Keel's protobuf classes.
READ_FIELDS: Final[dict[str, dict[int, int]]] = {
    _REQUEST: {1: _LEN},
    _RESOURCE_SPANS: {1: _LEN, 2: _LEN, 3: _LEN},
    _RESOURCE: {1: _LEN, 2: _VARINT},
    _SCOPE_SPANS: {1: _LEN, 2: _LEN, 3: _LEN},
    _SCOPE: {1: _LEN, 2: _LEN, 4: _VARINT},
    _SPAN: {
        1: _LEN,
        2: _LEN,
        3: _LEN,
        4: _LEN,
        5: _LEN,
        6: _VARINT,
        7: _I64,
        8: _I64,
        9: _LEN,
        10: _VARINT,
        11: _LEN,
        12: _VARINT,
        14: _VARINT,
        15: _LEN,
        16: _I32,
    },
    _EVENT: {1: _I64, 2: _LEN, 3: _LEN, 4: _VARINT},
    _STATUS: {2: _LEN, 3: _VARINT},
    _KEY_VALUE: {1: _LEN, 2: _LEN},
    _ANY_VALUE: {1: _LEN, 2: _VARINT, 3: _VARINT, 4: _I64, 5: _LEN, 6: _LEN, 7: _LEN},
    _ARRAY: {1: _LEN},
    _KV_LIST: {1: _LEN},
}


def schema_fields() -> dict[str, frozenset[int]]:
    """Every field number of each message of the request, from the descriptors of Keel's protobuf
    classes: protobuf checks what these hold, so one READ_FIELDS lacks is left to it."""
    found: dict[str, frozenset[int]] = {}
    pending = [ExportTraceServiceRequest.DESCRIPTOR]
    while pending:
        descriptor = pending.pop()
        if descriptor.full_name not in found:
            found[descriptor.full_name] = frozenset(field.number for field in descriptor.fields)
            pending.extend(field.message_type for field in descriptor.fields if field.message_type is not None)
    return found


_SCHEMA: Final = schema_fields()


class Unread(Exception):
    """The body has something this reader leaves to protobuf's runtime."""


class _Message:
    """A message's fields as `Reader.tag` checks them: `read[number]` is the wire type of a field this
    reader reads plus one, 0 for the others."""

    def __init__(self, name: str) -> None:
        fields = READ_FIELDS[name]
        table = bytearray(max(fields) + 1)
        for number, wire_type in fields.items():
            table[number] = wire_type + 1
        self.read = bytes(table)
        self.schema = _SCHEMA[name]


_REQUEST_FIELDS: Final = _Message(_REQUEST)
_RESOURCE_SPANS_FIELDS: Final = _Message(_RESOURCE_SPANS)
_RESOURCE_FIELDS: Final = _Message(_RESOURCE)
_SCOPE_SPANS_FIELDS: Final = _Message(_SCOPE_SPANS)
_SCOPE_FIELDS: Final = _Message(_SCOPE)
_SPAN_FIELDS: Final = _Message(_SPAN)
_EVENT_FIELDS: Final = _Message(_EVENT)
_STATUS_FIELDS: Final = _Message(_STATUS)
_KEY_VALUE_FIELDS: Final = _Message(_KEY_VALUE)
_ANY_VALUE_FIELDS: Final = _Message(_ANY_VALUE)
_ARRAY_FIELDS: Final = _Message(_ARRAY)
_KV_LIST_FIELDS: Final = _Message(_KV_LIST)


def _int32(value: int) -> int:
    """An enum's varint as protobuf keeps it: the low 32 bits, signed."""
    value &= 0xFFFFFFFF
    return value - 0x100000000 if value >= 0x80000000 else value


def _int64(value: int) -> int:
    return value - 0x10000000000000000 if value >= 0x8000000000000000 else value


class Reader:
    """One pass over a request body (`spans_read`)."""

    def __init__(self, body: bytes, limit: int, otlp: Any) -> None:
        self.data = body
        self.buf = self.data
        self.size = len(body)
        self.pos = 0
        self.end = 0  # a LEN field's end, once `length` has read it
        self.cut = 0  # the length of the string value `any_value` just cut, or 0
        self.limit = limit
        self.clean = otlp._clean
        self.finite = otlp._finite
        self.rejection = otlp._pb_rejection
        self.raw_span = otlp.RawSpan
        self.span_event = otlp.SpanEvent
        self.missing_resource = otlp.MISSING_RESOURCE
        self.zero_span_id = otlp._ZERO_SPAN_ID

    # --- the wire format

    def varint(self) -> int:
        buf = self.buf
        pos = self.pos
        result = 0
        shift = 0
        while True:
            if pos >= self.size or shift > 63:
                raise Unread("a truncated or over-long varint")
            byte = buf[pos]
            pos += 1
            if shift == 63 and byte > 1:
                raise Unread("a varint past 64 bits")
            result |= (byte & 0x7F) << shift
            if byte < 0x80:
                break
            shift += 7
        self.pos = pos
        return result

    def fixed(self, size: int) -> int:
        buf = self.buf
        pos = self.pos
        if size > self.size - pos:
            raise Unread("a truncated fixed-size field")
        result = 0
        index = size
        while index > 0:
            index -= 1
            result = (result << 8) | buf[pos + index]
        self.pos = pos + size
        return result

    def length(self) -> int:
        """Read a LEN field's length; sets `end` and returns where its content starts."""
        size = self.varint()
        start = self.pos
        if size > self.size - start:
            raise Unread("a field longer than the body")
        self.end = start + size
        return start

    def skip(self, wire_type: int) -> None:
        if wire_type == _VARINT:
            self.varint()
        elif wire_type == _I64:
            self.fixed(8)
        elif wire_type == _LEN:
            self.length()
            self.pos = self.end
        elif wire_type == _I32:
            self.fixed(4)
        else:
            raise Unread("a group or an unknown wire type")

    def tag(self, message: _Message) -> int:
        """Read a field's tag; returns its number when the message reads it with this wire type, else
        skips the field (not in the schema) and returns 0. Raises Unread for a field of the schema that
        this reader does not read."""
        key = self.varint()
        number = key >> 3
        wire_type = key & 7
        read = message.read
        expected = read[number] if number < len(read) else 0
        if expected == 0:
            if number == 0 or number > _MAX_FIELD_NUMBER or number in message.schema:
                raise Unread(f"field {number}")
            self.skip(wire_type)
            return 0
        if expected != wire_type + 1:
            raise Unread(f"field {number} with wire type {wire_type}")
        return number

    def text(self) -> str:
        start = self.length()
        end = self.end
        self.pos = end
        try:
            return self.data[start:end].decode("utf-8")
        except UnicodeDecodeError:
            raise Unread("a string that is not UTF-8") from None

    def raw(self) -> bytes:
        start = self.length()
        end = self.end
        self.pos = end
        return self.data[start:end]

    def close(self, end: int) -> None:
        """Check that the message's last field ended where the message does."""
        if self.pos != end:
            raise Unread("a field that runs past its message")

    # --- messages

    def request(self) -> tuple[list[Any], Counter[str]]:
        spans: list[Any] = []
        reasons: Counter[str] = Counter()
        while self.pos < self.size:
            if self.tag(_REQUEST_FIELDS) == 1:
                start = self.length()
                end = self.end
                self.resource_spans(start, end, spans, reasons)
                self.pos = end
        return spans, reasons

    def resource_spans(self, start: int, end: int, spans: list[Any], reasons: Counter[str]) -> None:
        resource: dict[str, Any] | None = None
        scopes: list[tuple[int, int]] = []
        self.pos = start
        while self.pos < end:
            number = self.tag(_RESOURCE_SPANS_FIELDS)
            if number == 1:
                if resource is not None:
                    raise Unread("a second resource")
                first = self.length()
                last = self.end
                resource = self.resource(first, last)
            elif number == 2:
                first = self.length()
                scopes.append((first, self.end))
                self.pos = self.end
            elif number == 3:
                self.text()
        self.close(end)
        # The resource may come after its spans in the body.
        for first, last in scopes:
            self.scope_spans(first, last, resource, spans, reasons)

    def resource(self, start: int, end: int) -> dict[str, Any]:
        attributes: dict[str, Any] = {}
        self.pos = start
        while self.pos < end:
            number = self.tag(_RESOURCE_FIELDS)
            if number == 1:
                first = self.length()
                self.key_value(first, self.end, attributes, None, 0)
            elif number == 2:
                self.varint()
        self.close(end)
        return attributes

    def scope_spans(
        self, start: int, end: int, resource: dict[str, Any] | None, spans: list[Any], reasons: Counter[str]
    ) -> None:
        scope_name = ""
        scope_version = ""
        seen_scope = False
        bodies: list[tuple[int, int]] = []
        self.pos = start
        while self.pos < end:
            number = self.tag(_SCOPE_SPANS_FIELDS)
            if number == 1:
                if seen_scope:
                    raise Unread("a second scope")
                seen_scope = True
                first = self.length()
                scope_name, scope_version = self.scope(first, self.end)
            elif number == 2:
                first = self.length()
                bodies.append((first, self.end))
                self.pos = self.end
            elif number == 3:
                self.text()
        self.close(end)
        scope_name = self.clean(scope_name, self.limit)
        scope_version = self.clean(scope_version, self.limit)
        for first, last in bodies:
            # Every span is read, resource or not: one protobuf would refuse is refused here too.
            span = self.span(first, last, resource, scope_name, scope_version, reasons)
            if span is not None:
                spans.append(span)

    def scope(self, start: int, end: int) -> tuple[str, str]:
        name = ""
        version = ""
        self.pos = start
        while self.pos < end:
            number = self.tag(_SCOPE_FIELDS)
            if number == 1:
                name = self.text()
            elif number == 2:
                version = self.text()
            elif number == 4:
                self.varint()
        self.close(end)
        return name, version

    def span(
        self,
        start: int,
        end: int,
        resource: dict[str, Any] | None,
        scope_name: str,
        scope_version: str,
        reasons: Counter[str],
    ) -> Any:
        """The span as tracing.otlp's `decode_protobuf_runtime` builds it, or None (its reason counted)."""
        trace_id = b""
        span_id = b""
        parent_id = b""
        name = ""
        kind = 0
        start_ns = 0
        end_ns = 0
        status: tuple[int, str] | None = None
        truncated: dict[str, int] = {}
        attributes: dict[str, Any] = {}
        events: list[Any] = []
        self.pos = start
        while self.pos < end:
            number = self.tag(_SPAN_FIELDS)
            if number == 9:
                first = self.length()
                self.key_value(first, self.end, attributes, truncated, 0)
            elif number == 1:
                trace_id = self.raw()
            elif number == 2:
                span_id = self.raw()
            elif number == 4:
                parent_id = self.raw()
            elif number == 5:
                name = self.text()
            elif number == 6:
                kind = _int32(self.varint())
            elif number == 7:
                start_ns = self.fixed(8)
            elif number == 8:
                end_ns = self.fixed(8)
            elif number == 11:
                first = self.length()
                events.append(self.event(first, self.end))
            elif number == 15:
                if status is not None:
                    raise Unread("a second status")
                first = self.length()
                status = self.status(first, self.end)
            elif number == 3:
                self.text()
            elif number == 16:
                self.fixed(4)
            elif number != 0:  # 10, 12, 14: the dropped counts
                self.varint()
        self.close(end)
        if resource is None:
            reasons[self.missing_resource] += 1
            return None
        reason = self.rejection(trace_id, span_id, parent_id, name, start_ns, end_ns)
        if reason is not None:
            reasons[reason] += 1
            return None
        limit = self.limit
        if len(name) > limit or "\x00" in name:
            name = self.clean(name, limit)
        status_code = 0
        status_message = ""
        if status is not None:
            status_code, status_message = status
            if len(status_message) > limit or "\x00" in status_message:
                status_message = self.clean(status_message, limit)
        # Positional, in RawSpan's field order (a call with keywords costs a dict here).
        return self.raw_span(
            trace_id.hex(),
            span_id.hex(),
            parent_id.hex() if parent_id and parent_id != self.zero_span_id else None,
            name,
            kind,
            start_ns,
            end_ns,
            status_code,
            status_message,
            attributes,
            tuple(events),
            resource,
            scope_name,
            scope_version,
            truncated,
        )

    def event(self, start: int, end: int) -> Any:
        time_ns = 0
        name = ""
        attributes: dict[str, Any] = {}
        self.pos = start
        while self.pos < end:
            number = self.tag(_EVENT_FIELDS)
            if number == 3:
                first = self.length()
                self.key_value(first, self.end, attributes, None, 0)
            elif number == 1:
                time_ns = self.fixed(8)
            elif number == 2:
                name = self.text()
            elif number == 4:
                self.varint()
        self.close(end)
        return self.span_event(name=self.clean(name, self.limit), time_ns=time_ns, attributes=attributes)

    def status(self, start: int, end: int) -> tuple[int, str]:
        code = 0
        message = ""
        self.pos = start
        while self.pos < end:
            number = self.tag(_STATUS_FIELDS)
            if number == 2:
                message = self.text()
            elif number == 3:
                code = _int32(self.varint())
        self.close(end)
        return code, message

    def key_value(
        self, start: int, end: int, into: dict[str, Any], truncated: dict[str, int] | None, depth: int
    ) -> None:
        """Read a KeyValue into `into` as tracing.otlp's `_pb_attributes` and `_pb_value` would; a span's
        own attributes pass `truncated`, where the original length of a string cut short is kept."""
        key = ""
        value: Any = None
        cut = 0
        seen_value = False
        self.pos = start
        while self.pos < end:
            number = self.tag(_KEY_VALUE_FIELDS)
            if number == 1:
                key = self.text()
            elif number == 2:
                if seen_value:
                    raise Unread("a second value")
                seen_value = True
                first = self.length()
                value = self.any_value(first, self.end, depth + 1)
                cut = self.cut
        self.close(end)
        if "\x00" in key:
            key = key.replace("\x00", "\ufffd")
        if cut and truncated is not None:
            truncated[key] = cut
        into[key] = value

    def any_value(self, start: int, end: int, depth: int) -> Any:
        """The value as tracing.otlp's `_pb_value` makes it; `cut` tells whether a string was cut short."""
        if depth > MAX_VALUE_DEPTH:
            raise Unread("values nested too deep")
        value: Any = None
        seen = False
        cut = 0
        self.pos = start
        while self.pos < end:
            number = self.tag(_ANY_VALUE_FIELDS)
            if number == 0:
                continue
            if seen:
                raise Unread("a second value of the oneof")
            seen = True
            if number == 1:
                text = self.text()
                limit = self.limit
                if len(text) > limit:
                    cut = len(text)
                    text = self.clean(text, limit)
                elif "\x00" in text:
                    text = self.clean(text, limit)
                value = text
            elif number == 2:
                value = self.varint() != 0
            elif number == 3:
                value = _int64(self.varint())
            elif number == 4:
                first = self.pos
                self.fixed(8)
                value = self.finite(_DOUBLE.unpack_from(self.data, first)[0])
            elif number == 7:
                encoded = base64.b64encode(self.raw()).decode("ascii")
                value = self.clean(encoded, self.limit) if len(encoded) > self.limit else encoded
            elif number == 5:
                first = self.length()
                value = self.array(first, self.end, depth)
            else:
                first = self.length()
                value = self.kv_list(first, self.end, depth)
        self.close(end)
        self.cut = cut
        return value

    def array(self, start: int, end: int, depth: int) -> list[Any]:
        values: list[Any] = []
        self.pos = start
        while self.pos < end:
            if self.tag(_ARRAY_FIELDS) == 1:
                first = self.length()
                values.append(self.any_value(first, self.end, depth + 1))
        self.close(end)
        return values

    def kv_list(self, start: int, end: int, depth: int) -> dict[str, Any]:
        values: dict[str, Any] = {}
        self.pos = start
        while self.pos < end:
            if self.tag(_KV_LIST_FIELDS) == 1:
                first = self.length()
                self.key_value(first, self.end, values, None, depth + 1)
        self.close(end)
        return values


def spans_read(body: bytes, limit: int) -> tuple[list[Any], Counter[str]]:
    """The body's valid spans as tracing.otlp.RawSpans, and how many were rejected for each reason (as
    tracing.otlp's `decode_protobuf_runtime` counts them); raises Unread for a body left to protobuf."""
    from tracing import otlp  # tracing.otlp imports this module

    return Reader(body, limit, otlp).request()
