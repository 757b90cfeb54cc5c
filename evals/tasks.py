"""Celery entry points of the evals. Tasks carry ids; the rows say what to do, so redelivery is harmless."""

from __future__ import annotations

from datetime import datetime

from celery import shared_task
from django.db import InterfaceError, OperationalError

from evals import online, regressions, runs, schedules
from evals.models import OnlineRule


@shared_task(
    name="evals.run_execute",
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
    autoretry_for=(OperationalError, InterfaceError),
    retry_backoff=True,
    max_retries=5,
)
def run_execute(run_id: int) -> None:
    """Execute a run to its end or its pause; a run another worker holds, or a finished one, is skipped."""
    runs.run_execute(run_id=run_id)


@shared_task(name="evals.runs_sweep", ignore_result=True, soft_time_limit=50, time_limit=60)
def runs_sweep() -> None:
    """Scheduled by beat: hand out runs whose message or worker was lost, and paused runs whose pause is over."""
    for run_id in runs.runs_sweep():
        run_execute.delay(run_id)


@shared_task(name="evals.schedules_tick", ignore_result=True, soft_time_limit=50, time_limit=60)
def schedules_tick() -> None:
    """Scheduled by beat every minute: one run per suite whose cron slot is due."""
    schedules.schedules_tick()
    regressions.label_moves_check()


@shared_task(name="evals.online_rules_tick", ignore_result=True, soft_time_limit=240, time_limit=300)
def online_rules_tick() -> None:
    """Scheduled by beat every minute: each online rule evaluates the trajectories that ended since its last tick."""
    online.rules_tick()


@shared_task(name="evals.online_rule_backfill", acks_late=True, ignore_result=True)
def online_rule_backfill(rule_id: int, start: str, end: str) -> None:
    rule = OnlineRule.objects.filter(pk=rule_id).first()
    if rule is not None:
        online.rule_backfill(rule=rule, start=datetime.fromisoformat(start), end=datetime.fromisoformat(end))
