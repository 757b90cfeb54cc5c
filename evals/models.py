"""Versioned datasets: a dataset is a name in a workspace; its items live in numbered versions.

A version is immutable once created: every change (an upload, items from trajectories, items sent
through the API) creates the next version holding the whole new item list, so a run that names a
version always sees the same items. Items are copied into each version, which keeps reads simple;
the sizes eval datasets have make that affordable.
"""

from __future__ import annotations

from typing import ClassVar

from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from agent_registry.models import Agent, ApiKey, User, Workspace

# Names appear in URLs (/datasets/{name}), so they keep to characters a path needs no escaping for.
DATASET_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


class Dataset(models.Model):
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    agent = models.ForeignKey(Agent, null=True, blank=True, on_delete=models.SET_NULL, related_name="datasets")
    name = models.CharField(
        max_length=200,
        validators=[RegexValidator(DATASET_NAME_PATTERN, "use letters, digits, '.', '_' and '-'")],
    )
    description = models.TextField(blank=True)
    created_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_via_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["workspace", "name"], name="dataset_name_unique"),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        if self.agent is not None and self.agent.workspace_id != self.workspace_id:
            raise ValidationError({"agent": "the agent belongs to another workspace"})


class DatasetVersion(models.Model):
    """One immutable state of a dataset's items, numbered from 1 per dataset."""

    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField()
    message = models.TextField(blank=True)
    item_count = models.PositiveIntegerField(default=0)
    created_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_via_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["dataset", "version"], name="datasetversion_number_unique"),
            models.CheckConstraint(condition=Q(version__gte=1), name="datasetversion_number_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.dataset_id} v{self.version}"


class DatasetItem(models.Model):
    """An item of one version. `source_trace_id` links it to the trajectory it came from (blank when
    uploaded); a trace id, not a foreign key, so that retention deleting the trajectory keeps the item."""

    version = models.ForeignKey(DatasetVersion, on_delete=models.CASCADE, related_name="items")
    position = models.PositiveIntegerField()
    # The item's identity across versions (given, or its input's hash): two runs are compared item by item on it.
    key = models.CharField(max_length=200)
    task = models.TextField(blank=True)
    input_messages = models.JSONField(default=list, blank=True)
    reference_output = models.TextField(blank=True)  # blank: no reference
    expected_tool_calls = models.JSONField(null=True, blank=True)
    expected_state = models.JSONField(null=True, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    source_trace_id = models.CharField(max_length=32, blank=True)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["version", "position"], name="datasetitem_position_unique"),
            models.UniqueConstraint(fields=["version", "key"], name="datasetitem_key_unique"),
        ]
        indexes: ClassVar = [
            models.Index(fields=["source_trace_id"], name="datasetitem_source_trace", condition=~Q(source_trace_id="")),
        ]

    def __str__(self) -> str:
        return f"item {self.position} of version {self.version_id}"


# --- Evaluators -----------------------------------------------------------------------------------------

# Evaluator names are metric names: the evaluation commitment's names fit (lowercase, digits, '_').
EVALUATOR_NAME_PATTERN = r"^[a-z][a-z0-9_]{0,63}$"


