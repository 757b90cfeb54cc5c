from __future__ import annotations

import threading
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agent_registry import services as registry_services
from agent_registry.models import Agent
from agent_registry.tests.factories import AgentFactory, WorkspaceFactory
from tracing import services
from tracing.models import BatchStatus, IngestBatch, Span, ToolResultShape, Trajectory
from tracing.tests.agent_traces import refund_conversation
from tracing.tests.conftest import OtelRecorder

pytestmark = pytest.mark.django_db

# gpt-4o in litellm's price map: $2.50 per million input tokens, $10 per million output tokens.
REFUND_COST = Decimal("0.00115000")  # (100 + 160) × 2.5e-6 + (20 + 30) × 1e-5


def _accept(api_key, body: bytes) -> IngestBatch:
    accepted = services.ingest_otlp_defer(
        api_key=api_key, body=body, content_type="application/x-protobuf", content_encoding=""
    )
    assert accepted.batch_id is not None
    return IngestBatch.objects.get(pk=accepted.batch_id)


@pytest.fixture
def key_for():
    def make(workspace, agents=()):
        api_key, _ = registry_services.apikey_create(
            workspace=workspace, name="ingest", scopes=["ingest"], agents=agents
        )
        return api_key

    return make


def test_a_batch_becomes_spans_and_a_trajectory(otel, key_for, workspace):
    agent = AgentFactory.create(workspace=workspace, slug="ride-support")
    trace_id = refund_conversation(otel.tracer())
    batch = _accept(key_for(workspace), otel.protobuf())

    assert services.span_batch_process(batch_id=batch.pk) == 4

    trajectory = Trajectory.objects.get(workspace=workspace, trace_id=trace_id)
    assert trajectory.agent == agent
    assert trajectory.status == "ok"
    assert (trajectory.span_count, trajectory.llm_call_count, trajectory.tool_call_count) == (4, 2, 1)
    assert (trajectory.input_tokens, trajectory.output_tokens) == (260, 50)
    assert trajectory.cost_usd == REFUND_COST
    assert trajectory.session_id == "session-1"
    assert trajectory.input_preview == "I was charged twice for a cancelled ride"
    assert trajectory.output_preview == "I have refunded the duplicate charge."
    assert trajectory.name == "invoke_agent ride-support"
    batch.refresh_from_db()
    assert (batch.status, bytes(batch.body)) == (BatchStatus.DONE, b"")


def test_processing_a_batch_twice_or_the_same_spans_again_stores_nothing_twice(otel, key_for, workspace):
    trace_id = refund_conversation(otel.tracer())
    key = key_for(workspace)
    first = _accept(key, otel.protobuf())
    again = _accept(key, otel.protobuf())  # a client retry of the same export

    assert services.span_batch_process(batch_id=first.pk) == 4
    assert services.span_batch_process(batch_id=first.pk) == 0
    assert services.span_batch_process(batch_id=again.pk) == 0

    assert Span.objects.filter(trace_id=trace_id).count() == 4
    assert Trajectory.objects.get(trace_id=trace_id).cost_usd == REFUND_COST


def test_spans_of_one_trace_in_several_batches_in_any_order_make_the_same_trajectory(key_for, workspace):
    recorder = OtelRecorder()
    trace_id = refund_conversation(recorder.tracer())
    spans = recorder.exporter.get_finished_spans()
    key = key_for(workspace)
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    # The root span (exported last by the SDK) arrives first, the children one by one after it.
    bodies = [encode_spans([span]).SerializeToString() for span in reversed(spans)]
    running_statuses = []
    for body in bodies:
        services.span_batch_process(batch_id=_accept(key, body).pk)
        running_statuses.append(Trajectory.objects.get(trace_id=trace_id).span_count)

    trajectory = Trajectory.objects.get(trace_id=trace_id)
    assert running_statuses == [1, 2, 3, 4]
    assert (trajectory.span_count, trajectory.input_tokens, trajectory.cost_usd) == (4, 260, REFUND_COST)
    assert trajectory.status == "ok"


