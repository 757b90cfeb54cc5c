"""Beat schedules (in the database): shadow-run sweep, routing outcomes, cache expiry."""

from django.db import migrations

SHADOW_TASK = "routing.shadow_run_sweep"
OUTCOMES_TASK = "routing.routing_decision_outcomes_refresh"
CACHE_TASK = "routing.cache_entries_sweep"


def schedule(apps, schema_editor):
    IntervalSchedule = apps.get_model("django_celery_beat", "IntervalSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    minute, _ = IntervalSchedule.objects.get_or_create(every=60, period="seconds")
    hourly, _ = IntervalSchedule.objects.get_or_create(every=1, period="hours")
    for name, task, every in (
        ("Shadow run sweep", SHADOW_TASK, minute),
        ("Routing outcomes", OUTCOMES_TASK, minute),
        ("Semantic cache expiry", CACHE_TASK, hourly),
    ):
        PeriodicTask.objects.update_or_create(name=name, defaults={"task": task, "interval": every, "enabled": True})


def unschedule(apps, schema_editor):
    apps.get_model("django_celery_beat", "PeriodicTask").objects.filter(
        task__in=[SHADOW_TASK, OUTCOMES_TASK, CACHE_TASK]
    ).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("routing", "0001_initial"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(schedule, unschedule)]
