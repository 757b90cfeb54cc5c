"""A Celery worker killed with SIGKILL in the middle of an export: after a restart the export is written once,
whole, and nothing half-written is ever downloadable.

The other two units of work a worker can be killed in the middle of are covered where they live, with
real workers as here:
- a span batch: tests/celery/test_worker_crash.py (stored exactly once by the next worker);
- an eval run: tests/celery/test_eval_runs.py, `test_a_run_whose_worker_is_killed_is_finished_by_the_next_worker
  _without_asking_twice` (the run resumes; no sample asked of the model twice).

Here the worker is frozen (SIGSTOP) at a moment when some groups of the export are written and not all,
then killed with its pool: the export stays `running` with only a `.partial` file, no file to download. Once
its lease has run out (the test moves the claim back rather than waiting ten minutes) the sweep hands it to
a new worker, which starts the file over; the file that comes out holds every group and every trajectory
exactly once and matches its manifest."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from agent_registry import services as registry_services
from agent_registry.tests.factories import WorkspaceFactory
from tests.celery.processes import PROCESS_TESTS, celery_producer, celery_start, celery_stop, process_env
from tests.faults.traffic import record_facts, wait_for
from tracing import services as tracing_services
from tracing.models import BatchStatus, IngestBatch, Trajectory
from trainer_bridge import services
from trainer_bridge.models import Export, JobStatus

pytestmark = [pytest.mark.django_db(transaction=True), PROCESS_TESTS]

GROUPS = 150
PER_GROUP = 4
REWARDS = (0.0, 0.25, 0.75, 1.0)  # differing rewards: every group carries a signal and is kept
WORKER = ["worker", "-l", "info", "-c", "1", "--without-mingle", "--without-gossip"]


def _trajectories(api_key) -> None:
    """GROUPS tasks with PER_GROUP different answers each, stored as the ingest worker stores them."""
    documents = [
        {
            "agent": "ride-support",
            "task_id": f"task-{group}",
            "reward": REWARDS[answer],
            "messages": [
                {"role": "user", "content": f"Refund my ride number {group}, please."},
                {"role": "assistant", "content": f"Answer {answer} to ride {group}: " + "refund " * (answer + 1)},
            ],
        }
        for group in range(GROUPS)
        for answer in range(PER_GROUP)
    ]
    for start in range(0, len(documents), 200):
        tracing_services.ingest_trajectories_accept(api_key=api_key, payload=documents[start : start + 200])
    for batch_id in IngestBatch.objects.filter(status=BatchStatus.PENDING).values_list("pk", flat=True):
        tracing_services.span_batch_process(batch_id=batch_id)


def _in_the_middle(export_id: int) -> bool:
    export = Export.objects.get(pk=export_id)
    partial = services.export_dir() / f"export-{export_id}-{export.format}.partial"
    return 0 < export.groups_done < export.groups_total and partial.exists()


def test_an_export_whose_worker_is_killed_is_written_once_whole_by_the_next_worker(tmp_path, settings):
    settings.MEDIA_ROOT = tmp_path / "media"
    workspace = WorkspaceFactory.create(slug="faults-export")
    api_key, _ = registry_services.apikey_create(workspace=workspace, name="agent", scopes=["ingest"])
    _trajectories(api_key)
    assert Trajectory.objects.filter(workspace=workspace).count() == GROUPS * PER_GROUP
    curation = services.curation_create(
        workspace=workspace,
        name="refunds",
        query={"agents": ["ride-support"]},
        grouping="task_id",
        reward={"source": "trajectory"},
        filters={},
    )
    export = services.export_create(curation=curation, format="art", dispatch=False)
    assert export.groups_total == GROUPS
    final = services.export_dir() / f"export-{export.pk}-art.jsonl"
    partial = final.with_suffix(".partial")

    broker_dir = tmp_path / "broker"
    env = {**process_env(None, broker_dir), "KEEL_MEDIA_ROOT": str(settings.MEDIA_ROOT)}
    producer = celery_producer(None, broker_dir)
    first_log = tmp_path / "first.log"
    first = celery_start(WORKER, env, first_log, new_session=True)
    try:
        producer.send_task("trainer_bridge.export_execute", args=[export.pk])
        # Frozen for each look, so that what is seen is what the kill leaves; thawed when it is not the moment.
        deadline = time.monotonic() + 120
        while True:
            os.killpg(first.pid, signal.SIGSTOP)
            if _in_the_middle(export.pk):
                break
            os.killpg(first.pid, signal.SIGCONT)
            if time.monotonic() > deadline:
                raise AssertionError(f"no moment mid-export to kill the worker at:\n{first_log.read_text()[-6000:]}")
            time.sleep(0.02)
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the worker and its pool process, mid-export
        first.wait()

    killed = Export.objects.get(pk=export.pk)
    assert killed.status == JobStatus.RUNNING
    assert 0 < killed.groups_done < GROUPS
    assert partial.exists()
    assert not final.exists()
    assert killed.path == ""
    with pytest.raises(services.ExportNotReady):
        services.export_file(export=killed)
    assert services.export_execute(export_id=export.pk) is None  # the dead worker's lease still holds

    # The lease runs out (moved back rather than waited for), and the sweep sends the export to a new worker.
    Export.objects.filter(pk=export.pk).update(
        claimed_at=timezone.now() - timedelta(seconds=services.EXPORT_LEASE_SECONDS + 1)
    )
    second_log = tmp_path / "second.log"
    second = celery_start(WORKER, env, second_log)
    try:
        producer.send_task("trainer_bridge.exports_sweep")
        wait_for(
            lambda: Export.objects.get(pk=export.pk).status == JobStatus.SUCCEEDED,
            120,
            "the next worker did not finish the export",
            second_log,
        )
    finally:
        celery_stop(second)

    done = Export.objects.get(pk=export.pk)
    assert done.groups_done == GROUPS
    assert Path(done.path) == final
    assert not partial.exists()
    content = final.read_bytes()
    assert (done.bytes, done.sha256) == (len(content), hashlib.sha256(content).hexdigest())
    assert done.manifest["sha256"] == done.sha256
    lines = [json.loads(line) for line in content.splitlines()]
    assert Counter(line["metadata"]["task_id"] for line in lines) == Counter(f"task:task-{g}" for g in range(GROUPS))
    trace_ids = [trajectory["metadata"]["trace_id"] for line in lines for trajectory in line["trajectories"]]
    assert len(trace_ids) == len(set(trace_ids)) == GROUPS * PER_GROUP
    assert sorted(os.listdir(final.parent)) == [final.name]  # no other file, no leftover partial
    record_facts(
        "worker killed (SIGKILL) mid-export",
        groups_total=export.groups_total,
        groups_written_when_killed=killed.groups_done,
        status_when_killed=killed.status,
        resumed_status=done.status,
        groups_in_the_file=len(lines),
        trajectories_in_the_file=len(trace_ids),
        trajectories_written_twice=len(trace_ids) - len(set(trace_ids)),
        leftover_files=len(os.listdir(final.parent)) - 1,
    )
