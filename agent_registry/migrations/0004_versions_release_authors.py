"""Versions stay immutable, but deleting a user or an API key may clear who authored them.

`created_by` and `created_via_key` are `on_delete=SET_NULL`, which Django carries out as an UPDATE;
the trigger of 0002 refused it, so a user, a key or a workspace whose keys had published a version
could not be deleted. The only UPDATE now accepted sets those two columns to NULL and nothing else.
"""

from django.db import migrations

FUNCTION = """
CREATE OR REPLACE FUNCTION keel_refuse_update() RETURNS trigger AS $$
BEGIN
    IF (to_jsonb(NEW) - 'created_by_id' - 'created_via_key_id')
            = (to_jsonb(OLD) - 'created_by_id' - 'created_via_key_id')
        AND (NEW.created_by_id IS NULL OR NEW.created_by_id = OLD.created_by_id)
        AND (NEW.created_via_key_id IS NULL OR NEW.created_via_key_id = OLD.created_via_key_id) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'rows of % are immutable; create a new version instead', TG_TABLE_NAME
        USING ERRCODE = 'integrity_constraint_violation';
END;
$$ LANGUAGE plpgsql;
"""

PREVIOUS = """
CREATE OR REPLACE FUNCTION keel_refuse_update() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'rows of % are immutable; create a new version instead', TG_TABLE_NAME
        USING ERRCODE = 'integrity_constraint_violation';
END;
$$ LANGUAGE plpgsql;
"""


class Migration(migrations.Migration):
    dependencies = [("agent_registry", "0003_heartbeat_schedule")]

    operations = [migrations.RunSQL(FUNCTION, PREVIOUS)]
