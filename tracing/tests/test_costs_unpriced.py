"""Model calls no price covers: a self-hosted model litellm does not know and the workspace prices not. Their cost
is unknown, not $0: null on the step, counted on the trajectory (`unpriced_calls`), and the trajectory's cost is
the sum of the priced calls, or null when none was priced."""

from __future__ import annotations

import base64
import importlib
from decimal import Decimal
from typing import Any

import orjson
import pytest
from django.apps import apps
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from opentelemetry.trace import StatusCode, Tracer

from tracing import selectors, services
from tracing.models import Span, Trajectory
from tracing.steps import CostNode, unpriced_calls
from tracing.tests.factories import TrajectoryFactory

pytestmark = pytest.mark.django_db

SELF_HOSTED = "acme/support-llama-8b"  # in no price map
# gpt-4o: $2.50 / M input, $10 / M output; 1000 in and 100 out cost $0.0035.
GPT_4O_CALL = Decimal("0.00350000")

migration = importlib.import_module("tracing.migrations.0020_trajectory_unpriced_calls")


def _chat(
    tracer: Tracer, model: str, input_tokens: int | None = 1000, output_tokens: int | None = 100, /, **extra: Any
) -> Any:
    attributes: dict[str, Any] = {"gen_ai.operation.name": "chat", "gen_ai.request.model": model}
    if input_tokens is not None:
        attributes["gen_ai.usage.input_tokens"] = input_tokens
    if output_tokens is not None:
        attributes["gen_ai.usage.output_tokens"] = output_tokens
    attributes.update(extra)
    return tracer.start_as_current_span(f"chat {model}", attributes=attributes)


def _run(tracer: Tracer, models: list[str], session: str = "s-1", **agent: Any) -> str:
    attributes = {"gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": session, **agent}
    with tracer.start_as_current_span("invoke_agent", attributes=attributes) as root:
        for model in models:
            with _chat(tracer, model):
                pass
    return format(root.get_span_context().trace_id, "032x")


def test_a_trajectory_with_priced_and_unpriced_calls_costs_the_priced_ones_and_counts_the_others(
    otel, workspace, api_client_for
):
    trace_id = _run(otel.tracer(), ["gpt-4o", SELF_HOSTED, "gpt-4o", SELF_HOSTED])
    otel.ingest(workspace)

    trajectory = Trajectory.objects.get(workspace=workspace)
    assert (trajectory.cost_usd, trajectory.unpriced_call_count, trajectory.unpriced_models) == (
        2 * GPT_4O_CALL,
        2,
        [SELF_HOSTED],
    )
    assert list(Span.objects.filter(model=SELF_HOSTED).values_list("cost_usd", flat=True)) == [None, None]

    client = api_client_for(workspace, scopes=["read"])
    (listed,) = client.get("/api/v1/trajectories").json()["items"]
    detail = client.get(f"/api/v1/trajectories/{trace_id}").json()
    (in_session,) = client.get("/api/v1/sessions/s-1").json()["trajectories"]
    for item in (listed, detail, in_session):
        assert (item["cost"], item["unpriced_calls"], item["unpriced_models"]) == ("0.00700000", 2, [SELF_HOSTED])
    calls = [(step["model"], step["cost_usd"]) for step in detail["step_details"] if step["kind"] == "llm_call"]
    assert calls == [("gpt-4o", 0.0035), (SELF_HOSTED, None), ("gpt-4o", 0.0035), (SELF_HOSTED, None)]


def test_a_trajectory_of_only_unpriced_calls_has_no_cost_not_a_cost_of_zero(otel, workspace, api_client_for):
    trace_id = _run(otel.tracer(), [SELF_HOSTED, SELF_HOSTED, "other/llm-without-price"])
    otel.ingest(workspace)

    trajectory = Trajectory.objects.get(workspace=workspace)
    assert (trajectory.cost_usd, trajectory.unpriced_call_count, trajectory.unpriced_models) == (
        None,
        3,
        [SELF_HOSTED, "other/llm-without-price"],
    )
    client = api_client_for(workspace, scopes=["read"])
    (listed,) = client.get("/api/v1/trajectories").json()["items"]
    detail = client.get(f"/api/v1/trajectories/{trace_id}").json()
    assert (listed["cost"], listed["unpriced_calls"]) == (None, 3)
    assert (detail["cost"], detail["unpriced_calls"]) == (None, 3)
    assert {step["cost_usd"] for step in detail["step_details"] if step["kind"] == "llm_call"} == {None}


