"""Real Celery processes against the real brokers: kombu's filesystem transport (the embedded default),
the machine's Redis and RabbitMQ. A worker consumes a task that a producer sent; beat reads its schedule from
the database (django-celery-beat) and the worker runs what it sends."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from agent_registry.models import WorkerHeartbeat
from tests.celery.processes import PROCESS_TESTS, celery_producer, celery_start, celery_stop, process_env

# Real worker and beat processes read what the test wrote, so the data must be committed.
pytestmark = [pytest.mark.django_db(transaction=True), PROCESS_TESTS]

HEARTBEAT = "agent_registry.worker_heartbeat_record"
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15")
AMQP_URL = os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


def _wait_for_beats(count: int, timeout: float, log: Path) -> WorkerHeartbeat:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        beat = WorkerHeartbeat.objects.order_by("-last_seen_at").first()
        if beat is not None and beat.beats >= count:
            return beat
        time.sleep(0.2)
    raise AssertionError(f"no {count} heartbeats within {timeout} s; process log:\n{log.read_text()[-4000:]}")


@pytest.fixture(params=["filesystem", "redis", "amqp"])
def broker(request, tmp_path) -> Iterator[tuple[str | None, Path]]:
    """(CELERY_BROKER_URL, KEEL_BROKER_DIR); None means the embedded default (filesystem)."""
    if request.param == "filesystem":
        yield None, tmp_path / "broker"
        return
    if request.param == "amqp":
        # RabbitMQ: .ci/run starts it when it is not running; leftovers of earlier runs are purged.
        Celery("purge", broker=AMQP_URL).control.purge()
        yield AMQP_URL, tmp_path / "unused"
        Celery("purge", broker=AMQP_URL).control.purge()
        return
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    client.ping()  # the Redis paths are required in CI (.ci/run starts Redis), so no skip here
    client.flushdb()
    yield REDIS_URL, tmp_path / "unused"
    client.flushdb()


def test_a_worker_runs_a_task_sent_through_the_broker(broker, tmp_path):
    broker_url, broker_dir = broker
    producer = celery_producer(broker_url, broker_dir)
    producer.send_task(HEARTBEAT)  # queued before the worker exists: the broker keeps it
    log = tmp_path / "worker.log"
    worker = celery_start(
        ["worker", "-l", "info", "-c", "1", "--without-mingle", "--without-gossip"],
        process_env(broker_url, broker_dir),
        log,
    )
    try:
        beat = _wait_for_beats(1, timeout=60, log=log)
    finally:
        celery_stop(worker)
    assert beat.beats == 1


def test_beat_sends_the_database_schedule_and_the_worker_runs_it(broker, tmp_path):
    broker_url, broker_dir = broker
    # The migration schedules the heartbeat every 30 s (tested in agent_registry); earlier transactional
    # tests flush that row, so the schedule is written here, every second, as the migration writes it.
    every_second, _ = IntervalSchedule.objects.get_or_create(every=1, period=IntervalSchedule.SECONDS)
    PeriodicTask.objects.update_or_create(
        name="Worker heartbeat", defaults={"task": HEARTBEAT, "interval": every_second, "enabled": True}
    )
    env = process_env(broker_url, broker_dir)
    worker_log, beat_log = tmp_path / "worker.log", tmp_path / "beat.log"
    worker = celery_start(["worker", "-l", "info", "-c", "1", "--without-mingle", "--without-gossip"], env, worker_log)
    beat = celery_start(["beat", "-l", "info", "--schedule", str(tmp_path / "beat-schedule")], env, beat_log)
    try:
        heartbeat = _wait_for_beats(3, timeout=90, log=beat_log)
    finally:
        celery_stop(beat)
        celery_stop(worker)
    assert heartbeat.beats >= 3
    assert PeriodicTask.objects.get(task=HEARTBEAT).total_run_count >= 3
