"""Ingest batches, spans, trajectories and scores.

The ingest path writes one `IngestBatch` row (the request body as received) and answers; that row is
the durable record of what Keel acknowledged. A worker turns the batch into `Span` rows, keyed on
their OpenTelemetry ids so that a retried batch inserts nothing twice, and re-assembles the
`Trajectory` of every trace the batch touched from all of that trace's spans (never by adding deltas),
so the order in which spans and batches arrive does not matter.
"""

from __future__ import annotations

from typing import ClassVar, Final

from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.db import models
from django.db.models import F, Q
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
    SPANS = "spans", "Keel's own spans (gateway)"


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
            # Back-pressure reads what the workers stored in the last seconds.
            models.Index(fields=["processed_at"], name="ingestbatch_done", condition=Q(status="done")),
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


UNPRICED_MODELS_KEPT = 20


# `signals` of a trajectory whose user left after an error contains this (tracing.signals' disengagement).
LEFT_AFTER_ERROR_SIGNALS: Final = [{"signal": "disengagement", "kind": "left_after_error"}]


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
    # The sum of what its model calls cost where a price covers them; null when none does and some went
    # unpriced (a self-hosted model litellm and the workspace do not price): not known, not free.
    cost_usd = models.DecimalField(max_digits=16, decimal_places=8, null=True, blank=True, default=0)
    # The model calls no price covered (tracing.steps.unpriced_calls), and the models they named (at most
    # UNPRICED_MODELS_KEPT, to name them where a cost is shown).
    unpriced_call_count = models.PositiveIntegerField(default=0)
    unpriced_models = ArrayField(models.CharField(max_length=300), default=list, blank=True)
    session_id = models.CharField(max_length=500, blank=True)
    user_id = models.CharField(max_length=500, blank=True)
    tags = ArrayField(models.CharField(max_length=200), default=list, blank=True)
    prompt_versions = models.ManyToManyField(PromptVersion, blank=True, related_name="trajectories")
    task_id = models.CharField(max_length=500, blank=True)
    reward = models.FloatField(null=True, blank=True)
    input_preview = models.TextField(blank=True)
    output_preview = models.TextField(blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    # The assembled view (tracing.steps.view_document_json) as JSON text, rebuilt whenever spans arrive, so
    # reading a long trajectory costs one row instead of re-reading and re-mapping all of its spans. Blank
    # for a trajectory of fewer than tracing.services.VIEW_DOCUMENT_MIN_SPANS spans.
    view_document = models.TextField(blank=True)
    # Triage (tracing.signals): the instances found, their names for filtering, the combined score.
    signals = models.JSONField(default=list, blank=True)
    signal_names = ArrayField(models.CharField(max_length=40), default=list, blank=True)
    triage_score = models.FloatField(default=0)
    signal_errors = models.JSONField(default=list, blank=True)
    # A counterfactual replay points at the trajectory it re-ran, and at the step it re-ran from.
    replay_of = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="replays")
    replay_from_step = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints: ClassVar = [
            # Trace id first: ingest's lookup by trace id reaches the trajectory through this index alone
            # (services._TRAJECTORY_IDS); the workspace-first indexes below serve the lists.
            models.UniqueConstraint(fields=["trace_id", "workspace"], name="trajectory_unique_per_workspace"),
            models.CheckConstraint(condition=Q(status__in=TrajectoryStatus.values), name="trajectory_status_valid"),
        ]
        indexes: ClassVar = [
            models.Index(fields=["workspace", "-started_at"], name="trajectory_recent"),
            models.Index(fields=["workspace", "agent", "-started_at"], name="trajectory_agent_recent"),
            models.Index(fields=["workspace", "session_id"], name="trajectory_session"),
            # Only the trajectories whose user left after an error, which are few: ingest looks for them
            # among each batch's sessions (services._LEFT_AFTER_ERROR_CONTINUED). Without it, and without
            # statistics, the planner read the workspace's whole index for that: 1.86 ms per batch on a table
            # of 115,300 trajectories, against 0.14 ms through this one (bench/RESULTS.md, 2026-11-30).
            models.Index(
                fields=["workspace", "session_id"],
                name="trajectory_left_after_error",
                condition=Q(signals__contains=LEFT_AFTER_ERROR_SIGNALS),
            ),
            models.Index(fields=["workspace", "-triage_score"], name="trajectory_triage"),
            GinIndex(fields=["signal_names"], name="trajectory_signal_names"),
        ]

    def __str__(self) -> str:
        return f"trajectory {self.trace_id}"


