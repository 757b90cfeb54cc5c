"""Celery entry points of the registry."""

from __future__ import annotations

import socket

from celery import shared_task

from agent_registry import services


@shared_task(name="agent_registry.worker_heartbeat_record", ignore_result=True, soft_time_limit=20, time_limit=30)
def worker_heartbeat_record() -> None:
    """Scheduled by beat from the database; the dashboard shows the last one a worker ran."""
    services.worker_heartbeat_record(hostname=socket.gethostname())
