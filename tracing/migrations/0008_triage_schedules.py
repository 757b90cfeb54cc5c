"""Beat schedules (in the database) for alert evaluation, alert delivery and the daily review draw."""

from django.db import migrations

EVALUATE_TASK = "tracing.alert_rules_evaluate"
DELIVERY_TASK = "tracing.alert_delivery_sweep"
REVIEW_TASK = "tracing.review_samples_daily"


def schedule(apps, schema_editor):
    IntervalSchedule = apps.get_model("django_celery_beat", "IntervalSchedule")
    CrontabSchedule = apps.get_model("django_celery_beat", "CrontabSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    minute, _ = IntervalSchedule.objects.get_or_create(every=60, period="seconds")
    PeriodicTask.objects.update_or_create(
        name="Alert rule evaluation", defaults={"task": EVALUATE_TASK, "interval": minute, "enabled": True}
    )
    half_minute, _ = IntervalSchedule.objects.get_or_create(every=30, period="seconds")
    PeriodicTask.objects.update_or_create(
        name="Alert delivery sweep", defaults={"task": DELIVERY_TASK, "interval": half_minute, "enabled": True}
    )
    daily, _ = CrontabSchedule.objects.get_or_create(
        minute="15", hour="4", day_of_week="*", day_of_month="*", month_of_year="*", timezone="UTC"
    )
    PeriodicTask.objects.update_or_create(
        name="Daily review samples", defaults={"task": REVIEW_TASK, "crontab": daily, "enabled": True}
    )


def unschedule(apps, schema_editor):
    apps.get_model("django_celery_beat", "PeriodicTask").objects.filter(
        task__in=[EVALUATE_TASK, DELIVERY_TASK, REVIEW_TASK]
    ).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("tracing", "0007_triage_review_alerts"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(schedule, unschedule)]