class Span(models.Model):
    """One OpenTelemetry span in Keel's normalized form (tracing.otlp.Span). Append-only.

    The hottest table: every index costs on every insert, so there is one besides the primary key,
    (workspace, trace_id, span_id), and every read goes through it. The foreign keys carry no index
    and no constraint either (a constraint needs an index on this side to check deletes, and the
    workspace's checked each inserted row at commit: 17 % of the storing backend's time, tracing 0021).
    Spans leave with their trajectory, explicitly, in tracing.services (retention), by (workspace,
    trace_id), and with their workspace through Django's cascade; they are written only for a workspace
    Keel has just read (the ingest key's, a replay's, the gateway agent's). Rows up to 8,160 bytes are
    stored whole, uncompressed (migration 0015): compressing them cost more of PostgreSQL's time than
    storing them.
    """

    workspace = models.ForeignKey(
        Workspace, on_delete=models.CASCADE, related_name="+", db_index=False, db_constraint=False
    )
    trajectory = models.ForeignKey(
        Trajectory, on_delete=models.DO_NOTHING, related_name="+", db_index=False, db_constraint=False
    )
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
    prompt_version = models.ForeignKey(
        PromptVersion, null=True, on_delete=models.DO_NOTHING, related_name="+", db_index=False, db_constraint=False
    )
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
    # The client's own id of the score (a Langfuse client's), so a batch it sends again stores nothing twice.
    external_id = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(
                fields=["workspace", "external_id"], condition=~Q(external_id=""), name="score_external_id_unique"
            ),
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


