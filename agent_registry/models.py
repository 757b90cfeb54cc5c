"""Workspaces, people and keys; agents, their versioned requirements; prompts, versions and labels.

Versions (requirements and prompts) are immutable: a migration installs a trigger that refuses
UPDATE on their tables, so "never edited" holds even for code that forgets. The current
requirements and the deployed prompt version are movable pointers (Wagtail's live revision,
Langfuse's labels).
"""

from __future__ import annotations

from typing import ClassVar

from django.contrib.auth.models import AbstractUser
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now


class User(AbstractUser):
    """A person who signs in to the dashboard. Access to data comes from memberships."""


class Workspace(models.Model):
    """A tenant. Every row Keel stores belongs to exactly one workspace."""

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(db_default=Now())

    def __str__(self) -> str:
        return self.name


class Role(models.TextChoices):
    OWNER = "owner", "Owner"
    MEMBER = "member", "Member"
    VIEWER = "viewer", "Viewer"


class Membership(models.Model):
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["workspace", "user"], name="membership_unique_per_workspace"),
            models.CheckConstraint(condition=Q(role__in=Role.values), name="membership_role_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.workspace} ({self.role})"


class Scope(models.TextChoices):
    INGEST = "ingest", "Ingest spans"
    GATEWAY = "gateway", "Call the gateway"
    READ = "read", "Read"
    WRITE = "write", "Write"
    TRAIN = "train", "Run training jobs"


class AgentStatus(models.TextChoices):
    DRAFT = "draft", "Draft"
    ACTIVE = "active", "Active"
    PAUSED = "paused", "Paused"
    RETIRED = "retired", "Retired"


class Agent(models.Model):
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="agents")
    slug = models.SlugField(max_length=64)
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    owner = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="owned_agents")
    status = models.CharField(max_length=16, choices=AgentStatus.choices, default=AgentStatus.DRAFT)
    # Trajectories that ended longer ago than this are deleted (in batches, by a scheduled task); None keeps them.
    trace_retention_days = models.PositiveIntegerField(null=True, blank=True)
    # The requirements version in force; saving answers creates a version and moves this pointer.
    current_requirements = models.OneToOneField(
        "RequirementsVersion", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["workspace", "slug"], name="agent_slug_unique_per_workspace"),
            models.CheckConstraint(condition=Q(status__in=AgentStatus.values), name="agent_status_valid"),
        ]
        ordering = ("name",)

    def __str__(self) -> str:
        return self.name


class ApiKey(models.Model):
    """A workspace's key for the API. Only a SHA-256 of the key is stored; the key is shown once.

    Keys are long random strings, so a fast hash is safe here and keeps authentication cheap on
    the ingest path. `prefix` is the public part, used to find the row and to recognise a key.
    """

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=200)
    prefix = models.CharField(max_length=32, unique=True)
    key_hash = models.CharField(max_length=64)
    scopes = ArrayField(models.CharField(max_length=16, choices=Scope.choices), default=list)
    # No agents: the key works for every agent of the workspace.
    agents = models.ManyToManyField(Agent, blank=True, related_name="api_keys")
    created_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(db_default=Now())
    last_used_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints: ClassVar = [
            models.CheckConstraint(
                condition=Q(scopes__contained_by=Scope.values) & ~Q(scopes=[]),
                name="api_key_scopes_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None


class RequirementsVersion(models.Model):
    """One immutable answer set to the six forcing questions (validated by agent_registry.requirements)."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="requirements_versions")
    version = models.PositiveIntegerField()
    answers = models.JSONField()
    message = models.CharField(max_length=500, blank=True)
    created_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_via_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["agent", "version"], name="requirements_version_unique"),
            models.CheckConstraint(condition=Q(version__gte=1), name="requirements_version_positive"),
        ]
        ordering = ("-version",)

    def __str__(self) -> str:
        return f"{self.agent} requirements v{self.version}"


class Prompt(models.Model):
    """A named prompt of an agent. Names are unique in the workspace, as Langfuse's are in a project,
    so `GET /api/public/v2/prompts/{name}` finds exactly one; `/` in a name makes folders."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="prompts")
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="prompts")
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    tags = ArrayField(models.CharField(max_length=64), default=list, blank=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["workspace", "name"], name="prompt_name_unique_per_workspace"),
        ]
        ordering = ("name",)

    def __str__(self) -> str:
        return self.name