def test_a_trajectory_is_running_until_its_root_span_arrives(key_for, workspace):
    recorder = OtelRecorder()
    trace_id = refund_conversation(recorder.tracer())
    children = [span for span in recorder.exporter.get_finished_spans() if span.parent is not None]
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    services.span_batch_process(batch_id=_accept(key_for(workspace), encode_spans(children).SerializeToString()).pk)

    assert Trajectory.objects.get(trace_id=trace_id).status == "running"


def test_a_failed_tool_marks_the_trajectory_as_error(otel, key_for, workspace):
    trace_id = refund_conversation(otel.tracer(), tool_fails=True)
    services.span_batch_process(batch_id=_accept(key_for(workspace), otel.protobuf()).pk)

    trajectory = Trajectory.objects.get(trace_id=trace_id)
    assert (trajectory.status, trajectory.error_count) == ("error", 1)


def test_an_unknown_agent_name_from_a_workspace_key_creates_the_agent(otel, key_for, workspace):
    refund_conversation(otel.tracer(), agent="Travel Planner")
    services.span_batch_process(batch_id=_accept(key_for(workspace), otel.protobuf()).pk)

    agent = Agent.objects.get(workspace=workspace, slug="travel-planner")
    assert agent.name == "Travel Planner"
    assert Trajectory.objects.get(workspace=workspace).agent == agent


def test_a_key_limited_to_one_agent_files_every_trace_under_it(otel, key_for, workspace):
    mine = AgentFactory.create(workspace=workspace, slug="ride-support")
    AgentFactory.create(workspace=workspace, slug="shopping")
    refund_conversation(otel.tracer(), agent="shopping")  # names an agent the key may not write to
    services.span_batch_process(batch_id=_accept(key_for(workspace, agents=[mine]), otel.protobuf()).pk)

    assert Trajectory.objects.get(workspace=workspace).agent == mine
    assert not Agent.objects.filter(workspace=workspace, slug="Shopping").exists()


def test_spans_link_the_prompt_version_they_name(otel, key_for, workspace):
    agent = AgentFactory.create(workspace=workspace, slug="ride-support")
    first = registry_services.prompt_create(
        agent=agent, name="ride-support/system", type="text", template="v1", labels=["production"]
    )
    registry_services.prompt_version_create(prompt=first.prompt, template="v2")
    refund_conversation(otel.tracer(), prompt=("ride-support/system", "1"))
    services.span_batch_process(batch_id=_accept(key_for(workspace), otel.protobuf()).pk)

    trajectory = Trajectory.objects.get(workspace=workspace)
    assert list(trajectory.prompt_versions.all()) == [first]
    assert Span.objects.filter(prompt_version=first).count() == 1


def test_the_same_trace_id_in_two_workspaces_stays_apart(otel, key_for, workspace, other_workspace):
    trace_id = refund_conversation(otel.tracer())
    body = otel.protobuf()
    services.span_batch_process(batch_id=_accept(key_for(workspace), body).pk)
    services.span_batch_process(batch_id=_accept(key_for(other_workspace), body).pk)

    assert Trajectory.objects.filter(trace_id=trace_id).count() == 2
    assert Span.objects.filter(workspace=workspace).count() == 4
    assert Span.objects.filter(workspace=other_workspace).count() == 4


def test_a_batch_claimed_by_a_live_worker_is_skipped_and_an_expired_claim_is_taken_over(otel, key_for, workspace):
    refund_conversation(otel.tracer())
    batch = _accept(key_for(workspace), otel.protobuf())
    # As a worker that claimed it would have left it:
    IngestBatch.objects.filter(pk=batch.pk).update(status=BatchStatus.PROCESSING, claimed_at=timezone.now(), attempts=1)

    assert services.span_batch_process(batch_id=batch.pk) == 0
    assert services.ingest_batch_sweep() == []

    IngestBatch.objects.filter(pk=batch.pk).update(claimed_at=timezone.now() - timedelta(minutes=5))
    assert services.ingest_batch_sweep() == [batch.pk]
    assert services.span_batch_process(batch_id=batch.pk) == 4
    batch.refresh_from_db()
    assert (batch.status, batch.attempts) == (BatchStatus.DONE, 2)