class PendingScore(models.Model):
    """A score sent for a trace Keel has not stored yet: a Langfuse client sends its scores and its spans
    separately, and the scores may come first. `tracing.services.pending_scores_attach` makes it a Score
    once the trajectory exists; one still waiting after PENDING_SCORE_DAYS is dropped."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    trace_id = models.CharField(max_length=32)
    span_id = models.CharField(max_length=16, blank=True)
    name = models.CharField(max_length=200)
    data_type = models.CharField(max_length=12, choices=ScoreDataType.choices)
    value = models.FloatField(null=True, blank=True)
    string_value = models.TextField(blank=True)
    comment = models.TextField(blank=True)
    created_via_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    external_id = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(
                fields=["workspace", "external_id"],
                condition=~Q(external_id=""),
                name="pendingscore_external_id_unique",
            ),
        ]
        indexes: ClassVar = [models.Index(fields=["workspace", "trace_id"], name="pendingscore_trace")]

    def __str__(self) -> str:
        return f"{self.name} for {self.trace_id} (pending)"


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


class ReplayStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    DONE = "done", "Done"
    STOPPED_DIVERGENCE = "stopped_divergence", "Stopped at a divergence"
    FAILED = "failed", "Failed"


class DivergencePolicy(models.TextChoices):
    """What a replay does when the model calls a tool with arguments the recording never saw."""

    STOP = "stop", "Stop there"
    STUB = "stub", "Serve a stub result and go on"


class Replay(models.Model):
    """A counterfactual re-run of a trajectory from one of its steps, with another prompt version and/or model.

    The row is the unit of work (DESIGN.md, "Where work state lives"): a worker claims it, calls the
    model, serves tool calls from the recording, and stores what happened as a new trajectory whose
    `replay_of` points back at `original`. `trace_id` is fixed at creation, so a retried run writes the
    same trace.
    """

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    original = models.ForeignKey(Trajectory, on_delete=models.CASCADE, related_name="replay_runs")
    # An index into the original's steps (tracing.steps.TrajectoryView.steps); the replay re-makes the
    # first model call at or after it, with everything before it as the recorded history.
    from_step = models.PositiveIntegerField()
    prompt_version = models.ForeignKey(
        PromptVersion, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # A litellm model string; blank replays with the model the original called at that step.
    model = models.CharField(max_length=300, blank=True)
    divergence_policy = models.CharField(max_length=8, choices=DivergencePolicy.choices, default=DivergencePolicy.STOP)
    # The result served for an unmatched tool call under the "stub" policy; null serves a generic stub.
    stub_result = models.JSONField(null=True, blank=True)
    max_steps = models.PositiveSmallIntegerField(default=20)
    status = models.CharField(max_length=20, choices=ReplayStatus.choices, default=ReplayStatus.PENDING)
    # Progress in model calls: done so far, and how many the original made from the same point.
    steps_done = models.PositiveIntegerField(default=0)
    steps_planned = models.PositiveIntegerField(default=0)
    trace_id = models.CharField(max_length=32)
    replay_trajectory = models.ForeignKey(
        Trajectory, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The first tool call with no recorded match: the replay trajectory's step of the model call that
    # asked for it, the tool, and its arguments.
    divergence_step = models.PositiveIntegerField(null=True, blank=True)
    divergence_tool_name = models.CharField(max_length=300, blank=True)
    divergence_arguments = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    created_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_via_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(db_default=Now())
    claimed_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints: ClassVar = [
            models.CheckConstraint(condition=Q(status__in=ReplayStatus.values), name="replay_status_valid"),
            models.CheckConstraint(
                condition=Q(divergence_policy__in=DivergencePolicy.values), name="replay_divergence_policy_valid"
            ),
            models.CheckConstraint(condition=Q(max_steps__gte=1), name="replay_max_steps_positive"),
            models.UniqueConstraint(fields=["workspace", "trace_id"], name="replay_trace_unique_per_workspace"),
        ]
        indexes: ClassVar = [
            models.Index(fields=["original", "-created_at"], name="replay_of_trajectory"),
            # The sweeper reads only unfinished replays.
            models.Index(
                fields=["status", "created_at"],
                name="replay_unfinished",
                condition=Q(status__in=["pending", "running"]),
            ),
        ]

    def __str__(self) -> str:
        return f"replay {self.pk} of {self.original_id} from step {self.from_step} ({self.status})"


class LangfuseMirror(models.Model):
    """A workspace's Langfuse project that receives a copy of every span and score Keel stores.

    The secret key is stored encrypted (config/crypto.py) and never shown again. The status fields
    are what the dashboard and the API show: when the last delivery succeeded, the last error.
    """

    workspace = models.OneToOneField(Workspace, on_delete=models.CASCADE, related_name="langfuse_mirror")
    host = models.URLField(max_length=500)
    public_key = models.CharField(max_length=200)
    secret_key_encrypted = models.TextField()
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(auto_now=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    last_error_at = models.DateTimeField(null=True, blank=True)
    delivered_spans = models.PositiveBigIntegerField(default=0)
    delivered_scores = models.PositiveBigIntegerField(default=0)

    def __str__(self) -> str:
        return f"Langfuse mirror of {self.workspace} to {self.host}"


class ExportKind(models.TextChoices):
    SPANS = "spans", "Spans"
    SCORE = "score", "Score"


class ExportStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    SENDING = "sending", "Sending"
    DONE = "done", "Done"
    FAILED = "failed", "Failed"


class LangfuseExport(models.Model):
    """One delivery to the Langfuse mirror (an outbox row): written with the spans or score it carries,
    sent by a worker, retried with backoff, failed for good only after many attempts."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=8, choices=ExportKind.choices)
    payload = models.TextField(blank=True)  # the encoded spans (tracing.langfuse_encode), as JSON
    score = models.ForeignKey(Score, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    item_count = models.PositiveIntegerField(default=1)
    status = models.CharField(max_length=8, choices=ExportStatus.choices, default=ExportStatus.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    next_attempt_at = models.DateTimeField(db_default=Now())
    claimed_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(db_default=Now())
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes: ClassVar = [
            models.Index(
                fields=["next_attempt_at"],
                name="langfuse_export_due",
                condition=Q(status__in=["pending", "sending"]),
            ),
        ]
        constraints: ClassVar = [
            models.CheckConstraint(condition=Q(status__in=ExportStatus.values), name="langfuse_export_status_valid"),
            models.CheckConstraint(
                condition=Q(kind="spans") | (Q(kind="score") & Q(score__isnull=False)),
                name="langfuse_export_carries_its_kind",
            ),
        ]

    def __str__(self) -> str:
        return f"Langfuse export {self.pk} ({self.kind}, {self.status})"


# --- Triage settings, review samples, alerts (tracing.triage, tracing.alerts) ---------------------------


class TriageSettings(models.Model):
    """What a team changed from the default triage setup of one agent (tracing.triage_config merges it
    over tracing.signals' defaults), and how much of its traffic is drawn for review each day."""

    agent = models.OneToOneField(Agent, on_delete=models.CASCADE, related_name="triage_settings")
    language = models.CharField(max_length=16, default="en")
    # {language: {list name: {"mode": "extend" | "replace", "phrases": [...]}}}
    phrases = models.JSONField(default=dict, blank=True)
    weights = models.JSONField(default=dict, blank=True)  # signal -> weight in [-1, 1]
    thresholds = models.JSONField(default=dict, blank=True)  # tracing.triage_config.EXPOSED_THRESHOLDS
    limits = models.JSONField(default=dict, blank=True)  # tracing.triage_config.LIMITS
    handoff_tools = ArrayField(models.CharField(max_length=300), default=list, blank=True)
    # The daily review draw: this many trajectories of the last day per strategy (0: none).
    review_budget_per_day = models.PositiveIntegerField(default=0)
    review_strategies = ArrayField(models.CharField(max_length=20), default=list, blank=True)
    updated_at = models.DateTimeField(db_default=Now())
    updated_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    def __str__(self) -> str:
        return f"triage settings of {self.agent}"


class ToolResultShape(models.Model):
    """How often an agent's tool returned a result of one shape (`tracing.signals.tool_result_shape`):
    the history `silent_tool_api_change` compares new results with. Ingest adds to `count` as tool
    results arrive (tracing.services.spans_write); only successful, non-empty results are counted."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="tool_result_shapes")
    tool_name = models.CharField(max_length=300)
    # SHA-256 of the shape's canonical JSON: a shape can have thousands of keys, too long for a btree key.
    shape_key = models.CharField(max_length=64)
    shape = models.JSONField()  # key path -> JSON type name
    count = models.PositiveBigIntegerField()
    first_seen = models.DateTimeField(db_default=Now())
    last_seen = models.DateTimeField(db_default=Now())

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(
                fields=["agent", "tool_name", "shape_key"], name="tool_result_shape_unique_per_agent_tool"
            ),
            models.CheckConstraint(condition=Q(count__gte=1), name="tool_result_shape_count_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.tool_name} result shape {self.shape_key[:8]} ({self.count})"


class ReviewStrategy(models.TextChoices):
    SIGNAL = "signal", "Signal-based"
    RANDOM = "random", "Random"
    LENGTH = "length", "Length-based"
    STRATIFIED_AGENT = "stratified_agent", "Stratified by agent"
    STRATIFIED_SCORE = "stratified_score", "Stratified by triage score"


class ReviewSampleSource(models.TextChoices):
    MANUAL = "manual", "Drawn by a person"
    DAILY = "daily", "Daily draw"


class ReviewSample(models.Model):
    """A review queue: trajectories of a time window drawn by one strategy, reviewed in order.

    A sample's queue is its workspace, agent (none: every agent) and strategy: a trajectory already
    drawn into an earlier sample of the same queue is not drawn again unless `allow_repeats`.
    """

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    agent = models.ForeignKey(Agent, null=True, blank=True, on_delete=models.CASCADE, related_name="review_samples")
    strategy = models.CharField(max_length=20, choices=ReviewStrategy.choices)
    source = models.CharField(max_length=8, choices=ReviewSampleSource.choices, default=ReviewSampleSource.MANUAL)
    window_start = models.DateTimeField()
    window_end = models.DateTimeField()
    budget = models.PositiveIntegerField()
    seed = models.CharField(max_length=64)
    allow_repeats = models.BooleanField(default=False)
    created_at = models.DateTimeField(db_default=Now())
    created_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_via_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        constraints: ClassVar = [
            models.CheckConstraint(
                condition=Q(strategy__in=ReviewStrategy.values), name="review_sample_strategy_valid"
            ),
            models.CheckConstraint(
                condition=Q(source__in=ReviewSampleSource.values), name="review_sample_source_valid"
            ),
            models.CheckConstraint(condition=Q(window_end__gt=F("window_start")), name="review_sample_window_valid"),
            models.CheckConstraint(condition=Q(budget__gte=1), name="review_sample_budget_positive"),
            # Several beat or worker processes may run the daily draw: only one sample per day and queue.
            models.UniqueConstraint(
                fields=["agent", "strategy", "window_start"],
                condition=Q(source="daily"),
                name="review_sample_daily_once",
            ),
        ]
        indexes: ClassVar = [models.Index(fields=["workspace", "-created_at"], name="review_sample_recent")]

    def __str__(self) -> str:
        return f"review sample {self.pk} ({self.strategy}, {self.budget})"


class ReviewItemStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    REVIEWED = "reviewed", "Reviewed"
    SKIPPED = "skipped", "Skipped"


class ReviewItem(models.Model):
    """One trajectory of a review sample, and the reviewer's decision about it."""

    sample = models.ForeignKey(ReviewSample, on_delete=models.CASCADE, related_name="items")
    trajectory = models.ForeignKey(Trajectory, on_delete=models.CASCADE, related_name="review_items")
    position = models.PositiveIntegerField()
    # What triage said when the trajectory was drawn (it may be recomputed later).
    triage_score = models.FloatField(default=0)
    signal_names = ArrayField(models.CharField(max_length=40), default=list, blank=True)
    status = models.CharField(max_length=8, choices=ReviewItemStatus.choices, default=ReviewItemStatus.PENDING)
    informative = models.BooleanField(null=True, blank=True)
    failure_mode = models.CharField(max_length=40, blank=True)  # tracing.sampling.FAILURE_MODES
    note = models.TextField(blank=True)
    reviewer = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    reviewed_via_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    reviewed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["sample", "trajectory"], name="review_item_once_per_sample"),
            models.UniqueConstraint(fields=["sample", "position"], name="review_item_position_unique"),
            models.CheckConstraint(condition=Q(status__in=ReviewItemStatus.values), name="review_item_status_valid"),
            # A reviewed item says whether it was informative; a pending one says nothing yet.
            models.CheckConstraint(
                condition=(Q(status="reviewed") & Q(informative__isnull=False))
                | (Q(status="pending") & Q(informative__isnull=True))
                | Q(status="skipped"),
                name="review_item_decision_matches_status",
            ),
        ]
        indexes: ClassVar = [models.Index(fields=["sample", "status", "position"], name="review_item_queue")]

    def __str__(self) -> str:
        return f"review item {self.position} of sample {self.sample_id} ({self.status})"