class PromptType(models.TextChoices):
    TEXT = "text", "Text"
    CHAT = "chat", "Chat"


class PromptVersion(models.Model):
    """An immutable prompt: template, model parameters, commit message, author."""

    prompt = models.ForeignKey(Prompt, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField()
    type = models.CharField(max_length=8, choices=PromptType.choices)
    template = models.JSONField()  # a string (text) or a list of messages (chat)
    config = models.JSONField(default=dict, blank=True)  # model, temperature, max_tokens, ...
    commit_message = models.CharField(max_length=500, blank=True)
    created_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_via_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["prompt", "version"], name="prompt_version_unique"),
            models.CheckConstraint(condition=Q(version__gte=1), name="prompt_version_positive"),
            models.CheckConstraint(condition=Q(type__in=PromptType.values), name="prompt_version_type_valid"),
        ]
        ordering = ("-version",)

    def __str__(self) -> str:
        return f"{self.prompt.name} v{self.version}"


class PromptLabel(models.Model):
    """A movable pointer to one version (`production`, `staging`, ...). Moving it deploys or rolls back."""

    prompt = models.ForeignKey(Prompt, on_delete=models.CASCADE, related_name="labels")
    name = models.CharField(max_length=64)
    version = models.ForeignKey(PromptVersion, on_delete=models.PROTECT, related_name="labels")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["prompt", "name"], name="prompt_label_unique"),
            models.CheckConstraint(
                condition=Q(name__regex=r"^[a-z0-9][a-z0-9_.\-]{0,63}$") & ~Q(name="latest"),
                name="prompt_label_name_valid",
            ),
        ]
        ordering = ("name",)

    def __str__(self) -> str:
        return f"{self.prompt.name}@{self.name}"


