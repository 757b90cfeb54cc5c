"""Celery entry points of tracing."""

from __future__ import annotations

from celery import shared_task
from django.db import InterfaceError, OperationalError

from tracing import services


@shared_task(
    name="tracing.span_batch_process",
    acks_late=True,
    ignore_result=True,
    autoretry_for=(OperationalError, InterfaceError),
    retry_backoff=True,
    max_retries=8,
    soft_time_limit=50,
    time_limit=60,
)
def span_batch_process(batch_id: int) -> None:
    """Turn one stored ingest batch into spans and trajectories; a finished batch is skipped."""
    services.span_batch_process(batch_id=batch_id)


@shared_task(name="tracing.ingest_batch_sweep", ignore_result=True, soft_time_limit=50, time_limit=60)
def ingest_batch_sweep() -> None:
    """Scheduled by beat: hand batches whose message or worker was lost to a worker again."""
    for batch_id in services.ingest_batch_sweep():
        span_batch_process.delay(batch_id)
