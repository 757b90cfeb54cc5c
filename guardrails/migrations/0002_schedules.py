"""Beat schedules (in the database): approval expiry and the release of stale budget reservations."""

from django.db import migrations

APPROVALS_TASK = "guardrails.approval_requests_expire"
RESERVATIONS_TASK = "guardrails.budget_reservations_release"


def schedule(apps, schema_editor):
    IntervalSchedule = apps.get_model("django_celery_beat", "IntervalSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    minute, _ = IntervalSchedule.objects.get_or_create(every=60, period="seconds")
    for name, task in (
        ("Approval expiry", APPROVALS_TASK),
        ("Budget reservation release", RESERVATIONS_TASK),
    ):
        PeriodicTask.objects.update_or_create(name=name, defaults={"task": task, "interval": minute, "enabled": True})


def unschedule(apps, schema_editor):
    apps.get_model("django_celery_beat", "PeriodicTask").objects.filter(
        task__in=[APPROVALS_TASK, RESERVATIONS_TASK]
    ).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("guardrails", "0001_initial"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(schedule, unschedule)]