def test_a_trajectory_without_model_calls_still_costs_zero(otel, workspace, api_client_for):
    _run(otel.tracer(), [])
    otel.ingest(workspace)

    trajectory = Trajectory.objects.get(workspace=workspace)
    assert (trajectory.cost_usd, trajectory.unpriced_call_count) == (Decimal(0), 0)
    (listed,) = api_client_for(workspace, scopes=["read"]).get("/api/v1/trajectories").json()["items"]
    assert (listed["cost"], listed["unpriced_calls"], listed["unpriced_models"]) == ("0.00000000", 0, [])


def test_a_reported_cost_counts_as_priced_and_a_reported_zero_yields_to_the_workspaces_price(
    otel, workspace, api_client_for
):
    services.model_price_set(
        workspace=workspace, model=SELF_HOSTED, input_usd_per_million=Decimal(1), output_usd_per_million=Decimal(2)
    )
    tracer = otel.tracer()
    with tracer.start_as_current_span("invoke_agent", attributes={"gen_ai.operation.name": "invoke_agent"}):
        with _chat(tracer, "reported/model", **{"gen_ai.usage.cost": 0.25}):
            pass
        with _chat(tracer, SELF_HOSTED, **{"gen_ai.usage.cost": 0.0}):  # 1000 × 1e-6 + 100 × 2e-6
            pass
        with _chat(tracer, "gpt-4o", **{"gen_ai.usage.cost": 0.0}):  # litellm's price alone: the sender's 0 stands
            pass
        with _chat(tracer, "zero/model", 0, 0, **{"gen_ai.usage.cost": 0.0}):  # no tokens used: 0 is a cost
            pass
    otel.ingest(workspace)

    trajectory = Trajectory.objects.get(workspace=workspace)
    assert (trajectory.cost_usd, trajectory.unpriced_call_count) == (Decimal("0.25120000"), 0)


def test_a_reported_zero_for_a_model_no_price_covers_is_unpriced_not_free(otel, workspace, api_client_for):
    """Langfuse's SDKs, among others, report 0 for a model their price map lacks: that is their "no price"."""
    tracer = otel.tracer()
    with tracer.start_as_current_span("invoke_agent", attributes={"gen_ai.operation.name": "invoke_agent"}):
        with _chat(tracer, "gpt-4o"):
            pass
        with _chat(tracer, SELF_HOSTED, **{"gen_ai.usage.cost": 0.0}):
            pass
    otel.ingest(workspace)

    trajectory = Trajectory.objects.get(workspace=workspace)
    assert (trajectory.cost_usd, trajectory.unpriced_call_count, trajectory.unpriced_models) == (
        GPT_4O_CALL,
        1,
        [SELF_HOSTED],
    )
    assert Span.objects.get(model=SELF_HOSTED).cost_usd is None


def test_a_failed_call_with_no_usage_is_not_an_unpriced_one_but_a_call_with_no_usage_is(otel, workspace):
    tracer = otel.tracer()
    with tracer.start_as_current_span("invoke_agent", attributes={"gen_ai.operation.name": "invoke_agent"}):
        with _chat(tracer, "gpt-4o", None, None) as refused:
            refused.set_status(StatusCode.ERROR, "rate limited")
        with _chat(tracer, "gpt-4o", None, None):  # answered, but its usage was not recorded
            pass
        with _chat(tracer, "gpt-4o"):
            pass
    otel.ingest(workspace)

    trajectory = Trajectory.objects.get(workspace=workspace)
    assert (trajectory.cost_usd, trajectory.unpriced_call_count, trajectory.unpriced_models) == (
        GPT_4O_CALL,
        1,
        ["gpt-4o"],
    )


