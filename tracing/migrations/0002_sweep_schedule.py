"""Schedule the ingest sweeper in beat's database schedule: batches whose broker message or worker was
lost are handed to a worker again."""

from django.db import migrations

TASK = "tracing.ingest_batch_sweep"


def schedule(apps, schema_editor):
    IntervalSchedule = apps.get_model("django_celery_beat", "IntervalSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    every, _ = IntervalSchedule.objects.get_or_create(every=15, period="seconds")
    PeriodicTask.objects.update_or_create(
        name="Ingest batch sweep", defaults={"task": TASK, "interval": every, "enabled": True}
    )


def unschedule(apps, schema_editor):
    apps.get_model("django_celery_beat", "PeriodicTask").objects.filter(task=TASK).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("tracing", "0001_initial"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(schedule, unschedule)]
