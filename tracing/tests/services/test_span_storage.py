"""How spans_write stores span rows (COPY in binary format, no foreign-key constraint from the span
table to the workspace: tracing 0021) and finds the batch's stored trajectories."""

from __future__ import annotations

import hashlib
from decimal import Decimal
from typing import Any

import orjson
import pytest
from django.db import connection
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

from agent_registry import services as registry_services
from agent_registry.models import Workspace
from tracing import otlp, selectors, services
from tracing.models import Span, Trajectory
from tracing.records import INPUT_FROM, RESOURCE_FROM
from tracing.tests.agent_traces import long_conversation, refund_conversation

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
        # Every field comes back as mapped; ingest adds the cost (litellm's price of the model call).
        assert span.with_cost(mapped[span.span_id].cost_usd) == mapped[span.span_id]


def test_each_model_call_is_stored_as_what_it_adds_to_the_history_and_read_back_whole(otel, workspace):
    trace_id = long_conversation(otel.tracer(), turns=6)
    mapped = {span.span_id: span for span in otel.spans()}
    api_key, _ = registry_services.apikey_create(workspace=workspace, name="k", scopes=["ingest"])
    services.ingest_otlp_accept(
        api_key=api_key, body=otel.protobuf(), content_type="application/x-protobuf", content_encoding=""
    )

    rows = dict(Span.objects.filter(workspace=workspace, trace_id=trace_id).values_list("span_id", "data"))
    stored_data = {span_id: orjson.loads(data) for span_id, data in rows.items()}
    continued = {span_id: data for span_id, data in stored_data.items() if INPUT_FROM in data}
    calls = [span for span in mapped.values() if span.span_type == "generation"]
    assert len(calls) == 6
    assert len(continued) == 5
    for span_id, data in continued.items():
        earlier, count = data[INPUT_FROM]
        # The user's question, then an answer and a tool result per earlier call.
        assert count == len(mapped[earlier].input) == len(mapped[span_id].input) - 2
        assert data["input"] == mapped[span_id].input[count:]
    # The spans share their resource and scope: the first keeps them, the others name it.
    kept = [span_id for span_id, data in stored_data.items() if RESOURCE_FROM not in data]
    assert len(kept) == 1
    assert {data[RESOURCE_FROM] for data in stored_data.values() if RESOURCE_FROM in data} == set(kept)
    stored = selectors.trace_spans(workspace_id=workspace.pk, trace_ids=[trace_id])[trace_id]
    assert len(stored) == len(mapped) == 13
    for span in stored:
        assert span.with_cost(mapped[span.span_id].cost_usd) == mapped[span.span_id]


def test_a_workspaces_spans_leave_with_it(otel, workspace, other_workspace):
    _ingest(otel, workspace)
    kept, _ = _ingest(otel, other_workspace)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_constraint WHERE conrelid = 'tracing_span'::regclass AND contype = 'f'")
        assert cursor.fetchone() == (0,)

    Workspace.objects.filter(pk=workspace.pk).delete()

    assert set(Span.objects.values_list("workspace_id", "trace_id").distinct()) == {(other_workspace.pk, kept)}
    assert list(Trajectory.objects.values_list("trace_id", flat=True)) == [kept]


def test_trajectory_rows_keep_awkward_values_when_inserted_and_when_assembled_again(otel, workspace):
    """The trajectory rows travel to PostgreSQL as one JSON document (`_rows_document`): text, lists, objects,
    money and floats come back as they were, from the INSERT of a new trace and from the UPDATE of one
    assembled again when more of its spans arrive."""
    api_key, _ = registry_services.apikey_create(workspace=workspace, name="k", scopes=["ingest"])
    tracer = otel.tracer()
    with tracer.start_as_current_span(
        "invoke_agent awkward",
        attributes={
            "gen_ai.operation.name": "invoke_agent",
            otlp.KEEL_SESSION_ID: AWKWARD,
            otlp.KEEL_TAGS: [AWKWARD, "plain"],
            otlp.KEEL_REWARD: 0.1,
            f"{otlp.KEEL_METADATA_PREFIX}note": AWKWARD,
            f"{otlp.KEEL_METADATA_PREFIX}numbers": [2**62, -1],
            f"{otlp.KEEL_METADATA_PREFIX}ratio": 2.5e-7,
        },
    ) as root:
        trace_id = format(root.get_span_context().trace_id, "032x")
        with tracer.start_as_current_span("first step"):
            pass
    *first_batch, root_span = otel.exporter.get_finished_spans()
    with tracer.start_as_current_span("late step", context=trace.set_span_in_context(root)):
        pass
    (late,) = otel.exporter.get_finished_spans()[2:]

    def ingest(spans: list[Any]) -> Trajectory:
        body = encode_spans(spans).SerializeToString()
        services.ingest_otlp_accept(
            api_key=api_key, body=body, content_type=otlp.CONTENT_TYPE_PROTOBUF, content_encoding=""
        )
        return Trajectory.objects.get(workspace=workspace, trace_id=trace_id)

    inserted = ingest([*first_batch, root_span])
    assembled_again = ingest([late])

    for trajectory, span_count in ((inserted, 2), (assembled_again, 3)):
        assert trajectory.span_count == span_count
        assert trajectory.session_id == AWKWARD
        assert trajectory.tags == sorted([AWKWARD, "plain"])
        assert trajectory.reward == 0.1
        assert trajectory.metadata == {"note": AWKWARD, "numbers": [2**62, -1], "ratio": 2.5e-7}
        assert trajectory.cost_usd == Decimal(0)
        assert trajectory.unpriced_models == []
        assert isinstance(trajectory.signals, list)
        assert trajectory.signal_names == [instance["signal"] for instance in trajectory.signals]