class Evaluator(models.Model):
    """One version of a named evaluator: its type and settings (see evals/evaluators.py).

    Versions are immutable; changing an evaluator creates its next version, and every score names the
    version that produced it, so scores made under different settings are never mixed up."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    agent = models.ForeignKey(Agent, null=True, blank=True, on_delete=models.SET_NULL, related_name="evaluators")
    name = models.CharField(
        max_length=64,
        validators=[RegexValidator(EVALUATOR_NAME_PATTERN, "use lowercase letters, digits and '_'")],
    )
    version = models.PositiveIntegerField()
    type = models.CharField(max_length=40)
    config = models.JSONField(default=dict)
    description = models.TextField(blank=True)
    created_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["workspace", "name", "version"], name="evaluator_version_unique"),
            models.CheckConstraint(condition=Q(version__gte=1), name="evaluator_version_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.name} v{self.version}"


# --- Suites ---------------------------------------------------------------------------------------------


class SuiteTarget(models.TextChoices):
    AGENT = "agent", "Agent through the gateway"  # a prompt version (or label) and optionally a tier
    MODEL_TARGET = "model_target", "Model target through the gateway"
    RECORDED = "recorded", "Recorded trajectories (offline)"


class Suite(models.Model):
    """A dataset, evaluators and a target, with k samples per item; run on demand or on a cron schedule."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    agent = models.ForeignKey(Agent, null=True, blank=True, on_delete=models.CASCADE, related_name="eval_suites")
    name = models.CharField(
        max_length=200,
        validators=[RegexValidator(DATASET_NAME_PATTERN, "use letters, digits, '.', '_' and '-'")],
    )
    description = models.TextField(blank=True)
    dataset = models.ForeignKey(Dataset, null=True, blank=True, on_delete=models.PROTECT, related_name="suites")
    # Pinned dataset version; none: the latest version when a run starts.
    dataset_version = models.ForeignKey(
        DatasetVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="suites"
    )
    target = models.CharField(max_length=16, choices=SuiteTarget.choices, default=SuiteTarget.AGENT)
    # For an agent target: an explicit prompt version wins over the label (default: production).
    prompt_label = models.CharField(max_length=64, blank=True, default="production")
    prompt_version = models.ForeignKey(
        "agent_registry.PromptVersion", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    tier = models.CharField(max_length=16, blank=True)  # blank: the router decides
    model_target = models.ForeignKey(
        "routing.ModelTarget", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    # The prompt's variables for every request (an item's metadata.variables add to them).
    variables = models.JSONField(default=dict, blank=True)
    evaluators = models.ManyToManyField(Evaluator, through="SuiteEvaluator", related_name="suites")
    samples = models.PositiveSmallIntegerField(default=1)  # k
    concurrency = models.PositiveSmallIntegerField(default=4)
    schedule_cron = models.CharField(max_length=100, blank=True)  # five-field cron, in UTC
    schedule_enabled = models.BooleanField(default=False)
    # The last schedule slot a run was made for: beat creates the next one once it is due.
    schedule_last_slot = models.DateTimeField(null=True, blank=True)
    proposed = models.BooleanField(default=False)  # made by Keel from the evaluation commitment
    created_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["workspace", "name"], name="suite_name_unique"),
            models.CheckConstraint(condition=Q(samples__gte=1, samples__lte=64), name="suite_samples_range"),
            models.CheckConstraint(
                condition=Q(concurrency__gte=1, concurrency__lte=64), name="suite_concurrency_range"
            ),
            models.CheckConstraint(condition=Q(target__in=SuiteTarget.values), name="suite_target_valid"),
        ]

    def __str__(self) -> str:
        return self.name


class SuiteEvaluator(models.Model):
    suite = models.ForeignKey(Suite, on_delete=models.CASCADE, related_name="suite_evaluators")
    evaluator = models.ForeignKey(Evaluator, on_delete=models.PROTECT, related_name="+")
    position = models.PositiveSmallIntegerField(default=0)

    class Meta:
        ordering = ("position", "id")
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["suite", "evaluator"], name="suite_evaluator_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.suite_id}: {self.evaluator_id}"


# --- Runs -----------------------------------------------------------------------------------------------


class RunStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    PAUSED = "paused", "Paused"  # the model provider is unreachable; resumes by itself or on request
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


RUN_ACTIVE = (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.PAUSED)


class RunTrigger(models.TextChoices):
    MANUAL = "manual", "Manual"
    API = "api", "API"
    SCHEDULE = "schedule", "Schedule"
    LABEL = "label", "Prompt label moved"
    IMPORT = "import", "Imported"


