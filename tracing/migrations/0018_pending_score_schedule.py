"""Schedule the attaching of pending scores (Langfuse clients' scores that came before their trace)."""

from django.db import migrations

TASK = "tracing.pending_scores_attach"


def schedule(apps, schema_editor):
    IntervalSchedule = apps.get_model("django_celery_beat", "IntervalSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    every, _ = IntervalSchedule.objects.get_or_create(every=15, period="seconds")
    PeriodicTask.objects.update_or_create(
        name="Pending scores attach", defaults={"task": TASK, "interval": every, "enabled": True}
    )


def unschedule(apps, schema_editor):
    apps.get_model("django_celery_beat", "PeriodicTask").objects.filter(task=TASK).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("tracing", "0017_langfuse_scores"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(schedule, unschedule)]
