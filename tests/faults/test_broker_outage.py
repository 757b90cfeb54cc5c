"""The broker (a Redis server of the test's own) goes away and comes back empty: no unit of work that Keel
committed is lost, and none is done twice.

A real Celery worker consumes from that Redis. While Redis is up, one batch is processed (the worker is
live) and another is queued with the worker not consuming (its message sits in Redis). Then Redis is killed,
which loses that message. During the outage a batch is posted and an eval run is started through the
API: both are acknowledged (the rows are committed; publishing fails and is logged, it does not turn the
answer into a 500). Redis comes back empty, the worker reconnects by itself, and the sweepers (which beat
runs every minute; here the test sends them) hand every committed unit out again: each batch is stored
once, the run completes asking the model once per sample.

The batches are JSON trajectories (POST /api/v1/ingest/trajectories, 202), which are queued for a worker; an OTLP
request is written in the request and never reaches the broker.

A Redis that stops answering without going away (frozen: SIGSTOP here, a network partition in life) must
not hang the request that sends a task: Keel's settings give the Redis transport a socket timeout."""

from __future__ import annotations

import json
import logging
import os
import runpy
import signal
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from django.db import connections
from django.test import Client
from django.utils import timezone
from kombu.exceptions import OperationalError as BrokerUnavailable

from agent_registry import services as registry_services
from agent_registry.tests.factories import WorkspaceFactory
from config.celery import app as keel_celery
from evals import runs
from evals.models import Run, RunSample, RunStatus
from tests.celery.processes import BASE_DIR, PROCESS_TESTS, celery_producer, celery_start, celery_stop, process_env
from tests.celery.test_eval_runs import _dispatching_to, _stub, _suite
from tests.faults.traffic import (
    SPANS_PER_TRACE,
    RedisServer,
    record_facts,
    trace_ids_new,
    trajectories_json,
    wait_for,
)
from tracing.models import BatchSource, BatchStatus, IngestBatch, Span, Trajectory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.redis, PROCESS_TESTS]

WORKER = ["worker", "-l", "info", "-c", "1", "--without-mingle", "--without-gossip"]
QUEUE = "celery"
TRACES_PER_BATCH = 3


def _post_batch(client: Client, trace_ids: list[str]) -> int:
    """Post one batch of JSON trajectories, stored as one pending batch for a worker; returns the status code."""
    response = client.post(
        "/api/v1/ingest/trajectories", data=trajectories_json(trace_ids), content_type="application/json"
    )
    return int(response.status_code)


def _batch_of(trace_id: str) -> IngestBatch:
    """The batch whose body holds this trace id (bodies are emptied once processed, so look while pending)."""
    for batch in IngestBatch.objects.filter(status=BatchStatus.PENDING):
        if trace_id.encode() in bytes(batch.body):
            return batch
    raise AssertionError(f"no pending batch holds {trace_id}")


def _control(what: str, queue: str, log: Path) -> None:
    """Ask the worker to stop or start consuming a queue; retried until the worker (reconnecting) answers."""

    def answered() -> bool:
        command = keel_celery.control.cancel_consumer if what == "cancel" else keel_celery.control.add_consumer
        try:
            return bool(command(queue, reply=True, timeout=1))
        except (BrokerUnavailable, redis.RedisError, OSError):
            return False  # the broker is not back yet

    wait_for(answered, 60, f"the worker did not answer {what}_consumer", log)


