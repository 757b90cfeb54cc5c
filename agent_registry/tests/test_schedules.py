"""The beat schedules that migrations write into django-celery-beat's tables."""

import pytest
from django_celery_beat.models import PeriodicTask

pytestmark = pytest.mark.django_db


def test_migrations_schedule_the_periodic_tasks():
    schedules = {
        task.task: (task.interval.every, task.interval.period) if task.interval else (task.crontab.hour, "cron")
        for task in PeriodicTask.objects.select_related("interval", "crontab").filter(enabled=True)
    }

    assert schedules["agent_registry.worker_heartbeat_record"] == (30, "seconds")
    assert schedules["tracing.ingest_batch_sweep"] == (15, "seconds")
    assert schedules["tracing.langfuse_export_sweep"] == (30, "seconds")
    assert schedules["tracing.replay_sweep"] == (60, "seconds")
    assert schedules["tracing.trajectory_retention_sweep"] == ("3", "cron")