class AlertSeverity(models.TextChoices):
    INFO = "info", "Info"
    WARNING = "warning", "Warning"
    PAGE = "page", "Page"


# What an alert rule watches besides a signal name: trajectories that ended in error.
ERROR_STATUS_SIGNAL = "error_status"


class AlertDirection(models.TextChoices):
    """Which side of the threshold fires: a problem signal rising above it, or a good one (satisfaction)
    dropping below it."""

    ABOVE = "above", "Above"
    BELOW = "below", "Below"


class AlertRule(models.Model):
    """Fire when the share of an agent's trajectories with a signal (or an error status) passes a
    threshold over a window, with at least `min_trajectories` in it; then stay quiet for the cooldown.

    `last_fired_at` is how evaluators agree: a firing is claimed by a conditional UPDATE on it, so
    several beat or worker processes evaluating at once fire a rule once.
    """

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="alert_rules")
    name = models.CharField(max_length=200)
    signal = models.CharField(max_length=40)  # a tracing.signals name, or ERROR_STATUS_SIGNAL
    # A share: fire when the rate is above it ([0, 1)) or, for `below`, under it ((0, 1]).
    threshold = models.FloatField()
    direction = models.CharField(max_length=5, choices=AlertDirection.choices, default=AlertDirection.ABOVE)
    window_minutes = models.PositiveIntegerField(default=60)
    min_trajectories = models.PositiveIntegerField(default=20)
    severity = models.CharField(max_length=8, choices=AlertSeverity.choices, default=AlertSeverity.WARNING)
    cooldown_minutes = models.PositiveIntegerField(default=60)
    enabled = models.BooleanField(default=True)
    email_to = ArrayField(models.EmailField(), default=list, blank=True)
    webhook_url = models.URLField(max_length=500, blank=True)
    webhook_secret_encrypted = models.TextField(blank=True)
    last_fired_at = models.DateTimeField(null=True, blank=True)
    last_evaluated_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    created_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        constraints: ClassVar = [
            models.CheckConstraint(condition=Q(severity__in=AlertSeverity.values), name="alert_rule_severity_valid"),
            models.CheckConstraint(condition=Q(direction__in=AlertDirection.values), name="alert_rule_direction_valid"),
            # A threshold either side can be crossed: above 100% or below 0% never fires.
            models.CheckConstraint(
                condition=(Q(direction=AlertDirection.ABOVE) & Q(threshold__gte=0) & Q(threshold__lt=1))
                | (Q(direction=AlertDirection.BELOW) & Q(threshold__gt=0) & Q(threshold__lte=1)),
                name="alert_rule_threshold_share",
            ),
            models.CheckConstraint(condition=Q(window_minutes__gte=1), name="alert_rule_window_positive"),
            models.CheckConstraint(condition=Q(cooldown_minutes__gte=1), name="alert_rule_cooldown_positive"),
            models.CheckConstraint(condition=Q(min_trajectories__gte=1), name="alert_rule_min_positive"),
            # A webhook is signed: no URL without a secret.
            models.CheckConstraint(
                condition=Q(webhook_url="") | ~Q(webhook_secret_encrypted=""), name="alert_rule_webhook_signed"
            ),
        ]
        indexes: ClassVar = [models.Index(fields=["enabled"], name="alert_rule_enabled")]

    def __str__(self) -> str:
        sign = "<" if self.direction == AlertDirection.BELOW else ">"
        return f"{self.name} ({self.signal} {sign} {self.threshold:.1%} over {self.window_minutes} min)"


