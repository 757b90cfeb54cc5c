"""Model targets, per-agent router configuration, chains and tools, routing decisions, shadow runs,
hand-offs to people, and the semantic cache.

A `RoutingDecision` is written for every gateway request to an agent, in the request, with the
features the router saw, its estimate per tier and a reason a person can read. Its outcome (cost,
latency, quality) is filled in as it becomes known; past decisions and their outcomes are what the
learned router reads back (nearest requests by embedding, pgvector) to estimate quality per tier.
"""

from __future__ import annotations

from typing import ClassVar

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now
from pgvector.django import HnswIndex, VectorField

from agent_registry.models import Agent, PromptVersion, User, Workspace

# The width of every embedding Keel stores: the offline embedder's, and what provider embeddings are
# projected to (routing/embedding.py), so one HNSW index serves them all.
EMBEDDING_DIMENSIONS = 256


class TierChoice(models.TextChoices):
    SINGLE_CALL = "single_call", "Single call"
    CHAIN = "chain", "Chain"
    AGENTIC = "agentic", "Agentic"
    HUMAN = "human", "Human"


class TargetSource(models.TextChoices):
    API = "api", "API or dashboard"
    ENVIRONMENT = "env", "Environment (KEEL_MODEL_TARGETS)"


class ModelTarget(models.Model):
    """A model Keel can call: a litellm model string, where it is served and how to call it.

    Any OpenAI-compatible server (vLLM, llama.cpp, Ollama) is a target with `api_base`. The key is
    stored encrypted (config/crypto.py) and never shown again. After `failure_threshold` failures in a
    row the target rests for `cooldown_seconds`; its `fallbacks` (other aliases) are tried meanwhile.
    """

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="model_targets")
    alias = models.SlugField(max_length=100)
    model = models.CharField(max_length=300)
    api_base = models.URLField(max_length=500, blank=True)
    api_key_encrypted = models.TextField(blank=True)
    tier = models.CharField(max_length=16, choices=TierChoice.choices, blank=True)
    timeout_seconds = models.FloatField(default=30.0)
    max_retries = models.PositiveSmallIntegerField(default=2)
    fallbacks = ArrayField(models.SlugField(max_length=100), default=list, blank=True)
    failure_threshold = models.PositiveSmallIntegerField(default=3)
    cooldown_seconds = models.PositiveIntegerField(default=30)
    consecutive_failures = models.PositiveIntegerField(default=0)
    cooldown_until = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    source = models.CharField(max_length=8, choices=TargetSource.choices, default=TargetSource.API)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["workspace", "alias"], name="modeltarget_alias_unique"),
            models.CheckConstraint(condition=Q(timeout_seconds__gt=0), name="modeltarget_timeout_positive"),
            models.CheckConstraint(condition=Q(tier__in=["", *TierChoice.values]), name="modeltarget_tier_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.alias} ({self.model})"


class RouterConfig(models.Model):
    """What an agent's router takes beyond its requirements: which targets serve the tiers, rules tried
    before any estimate, the learned estimate's knobs, shadow traffic, the semantic cache, hand-offs.

    `rules` is a list of `{"name", "kind": "pattern" | "intent" | "stakes", "value", "to_tier", "reason"}`
    (routing/router.py says what each kind matches); `intents` maps an intent label to its phrases.
    """

    agent = models.OneToOneField(Agent, on_delete=models.CASCADE, related_name="router_config")
    single_call_target = models.ForeignKey(
        ModelTarget, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    agentic_target = models.ForeignKey(ModelTarget, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    judge_target = models.ForeignKey(ModelTarget, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    embedding_target = models.ForeignKey(
        ModelTarget, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    rules = models.JSONField(default=list, blank=True)
    intents = models.JSONField(default=dict, blank=True)
    neighbours = models.PositiveSmallIntegerField(default=20)
    min_neighbours = models.PositiveSmallIntegerField(default=8)
    cost_weight = models.FloatField(default=0.3)
    latency_weight = models.FloatField(default=0.2)
    risk_weight = models.FloatField(default=0.1)
    shadow_rate = models.FloatField(default=0.0)
    # The single-call tier's model call starts while the learned router decides (routing/speculation.py).
    speculative_single_call = models.BooleanField(default=False)
    cache_enabled = models.BooleanField(default=False)
    cache_threshold = models.FloatField(default=0.93)
    cache_ttl_seconds = models.PositiveIntegerField(default=24 * 3600)
    cache_end_user_requests = models.BooleanField(default=False)
    human_message = models.TextField(
        default="I've passed this to a member of our team, who will get back to you shortly.", blank=True
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints: ClassVar = [
            models.CheckConstraint(
                condition=Q(shadow_rate__gte=0, shadow_rate__lte=1), name="routerconfig_shadow_rate_share"
            ),
            models.CheckConstraint(
                condition=Q(cache_threshold__gt=0, cache_threshold__lte=1), name="routerconfig_cache_threshold_range"
            ),
            models.CheckConstraint(condition=Q(cache_ttl_seconds__gt=0), name="routerconfig_cache_ttl_positive"),
        ]

    def __str__(self) -> str:
        return f"router of {self.agent}"


class ChainStep(models.Model):
    """One step of an agent's chain tier, run in `position` order. The step's system prompt is its prompt
    version (or `instructions`); it sees the request and every earlier step's output; a step with an
    `output_schema` must answer JSON that the schema accepts."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="chain_steps")
    position = models.PositiveSmallIntegerField()
    name = models.SlugField(max_length=64)
    # RESTRICT, not PROTECT: a version a step runs cannot be deleted alone, but it goes with its agent,
    # whose cascade takes the step too.
    prompt_version = models.ForeignKey(
        PromptVersion, null=True, blank=True, on_delete=models.RESTRICT, related_name="chain_steps"
    )
    instructions = models.TextField(blank=True)
    model_target = models.ForeignKey(ModelTarget, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    output_schema = models.JSONField(null=True, blank=True)

    class Meta:
        ordering: ClassVar = ["agent", "position"]
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["agent", "position"], name="chainstep_position_unique"),
            models.UniqueConstraint(fields=["agent", "name"], name="chainstep_name_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.agent} chain step {self.position}: {self.name}"


class AgentTool(models.Model):
    """A tool the agentic tier offers the model (an OpenAI function definition). With `endpoint_url`
    Keel calls the customer's endpoint itself; without it the call goes back to the client, as in the
    standard OpenAI tool flow, and the conversation continues when the client sends the result."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="tools")
    name = models.CharField(max_length=64)
    description = models.TextField(blank=True)
    parameters = models.JSONField(default=dict)
    endpoint_url = models.URLField(max_length=500, blank=True)
    endpoint_secret_encrypted = models.TextField(blank=True)
    timeout_seconds = models.FloatField(default=10.0)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["agent", "name"], name="agenttool_name_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.agent} tool {self.name}"


class DecisionMethod(models.TextChoices):
    RULE = "rule", "Rule"
    ESTIMATE = "estimate", "Learned estimate"
    COLD_START = "cold_start", "Cold start (too few similar requests)"
    DEFAULT = "default", "Default tier"
    CONTINUATION = "continuation", "Continues the conversation's tier"
    SINGLE_LEVEL = "single_level", "Single-level routing"


class OutcomeStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    OK = "ok", "OK"
    ERROR = "error", "Error"


class RoutingDecision(models.Model):
    """Which tier the router chose for one request, why, and (once known) how it went."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="routing_decisions")
    trace_id = models.CharField(max_length=32)
    conversation_id = models.CharField(max_length=200, blank=True)
    request_text = models.TextField()
    embedding = VectorField(dimensions=EMBEDDING_DIMENSIONS, null=True, blank=True)
    features = models.JSONField(default=dict)
    estimates = models.JSONField(default=dict)  # per tier: quality, cost_usd, latency_ms, support, utility
    tier = models.CharField(max_length=16, choices=TierChoice.choices)
    method = models.CharField(max_length=16, choices=DecisionMethod.choices)
    rule = models.CharField(max_length=200, blank=True)
    reason = models.TextField()
    decision_us = models.PositiveIntegerField(default=0)  # time the router took, microseconds
    cache_hit = models.BooleanField(default=False)
    status = models.CharField(max_length=8, choices=OutcomeStatus.choices, default=OutcomeStatus.PENDING)
    latency_ms = models.PositiveIntegerField(null=True, blank=True)
    cost_usd = models.DecimalField(max_digits=14, decimal_places=8, null=True, blank=True)
    quality = models.FloatField(null=True, blank=True)  # 0..1, from scores, a judge or signals
    quality_source = models.CharField(max_length=32, blank=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        indexes: ClassVar = [
            models.Index(fields=["agent", "-created_at"], name="routingdecision_recent"),
            models.Index(fields=["workspace", "trace_id"], name="routingdecision_trace"),
            models.Index(
                fields=["agent", "conversation_id", "-created_at"],
                name="routingdecision_conversation",
                condition=~Q(conversation_id=""),
            ),
            # Only the decisions the router learns from (routing_neighbours' filter): a new decision, whose
            # outcome is not known yet, enters the graph when its quality is set, not with every request,
            # and a search does not walk past the ones it would discard.
            HnswIndex(
                name="routingdecision_embedding",
                fields=["embedding"],
                m=16,
                ef_construction=64,
                opclasses=["vector_cosine_ops"],
                condition=Q(quality__isnull=False, cache_hit=False),
            ),
        ]
        constraints: ClassVar = [
            models.CheckConstraint(condition=Q(tier__in=TierChoice.values), name="routingdecision_tier_valid"),
            models.CheckConstraint(
                condition=Q(quality__isnull=True) | Q(quality__gte=0, quality__lte=1),
                name="routingdecision_quality_range",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.trace_id}: {self.tier} ({self.method})"


class ShadowStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    DONE = "done", "Done"
    FAILED = "failed", "Failed"


class ShadowRun(models.Model):
    """The same request sent through another tier, off the caller's path, and both answers scored, so
    the router's choice can be checked against the alternative."""

    decision = models.ForeignKey(RoutingDecision, on_delete=models.CASCADE, related_name="shadows")
    tier = models.CharField(max_length=16, choices=TierChoice.choices)
    # What the primary request sent (messages with the system prompt, tools, parameters, variables) and
    # answered, so the shadow can run and be judged without reading the primary trajectory back.
    request = models.JSONField(default=dict)
    primary_answer = models.JSONField(default=dict)
    trace_id = models.CharField(max_length=32, blank=True)
    status = models.CharField(max_length=8, choices=ShadowStatus.choices, default=ShadowStatus.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    claimed_at = models.DateTimeField(null=True, blank=True)
    latency_ms = models.PositiveIntegerField(null=True, blank=True)
    cost_usd = models.DecimalField(max_digits=14, decimal_places=8, null=True, blank=True)
    quality = models.FloatField(null=True, blank=True)
    primary_quality = models.FloatField(null=True, blank=True)
    judge_reason = models.TextField(blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(db_default=Now())
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes: ClassVar = [
            models.Index(
                fields=["status", "created_at"],
                name="shadowrun_unfinished",
                condition=Q(status__in=["pending", "running"]),
            ),
        ]
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["decision", "tier"], name="shadowrun_decision_tier_unique"),
        ]

    def __str__(self) -> str:
        return f"shadow {self.tier} of {self.decision_id}"


class HandoffStatus(models.TextChoices):
    OPEN = "open", "Open"
    CLAIMED = "claimed", "Claimed"
    RESOLVED = "resolved", "Resolved"


class Handoff(models.Model):
    """A conversation the router passed to a person (the human tier)."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="handoffs")
    decision = models.OneToOneField(
        RoutingDecision, null=True, blank=True, on_delete=models.SET_NULL, related_name="handoff"
    )
    trace_id = models.CharField(max_length=32)
    conversation_id = models.CharField(max_length=200, blank=True)
    end_user = models.CharField(max_length=200, blank=True)
    reason = models.TextField()
    messages = models.JSONField(default=list)
    status = models.CharField(max_length=10, choices=HandoffStatus.choices, default=HandoffStatus.OPEN)
    assigned_to = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    resolution = models.TextField(blank=True)
    created_at = models.DateTimeField(db_default=Now())
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes: ClassVar = [
            models.Index(fields=["workspace", "status", "-created_at"], name="handoff_queue"),
        ]

    def __str__(self) -> str:
        return f"hand-off {self.pk} ({self.status})"


class CacheEntry(models.Model):
    """A stored answer, found again by a similar request with the same scope: workspace, agent, model
    target, prompt version and the hash of the system prompt. Only the user's request is embedded."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="cache_entries")
    # None: the target was deleted. Such an entry is never served again; it stays, expired, while its hits
    # are reviewable (routing.cache.cache_entries_retire_for_target).
    model_target = models.ForeignKey(
        ModelTarget, null=True, blank=True, on_delete=models.SET_NULL, related_name="cache_entries"
    )
    prompt_version = models.ForeignKey(
        PromptVersion, null=True, blank=True, on_delete=models.CASCADE, related_name="cache_entries"
    )
    system_hash = models.CharField(max_length=64)
    request_text = models.TextField()
    request_hash = models.CharField(max_length=64, blank=True)  # sha256 of request_text: exact repeats
    embedding = VectorField(dimensions=EMBEDDING_DIMENSIONS)
    response = models.JSONField()  # {"message": {...}, "usage": {...}, "model": "..."}
    trace_id = models.CharField(max_length=32)
    hit_count = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(db_default=Now())
    expires_at = models.DateTimeField()

    class Meta:
        indexes: ClassVar = [
            models.Index(fields=["agent", "model_target", "prompt_version", "system_hash"], name="cacheentry_scope"),
            models.Index(fields=["expires_at"], name="cacheentry_expiry"),
            models.Index(fields=["agent", "request_hash"], name="cacheentry_request"),
            HnswIndex(
                name="cacheentry_embedding",
                fields=["embedding"],
                m=16,
                ef_construction=64,
                opclasses=["vector_cosine_ops"],
            ),
        ]

    def __str__(self) -> str:
        return f"cache entry {self.pk} of {self.agent}"


class CacheHit(models.Model):
    """A request answered from the cache, kept beside the entry it matched so a person can judge it."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="cache_hits")
    entry = models.ForeignKey(CacheEntry, on_delete=models.CASCADE, related_name="hits")
    trace_id = models.CharField(max_length=32)
    request_text = models.TextField()
    similarity = models.FloatField()
    false_hit = models.BooleanField(null=True, blank=True)  # None: not reviewed
    reviewed_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    reviewed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        indexes: ClassVar = [
            models.Index(fields=["agent", "-created_at"], name="cachehit_recent"),
        ]

    def __str__(self) -> str:
        return f"cache hit {self.pk} (similarity {self.similarity:.3f})"
