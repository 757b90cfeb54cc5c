"""Beat schedules (in the database) for the Langfuse outbox and the daily retention sweep."""

from django.db import migrations

EXPORT_TASK = "tracing.langfuse_export_sweep"
RETENTION_TASK = "tracing.trajectory_retention_sweep"


def schedule(apps, schema_editor):
    IntervalSchedule = apps.get_model("django_celery_beat", "IntervalSchedule")
    CrontabSchedule = apps.get_model("django_celery_beat", "CrontabSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    every, _ = IntervalSchedule.objects.get_or_create(every=30, period="seconds")
    PeriodicTask.objects.update_or_create(
        name="Langfuse export sweep", defaults={"task": EXPORT_TASK, "interval": every, "enabled": True}
    )
    nightly, _ = CrontabSchedule.objects.get_or_create(
        minute="30", hour="3", day_of_week="*", day_of_month="*", month_of_year="*", timezone="UTC"
    )
    PeriodicTask.objects.update_or_create(
        name="Trajectory retention", defaults={"task": RETENTION_TASK, "crontab": nightly, "enabled": True}
    )


def unschedule(apps, schema_editor):
    apps.get_model("django_celery_beat", "PeriodicTask").objects.filter(task__in=[EXPORT_TASK, RETENTION_TASK]).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("tracing", "0004_langfuse_mirror"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(schedule, unschedule)]
