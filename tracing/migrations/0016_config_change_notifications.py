"""Changes to the rows span ingest reads for every batch (model prices, triage settings, the Langfuse mirror)
notify every process's caches (config/config_cache.py)."""

from django.db import migrations

from config.config_cache import trigger_drop_sql, trigger_sql

# A mirror's delivery status is written after every delivery; that alone changes no config.
TABLES = (
    ("tracing_modelpriceoverride", ()),
    ("tracing_triagesettings", ()),
    (
        "tracing_langfusemirror",
        ("last_success_at", "last_error", "last_error_at", "delivered_spans", "delivered_scores"),
    ),
)


class Migration(migrations.Migration):
    dependencies = [
        ("tracing", "0015_span_rows_inline"),
        ("agent_registry", "0008_config_change_notifications"),
    ]

    operations = [
        migrations.RunSQL(trigger_sql(table, ignored_columns=ignored), trigger_drop_sql(table))
        for table, ignored in TABLES
    ]