def test_a_priced_span_arriving_later_makes_the_cost_known(otel, workspace):
    tracer = otel.tracer()
    with tracer.start_as_current_span("invoke_agent", attributes={"gen_ai.operation.name": "invoke_agent"}) as root:
        with _chat(tracer, SELF_HOSTED):
            pass
        otel.ingest(workspace)  # the call first, the rest of the trace in a later batch
        assert Trajectory.objects.values_list("cost_usd", "unpriced_call_count").get() == (None, 1)
        with _chat(tracer, "gpt-4o"):
            pass
    otel.ingest(workspace)

    trajectory = Trajectory.objects.get(trace_id=format(root.get_span_context().trace_id, "032x"))
    assert (trajectory.cost_usd, trajectory.unpriced_call_count, trajectory.unpriced_models) == (
        GPT_4O_CALL,
        1,
        [SELF_HOSTED],
    )


def test_ordering_by_cost_puts_unknown_costs_last_both_ways_and_pages_through_them(otel, workspace, api_client_for):
    tracer = otel.tracer()
    unknown = [_run(tracer, [SELF_HOSTED]) for _ in range(2)]
    one = _run(tracer, ["gpt-4o"])
    two = _run(tracer, ["gpt-4o", "gpt-4o", SELF_HOSTED])
    free = _run(tracer, [])
    otel.ingest(workspace)
    client = api_client_for(workspace, scopes=["read"])
    # Unknown costs tie on null: the id breaks the tie, the later row first when descending.
    by_pk = sorted(unknown, key=lambda trace_id: Trajectory.objects.get(trace_id=trace_id).pk)

    def paged(order: str) -> list[str]:
        seen: list[str] = []
        query = f"/api/v1/trajectories?order={order}&limit=1"
        page = client.get(query).json()
        while True:
            seen += [item["trace_id"] for item in page["items"]]
            if page["next_cursor"] is None:
                return seen
            page = client.get(f"{query}&cursor={page['next_cursor']}").json()

    for order, expected in (("-cost", [two, one, free, *reversed(by_pk)]), ("cost", [free, one, two, *by_pk])):
        whole = [item["trace_id"] for item in client.get(f"/api/v1/trajectories?order={order}").json()["items"]]
        assert whole == expected
        assert paged(order) == expected


def test_a_sessions_cost_is_unknown_only_when_none_of_its_turns_was_priced(otel, workspace, api_client_for):
    tracer = otel.tracer()
    _run(tracer, [SELF_HOSTED], session="dark")
    _run(tracer, [SELF_HOSTED, SELF_HOSTED], session="dark")
    _run(tracer, [SELF_HOSTED], session="mixed")
    _run(tracer, ["gpt-4o"], session="mixed")
    _run(tracer, ["gpt-4o"], session="priced")
    otel.ingest(workspace)

    listed = api_client_for(workspace, scopes=["read"]).get("/api/v1/sessions").json()

    totals = {session["session_id"]: (session["cost_usd"], session["unpriced_calls"]) for session in listed}
    assert totals == {"dark": (None, 3), "mixed": ("0.00350000", 1), "priced": ("0.00350000", 0)}
    models = {session["session_id"]: session["unpriced_models"] for session in listed}
    assert models == {"dark": [SELF_HOSTED], "mixed": [SELF_HOSTED], "priced": []}


@pytest.mark.parametrize(
    ("nodes", "expected"),
    [
        # A call under a wrapper that reports its cost, and one that reports it for the call below it.
        (
            [
                CostNode("agent", None, False, True, None),
                CostNode("call", "agent", True, False, "m"),
                CostNode("wrapper", None, True, False, "w"),
                CostNode("inner", "wrapper", False, True, None),
            ],
            (0, ()),
        ),
        # An unpriced call beside a priced one under a parent without a cost; a cycle of parents ends.
        (
            [
                CostNode("root", None, False, False, None),
                CostNode("priced", "root", True, True, "gpt-4o"),
                CostNode("b", "root", True, False, "b"),
                CostNode("a", "root", True, False, "a"),
                CostNode("x", "y", True, False, None),
                CostNode("y", "x", False, True, None),
                CostNode("loop-1", "loop-2", True, False, "a"),
                CostNode("loop-2", "loop-1", False, False, None),
            ],
            (3, ("a", "b")),
        ),
    ],
)
def test_unpriced_calls_leave_out_calls_a_span_above_or_below_prices(nodes, expected):
    assert unpriced_calls(nodes) == expected


