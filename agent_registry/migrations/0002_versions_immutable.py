"""Requirements and prompt versions can be inserted and deleted (with their agent) but never updated."""

from django.db import migrations

TABLES = ("agent_registry_requirementsversion", "agent_registry_promptversion")

FUNCTION = """
CREATE OR REPLACE FUNCTION keel_refuse_update() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'rows of % are immutable; create a new version instead', TG_TABLE_NAME
        USING ERRCODE = 'integrity_constraint_violation';
END;
$$ LANGUAGE plpgsql;
"""


def _trigger(table: str) -> str:
    return (
        f"CREATE TRIGGER {table}_immutable BEFORE UPDATE ON {table} FOR EACH ROW EXECUTE FUNCTION keel_refuse_update();"
    )


class Migration(migrations.Migration):
    dependencies = [("agent_registry", "0001_initial")]

    operations = [
        migrations.RunSQL(FUNCTION, "DROP FUNCTION IF EXISTS keel_refuse_update() CASCADE;"),
        *(
            migrations.RunSQL(_trigger(table), f"DROP TRIGGER IF EXISTS {table}_immutable ON {table};")
            for table in TABLES
        ),
    ]
