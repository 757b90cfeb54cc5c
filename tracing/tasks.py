"""Celery entry points of tracing."""

from __future__ import annotations

from typing import Any

from celery import Task, shared_task
from celery.utils.time import get_exponential_backoff_interval
from django.db import InterfaceError, OperationalError

from tracing import alerts, langfuse_bridge, replay, services, triage
from tracing.exceptions import ReplayProviderUnavailable


@shared_task(
    bind=True,
    name="tracing.span_batch_process",
    acks_late=True,
    ignore_result=True,
    autoretry_for=(OperationalError, InterfaceError),
    retry_backoff=True,
    max_retries=8,
    soft_time_limit=50,
    time_limit=60,
)
def span_batch_process(self: Task[Any, None], batch_id: int, held: int | None = None) -> None:
    """Turn one stored ingest batch into spans and trajectories; a finished batch is skipped. When the
    database fails mid-batch, the retry takes back this task's own claim (`held`)."""
    try:
        services.span_batch_process(batch_id=batch_id, held=held)
    except services.BatchInterrupted as interrupted:
        countdown = get_exponential_backoff_interval(factor=1, retries=self.request.retries, maximum=600)
        raise self.retry(
            args=(batch_id,), kwargs={"held": interrupted.attempt}, exc=interrupted, countdown=countdown
        ) from interrupted


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


@shared_task(name="tracing.agent_signals_recompute", ignore_result=True, soft_time_limit=280, time_limit=300)
def agent_signals_recompute(agent_id: int) -> None:
    """After an agent's triage settings changed: queue a recompute of each chunk of its trajectories."""
    triage.agent_signals_recompute_enqueue(agent_id=agent_id)


@shared_task(name="tracing.review_samples_daily", ignore_result=True, soft_time_limit=1700, time_limit=1800)
def review_samples_daily() -> None:
    """Scheduled by beat, daily: draw each agent's review budget from yesterday's trajectories."""
    triage.review_samples_daily()


@shared_task(name="tracing.alert_rules_evaluate", ignore_result=True, soft_time_limit=50, time_limit=60)
def alert_rules_evaluate() -> None:
    """Scheduled by beat, every minute: evaluate every enabled alert rule; a rule fires once per cooldown
    however many evaluators run."""
    alerts.alert_rules_evaluate()


@shared_task(
    name="tracing.alert_delivery_deliver", acks_late=True, ignore_result=True, soft_time_limit=50, time_limit=60
)
def alert_delivery_deliver(delivery_id: int) -> None:
    """Send one alert by email or webhook; failures are retried by schedule, with backoff."""
    alerts.alert_delivery_deliver(delivery_id=delivery_id)


@shared_task(name="tracing.alert_delivery_sweep", ignore_result=True, soft_time_limit=50, time_limit=60)
def alert_delivery_sweep() -> None:
    """Scheduled by beat: send the alert deliveries whose retry time has come."""
    for delivery_id in alerts.alert_delivery_due():
        alert_delivery_deliver.delay(delivery_id)


@shared_task(name="tracing.pending_scores_attach", ignore_result=True, soft_time_limit=50, time_limit=60)
def pending_scores_attach() -> None:
    """Scheduled by beat: scores that came before their trace are attached once it is stored."""
    services.pending_scores_attach()