def test_the_migration_counts_stored_trajectories_unpriced_calls_from_their_spans(otel, workspace, monkeypatch):
    monkeypatch.setattr(migration, "BATCH_SIZE", 2)  # two batches of the three with calls, and one left over
    tracer = otel.tracer()
    mixed = _run(tracer, ["gpt-4o", SELF_HOSTED])
    dark = _run(tracer, [SELF_HOSTED])
    priced = _run(tracer, ["gpt-4o"])
    otel.ingest(workspace)
    # As rows stored before the counts: every cost a number, no call counted.
    Trajectory.objects.update(cost_usd=Decimal(0), unpriced_call_count=0, unpriced_models=[])
    Trajectory.objects.filter(trace_id__in=[mixed, priced]).update(cost_usd=GPT_4O_CALL)
    no_spans = TrajectoryFactory.create(workspace=workspace, llm_call_count=2, cost_usd=Decimal(0))

    migration.unpriced_calls_backfill(apps, None)

    stored = {
        row[0]: row[1:]
        for row in Trajectory.objects.values_list("trace_id", "cost_usd", "unpriced_call_count", "unpriced_models")
    }
    assert stored == {
        mixed: (GPT_4O_CALL, 1, [SELF_HOSTED]),
        dark: (None, 1, [SELF_HOSTED]),
        priced: (GPT_4O_CALL, 0, []),
        no_spans.trace_id: (Decimal(0), 0, []),
    }

    migration.unpriced_costs_zero(apps, None)

    assert Trajectory.objects.get(trace_id=dark).cost_usd == Decimal(0)


def test_the_api_schema_documents_an_unknown_cost_and_the_unpriced_calls():
    schemas = Client().get("/api/v1/openapi.json").json()["components"]["schemas"]

    trajectory, session = schemas["TrajectoryOut"]["properties"], schemas["SessionOut"]["properties"]
    assert {"type": "null"} in trajectory["cost"]["anyOf"]
    assert {"type": "null"} in session["cost_usd"]["anyOf"]
    assert (trajectory["unpriced_calls"]["type"], session["unpriced_calls"]["type"]) == ("integer", "integer")
    assert trajectory["unpriced_models"]["items"] == {"type": "string"}
    assert "unpriced_calls" in schemas["TrajectoryDetailOut"]["required"]


@pytest.mark.parametrize("order", ["-started_at", "latency", "-tokens"])
def test_a_cursor_past_an_unknown_value_is_refused_where_the_order_has_none(workspace, api_client_for, order):
    forged = base64.urlsafe_b64encode(orjson.dumps([None, 1])).decode().rstrip("=")

    response = api_client_for(workspace, scopes=["read"]).get(
        "/api/v1/trajectories", {"order": order, "cursor": forged}
    )

    assert response.status_code == 422
    assert response.json() == {"detail": "the cursor is not one this API gave out", "code": "invalid_query"}


@pytest.mark.parametrize(("order", "nulls_last"), [("-started_at", False), ("-cost", True), ("cost", True)])
def test_only_the_ordering_on_a_column_that_can_be_null_says_nulls_last(workspace, order, nulls_last):
    # PostgreSQL does not read NOT NULL into an ordering: `started_at DESC NULLS LAST` would sort every
    # matching trajectory instead of walking the `-started_at` index.
    TrajectoryFactory.create(workspace=workspace)

    with CaptureQueriesContext(connection) as queries:
        selectors.trajectory_list(workspace=workspace, filters=selectors.TrajectoryFilter(), order=order)

    listing = next(q["sql"] for q in queries.captured_queries if 'FROM "tracing_trajectory"' in q["sql"])
    assert ("NULLS LAST" in listing) is nulls_last
