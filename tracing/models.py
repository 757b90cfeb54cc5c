"""Ingest batches, spans, trajectories and scores.

The ingest path writes one `IngestBatch` row (the request body as received) and answers; that row is
the durable record of what Keel acknowledged. A worker turns the batch into `Span` rows, keyed on
their OpenTelemetry ids so that a retried batch inserts nothing twice, and re-assembles the
`Trajectory` of every trace the batch touched from all of that trace's spans (never by adding deltas),
so the order in which spans and batches arrive does not matter.
"""

from __future__ import annotations

from typing import ClassVar

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from agent_registry.models import Agent, ApiKey, PromptVersion, User, Workspace


class BatchStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    PROCESSING = "processing", "Processing"
    DONE = "done", "Done"
    FAILED = "failed", "Failed"


class BatchSource(models.TextChoices):
    OTLP = "otlp", "OTLP/HTTP"
    JSON = "json", "JSON trajectory"


class IngestBatch(models.Model):
    """What an ingest request delivered, stored before the request is answered."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    api_key = models.ForeignKey(ApiKey, null=True, on_delete=models.SET_NULL, related_name="+")
    source = models.CharField(max_length=8, choices=BatchSource.choices)
    content_type = models.CharField(max_length=100)
    content_encoding = models.CharField(max_length=20, blank=True)
    body = models.BinaryField()
    span_count = models.PositiveIntegerField()
    status = models.CharField(max_length=12, choices=BatchStatus.choices, default=BatchStatus.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    received_at = models.DateTimeField(db_default=Now())
    claimed_at = models.DateTimeField(null=True)
    processed_at = models.DateTimeField(null=True)
    error = models.TextField(blank=True)

    class Meta:
        indexes: ClassVar = [
            # The sweeper and the back-pressure check read only unfinished batches.
            models.Index(
                fields=["status", "received_at"],
                name="ingestbatch_unfinished",
                condition=Q(status__in=["pending", "processing"]),
            ),
        ]
        constraints: ClassVar = [
            models.CheckConstraint(condition=Q(status__in=BatchStatus.values), name="ingestbatch_status_valid"),
        ]

    def __str__(self) -> str:
        return f"batch {self.pk} ({self.span_count} spans, {self.status})"


class TrajectoryStatus(models.TextChoices):
    OK = "ok", "OK"
    ERROR = "error", "Error"
    RUNNING = "running", "Running"


class Trajectory(models.Model):
    """One trace read as a trajectory: totals and labels rolled up from its spans."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="trajectories")
    agent = models.ForeignKey(Agent, null=True, blank=True, on_delete=models.SET_NULL, related_name="trajectories")
    trace_id = models.CharField(max_length=32)
    name = models.CharField(max_length=500, blank=True)
    status = models.CharField(max_length=8, choices=TrajectoryStatus.choices, default=TrajectoryStatus.RUNNING)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField()
    latency_ms = models.FloatField(default=0)
    span_count = models.PositiveIntegerField(default=0)
    step_count = models.PositiveIntegerField(default=0)
    llm_call_count = models.PositiveIntegerField(default=0)
    tool_call_count = models.PositiveIntegerField(default=0)
    error_count = models.PositiveIntegerField(default=0)
    input_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)
    total_tokens = models.BigIntegerField(default=0)
    cost_usd = models.DecimalField(max_digits=16, decimal_places=8, default=0)
    session_id = models.CharField(max_length=500, blank=True)
    user_id = models.CharField(max_length=500, blank=True)
    tags = ArrayField(models.CharField(max_length=200), default=list, blank=True)
    prompt_versions = models.ManyToManyField(PromptVersion, blank=True, related_name="trajectories")
    task_id = models.CharField(max_length=500, blank=True)
    reward = models.FloatField(null=True, blank=True)
    input_preview = models.TextField(blank=True)
    output_preview = models.TextField(blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    # A counterfactual replay points at the trajectory it re-ran, and at the step it re-ran from.
    replay_of = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="replays")
    replay_from_step = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["workspace", "trace_id"], name="trajectory_unique_per_workspace"),
            models.CheckConstraint(condition=Q(status__in=TrajectoryStatus.values), name="trajectory_status_valid"),
        ]
        indexes: ClassVar = [
            models.Index(fields=["workspace", "-started_at"], name="trajectory_recent"),
            models.Index(fields=["workspace", "agent", "-started_at"], name="trajectory_agent_recent"),
            models.Index(fields=["workspace", "session_id"], name="trajectory_session"),
        ]

    def __str__(self) -> str:
        return f"trajectory {self.trace_id}"


