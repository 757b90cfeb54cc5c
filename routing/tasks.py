"""Celery entry points of routing."""

from __future__ import annotations

from celery import shared_task
from django.db import InterfaceError, OperationalError

from routing import cache, shadow


@shared_task(
    name="routing.shadow_run_execute",
    acks_late=True,
    ignore_result=True,
    autoretry_for=(OperationalError, InterfaceError),
    retry_backoff=True,
    max_retries=5,
    soft_time_limit=shadow.LEASE_SECONDS - 60,
    time_limit=shadow.LEASE_SECONDS - 30,
)
def shadow_run_execute(shadow_run_id: int) -> None:
    """Run one shadow request and score it; a finished run is skipped, so a redelivery is harmless."""
    shadow.shadow_run_execute(shadow_run_id=shadow_run_id)


@shared_task(name="routing.shadow_run_sweep", ignore_result=True, soft_time_limit=50, time_limit=60)
def shadow_run_sweep() -> None:
    """Scheduled by beat: hand shadow runs whose message or worker was lost to a worker again."""
    for shadow_run_id in shadow.shadow_run_sweep():
        shadow_run_execute.delay(shadow_run_id)


@shared_task(name="routing.routing_decision_outcomes_refresh", ignore_result=True, soft_time_limit=50, time_limit=60)
def routing_decision_outcomes_refresh() -> None:
    """Scheduled by beat: give routing decisions the quality their trajectories now show."""
    shadow.routing_decision_outcomes_refresh()


@shared_task(name="routing.cache_entries_sweep", ignore_result=True, soft_time_limit=300, time_limit=360)
def cache_entries_sweep() -> None:
    """Scheduled by beat: retire entries of prompt versions no label holds, delete expired ones."""
    cache.cache_entries_invalidate_stale_prompts()
    cache.cache_entries_sweep()
