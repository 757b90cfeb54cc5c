"""Where the OpenTelemetry examples send their spans, and how they notice that sending failed.

The exporter is configured only through the standard variables
(`OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, `OTEL_EXPORTER_OTLP_HEADERS`,
`OTEL_SERVICE_NAME`). `KEEL_URL` and `KEEL_API_KEY` are a shorthand: when the OTLP variables are not
set, they are filled in from these two, as `OTEL_EXPORTER_OTLP_ENDPOINT=$KEEL_URL` and
`OTEL_EXPORTER_OTLP_HEADERS="Authorization=Bearer $KEEL_API_KEY"`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

DEFAULT_KEEL_URL = "http://127.0.0.1:8000"  # where `make run` serves Keel


def keel_url() -> str:
    return os.environ.get("KEEL_URL", DEFAULT_KEEL_URL).rstrip("/")


def keel_api_key() -> str:
    """The API key from KEEL_API_KEY; exits with a message when there is none."""
    key = os.environ.get("KEEL_API_KEY", "")
    if not key:
        sys.exit(
            "Set KEEL_API_KEY to a Keel API key with the ingest scope, e.g. from\n"
            "  .venv/bin/python manage.py apikey_create --agent ride-support --scopes ingest read"
        )
    return key


def otlp_environment_prepare(service_name: str) -> None:
    """Fill in the standard OTLP variables from KEEL_URL / KEEL_API_KEY where they are not set."""
    if not (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")):
        # The exporter appends /v1/traces to OTEL_EXPORTER_OTLP_ENDPOINT.
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = keel_url()
    if not (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS") or os.environ.get("OTEL_EXPORTER_OTLP_HEADERS")):
        os.environ["OTEL_EXPORTER_OTLP_HEADERS"] = f"Authorization=Bearer {keel_api_key()}"
    os.environ.setdefault("OTEL_SERVICE_NAME", service_name)


class CheckedExporter(SpanExporter):
    """Passes spans on to another exporter and remembers whether any export failed.

    The SDK's exporters report a failed export (a 401, a server that is down) by logging it; an
    example should also say so in its exit status.
    """

    def __init__(self, exporter: SpanExporter) -> None:
        self.exporter = exporter
        self.exported_spans = 0
        self.failed_spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = self.exporter.export(spans)
        if result is SpanExportResult.SUCCESS:
            self.exported_spans += len(spans)
        else:
            self.failed_spans += len(spans)
        return result

    def shutdown(self) -> None:
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.exporter.force_flush(timeout_millis)