class Run(models.Model):
    """One execution of a suite (or an imported file of rollouts). What the run uses is fixed when it is
    created (dataset version, prompt version, evaluator versions), so resuming it later changes nothing."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    suite = models.ForeignKey(Suite, null=True, blank=True, on_delete=models.SET_NULL, related_name="runs")
    agent = models.ForeignKey(Agent, null=True, blank=True, on_delete=models.SET_NULL, related_name="eval_runs")
    name = models.CharField(max_length=300, blank=True)
    status = models.CharField(max_length=12, choices=RunStatus.choices, default=RunStatus.QUEUED)
    trigger = models.CharField(max_length=12, choices=RunTrigger.choices, default=RunTrigger.MANUAL)
    scheduled_for = models.DateTimeField(null=True, blank=True)  # the schedule slot, for scheduled runs
    idempotency_key = models.CharField(max_length=200, blank=True)
    dataset_version = models.ForeignKey(
        DatasetVersion, null=True, blank=True, on_delete=models.SET_NULL, related_name="runs"
    )
    target = models.CharField(max_length=16, choices=SuiteTarget.choices, default=SuiteTarget.AGENT)
    prompt_version = models.ForeignKey(
        "agent_registry.PromptVersion", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    tier = models.CharField(max_length=16, blank=True)
    model_target = models.ForeignKey(
        "routing.ModelTarget", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    samples = models.PositiveSmallIntegerField(default=1)
    concurrency = models.PositiveSmallIntegerField(default=4)
    variables = models.JSONField(default=dict, blank=True)
    # The evaluators' versions and settings when the run was made: [{"id", "name", "version", "type", "config"}].
    evaluators = models.JSONField(default=list)
    item_count = models.PositiveIntegerField(default=0)
    items_done = models.PositiveIntegerField(default=0)
    items_errored = models.PositiveIntegerField(default=0)
    pause_reason = models.TextField(blank=True)
    resume_after = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)
    report = models.JSONField(default=dict, blank=True)  # evaluator name -> metrics.RunReport.as_json()
    # The run this one is compared with when both are done (a newly labelled prompt version's run has
    # the previous version's as its baseline).
    baseline = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="candidates")
    claimed_at = models.DateTimeField(null=True, blank=True)  # the worker driving it, renewed as items finish
    created_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_via_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(db_default=Now())
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints: ClassVar = [
            models.CheckConstraint(condition=Q(status__in=RunStatus.values), name="run_status_valid"),
            # Several beat processes may see the same slot due: only one run is made for it.
            models.UniqueConstraint(
                fields=["suite", "scheduled_for"],
                name="run_schedule_slot_unique",
                condition=Q(scheduled_for__isnull=False),
            ),
            models.UniqueConstraint(
                fields=["workspace", "idempotency_key"], name="run_idempotency_unique", condition=~Q(idempotency_key="")
            ),
        ]
        indexes: ClassVar = [
            models.Index(fields=["workspace", "-created_at"], name="run_recent"),
            models.Index(fields=["status"], name="run_active", condition=Q(status__in=["queued", "running", "paused"])),
        ]

    def __str__(self) -> str:
        return self.name or f"run {self.pk}"

    @property
    def is_active(self) -> bool:
        return self.status in RUN_ACTIVE


class RunItemStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    DONE = "done", "Done"
    ERRORED = "errored", "Errored"


class RunItem(models.Model):
    """A dataset item in a run, copied so that the run reads the same whatever happens to the dataset."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="items")
    position = models.PositiveIntegerField()
    key = models.CharField(max_length=200)  # the dataset item's key; comparisons pair runs' items on it
    dataset_item = models.ForeignKey(DatasetItem, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    task = models.TextField(blank=True)
    input_messages = models.JSONField(default=list, blank=True)
    reference_output = models.TextField(blank=True)
    expected_tool_calls = models.JSONField(null=True, blank=True)
    expected_state = models.JSONField(null=True, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    source_trace_id = models.CharField(max_length=32, blank=True)
    status = models.CharField(max_length=8, choices=RunItemStatus.choices, default=RunItemStatus.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    claimed_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)
    score = models.FloatField(null=True, blank=True)  # the first evaluator's mean over samples, for lists

    class Meta:
        ordering = ("position",)
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["run", "position"], name="runitem_position_unique"),
            models.UniqueConstraint(fields=["run", "key"], name="runitem_key_unique"),
        ]
        indexes: ClassVar = [models.Index(fields=["run", "status"], name="runitem_status")]

    def __str__(self) -> str:
        return f"item {self.position} of run {self.run_id}"


