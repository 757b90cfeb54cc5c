"""A normalized span as a database row and back. Pure module, no Django.

The columns that queries filter and sum on (ids, type, status, times, model, tool, tokens, cost) are
columns; everything else of `tracing.otlp.Span` travels in one JSON document, `data`, which is cheaper
to write than a dozen JSON columns. `span_from_record(span_record(span))` gives back the same span.
"""

from __future__ import annotations

import base64
import logging
import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

import orjson

from tracing.otlp import Span, SpanEvent, Usage

# The fields of `data` taken as they are; `span_row` adds the others.
_DATA_FIELDS: Final = (
    "session_id",
    "user_id",
    "agent_name",
    "service_name",
    "trace_name",
    "request_model",
    "response_model",
    "input",
    "output",
    "tool_call_id",
    "prompt_name",
    "prompt_version",
    "task_id",
    "reward",
    "metadata",
    "error_type",
    "error_message",
    "resource_attributes",
    "scope_name",
    "scope_version",
    "attributes",
    "truncated_attributes",
    "finish_reasons",
)
_data_values: Final = operator.attrgetter(*_DATA_FIELDS)
# The fields of `data` left out when empty as well as when None: their reader (`span_from_record`) takes
# a missing key as empty. tool_arguments and tool_result are set apart by `span_row`.
_LEFT_OUT_EMPTY: Final = frozenset(
    {
        "metadata",
        "resource_attributes",
        "attributes",
        "truncated_attributes",
        "scope_name",
        "scope_version",
        "finish_reasons",
    }
)


# The key of `data` that names the span whose input a span's input goes on from (`InputHistories`).
INPUT_FROM: Final = "input_from"
# The key of `data` that names the span whose resource and scope a span has (`Resources`), and the fields
# it stands for.
RESOURCE_FROM: Final = "resource_from"
_RESOURCE_FIELDS: Final = ("service_name", "resource_attributes", "scope_name", "scope_version")

logger = logging.getLogger(__name__)


# The columns of a stored span that `span_from_record` reads (with `data`), in SpanRecord's order.
RECORD_COLUMNS: Final = (
    "trace_id",
    "span_id",
    "parent_span_id",
    "name",
    "kind",
    "span_type",
    "status",
    "status_message",
    "start_time_ns",
    "end_time_ns",
    "model",
    "tool_name",
    "input_tokens",
    "output_tokens",
    "total_tokens",
    "cost_usd",
)


# Not frozen, as tracing.otlp.Span is not (a frozen one costs a call per field to build); read-only all the same.
@dataclass(slots=True)
class SpanRecord:
    """The columns of a `tracing.Span` row, and `data` as JSON text ready for COPY."""

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: str
    span_type: str
    status: str
    status_message: str
    start_time_ns: int
    end_time_ns: int
    model: str
    tool_name: str
    input_tokens: int | None
    output_tokens: int | None
    total_tokens: int | None
    cost_usd: Decimal | None
    data: str


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=str)
    return str(value)


def json_dumps(value: Any) -> str:
    """JSON text PostgreSQL's jsonb accepts (orjson; bytes become base64, other oddities text)."""
    try:
        return orjson.dumps(value, default=_json_default).decode()
    except orjson.JSONEncodeError:
        pass
    # Keys other than strings take an option that makes every dict slower to write (a span's data: 5.0
    # against 2.8 µs), so only a value that has them pays for it.
    return orjson.dumps(value, default=_json_default, option=orjson.OPT_NON_STR_KEYS).decode()


def _int_column(value: int | None) -> int | None:
    # Token counts live in int4 columns; anything outside that range is not a real count.
    if value is None or not -(2**31) <= value < 2**31:
        return None
    return value


