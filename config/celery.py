"""The Celery application; every app's tasks.py is discovered from INSTALLED_APPS."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery, signals
from django.db import close_old_connections

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")

app = Celery("keel")
app.config_from_object("django.conf:settings", namespace="CELERY")
# Celery's Django fix-up closes every database connection before and after each task unless
# CELERY_DB_REUSE_MAX is set, so each task paid for a new PostgreSQL session (a backend process forked
# and its caches filled): for a span batch of a gateway request, more than the batch's own work. With
# the fix-up's closing switched off, a task keeps its connection the way a web request does: Django's
# close_old_connections around it, so CONN_MAX_AGE and CONN_HEALTH_CHECKS decide.
DB_REUSE_NEVER_CLOSE = 2**62
app.conf.update(CELERY_DB_REUSE_MAX=DB_REUSE_NEVER_CLOSE)
app.autodiscover_tasks()


@signals.task_prerun.connect
@signals.task_postrun.connect
def _connections_as_between_requests(**kwargs: Any) -> None:
    task = kwargs.get("task")
    if task is not None and getattr(task.request, "is_eager", False):
        return  # run in the caller's process and transaction (tests, eager mode): not ours to close
    close_old_connections()
