"""Celery entry points of the registry."""

from __future__ import annotations

import socket

from celery import shared_task

from agent_registry import ratelimit, services


@shared_task(name="agent_registry.worker_heartbeat_record", ignore_result=True, soft_time_limit=20, time_limit=30)
def worker_heartbeat_record() -> None:
    """Scheduled by beat from the database; the dashboard shows the last one a worker ran."""
    services.worker_heartbeat_record(hostname=socket.gethostname())


@shared_task(name="agent_registry.rate_limit_buckets_sweep", ignore_result=True, soft_time_limit=60, time_limit=90)
def rate_limit_buckets_sweep() -> None:
    """Hourly, from beat: delete rate limit buckets that have filled up again."""
    ratelimit.buckets_sweep()
