"""Changes to guardrail policies and budgets notify every process's caches (config/config_cache.py)."""

from django.db import migrations

from config.config_cache import trigger_drop_sql, trigger_sql

TABLES = ("guardrails_guardrailpolicy", "guardrails_budget")


class Migration(migrations.Migration):
    dependencies = [
        ("guardrails", "0002_schedules"),
        ("agent_registry", "0008_config_change_notifications"),
    ]

    operations = [migrations.RunSQL(trigger_sql(table), trigger_drop_sql(table)) for table in TABLES]