def span_row(
    span: Span, input_from: tuple[str, int] | None = None, resource_from: str | None = None
) -> tuple[Any, ...]:
    """A span's SpanRecord as a tuple, in its fields' order: what ingest writes, without building the record.

    `data` leaves out a field that holds None or is empty, which `span_from_record` reads back the same
    (a tool span's arguments and result aside: there, no key means the input's or the output's). The
    ingest benchmark's spans have 1,793 bytes of `data` on average, against 2,158 with every key written
    (1,052 as ingest writes them, with `input_from` and `resource_from`).

    With `input_from` (a span id and a count, from `InputHistories.input_from`), the span's input is a
    list whose first `count` items are that span's input: `data` keeps only the items after them, and
    names the span under `input_from`. With `resource_from` (from `Resources.resource_from`), the span's
    resource and scope are that span's: `data` names it instead of holding them. `spans_from_records`
    reads both back whole.
    """
    data: dict[str, Any] = {}
    for name, value in zip(_DATA_FIELDS, _data_values(span), strict=True):
        if value is not None and (value or name not in _LEFT_OUT_EMPTY):
            data[name] = value
    if input_from is not None:
        data["input"] = span.input[input_from[1] :]
        data[INPUT_FROM] = list(input_from)
    if resource_from is not None:
        for name in _RESOURCE_FIELDS:
            data.pop(name, None)
        data[RESOURCE_FROM] = resource_from
    # A tool span's arguments and result are, as mapped, the very objects of its input and output: kept
    # once, under `input` and `output`. A row without the key reads them back from there; None is kept.
    if span.input is None or span.tool_arguments is not span.input:
        data["tool_arguments"] = span.tool_arguments
    if span.output is None or span.tool_result is not span.output:
        data["tool_result"] = span.tool_result
    if span.tags:
        data["tags"] = list(span.tags)
    if span.tool_definitions:
        data["tool_definitions"] = list(span.tool_definitions)
    if span.events:
        data["events"] = [{"name": e.name, "time_ns": e.time_ns, "attributes": e.attributes} for e in span.events]
    usage = span.usage
    counts: dict[str, int] = {}
    if usage.cache_read_tokens is not None:
        counts["cache_read_tokens"] = usage.cache_read_tokens
    if usage.reasoning_tokens is not None:
        counts["reasoning_tokens"] = usage.reasoning_tokens
    if usage.cache_write_tokens is not None:
        counts["cache_write_tokens"] = usage.cache_write_tokens
    if counts:
        data["usage"] = counts
    cost = span.cost_usd
    return (
        span.trace_id,
        span.span_id,
        span.parent_span_id or "",
        span.name[:1000],
        span.kind,
        span.span_type,
        span.status,
        span.status_message,
        span.start_time_ns,
        span.end_time_ns,
        (span.model or "")[:300],
        (span.tool_name or "")[:300],
        _int_column(usage.input_tokens),
        _int_column(usage.output_tokens),
        _int_column(usage.total_tokens),
        None if cost is None else Decimal(str(cost)),
        json_dumps(data),
    )


def span_record(span: Span) -> SpanRecord:
    return SpanRecord(*span_row(span))


class InputHistories:
    """Which span, among the spans of one trace written together, a span's input goes on from.

    Each call of an agent's loop sends the whole dialogue so far: the trace's previous call's messages,
    then its answer and the tool results. Written whole, a trajectory of n calls stores about n²/2
    messages; in the ingest benchmark's requests, 512 of the 1,793 bytes of `data` per span repeated an
    earlier call's messages; written as what each call adds, 1,292 bytes. `tracing.otlp.map_spans` gives
    a history that goes on from an earlier one the very message objects of that one: the id of an earlier
    input's last message finds it, and comparing the same objects costs no more than comparing pointers.

    Only spans stored in the same statement are named, so a row never names one that is not there.
    """

    __slots__ = ("_ends",)

    def __init__(self) -> None:
        # id of the last item of an input seen -> (its span id, the input); the input keeps the id alive.
        self._ends: dict[int, tuple[str, list[Any]]] = {}

    def input_from(self, span: Span) -> tuple[str, int] | None:
        """(span id, count) of the longest input seen so far that starts the span's input, shorter than
        it; None when none does. Then remembers the span's input for the spans after it."""
        items = span.input
        # A tool span's input is also its arguments (`span_row` keeps them once): left whole.
        if type(items) is not list or not items or span.tool_arguments is items:
            return None
        ends = self._ends
        found = None
        for size in range(len(items) - 1, 0, -1):
            seen = ends.get(id(items[size - 1]))
            # The same objects compare equal at once; equal values found otherwise are as good a start.
            if seen is not None and len(seen[1]) == size and seen[1] == items[:size]:
                found = (seen[0], size)
                break
        ends[id(items[-1])] = (span.span_id, items)
        return found


class Resources:
    """Which span, among the spans of one trace written together, has a span's resource and scope.

    Every span of an OTLP request's resource repeats its attributes (the SDK's `telemetry.sdk.*`,
    `service.*`): 220 of the 1,292 bytes of `data` per span in the ingest benchmark's requests, with 82
    more of scope and service name. A trace's first span of each resource and scope keeps them; the
    others name it (1,052 bytes of `data` per span). The spans of one resource share its attributes'
    dict (`tracing.otlp`), whose id finds the spans seen with it.

    Only spans stored in the same statement are named, and only ones that keep the values themselves.
    """

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        # id of a resource's attributes -> the spans seen first with them (each keeps its dict alive)
        self._seen: dict[int, list[Span]] = {}

    def resource_from(self, span: Span) -> str | None:
        """The id of a span seen before with the same resource, scope and service name; None when there is
        none (the span is then remembered for the spans after it)."""
        resource = span.resource_attributes
        if not resource:
            return None
        seen = self._seen.setdefault(id(resource), [])
        for first in seen:
            if (
                first.scope_name == span.scope_name
                and first.scope_version == span.scope_version
                and first.service_name == span.service_name
            ):
                return first.span_id
        seen.append(span)
        return None


def trace_span_rows(spans: Iterable[Span]) -> list[tuple[Any, ...]]:
    """The rows (`span_row`) of spans of one trace written in one statement: a span whose input goes on
    from, or whose resource and scope are, an earlier one's names that span rather than repeating it."""
    histories = InputHistories()
    resources = Resources()
    return [span_row(span, histories.input_from(span), resources.resource_from(span)) for span in spans]


