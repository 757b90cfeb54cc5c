"""Celery entry points of the trainer bridge. Tasks carry ids; the rows say what to do."""

from __future__ import annotations

from celery import shared_task
from django.db import InterfaceError, OperationalError

from trainer_bridge import jobs, services


@shared_task(
    name="trainer_bridge.export_execute",
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
    autoretry_for=(OperationalError, InterfaceError),
    retry_backoff=True,
    max_retries=5,
)
def export_execute(export_id: int) -> None:
    """Write an export's file; a finished export, or one another live worker holds, is skipped."""
    services.export_execute(export_id=export_id)


@shared_task(name="trainer_bridge.exports_sweep", ignore_result=True, soft_time_limit=50, time_limit=60)
def exports_sweep() -> None:
    """Scheduled by beat: hand out exports whose message or worker was lost (the file starts over)."""
    for export_id in services.exports_sweep():
        export_execute.delay(export_id)


@shared_task(name="trainer_bridge.training_jobs_expire", ignore_result=True, soft_time_limit=50, time_limit=60)
def training_jobs_expire() -> None:
    """Scheduled by beat: fail the jobs whose worker died on their last attempt (no claim takes them again)."""
    jobs.jobs_expire()
