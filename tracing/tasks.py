"""Celery entry points of tracing."""

from __future__ import annotations

from celery import shared_task
from django.db import InterfaceError, OperationalError

from tracing import langfuse_bridge, replay, services
from tracing.exceptions import ReplayProviderUnavailable


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


@shared_task(
    name="tracing.replay_execute",
    acks_late=True,
    ignore_result=True,
    autoretry_for=(ReplayProviderUnavailable,),
    retry_backoff=True,
    retry_backoff_max=300,
    max_retries=replay.MAX_ATTEMPTS - 1,
    soft_time_limit=replay.SOFT_TIME_LIMIT_SECONDS,
    time_limit=replay.TIME_LIMIT_SECONDS,
)
def replay_execute(replay_id: int) -> None:
    """Run one counterfactual replay; a finished replay is skipped, so a redelivery is harmless."""
    replay.replay_execute(replay_id=replay_id)


@shared_task(name="tracing.replay_sweep", ignore_result=True, soft_time_limit=50, time_limit=60)
def replay_sweep() -> None:
    """Scheduled by beat: hand replays whose message or worker was lost to a worker again."""
    for replay_id in replay.replay_sweep():
        replay_execute.delay(replay_id)


@shared_task(name="tracing.trajectory_retention_sweep", ignore_result=True, soft_time_limit=3000, time_limit=3600)
def trajectory_retention_sweep() -> None:
    """Scheduled by beat, daily: delete each agent's trajectories older than its retention."""
    services.trajectory_retention_sweep()


@shared_task(
    name="tracing.langfuse_export_deliver", acks_late=True, ignore_result=True, soft_time_limit=50, time_limit=60
)
def langfuse_export_deliver(export_id: int) -> None:
    """Send one outbox row to the workspace's Langfuse mirror; failures are retried by schedule."""
    langfuse_bridge.langfuse_export_deliver(export_id=export_id)


@shared_task(name="tracing.langfuse_export_sweep", ignore_result=True, soft_time_limit=50, time_limit=60)
def langfuse_export_sweep() -> None:
    """Scheduled by beat: send the rows whose retry time has come."""
    for export_id in langfuse_bridge.langfuse_export_due():
        langfuse_export_deliver.delay(export_id)


@shared_task(name="tracing.trajectory_signals_recompute", ignore_result=True, soft_time_limit=280, time_limit=300)
def trajectory_signals_recompute(trajectory_ids: list[int]) -> None:
    """Recompute triage signals for a chunk of trajectories (after detectors or weights changed)."""
    services.trajectory_signals_recompute(trajectory_ids=trajectory_ids)
