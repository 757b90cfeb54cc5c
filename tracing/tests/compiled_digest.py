"""Run by tracing/tests/test_compiled.py in a process of its own (`python -m tracing.tests.compiled_digest
DIR`): each OTLP body in DIR through the pipeline's compiled modules, as this process imported them, and
a digest of what each stage made of it, so that a process with the modules compiled and one without can
be compared. Prints JSON: which modules ran compiled, and the digests by body."""

from __future__ import annotations

import hashlib
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from tracing import compiled, otlp, records, signals, steps

CONTENT_TYPES = {".pb": otlp.CONTENT_TYPE_PROTOBUF, ".json": otlp.CONTENT_TYPE_JSON}


def _digest(value: Any) -> str:
    return hashlib.sha256(repr(value).encode()).hexdigest()


def body_digests(body: bytes, content_type: str) -> dict[str, str]:
    request = otlp.decode_request(body, content_type, None)
    spans = otlp.map_spans(request.spans)
    by_trace: dict[str, list[otlp.Span]] = defaultdict(list)
    for span in spans:
        by_trace[span.trace_id].append(span)
    views = [steps.trajectory_view_build(by_trace[trace_id], trace_id=trace_id) for trace_id in sorted(by_trace)]
    return {
        "decoded": _digest(request),
        "mapped": _digest(spans),
        "rows": _digest([records.span_record(span) for span in spans]),
        "trajectories": _digest(views),
        "signals": _digest([signals.signals_compute(view) for view in views]),
    }


def main(directory: Path) -> None:
    digests = {
        path.name: body_digests(path.read_bytes(), CONTENT_TYPES[path.suffix])
        for path in sorted(directory.iterdir())
        if path.suffix in CONTENT_TYPES
    }
    print(json.dumps({"compiled": compiled.modules_loaded(), "digests": digests}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
