"""The trainer bridge: curations (saved queries of trajectories, grouped by task, with rewards), exports of
a curation to a training format, and training jobs that a GPU worker claims over HTTP.

Work state lives here, not in the broker: an export and a job are rows with a status and a lease, so a
killed worker's export is restarted (its partial file is discarded, never served) and a crashed GPU
worker's job is handed out again once its heartbeat stops.
"""

from __future__ import annotations

from typing import ClassVar

from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from agent_registry.models import ApiKey, User, Workspace

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


class Curation(models.Model):
    """A saved query of trajectories (see trainer_bridge/curation.py for the keys of each JSON field)."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    name = models.CharField(
        max_length=200, validators=[RegexValidator(NAME_PATTERN, "use letters, digits, '.', '_' and '-'")]
    )
    description = models.TextField(blank=True)
    query = models.JSONField(default=dict, blank=True)  # which trajectories
    grouping = models.CharField(max_length=20, default="auto")  # how they form groups
    reward = models.JSONField(default=dict, blank=True)  # where each trajectory's reward comes from
    filters = models.JSONField(default=dict, blank=True)  # RL filters, validation split
    created_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["workspace", "name"], name="curation_name_unique"),
        ]

    def __str__(self) -> str:
        return self.name


class ExportFormat(models.TextChoices):
    ART = "art", "ART trajectory groups"
    TRL_SFT = "trl_sft", "TRL SFT"
    TRL_DPO = "trl_dpo", "TRL DPO"
    TRL_KTO = "trl_kto", "TRL KTO"
    OPENAI = "openai", "OpenAI fine-tuning"
    NEMO_GYM = "nemo_gym", "NeMo Gym rollouts"


class JobStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


ACTIVE = (JobStatus.QUEUED, JobStatus.RUNNING)


class GroupJudgement(models.Model):
    """What a group judge (RULER) gave one group of trajectories, so that a curation's previews and its exports
    ask the judge once per group rather than on every preview and again at export. `group_key` is a hash of the
    task and each trajectory's id and judged output: a trajectory that changes is judged again."""

    evaluator = models.ForeignKey("evals.Evaluator", on_delete=models.CASCADE, related_name="+")  # one version
    group_key = models.CharField(max_length=64)
    rewards = models.JSONField()  # {trace_id: score}
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["evaluator", "group_key"], name="groupjudgement_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.evaluator_id}: {self.group_key[:12]}"


class Export(models.Model):
    """One file of a curation in one format, written by a Celery task, with its manifest."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    curation = models.ForeignKey(Curation, null=True, on_delete=models.SET_NULL, related_name="exports")
    format = models.CharField(max_length=12, choices=ExportFormat.choices)
    status = models.CharField(max_length=12, choices=JobStatus.choices, default=JobStatus.QUEUED)
    # The curation as it was when the export was asked for: the file is what this said.
    curation_snapshot = models.JSONField(default=dict)
    groups_total = models.PositiveIntegerField(default=0)
    groups_done = models.PositiveIntegerField(default=0)
    path = models.CharField(max_length=500, blank=True)  # under KEEL_EXPORT_DIR, once complete
    bytes = models.BigIntegerField(default=0)
    sha256 = models.CharField(max_length=64, blank=True)
    manifest = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_via_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(db_default=Now())
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints: ClassVar = [
            models.CheckConstraint(condition=Q(format__in=ExportFormat.values), name="export_format_valid"),
            models.CheckConstraint(condition=Q(status__in=JobStatus.values), name="export_status_valid"),
        ]
        indexes: ClassVar = [models.Index(fields=["workspace", "-created_at"], name="export_recent")]

    def __str__(self) -> str:
        return f"export {self.pk} ({self.format}, {self.status})"


class TrainingMethod(models.TextChoices):
    GRPO = "grpo", "Group-relative policy gradient"
    SFT = "sft", "Supervised fine-tuning"
    DPO = "dpo", "Direct preference optimisation"


class TrainingJob(models.Model):
    """A training run on an export, claimed and executed by a GPU worker over HTTP."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    export = models.ForeignKey(Export, on_delete=models.PROTECT, related_name="training_jobs")
    name = models.CharField(max_length=200, blank=True)
    method = models.CharField(max_length=8, choices=TrainingMethod.choices)
    base_model = models.CharField(max_length=500)  # a path or hub id the GPU machine can load
    config = models.JSONField(default=dict)  # trainer_bridge.training_config.TrainingConfig fields
    # Held-out rows in the training export's format (e.g. an export of another curation, or of the
    # same curation's validation split); the worker scores the policy on them as it trains.
    validation_export = models.ForeignKey(
        "trainer_bridge.Export", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    status = models.CharField(max_length=12, choices=JobStatus.choices, default=JobStatus.QUEUED)
    worker = models.CharField(max_length=200, blank=True)  # who holds it now: the name it gave
    # The key the holding worker authenticates with: a worker's later calls are matched by it.
    claimed_via_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    lease_seconds = models.PositiveIntegerField(default=300)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    steps_done = models.PositiveIntegerField(default=0)
    adapter_path = models.CharField(max_length=500, blank=True)  # uploaded to Keel
    adapter_location = models.CharField(max_length=1000, blank=True)  # or stored by the worker elsewhere
    flagged = models.BooleanField(default=False)  # reward rose while the validation score fell
    flag_reason = models.TextField(blank=True)
    model_target = models.ForeignKey(
        "routing.ModelTarget", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    comparison_run = models.ForeignKey("evals.Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    error = models.TextField(blank=True)
    created_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_via_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(db_default=Now())
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints: ClassVar = [
            models.CheckConstraint(condition=Q(method__in=TrainingMethod.values), name="trainingjob_method_valid"),
            models.CheckConstraint(condition=Q(status__in=JobStatus.values), name="trainingjob_status_valid"),
        ]
        indexes: ClassVar = [
            models.Index(fields=["status", "created_at"], name="trainingjob_queue"),
        ]

    def __str__(self) -> str:
        return self.name or f"training job {self.pk}"


class TrainingMetric(models.Model):
    """What the worker reported at one step: loss, reward and advantage statistics, KL, validation score."""

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="metrics")
    step = models.PositiveIntegerField()
    values = models.JSONField(default=dict)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ("step",)
        constraints: ClassVar = [models.UniqueConstraint(fields=["job", "step"], name="trainingmetric_step_unique")]

    def __str__(self) -> str:
        return f"{self.job_id} step {self.step}"
