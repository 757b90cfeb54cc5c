"""Changes to the rows the gateway keeps per process notify every process (config/config_cache.py)."""

from django.db import migrations

from config.config_cache import TRIGGER_FUNCTION_DROP_SQL, TRIGGER_FUNCTION_SQL, trigger_drop_sql, trigger_sql

# A key's `last_used_at` is written once a minute while it is used; that alone changes no config.
TABLES = (
    ("agent_registry_workspace", ()),
    ("agent_registry_apikey", ("last_used_at",)),
    ("agent_registry_apikey_agents", ()),
    ("agent_registry_agent", ()),
    ("agent_registry_prompt", ()),
    ("agent_registry_promptversion", ()),
    ("agent_registry_promptlabel", ()),
)


class Migration(migrations.Migration):
    dependencies = [("agent_registry", "0007_audit_events_rate_limits")]

    operations = [
        migrations.RunSQL(TRIGGER_FUNCTION_SQL, TRIGGER_FUNCTION_DROP_SQL),
        *(
            migrations.RunSQL(trigger_sql(table, ignored_columns=ignored), trigger_drop_sql(table))
            for table, ignored in TABLES
        ),
    ]
