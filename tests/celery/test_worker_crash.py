"""A worker killed with SIGKILL in the middle of a span batch loses nothing that Keel acknowledged.

The batch was stored before the client heard "OK" (`ingest_otlp_defer`, the way an OTLP request that could not
be written in the request takes; JSON trajectories and the gateway's spans are batches the same way). The dead
worker's transaction rolls back, the batch stays claimed until its lease runs out, the sweeper hands it to the
next worker, and every span ends up stored exactly once."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from agent_registry import services as registry_services
from agent_registry.tests.factories import WorkspaceFactory
from tests.celery.processes import PROCESS_TESTS, celery_producer, celery_start, celery_stop, process_env
from tracing import services
from tracing.models import BatchStatus, IngestBatch, Span, Trajectory
from tracing.tests.agent_traces import refund_conversation
from tracing.tests.conftest import OtelRecorder

pytestmark = [pytest.mark.django_db(transaction=True), PROCESS_TESTS]

CONVERSATIONS = 2000  # 8,000 spans: a batch that takes the worker a few seconds
PROCESS = "tracing.span_batch_process"


def _wait(condition, timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError(f"{what} within {timeout} s; worker log:\n{log.read_text()[-4000:]}")


def test_a_batch_whose_worker_is_killed_is_stored_once_by_the_next_worker(tmp_path, settings):
    workspace = WorkspaceFactory.create(slug="crash")
    api_key, _ = registry_services.apikey_create(workspace=workspace, name="agent", scopes=["ingest"])
    recorder = OtelRecorder()
    for number in range(CONVERSATIONS):
        refund_conversation(recorder.tracer(), session=f"s-{number}")
    accepted = services.ingest_otlp_defer(
        api_key=api_key, body=recorder.protobuf(), content_type="application/x-protobuf", content_encoding=""
    )
    assert accepted.accepted_spans == 4 * CONVERSATIONS
    batch_id = accepted.batch_id
    assert batch_id is not None
    broker_dir = tmp_path / "broker"
    env = {**process_env(None, broker_dir), "KEEL_INGEST_LEASE_SECONDS": "1"}
    producer = celery_producer(None, broker_dir)

    first_log = tmp_path / "first.log"
    first = celery_start(
        ["worker", "-l", "info", "-c", "1", "--without-mingle", "--without-gossip"], env, first_log, new_session=True
    )
    producer.send_task(PROCESS, args=[batch_id])
    _wait(
        lambda: IngestBatch.objects.filter(pk=batch_id, status=BatchStatus.PROCESSING).exists(),
        60,
        "the worker did not claim the batch",
        first_log,
    )
    os.killpg(first.pid, signal.SIGKILL)  # the worker and its pool process, mid-batch
    first.wait()

    batch = IngestBatch.objects.get(pk=batch_id)
    assert batch.status == BatchStatus.PROCESSING  # killed before it could finish
    assert Span.objects.filter(workspace=workspace).count() == 0  # its transaction rolled back

    time.sleep(1.5)  # the lease runs out
    settings.KEEL_INGEST_LEASE_SECONDS = 1
    assert services.ingest_batch_sweep() == [batch_id]
    second_log = tmp_path / "second.log"
    second = celery_start(["worker", "-l", "info", "-c", "1", "--without-mingle", "--without-gossip"], env, second_log)
    try:
        producer.send_task(PROCESS, args=[batch_id])
        _wait(
            lambda: IngestBatch.objects.filter(pk=batch_id, status=BatchStatus.DONE).exists(),
            120,
            "the next worker did not finish the batch",
            second_log,
        )
    finally:
        celery_stop(second)

    assert Span.objects.filter(workspace=workspace).count() == 4 * CONVERSATIONS
    assert Trajectory.objects.filter(workspace=workspace).count() == CONVERSATIONS
    assert IngestBatch.objects.get(pk=batch_id).attempts == 2