def _plan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(node for child in plan.get("Plans", ()) for node in _plan_nodes(child))]


def _md5(text: str) -> str:
    """The trace id `_trajectories_copy` gives copy number `text` (PostgreSQL's md5 of the number's text)."""
    return hashlib.md5(text.encode()).hexdigest()


def _trajectories_copy(cursor: Any, *, like: str, workspace_id: int, count: int, first: int) -> None:
    """`count` copies of the stored trajectory `like`, in `workspace_id`, with trace ids md5(first...)."""
    columns = [
        str(field.column)
        for field in Trajectory._meta.concrete_fields
        if field.column not in ("id", "trace_id", "workspace_id")
    ]
    cursor.execute(
        f"INSERT INTO tracing_trajectory (trace_id, workspace_id, {', '.join(columns)}) "
        f"SELECT md5(g::text), %s, {', '.join(columns)} FROM tracing_trajectory, generate_series(%s, %s) AS g "
        "WHERE trace_id = %s",
        [workspace_id, first, first + count - 1, like],
    )


@pytest.mark.parametrize("statistics", ["none", "stale", "current"])
def test_the_trajectory_lookup_probes_the_unique_index_per_trace_id(otel, workspace, other_workspace, statistics):
    """Whatever the planner knows of the trajectory table, the lookup reads one entry of the unique index per
    trace id asked for: with no statistics (a new install), with statistics taken when the workspace was
    rare (it grew since), and with current ones. `workspace_id = %s AND trace_id = ANY(...)` read every
    trajectory of the workspace in the first two. A trace id stored in another workspace only is not found."""
    trace_id, _ = _ingest(otel, workspace)
    with connection.cursor() as cursor:
        if statistics == "stale":
            _trajectories_copy(cursor, like=trace_id, workspace_id=other_workspace.pk, count=3000, first=100_000)
            cursor.execute("ANALYZE tracing_trajectory")
        _trajectories_copy(cursor, like=trace_id, workspace_id=workspace.pk, count=3000, first=1)
        _trajectories_copy(cursor, like=trace_id, workspace_id=other_workspace.pk, count=1, first=200_000)
        if statistics == "current":
            cursor.execute("ANALYZE tracing_trajectory")
        elif statistics == "none":
            cursor.execute("SELECT current_setting('server_version_num')::int")
            if cursor.fetchone()[0] < 180000:
                pytest.skip("clearing a table's statistics takes PostgreSQL 18")
            cursor.execute("SELECT pg_clear_relation_stats('public', 'tracing_trajectory')")
            for column in ("workspace_id", "trace_id"):
                cursor.execute("SELECT pg_clear_attribute_stats('public', 'tracing_trajectory', %s, false)", [column])
    stored = [_md5(str(number)) for number in (1, 2)]
    elsewhere = _md5("200000")
    asked = [trace_id, *stored, elsewhere, *(f"{number:032x}" for number in range(46))]

    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {services._TRAJECTORY_IDS}", [asked, workspace.pk])
        plan = cursor.fetchone()[0][0]["Plan"]
        found = services._trajectory_ids(cursor.cursor, workspace.pk, asked)

    nodes = _plan_nodes(plan)
    table = [node for node in nodes if node.get("Relation Name") == "tracing_trajectory"]
    assert [node["Actual Loops"] for node in table] == [len(asked)] == [50]
    assert {node["Index Name"] for node in nodes if "Index Name" in node} == {"trajectory_unique_per_workspace"}
    assert sum(node.get("Rows Removed by Filter", 0) for node in table) <= 1
    assert set(found) == {trace_id, *stored}