def test_work_committed_while_the_broker_was_away_or_lost_with_it_is_done_once_after_it_returns(
    tmp_path, settings, caplog
):
    broker = RedisServer(tmp_path / "redis.log")
    broker.start()
    broker_client = redis.Redis(port=broker.port)
    log = tmp_path / "worker.log"
    worker = None
    with _stub(0, tmp_path / "stub.log") as stub:
        suite = _suite(stub, items=2, samples=2, concurrency=1)
        _, raw_key = registry_services.apikey_create(
            workspace=suite.workspace, name="agent", scopes=["ingest", "read", "write"]
        )
        client = Client(headers={"Authorization": f"Bearer {raw_key}"})
        # Sweeps in the worker re-send any pending batch older than a second (the default is a minute).
        env = {**process_env(broker.url, tmp_path / "unused"), "KEEL_INGEST_REQUEUE_AFTER_SECONDS": "1"}
        try:
            worker = celery_start(WORKER, env, log)
            with _dispatching_to(broker.url, tmp_path / "unused"):
                live = trace_ids_new(TRACES_PER_BATCH)
                assert _post_batch(client, live) == 202
                wait_for(
                    lambda: Trajectory.objects.filter(trace_id__in=live).count() == len(live),
                    90,
                    "the worker did not process the first batch",
                    log,
                )

                # Queued in Redis with nobody consuming, then lost with Redis.
                _control("cancel", QUEUE, log)
                queued = trace_ids_new(TRACES_PER_BATCH)
                assert _post_batch(client, queued) == 202
                queued_batch = _batch_of(queued[0])
                assert broker_client.llen(QUEUE) == 1
                broker.kill()

                # Committed while the broker is away: acknowledged, the publish failure logged.
                caplog.set_level(logging.ERROR, logger="config.dispatch")
                during = trace_ids_new(TRACES_PER_BATCH)
                assert _post_batch(client, during) == 202
                during_batch = _batch_of(during[0])
                started = client.post(
                    f"/api/v1/suites/{suite.name}/runs", data=json.dumps({}), content_type="application/json"
                )
                assert started.status_code == 202, started.content
                run = Run.objects.get(pk=started.json()["id"])
                assert run.status == RunStatus.QUEUED
                failed = [record for record in caplog.records if record.getMessage() == "config.task_publish_failed"]
                assert sorted(getattr(record, "task", "") for record in failed) == [
                    "evals.run_execute",
                    "tracing.span_batch_process",
                ]

                broker.start()  # back, empty
                assert broker_client.llen(QUEUE) == 0  # the queued batch's message went with the old Redis
                _control("add", QUEUE, log)

                # Beat's sweeps, sent by hand. A queued run is handed out again past its grace period.
                Run.objects.filter(pk=run.pk).update(
                    created_at=timezone.now() - timedelta(seconds=runs.QUEUED_GRACE_SECONDS + 1)
                )
                producer = celery_producer(broker.url, tmp_path / "unused")
                producer.send_task("tracing.ingest_batch_sweep")
                producer.send_task("evals.runs_sweep")
                wait_for(
                    lambda: (
                        not IngestBatch.objects.exclude(status=BatchStatus.DONE).exists()
                        and Run.objects.get(pk=run.pk).status == RunStatus.COMPLETED
                    ),
                    120,
                    "the committed work did not complete after the broker came back",
                    log,
                )
        finally:
            if worker is not None:
                celery_stop(worker)
            broker.kill()
        chat_requests = stub.chat_requests()

    # Each of the three batches (before, lost with the broker, posted while it was away) was answered 202 above.
    batches = (live, queued, during)
    spans = Span.objects.filter(trace_id__in=[trace_id for trace_ids in batches for trace_id in trace_ids])
    record_facts(
        "broker killed and back empty",
        ingest_requests_acknowledged=len(batches),
        publish_failures_logged=len(failed),
        spans_acknowledged=len(batches) * TRACES_PER_BATCH * SPANS_PER_TRACE,
        spans_stored=spans.count(),
        spans_stored_twice=spans.count() - spans.values("trace_id", "span_id").distinct().count(),
        attempts_of_the_lost_batches=[
            IngestBatch.objects.get(pk=batch.pk).attempts for batch in (queued_batch, during_batch)
        ],
        eval_run_status=Run.objects.get(pk=run.pk).status,
        eval_samples_stored=RunSample.objects.filter(item__run=run).count(),
        model_requests_for_the_samples=chat_requests,
    )
    for trace_ids in (live, queued, during):
        assert Trajectory.objects.filter(trace_id__in=trace_ids).count() == TRACES_PER_BATCH
        assert Span.objects.filter(trace_id__in=trace_ids).count() == TRACES_PER_BATCH * SPANS_PER_TRACE
    # Each lost or unsent batch was processed once, by the sweep's message.
    attempts = dict(IngestBatch.objects.filter(source=BatchSource.JSON).values_list("pk", "attempts"))
    assert attempts[queued_batch.pk] == 1
    assert attempts[during_batch.pk] == 1
    assert RunSample.objects.filter(item__run=run).count() == 2 * 2
    assert chat_requests == 2 * 2  # the model was asked once per sample


def _keel_transport_options(broker_url: str, monkeypatch: Any) -> dict[str, Any]:
    """The broker transport options Keel's settings give this broker, read as the settings module reads them."""
    monkeypatch.setenv("CELERY_BROKER_URL", broker_url)
    monkeypatch.setenv("CELERY_BROKER_SOCKET_TIMEOUT", "1")  # the default is 5 s; the mechanism is the same
    namespace = runpy.run_path(str(BASE_DIR / "config" / "settings" / "components" / "celery.py"))
    options: dict[str, Any] = namespace["CELERY_BROKER_TRANSPORT_OPTIONS"]
    return options


def test_a_broker_that_stops_answering_fails_the_send_and_the_request_is_still_acknowledged(
    tmp_path, monkeypatch, caplog
):
    broker = RedisServer(tmp_path / "redis.log")
    broker.start()
    workspace = WorkspaceFactory.create(slug="frozen-broker")
    _, raw_key = registry_services.apikey_create(workspace=workspace, name="agent", scopes=["ingest"])
    client = Client(headers={"Authorization": f"Bearer {raw_key}"})
    caplog.set_level(logging.ERROR, logger="config.dispatch")
    answered: dict[str, int] = {}
    frozen = trace_ids_new(TRACES_PER_BATCH)
    try:
        with _dispatching_to(broker.url, tmp_path / "unused"):
            keel_celery.conf.broker_transport_options = _keel_transport_options(broker.url, monkeypatch)
            assert _post_batch(client, trace_ids_new(TRACES_PER_BATCH)) == 202  # connected, sent
            assert broker.process is not None
            os.kill(broker.process.pid, signal.SIGSTOP)

            def send() -> None:
                try:
                    answered["status"] = _post_batch(client, frozen)
                finally:
                    connections.close_all()  # this thread's own database connection

            request = threading.Thread(target=send)
            request.start()
            request.join(90)  # a hang detector: without a socket timeout the send waits for Redis forever
            assert not request.is_alive(), "the request hung on a broker that stopped answering"
    finally:
        if broker.process is not None:
            os.kill(broker.process.pid, signal.SIGCONT)
        broker.kill()

    publish_failures = [record for record in caplog.records if record.getMessage() == "config.task_publish_failed"]
    record_facts(
        "broker frozen (SIGSTOP)",
        # The first request was answered 202 above, before the broker froze.
        ingest_requests_acknowledged=1 + (answered.get("status") == 202),
        requests_hung=int("status" not in answered),
        publish_failures_logged=len(publish_failures),
        batches_kept_pending_for_the_sweep=IngestBatch.objects.filter(
            workspace=workspace, status=BatchStatus.PENDING
        ).count(),
    )
    assert answered == {"status": 202}
    assert [record.task for record in caplog.records if record.getMessage() == "config.task_publish_failed"] == [
        "tracing.span_batch_process"
    ]
    assert IngestBatch.objects.filter(workspace=workspace, status=BatchStatus.PENDING).count() == 2  # kept, to sweep
