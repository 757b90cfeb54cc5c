"""Changes to router configs and model targets notify every process's caches (config/config_cache.py)."""

from django.db import migrations

from config.config_cache import trigger_drop_sql, trigger_sql

TABLES = ("routing_routerconfig", "routing_modeltarget")


class Migration(migrations.Migration):
    dependencies = [
        ("routing", "0005_chain_step_prompt_version_restrict"),
        ("agent_registry", "0008_config_change_notifications"),
    ]

    operations = [migrations.RunSQL(trigger_sql(table), trigger_drop_sql(table)) for table in TABLES]