def spans_from_records(records: Iterable[tuple[Mapping[str, Any], dict[str, Any]]]) -> list[Span]:
    """Rebuild spans from rows' columns (as named in SpanRecord) and their decoded `data`, which this
    completes: an input stored as what it adds to another span's (`input_from`) is read whole, and a
    resource and scope another span has (`resource_from`) are read from it, among `records`, which holds
    every span of each trace it has a span of."""
    records = list(records)
    by_span = {(columns["trace_id"], columns["span_id"]): data for columns, data in records}
    for columns, data in records:
        if INPUT_FROM in data:
            _input_complete(columns["trace_id"], data, by_span)
        if RESOURCE_FROM in data:
            _resource_complete(columns["trace_id"], data, by_span)
    return [span_from_record(columns, data) for columns, data in records]


def _resource_complete(trace_id: str, data: dict[str, Any], by_span: Mapping[tuple[str, str], dict[str, Any]]) -> None:
    span_id = data.pop(RESOURCE_FROM)
    first = by_span.get((trace_id, span_id))
    if first is None or RESOURCE_FROM in first:
        # Ingest names only a span it writes with this one, which keeps its resource: a row written some
        # other way. The span reads back without resource.
        logger.warning("tracing.span_resource_missing", extra={"trace_id": trace_id, "span_id": span_id})
        return
    for name in _RESOURCE_FIELDS:
        if name in first:
            data[name] = first[name]


def _input_complete(trace_id: str, data: dict[str, Any], by_span: Mapping[tuple[str, str], dict[str, Any]]) -> None:
    """Put the whole input in `data`, and in each data it goes on from (nearest last)."""
    chain = [data]
    while True:
        span_id = chain[-1][INPUT_FROM][0]
        base = by_span.get((trace_id, span_id))
        if base is None or INPUT_FROM not in base or any(base is item for item in chain):
            break
        chain.append(base)
    for item in reversed(chain):
        span_id, count = item.pop(INPUT_FROM)
        base = by_span.get((trace_id, span_id))
        before = base.get("input") if base is not None and INPUT_FROM not in base else None
        if type(before) is not list or len(before) < count:
            # Ingest writes a span with the one it names, in one statement, and spans leave with their
            # trace: this is a row written some other way. Its input is what it added.
            logger.warning("tracing.span_input_base_missing", extra={"trace_id": trace_id, "span_id": span_id})
            continue
        item["input"] = [*before[:count], *(item.get("input") or ())]


def span_from_record(columns: Mapping[str, Any], data: Mapping[str, Any]) -> Span:
    """Rebuild a span from a row's columns (as named in SpanRecord) and its decoded `data`, complete:
    `spans_from_records` completes the data of a row that names another span (`input_from`, `resource_from`)."""
    usage = data.get("usage") or {}
    cost = columns.get("cost_usd")
    return Span(
        trace_id=columns["trace_id"],
        span_id=columns["span_id"],
        parent_span_id=columns["parent_span_id"] or None,
        name=columns["name"],
        kind=columns["kind"],
        start_time_ns=columns["start_time_ns"],
        end_time_ns=columns["end_time_ns"],
        status=columns["status"],
        status_message=columns["status_message"],
        span_type=columns["span_type"],
        session_id=data.get("session_id"),
        user_id=data.get("user_id"),
        agent_name=data.get("agent_name"),
        service_name=data.get("service_name"),
        trace_name=data.get("trace_name"),
        request_model=data.get("request_model"),
        response_model=data.get("response_model"),
        input=data.get("input"),
        output=data.get("output"),
        tool_name=columns["tool_name"] or None,
        tool_call_id=data.get("tool_call_id"),
        tool_arguments=data["tool_arguments"] if "tool_arguments" in data else data.get("input"),
        tool_result=data["tool_result"] if "tool_result" in data else data.get("output"),
        tool_definitions=tuple(data.get("tool_definitions") or ()),
        usage=Usage(
            input_tokens=columns.get("input_tokens"),
            output_tokens=columns.get("output_tokens"),
            total_tokens=columns.get("total_tokens"),
            cache_read_tokens=usage.get("cache_read_tokens"),
            reasoning_tokens=usage.get("reasoning_tokens"),
            cache_write_tokens=usage.get("cache_write_tokens"),
        ),
        cost_usd=float(cost) if cost is not None else None,
        prompt_name=data.get("prompt_name"),
        prompt_version=data.get("prompt_version"),
        task_id=data.get("task_id"),
        reward=data.get("reward"),
        tags=tuple(data.get("tags") or ()),
        metadata=data.get("metadata") or {},
        error_type=data.get("error_type"),
        error_message=data.get("error_message"),
        events=tuple(
            SpanEvent(name=event["name"], time_ns=event["time_ns"], attributes=event.get("attributes") or {})
            for event in data.get("events") or ()
        ),
        resource_attributes=data.get("resource_attributes") or {},
        scope_name=data.get("scope_name") or "",
        scope_version=data.get("scope_version") or "",
        attributes=data.get("attributes") or {},
        truncated_attributes=data.get("truncated_attributes") or {},
        # Rows written before the field existed have no key.
        finish_reasons=tuple(data.get("finish_reasons") or ()),
    )
