"""A stored trajectory as OTLP/JSON, with its triage signals as span events. Pure module, no Django.

Served by `GET /api/v1/trajectories/{trace_id}/otlp`, so any OpenTelemetry tool (a collector, Jaeger,
Phoenix, Langfuse's OTLP endpoint, Keel itself) can take a trajectory with what Keel's triage found:

- every span, with its attributes in the vocabulary tracing.langfuse_encode writes (the attributes
  Keel did not map, unchanged, plus the `langfuse.*` names of the fields it did), its events and status;
- on the root span, the attributes `signals.triage_score` (double), `signals.names` (string array) and
  `signals.count` (int), and one event per signal instance (after the Signals paper's reference
  implementation, which emits `signal.<type>` events):

| event attribute | value |
|---|---|
| (event name) | `signal.<signal>`, e.g. `signal.loop` |
| `signal.name`, `signal.kind`, `signal.category` | e.g. `loop`, `retry`, `execution` |
| `signal.severity` (double), `signal.level` | in [0, 1]; `info`, `warning` or `error` |
| `signal.why` | the detector's explanation |
| `signal.snippets` (string array) | the quoted evidence |
| `signal.steps` (int array), `signal.span_ids` (string array) | the steps that show it, and their spans |

The event's time is the start of its first evidence step (the root span's end when it has none).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from tracing.langfuse_encode import langfuse_attributes
from tracing.otlp import SPAN_KINDS, Span
from tracing.steps import Step

_STATUS_CODES: Final = {"unset": 0, "ok": 1, "error": 2}


def any_value(value: Any) -> dict[str, Any]:
    """A value in OTLP/JSON's AnyValue form (int64 as a string, as the JSON mapping writes it)."""
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, (list, tuple)):
        return {"arrayValue": {"values": [any_value(item) for item in value]}}
    if isinstance(value, Mapping):
        return {"kvlistValue": {"values": key_values(value)}}
    if value is None:
        return {}
    return {"stringValue": json.dumps(value, ensure_ascii=False, default=str)}


def key_values(attributes: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [{"key": str(key), "value": any_value(value)} for key, value in attributes.items()]


def _root(spans: Sequence[Span]) -> Span | None:
    ids = {span.span_id for span in spans}
    roots = [span for span in spans if span.parent_span_id is None or span.parent_span_id not in ids]
    return min(roots or spans, key=lambda span: (span.start_time_ns, span.span_id)) if spans else None


def signal_events(
    instances: Iterable[Mapping[str, Any]], steps: Sequence[Step], fallback_time_ns: int
) -> list[dict[str, Any]]:
    """One OTLP event per stored signal instance (tracing.services.signal_report_json's form)."""
    events = []
    for instance in instances:
        indices = [index for index in instance.get("steps") or () if isinstance(index, int) and 0 <= index < len(steps)]
        evidence = [steps[index] for index in indices]
        attributes = {
            "signal.name": str(instance.get("signal", "")),
            "signal.kind": str(instance.get("kind", "")),
            "signal.category": str(instance.get("category", "")),
            "signal.severity": float(instance.get("severity") or 0.0),
            "signal.level": str(instance.get("level", "")),
            "signal.why": str(instance.get("why", "")),
            "signal.snippets": [str(snippet) for snippet in instance.get("snippets") or ()],
            "signal.steps": indices,
            "signal.span_ids": list(dict.fromkeys(step.span_id for step in evidence)),
        }
        events.append(
            {
                "timeUnixNano": str(evidence[0].start_time_ns if evidence else fallback_time_ns),
                "name": f"signal.{attributes['signal.name']}",
                "attributes": key_values(attributes),
            }
        )
    return events


def trajectory_otlp_json(
    spans: Sequence[Span],
    steps: Sequence[Step],
    *,
    signals: Sequence[Mapping[str, Any]],
    signal_names: Sequence[str],
    triage_score: float,
) -> dict[str, Any]:
    """An OTLP/JSON `ExportTraceServiceRequest` body holding the trajectory's spans, grouped by resource
    and scope, the signals on the root span."""
    root = _root(spans)
    groups: dict[str, dict[str, Any]] = {}
    for span in sorted(spans, key=lambda item: (item.start_time_ns, item.span_id)):
        resource_key = json.dumps(span.resource_attributes, sort_keys=True, default=str)
        resource = groups.setdefault(
            resource_key,
            {"resource": {"attributes": key_values(span.resource_attributes)}, "scopes": {}},
        )
        scope = resource["scopes"].setdefault(
            (span.scope_name, span.scope_version),
            {"scope": {"name": span.scope_name, "version": span.scope_version}, "spans": []},
        )
        attributes: dict[str, Any] = dict(langfuse_attributes(span))
        events = [
            {"timeUnixNano": str(event.time_ns), "name": event.name, "attributes": key_values(event.attributes)}
            for event in span.events
        ]
        if span is root:
            attributes["signals.triage_score"] = float(triage_score)
            attributes["signals.names"] = list(signal_names)
            attributes["signals.count"] = len(signals)
            events.extend(signal_events(signals, steps, span.end_time_ns))
        encoded: dict[str, Any] = {
            "traceId": span.trace_id,
            "spanId": span.span_id,
            "name": span.name,
            "kind": SPAN_KINDS.index(span.kind) if span.kind in SPAN_KINDS else 1,
            "startTimeUnixNano": str(span.start_time_ns),
            "endTimeUnixNano": str(span.end_time_ns),
            "attributes": key_values(attributes),
            "events": events,
            "status": {"code": _STATUS_CODES.get(span.status, 0), "message": span.status_message},
        }
        if span.parent_span_id:
            encoded["parentSpanId"] = span.parent_span_id
        scope["spans"].append(encoded)
    return {
        "resourceSpans": [
            {"resource": group["resource"], "scopeSpans": list(group["scopes"].values())} for group in groups.values()
        ]
    }