def test_the_sweeper_resends_pending_batches_whose_message_may_be_lost(otel, key_for, workspace):
    refund_conversation(otel.tracer())
    fresh = _accept(key_for(workspace), otel.protobuf())
    stale = _accept(key_for(workspace), otel.protobuf())
    IngestBatch.objects.filter(pk=stale.pk).update(received_at=timezone.now() - timedelta(minutes=5))

    assert services.ingest_batch_sweep() == [stale.pk]
    assert IngestBatch.objects.get(pk=fresh.pk).status == BatchStatus.PENDING


def test_the_number_of_queries_does_not_grow_with_the_traces_in_a_batch(otel, key_for, workspace):
    key = key_for(workspace)

    def queries_for(traces: int) -> int:
        for number in range(traces):
            refund_conversation(otel.tracer(), session=f"session-{traces}-{number}")
        batch = _accept(key, otel.protobuf())
        otel.exporter.clear()
        with CaptureQueriesContext(connection) as queries:
            assert services.span_batch_process(batch_id=batch.pk) == 4 * traces
        return len(queries)

    queries_for(1)  # the first batch also creates the agent its spans name
    one = queries_for(1)
    assert queries_for(20) == one


@pytest.mark.django_db(transaction=True)
def test_concurrent_batches_of_one_trace_add_up(key_for):
    workspace = WorkspaceFactory.create(slug="concurrent")
    recorder = OtelRecorder()
    trace_id = refund_conversation(recorder.tracer())
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    # A key of the agent's, so the tool result's batch knows its agent even before the root span names it.
    key = key_for(workspace, agents=[AgentFactory.create(workspace=workspace, slug="ride-support")])
    batches = [
        _accept(key, encode_spans([span]).SerializeToString()) for span in recorder.exporter.get_finished_spans()
    ]
    errors: list[BaseException] = []

    def process(batch_id: int) -> None:
        try:
            services.span_batch_process(batch_id=batch_id)
        except BaseException as error:  # reported to the test thread below
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=process, args=(batch.pk,)) for batch in batches]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    trajectory = Trajectory.objects.get(trace_id=trace_id)
    assert (trajectory.span_count, trajectory.input_tokens, trajectory.cost_usd) == (4, 260, REFUND_COST)
    # The one tool result is counted once, also when its batch lost the race to insert the trajectory.
    assert list(ToolResultShape.objects.values_list("tool_name", "count")) == [("lookup_trip", 1)]


def test_trajectory_metadata_comes_from_its_spans_with_langfuse_values_decoded(otel, key_for, workspace):
    tracer = otel.tracer()
    with (
        tracer.start_as_current_span(
            "agent",
            attributes={
                "langfuse.trace.metadata.channel": '"in-app chat"',  # Langfuse SDK v5 JSON-encodes every value
                "langfuse.trace.metadata.ticket": "17",
                "keel.metadata.tier": "gold",
            },
        ) as root,
        tracer.start_as_current_span("step", attributes={"keel.metadata.tier": "silver", "keel.metadata.x": 1}),
    ):
        pass
    trace_id = format(root.get_span_context().trace_id, "032x")
    services.span_batch_process(batch_id=_accept(key_for(workspace), otel.protobuf()).pk)

    assert Trajectory.objects.get(trace_id=trace_id).metadata == {
        "channel": "in-app chat",
        "ticket": 17,
        "tier": "gold",
        "x": 1,
    }


def test_a_trajectory_takes_the_trace_name_a_span_gives(otel, key_for, workspace):
    # Langfuse's SDK names the trace on the spans under the root (langfuse.trace.name); it was not used.
    tracer = otel.tracer()
    with (
        tracer.start_as_current_span("invoke_agent ride-support"),
        tracer.start_as_current_span("chat gpt-4o", attributes={"langfuse.trace.name": "refund request"}),
    ):
        pass
    batch = _accept(key_for(workspace), otel.protobuf())

    services.span_batch_process(batch_id=batch.pk)

    assert Trajectory.objects.get(workspace=workspace).name == "refund request"
