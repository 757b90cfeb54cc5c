"""The audit log and the rate limiter's buckets.

Audit events are append-only: a trigger refuses every UPDATE but the one that deleting a user or an API
key makes (`on_delete=SET_NULL` clears `actor_user_id` / `actor_key_id`, and `actor_label` keeps the name).
The buckets' table is UNLOGGED: no write to it waits for the WAL, and a crash, which empties it, only
refills every bucket. A periodic task deletes buckets that have filled up again.
"""

import django.db.models.deletion
import django.db.models.functions.datetime
from django.conf import settings
from django.db import migrations, models

AUDIT_TABLE = "agent_registry_auditevent"
BUCKET_TABLE = "agent_registry_ratelimitbucket"

APPEND_ONLY = f"""
CREATE OR REPLACE FUNCTION keel_audit_append_only() RETURNS trigger AS $$
BEGIN
    IF (to_jsonb(NEW) - 'actor_user_id' - 'actor_key_id') = (to_jsonb(OLD) - 'actor_user_id' - 'actor_key_id')
        AND (NEW.actor_user_id IS NULL OR NEW.actor_user_id = OLD.actor_user_id)
        AND (NEW.actor_key_id IS NULL OR NEW.actor_key_id = OLD.actor_key_id) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'audit events are append-only' USING ERRCODE = 'integrity_constraint_violation';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER {AUDIT_TABLE}_append_only BEFORE UPDATE ON {AUDIT_TABLE}
    FOR EACH ROW EXECUTE FUNCTION keel_audit_append_only();
"""
APPEND_ONLY_REVERSE = f"""
DROP TRIGGER IF EXISTS {AUDIT_TABLE}_append_only ON {AUDIT_TABLE};
DROP FUNCTION IF EXISTS keel_audit_append_only();
"""

SWEEP_TASK = "agent_registry.rate_limit_buckets_sweep"


def schedule_sweep(apps, schema_editor):
    IntervalSchedule = apps.get_model("django_celery_beat", "IntervalSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    every, _ = IntervalSchedule.objects.get_or_create(every=1, period="hours")
    PeriodicTask.objects.update_or_create(
        name="Rate limit buckets sweep", defaults={"task": SWEEP_TASK, "interval": every, "enabled": True}
    )


def unschedule_sweep(apps, schema_editor):
    apps.get_model("django_celery_beat", "PeriodicTask").objects.filter(task=SWEEP_TASK).delete()


class Migration(migrations.Migration):

    dependencies = [
        ('agent_registry', '0006_apikey_train_scope'),
        ('django_celery_beat', '0019_alter_periodictasks_options'),
    ]

    operations = [
        migrations.CreateModel(
            name='RateLimitBucket',
            fields=[
                ('key', models.CharField(max_length=200, primary_key=True, serialize=False)),
                ('tokens', models.FloatField()),
                ('stamp', models.FloatField()),
                ('allowed', models.BooleanField(default=True)),
            ],
        ),
        migrations.CreateModel(
            name='AuditEvent',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('action', models.CharField(choices=[('workspace.created', 'Workspace created'), ('member.added', 'Member added'), ('member.role_changed', "Member's role changed"), ('apikey.created', 'API key created'), ('apikey.revoked', 'API key revoked'), ('agent.created', 'Agent created'), ('agent.changed', 'Agent settings changed'), ('agent.deleted', 'Agent deleted'), ('prompt.label_moved', 'Prompt label moved'), ('prompt.label_deleted', 'Prompt label deleted'), ('prompt.deleted', 'Prompt deleted'), ('policy.created', 'Guardrail policy created'), ('policy.changed', 'Guardrail policy changed'), ('budget.created', 'Budget created'), ('budget.deleted', 'Budget deleted'), ('approval.decided', 'Approval decided'), ('model_target.created', 'Model target created'), ('model_target.changed', 'Model target changed'), ('model_target.deleted', 'Model target deleted'), ('tool.created', 'Tool created'), ('tool.changed', 'Tool changed'), ('tool.deleted', 'Tool deleted'), ('router.changed', 'Router configuration changed'), ('alert_rule.created', 'Alert rule created'), ('alert_rule.changed', 'Alert rule changed'), ('alert_rule.deleted', 'Alert rule deleted'), ('langfuse_mirror.changed', 'Langfuse mirror configured'), ('langfuse_mirror.deleted', 'Langfuse mirror removed'), ('model_price.changed', 'Model price set'), ('export.created', 'Export created'), ('export.downloaded', 'Export downloaded'), ('training_job.created', 'Training job created')], max_length=40)),
                ('actor_kind', models.CharField(choices=[('user', 'Person'), ('api_key', 'API key'), ('keel', 'Keel')], max_length=8)),
                ('actor_label', models.CharField(max_length=200)),
                ('target_type', models.CharField(blank=True, max_length=64)),
                ('target_id', models.CharField(blank=True, max_length=64)),
                ('target_name', models.CharField(blank=True, max_length=200)),
                ('details', models.JSONField(blank=True, default=dict)),
                ('ip_address', models.GenericIPAddressField(blank=True, null=True)),
                ('created_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('actor_key', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='agent_registry.apikey')),
                ('actor_user', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('workspace', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='audit_events', to='agent_registry.workspace')),
            ],
            options={
                'ordering': ('-created_at', '-id'),
                'indexes': [models.Index(fields=['workspace', '-created_at', '-id'], name='auditevent_recent'), models.Index(fields=['workspace', 'action', '-created_at'], name='auditevent_action')],
                'constraints': [models.CheckConstraint(condition=models.Q(('action__in', ['workspace.created', 'member.added', 'member.role_changed', 'apikey.created', 'apikey.revoked', 'agent.created', 'agent.changed', 'agent.deleted', 'prompt.label_moved', 'prompt.label_deleted', 'prompt.deleted', 'policy.created', 'policy.changed', 'budget.created', 'budget.deleted', 'approval.decided', 'model_target.created', 'model_target.changed', 'model_target.deleted', 'tool.created', 'tool.changed', 'tool.deleted', 'router.changed', 'alert_rule.created', 'alert_rule.changed', 'alert_rule.deleted', 'langfuse_mirror.changed', 'langfuse_mirror.deleted', 'model_price.changed', 'export.created', 'export.downloaded', 'training_job.created'])), name='auditevent_action_valid'), models.CheckConstraint(condition=models.Q(('actor_kind__in', ['user', 'api_key', 'keel'])), name='auditevent_actor_valid')],
            },
        ),
        migrations.RunSQL(f"ALTER TABLE {BUCKET_TABLE} SET UNLOGGED;", f"ALTER TABLE {BUCKET_TABLE} SET LOGGED;"),
        migrations.RunSQL(APPEND_ONLY, APPEND_ONLY_REVERSE),
        migrations.RunPython(schedule_sweep, unschedule_sweep),
    ]
