"""How spans_write stores span rows: COPY in binary format, and no foreign-key constraint from the span
table to the workspace (tracing 0021)."""

from __future__ import annotations

from decimal import Decimal

import orjson
import pytest
from django.db import connection

from agent_registry import services as registry_services
from agent_registry.models import Workspace
from tracing import otlp, selectors, services
from tracing.models import Span, Trajectory
from tracing.tests.agent_traces import refund_conversation

pytestmark = pytest.mark.django_db

# What text COPY escaped (backslash, tab, newline, carriage return), quotes, and text beyond ASCII.
AWKWARD = 'Mañana \\N a\tb\r\nc "quoted" \\\\ 🚕 — ünïcode'


def _ingest(otel, workspace, question: str = "I was charged twice") -> tuple[str, dict[str, otlp.Span]]:
    """Trace a refund conversation and ingest it; returns its trace id and its spans as mapped."""
    trace_id = refund_conversation(otel.tracer(), question=question)
    mapped = {span.span_id: span for span in otel.spans()}
    api_key, _ = registry_services.apikey_create(workspace=workspace, name="k", scopes=["ingest"])
    services.ingest_otlp_accept(
        api_key=api_key, body=otel.protobuf(), content_type="application/x-protobuf", content_encoding=""
    )
    otel.exporter.clear()
    return trace_id, mapped


def test_span_rows_keep_every_value_as_mapped(otel, workspace):
    trace_id, mapped = _ingest(otel, workspace, question=AWKWARD)

    rows = Span.objects.filter(workspace=workspace, trace_id=trace_id)
    assert rows.count() == len(mapped) == 4
    chat = rows.get(name="chat gpt-4o", input_tokens=100)
    assert (chat.output_tokens, chat.total_tokens, chat.model, chat.span_type) == (20, 120, "gpt-4o", "generation")
    # gpt-4o at litellm's prices: $2.50 and $10 per million input and output tokens.
    assert chat.cost_usd == Decimal("0.00045000")
    assert chat.prompt_version_id is None
    assert orjson.loads(chat.data)["input"] == [{"role": "user", "content": AWKWARD}]
    stored = selectors.trace_spans(workspace_id=workspace.pk, trace_ids=[trace_id])[trace_id]
    for span in stored:
        assert span.input == mapped[span.span_id].input
        assert span.output == mapped[span.span_id].output
        assert span.start_time_ns == mapped[span.span_id].start_time_ns
        assert span.parent_span_id == mapped[span.span_id].parent_span_id


def test_a_workspaces_spans_leave_with_it(otel, workspace, other_workspace):
    _ingest(otel, workspace)
    kept, _ = _ingest(otel, other_workspace)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_constraint WHERE conrelid = 'tracing_span'::regclass AND contype = 'f'")
        assert cursor.fetchone() == (0,)

    Workspace.objects.filter(pk=workspace.pk).delete()

    assert set(Span.objects.values_list("workspace_id", "trace_id").distinct()) == {(other_workspace.pk, kept)}
    assert list(Trajectory.objects.values_list("trace_id", flat=True)) == [kept]