class PromptLabelMove(models.Model):
    """The deployment history: each time a label pointed somewhere new."""

    prompt = models.ForeignKey(Prompt, on_delete=models.CASCADE, related_name="label_moves")
    label = models.CharField(max_length=64)
    from_version = models.ForeignKey(PromptVersion, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    to_version = models.ForeignKey(PromptVersion, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    moved_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    moved_via_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    moved_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ("-moved_at", "-id")

    def __str__(self) -> str:
        return f"{self.prompt.name}@{self.label}: {self.from_version_id} → {self.to_version_id}"


class WorkerHeartbeat(models.Model):
    """The last time each Celery worker ran the beat-scheduled heartbeat: proof that beat reads its
    schedule from the database and a worker consumes the broker. Shown on the dashboard home."""

    hostname = models.CharField(max_length=255, unique=True)
    last_seen_at = models.DateTimeField()
    beats = models.PositiveBigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.hostname} @ {self.last_seen_at:%H:%M:%S}"


class AuditAction(models.TextChoices):
    """The administrative actions the audit log records, named `<thing>.<what happened>`."""

    WORKSPACE_CREATED = "workspace.created", "Workspace created"
    MEMBER_ADDED = "member.added", "Member added"
    MEMBER_ROLE_CHANGED = "member.role_changed", "Member's role changed"
    APIKEY_CREATED = "apikey.created", "API key created"
    APIKEY_REVOKED = "apikey.revoked", "API key revoked"
    AGENT_CREATED = "agent.created", "Agent created"
    AGENT_CHANGED = "agent.changed", "Agent settings changed"
    AGENT_DELETED = "agent.deleted", "Agent deleted"
    REQUIREMENTS_ACTIVATED = "requirements.activated", "Earlier requirements made current"
    PROMPT_LABEL_MOVED = "prompt.label_moved", "Prompt label moved"
    PROMPT_LABEL_DELETED = "prompt.label_deleted", "Prompt label deleted"
    PROMPT_DELETED = "prompt.deleted", "Prompt deleted"
    POLICY_CREATED = "policy.created", "Guardrail policy created"
    POLICY_CHANGED = "policy.changed", "Guardrail policy changed"
    BUDGET_CREATED = "budget.created", "Budget created"
    BUDGET_DELETED = "budget.deleted", "Budget deleted"
    APPROVAL_DECIDED = "approval.decided", "Approval decided"
    MODEL_TARGET_CREATED = "model_target.created", "Model target created"
    MODEL_TARGET_CHANGED = "model_target.changed", "Model target changed"
    MODEL_TARGET_DELETED = "model_target.deleted", "Model target deleted"
    TOOL_CREATED = "tool.created", "Tool created"
    TOOL_CHANGED = "tool.changed", "Tool changed"
    TOOL_DELETED = "tool.deleted", "Tool deleted"
    ROUTER_CHANGED = "router.changed", "Router configuration changed"
    ALERT_RULE_CREATED = "alert_rule.created", "Alert rule created"
    ALERT_RULE_CHANGED = "alert_rule.changed", "Alert rule changed"
    ALERT_RULE_DELETED = "alert_rule.deleted", "Alert rule deleted"
    LANGFUSE_MIRROR_CHANGED = "langfuse_mirror.changed", "Langfuse mirror configured"
    LANGFUSE_MIRROR_DELETED = "langfuse_mirror.deleted", "Langfuse mirror removed"
    MODEL_PRICE_CHANGED = "model_price.changed", "Model price set"
    MODEL_PRICE_DELETED = "model_price.deleted", "Model price removed"
    EXPORT_CREATED = "export.created", "Export created"
    EXPORT_DOWNLOADED = "export.downloaded", "Export downloaded"
    TRAINING_JOB_CREATED = "training_job.created", "Training job created"


class AuditActorKind(models.TextChoices):
    USER = "user", "Person"
    API_KEY = "api_key", "API key"
    KEEL = "keel", "Keel"


class AuditEvent(models.Model):
    """One administrative action in a workspace: who (a person, an API key, or Keel itself), what, on
    which object, from where and when. Written by `agent_registry.audit.record` in the transaction of the
    action, so an action that fails leaves no event. Append-only; `details` never holds a secret.

    The actor's name is copied into `actor_label`, and the target's into `target_name`, so an event still
    reads right after the user, key or object is gone."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="audit_events")
    action = models.CharField(max_length=40, choices=AuditAction.choices)
    actor_kind = models.CharField(max_length=8, choices=AuditActorKind.choices)
    actor_user = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    actor_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    actor_label = models.CharField(max_length=200)
    target_type = models.CharField(max_length=64, blank=True)
    target_id = models.CharField(max_length=64, blank=True)
    target_name = models.CharField(max_length=200, blank=True)
    details = models.JSONField(default=dict, blank=True)
    ip_address = models.GenericIPAddressField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        indexes: ClassVar = [
            models.Index(fields=["workspace", "-created_at", "-id"], name="auditevent_recent"),
            models.Index(fields=["workspace", "action", "-created_at"], name="auditevent_action"),
        ]
        constraints: ClassVar = [
            models.CheckConstraint(condition=Q(action__in=AuditAction.values), name="auditevent_action_valid"),
            models.CheckConstraint(condition=Q(actor_kind__in=AuditActorKind.values), name="auditevent_actor_valid"),
        ]
        ordering = ("-created_at", "-id")

    def __str__(self) -> str:
        return f"{self.action} by {self.actor_label} at {self.created_at:%Y-%m-%d %H:%M:%S}"


class RateLimitBucket(models.Model):
    """A token bucket of the rate limiter (agent_registry.ratelimit), shared by every Keel process.

    `tokens` as of `stamp` (seconds on the limiter's clock); one UPSERT refills, takes a token and says
    whether one was there. The table is UNLOGGED (migration 0007): a crash forgets the buckets, which
    only gives everyone a full bucket again, and in exchange no write waits for the WAL."""

    key = models.CharField(max_length=200, primary_key=True)
    tokens = models.FloatField()
    stamp = models.FloatField()
    allowed = models.BooleanField(default=True)

    def __str__(self) -> str:
        return f"{self.key}: {self.tokens:.2f} tokens"