class Alert(models.Model):
    """One firing of a rule: what was observed, over which window, and the trajectories behind it."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    rule = models.ForeignKey(AlertRule, on_delete=models.CASCADE, related_name="alerts")
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="+")
    signal = models.CharField(max_length=40)
    severity = models.CharField(max_length=8, choices=AlertSeverity.choices)
    threshold = models.FloatField()
    direction = models.CharField(max_length=5, choices=AlertDirection.choices, default=AlertDirection.ABOVE)
    fired_at = models.DateTimeField()
    window_start = models.DateTimeField()
    window_end = models.DateTimeField()
    observed_rate = models.FloatField()
    matching_count = models.PositiveIntegerField()
    trajectory_count = models.PositiveIntegerField()
    # The newest trajectories behind the alert (all of them are the list filtered by agent, signal, window).
    trace_ids = ArrayField(models.CharField(max_length=32), default=list, blank=True)
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    acknowledged_via_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        constraints: ClassVar = [
            models.CheckConstraint(condition=Q(severity__in=AlertSeverity.values), name="alert_severity_valid"),
            models.CheckConstraint(condition=Q(direction__in=AlertDirection.values), name="alert_direction_valid"),
        ]
        indexes: ClassVar = [
            models.Index(fields=["workspace", "-fired_at"], name="alert_recent"),
            models.Index(fields=["workspace"], name="alert_unacknowledged", condition=Q(acknowledged_at__isnull=True)),
        ]

    def __str__(self) -> str:
        return f"alert {self.pk}: {self.signal} at {self.observed_rate:.1%}"


class AlertChannel(models.TextChoices):
    DASHBOARD = "dashboard", "Dashboard"
    EMAIL = "email", "Email"
    WEBHOOK = "webhook", "Webhook"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    SENDING = "sending", "Sending"
    DONE = "done", "Delivered"
    FAILED = "failed", "Failed"


class AlertDelivery(models.Model):
    """One channel's delivery of an alert (an outbox row, written with the alert): sent by a worker,
    retried with backoff, failed for good only after many attempts, its last error kept."""

    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="deliveries")
    channel = models.CharField(max_length=10, choices=AlertChannel.choices)
    status = models.CharField(max_length=8, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    next_attempt_at = models.DateTimeField(db_default=Now())
    claimed_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["alert", "channel"], name="alert_delivery_once_per_channel"),
            models.CheckConstraint(condition=Q(channel__in=AlertChannel.values), name="alert_delivery_channel_valid"),
            models.CheckConstraint(condition=Q(status__in=DeliveryStatus.values), name="alert_delivery_status_valid"),
        ]
        indexes: ClassVar = [
            models.Index(
                fields=["next_attempt_at"],
                name="alert_delivery_due",
                condition=Q(status__in=["pending", "sending"]),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.channel} delivery of alert {self.alert_id} ({self.status})"