class RunSample(models.Model):
    """One of the k answers to an item, with the trajectory that produced it."""

    item = models.ForeignKey(RunItem, on_delete=models.CASCADE, related_name="samples")
    sample = models.PositiveSmallIntegerField()
    output_text = models.TextField(blank=True)
    output = models.JSONField(default=dict, blank=True)  # {"message", "tool_calls", "facts"}
    trace_id = models.CharField(max_length=32, blank=True)
    latency_ms = models.FloatField(null=True, blank=True)
    cost_usd = models.FloatField(null=True, blank=True)
    error = models.TextField(blank=True)  # the target failed: the sample is errored, not scored
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ("sample",)
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["item", "sample"], name="runsample_unique"),
        ]

    def __str__(self) -> str:
        return f"sample {self.sample} of {self.item_id}"


class RunScore(models.Model):
    """One evaluator version's verdict on one sample; `error` set (and no score) when it could not judge."""

    sample = models.ForeignKey(RunSample, on_delete=models.CASCADE, related_name="scores")
    evaluator_name = models.CharField(max_length=64)
    evaluator_version = models.PositiveIntegerField()
    score = models.FloatField(null=True, blank=True)
    passed = models.BooleanField(default=False)
    reason = models.TextField(blank=True)
    error = models.TextField(blank=True)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["sample", "evaluator_name"], name="runscore_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.evaluator_name} v{self.evaluator_version}={self.score}"


class RegressionAlert(models.Model):
    """A newly labelled prompt version scored worse than the version the label held before."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    agent = models.ForeignKey(Agent, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    suite = models.ForeignKey(Suite, on_delete=models.CASCADE, related_name="regressions")
    baseline_run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+")
    candidate_run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+")
    metric = models.CharField(max_length=64)
    comparison = models.JSONField(default=dict)  # metrics.PairedComparison.as_json()
    message = models.TextField()
    created_at = models.DateTimeField(db_default=Now())
    acknowledged_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["candidate_run", "metric"], name="regression_once_per_metric"),
        ]

    def __str__(self) -> str:
        return self.message


# --- Online evaluation ----------------------------------------------------------------------------------


class OnlineRule(models.Model):
    """Evaluate a sampled share of an agent's production trajectories, a delay after they end."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="online_rules")
    name = models.CharField(
        max_length=200,
        validators=[RegexValidator(DATASET_NAME_PATTERN, "use letters, digits, '.', '_' and '-'")],
    )
    evaluators = models.ManyToManyField(Evaluator, related_name="online_rules")
    # {"status": "ok"|"error", "tags": [...], "exclude_tags": [...], "tier": "..."}
    filter = models.JSONField(default=dict, blank=True)
    sample_rate = models.FloatField(default=1.0)
    delay_seconds = models.PositiveIntegerField(default=60)
    enabled = models.BooleanField(default=True)
    # Trajectories that ended before this were considered (sampled in or out) by the rule.
    checked_until = models.DateTimeField(null=True, blank=True)
    proposed = models.BooleanField(default=False)
    created_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["workspace", "name"], name="onlinerule_name_unique"),
            models.CheckConstraint(condition=Q(sample_rate__gte=0, sample_rate__lte=1), name="onlinerule_rate_range"),
        ]

    def __str__(self) -> str:
        return self.name


class OnlineEvaluation(models.Model):
    """A trajectory a rule evaluated; at most one per rule and trajectory, so a backfill repeats nothing."""

    rule = models.ForeignKey(OnlineRule, on_delete=models.CASCADE, related_name="evaluations")
    trace_id = models.CharField(max_length=32)
    trajectory_ended_at = models.DateTimeField()
    # [{"evaluator", "version", "score", "passed", "reason", "error"}]
    results = models.JSONField(default=list)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["rule", "trace_id"], name="onlineevaluation_once"),
        ]
        indexes: ClassVar = [models.Index(fields=["rule", "-trajectory_ended_at"], name="onlineevaluation_recent")]

    def __str__(self) -> str:
        return f"{self.rule_id}: {self.trace_id}"
