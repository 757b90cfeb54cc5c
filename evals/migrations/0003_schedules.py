"""Beat schedules (in the database): suite cron slots and label moves, online rules, the run sweep."""

from django.db import migrations

TASKS = (
    ("Eval schedules", "evals.schedules_tick"),
    ("Online eval rules", "evals.online_rules_tick"),
    ("Eval run sweep", "evals.runs_sweep"),
)


def schedule(apps, schema_editor):
    IntervalSchedule = apps.get_model("django_celery_beat", "IntervalSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    minute, _ = IntervalSchedule.objects.get_or_create(every=60, period="seconds")
    for name, task in TASKS:
        PeriodicTask.objects.update_or_create(name=name, defaults={"task": task, "interval": minute, "enabled": True})


def unschedule(apps, schema_editor):
    apps.get_model("django_celery_beat", "PeriodicTask").objects.filter(task__in=[task for _, task in TASKS]).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("evals", "0002_suites_runs_online"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(schedule, unschedule)]