class Span(models.Model):
    """One OpenTelemetry span in Keel's normalized form (tracing.otlp.Span). Append-only."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    trajectory = models.ForeignKey(Trajectory, on_delete=models.CASCADE, related_name="spans")
    trace_id = models.CharField(max_length=32)
    span_id = models.CharField(max_length=16)
    parent_span_id = models.CharField(max_length=16, blank=True)
    name = models.CharField(max_length=1000)
    kind = models.CharField(max_length=16)
    span_type = models.CharField(max_length=16)
    status = models.CharField(max_length=8)
    status_message = models.TextField(blank=True)
    start_time_ns = models.BigIntegerField()
    end_time_ns = models.BigIntegerField()
    model = models.CharField(max_length=300, blank=True)
    tool_name = models.CharField(max_length=300, blank=True)
    input_tokens = models.IntegerField(null=True)
    output_tokens = models.IntegerField(null=True)
    total_tokens = models.IntegerField(null=True)
    cost_usd = models.DecimalField(max_digits=16, decimal_places=8, null=True)
    prompt_version = models.ForeignKey(PromptVersion, null=True, on_delete=models.SET_NULL, related_name="+")
    # Everything else of the normalized span (input, output, tool call, events, attributes, ...) as JSON
    # text: read and written whole, never queried inside, so text skips jsonb's parse on every insert.
    data = models.TextField()
    received_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["workspace", "trace_id", "span_id"], name="span_unique_per_trace"),
        ]

    def __str__(self) -> str:
        return f"span {self.span_id} of {self.trace_id}"


class ScoreDataType(models.TextChoices):
    NUMERIC = "numeric", "Numeric"
    BOOLEAN = "boolean", "Boolean"
    CATEGORICAL = "categorical", "Categorical"
    CORRECTION = "correction", "Correction"


class ScoreSource(models.TextChoices):
    API = "api", "API"
    HUMAN = "human", "Human"
    EVALUATOR = "evaluator", "Evaluator"


class Score(models.Model):
    """A judgement of a trajectory or one of its steps: a number, a yes/no, a category, or a corrected output."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    trajectory = models.ForeignKey(Trajectory, on_delete=models.CASCADE, related_name="scores")
    span_id = models.CharField(max_length=16, blank=True)
    name = models.CharField(max_length=200)
    data_type = models.CharField(max_length=12, choices=ScoreDataType.choices)
    value = models.FloatField(null=True, blank=True)
    string_value = models.TextField(blank=True)
    source = models.CharField(max_length=12, choices=ScoreSource.choices)
    comment = models.TextField(blank=True)
    created_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_via_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints: ClassVar = [
            models.CheckConstraint(condition=Q(data_type__in=ScoreDataType.values), name="score_data_type_valid"),
            models.CheckConstraint(condition=Q(source__in=ScoreSource.values), name="score_source_valid"),
            # Numbers and booleans carry a value; categories and corrections carry text.
            models.CheckConstraint(
                condition=(Q(data_type__in=["numeric", "boolean"]) & Q(value__isnull=False))
                | (Q(data_type__in=["categorical", "correction"]) & ~Q(string_value="")),
                name="score_value_matches_type",
            ),
        ]
        indexes: ClassVar = [models.Index(fields=["workspace", "name"], name="score_name")]

    def __str__(self) -> str:
        return f"{self.name}={self.value if self.value is not None else self.string_value}"


class ModelPriceOverride(models.Model):
    """A workspace's own price for a model (a negotiated rate, a self-hosted model); wins over litellm's."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    model = models.CharField(max_length=300)
    input_usd_per_million = models.DecimalField(max_digits=12, decimal_places=6)
    output_usd_per_million = models.DecimalField(max_digits=12, decimal_places=6)
    cache_read_usd_per_million = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["workspace", "model"], name="model_price_unique_per_workspace"),
            models.CheckConstraint(
                condition=Q(input_usd_per_million__gte=0) & Q(output_usd_per_million__gte=0),
                name="model_price_not_negative",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.model}: ${self.input_usd_per_million}/${self.output_usd_per_million} per 1M tokens"
