"""Request and response shapes of routing's management API. No response carries a secret: a target
says whether it has a key (`has_api_key`), a tool whether it has an endpoint secret."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from ninja import Field, Schema

from config.schemas import PatchSchema

Tier = Literal["single_call", "chain", "agentic", "human"]
TargetTier = Literal["", "single_call", "chain", "agentic", "human"]
Method = Literal["rule", "estimate", "cold_start", "default", "continuation", "single_level"]

# --- Model targets ----------------------------------------------------------------------------------


class ModelTargetIn(Schema):
    alias: str = Field(
        min_length=1, max_length=100, description="the name agents and `model` use, unique in the workspace"
    )
    model: str = Field(min_length=1, max_length=300, description="a litellm model string, e.g. openai/gpt-4o-mini")
    api_base: str = Field("", max_length=500, description="an OpenAI-compatible server (vLLM, llama.cpp, Ollama)")
    api_key: str | None = Field(None, max_length=2000, description="stored encrypted and never returned")
    tier: TargetTier = ""
    timeout_seconds: float = 30.0
    max_retries: int = 2
    fallbacks: list[str] = Field(default_factory=list, description="aliases tried, in order, when this target fails")
    failure_threshold: int = 3
    cooldown_seconds: int = 30
    enabled: bool = True


class ModelTargetPatch(PatchSchema):
    model: str | None = Field(None, min_length=1, max_length=300)
    api_base: str | None = Field(None, max_length=500)
    api_key: str | None = Field(None, max_length=2000, description='"" removes the stored key; absent keeps it')
    tier: TargetTier | None = None
    timeout_seconds: float | None = None
    max_retries: int | None = None
    fallbacks: list[str] | None = None
    failure_threshold: int | None = None
    cooldown_seconds: int | None = None
    enabled: bool | None = None


class TargetHealthOut(Schema):
    state: Literal["ok", "failing", "cooling_down", "disabled"]
    consecutive_failures: int
    cooldown_until: datetime | None
    last_error: str


class ModelTargetOut(Schema):
    alias: str
    model: str
    api_base: str
    has_api_key: bool
    tier: str
    timeout_seconds: float
    max_retries: int
    fallbacks: list[str]
    failure_threshold: int
    cooldown_seconds: int
    enabled: bool
    source: Literal["api", "env"]
    health: TargetHealthOut
    created_at: datetime
    updated_at: datetime


# --- Router configuration ---------------------------------------------------------------------------


class RuleSchema(Schema):
    name: str = Field(min_length=1, max_length=200)
    kind: str = Field(description="pattern, intent or stakes (routing/router.py)")
    value: str
    to_tier: Tier
    reason: str = ""


class RouterConfigIn(Schema):
    """Fields left out keep their value; a target set to null (or "") is cleared."""

    single_call_target: str | None = Field(None, description="model target alias")
    agentic_target: str | None = None
    judge_target: str | None = None
    embedding_target: str | None = None
    rules: list[RuleSchema] | None = None
    intents: dict[str, list[str]] | None = None
    neighbours: int | None = None
    min_neighbours: int | None = None
    cost_weight: float | None = None
    latency_weight: float | None = None
    risk_weight: float | None = None
    shadow_rate: float | None = Field(None, description="share of requests also run through another tier, 0..1")
    speculative_single_call: bool | None = Field(
        None,
        description="start the single-call tier's model call while the learned router decides; its answer is "
        "used when the router chooses the single call, and paid for but not used when it does not",
    )
    cache_enabled: bool | None = None
    cache_threshold: float | None = Field(None, description="cosine similarity a cached request must reach")
    cache_ttl_seconds: int | None = None
    cache_end_user_requests: bool | None = None
    human_message: str | None = None


class RouterConfigOut(Schema):
    agent: str
    single_call_target: str | None
    agentic_target: str | None
    judge_target: str | None
    embedding_target: str | None
    rules: list[dict[str, Any]]
    intents: dict[str, list[str]]
    neighbours: int
    min_neighbours: int
    cost_weight: float
    latency_weight: float
    risk_weight: float
    shadow_rate: float
    speculative_single_call: bool
    cache_enabled: bool
    cache_threshold: float
    cache_ttl_seconds: int
    cache_end_user_requests: bool
    human_message: str
    updated_at: datetime | None


# --- Chain and tools ------------------------------------------------------------------------------------


class ChainStepIn(Schema):
    name: str
    prompt: str | None = Field(
        None, description='a version of one of the agent\'s prompts as "<name>:<version>", as the chain is read back'
    )
    prompt_version: int | None = Field(None, description="the same by id; give prompt or prompt_version")
    instructions: str = ""
    model_target: str | None = Field(None, description="alias; none uses the agent's single-call target")
    output_schema: dict[str, Any] | None = None


class ChainIn(Schema):
    steps: list[ChainStepIn]


class ChainStepOut(Schema):
    position: int
    name: str
    prompt_version: int | None
    prompt: str | None = Field(description="name:version of the prompt version")
    instructions: str
    model_target: str | None
    output_schema: dict[str, Any] | None


class ChainOut(Schema):
    agent: str
    steps: list[ChainStepOut]


class AgentToolIn(Schema):
    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=dict, description="JSON Schema of the arguments (an object)")
    endpoint_url: str = ""
    endpoint_secret: str | None = Field(None, max_length=2000, description="stored encrypted and never returned")
    timeout_seconds: float = 10.0


class AgentToolPatch(PatchSchema):
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    endpoint_url: str | None = None
    endpoint_secret: str | None = Field(None, max_length=2000, description='"" removes the secret; absent keeps it')
    timeout_seconds: float | None = None


class AgentToolOut(Schema):
    name: str
    description: str
    parameters: dict[str, Any]
    endpoint_url: str
    has_endpoint_secret: bool
    timeout_seconds: float


# --- Decisions, hand-offs, the report -------------------------------------------------------------------


class RoutingDecisionListQuery(Schema):
    agent: str | None = None
    tier: Tier | None = None
    method: Method | None = None
    since: datetime | None = None
    until: datetime | None = None
    limit: int = Field(50, ge=1, le=200)
    cursor: str | None = None


class RoutingDecisionOut(Schema):
    id: int
    agent: str
    trace_id: str
    conversation_id: str
    request_text: str
    tier: str
    method: str
    rule: str
    reason: str
    decision_us: int
    cache_hit: bool
    status: str
    latency_ms: int | None
    cost_usd: float | None
    quality: float | None
    quality_source: str
    created_at: datetime
    trajectory_url: str


class RoutingDecisionPageOut(Schema):
    items: list[RoutingDecisionOut]
    next_cursor: str | None


class ShadowRunOut(Schema):
    tier: str
    trace_id: str
    status: str
    latency_ms: int | None
    cost_usd: float | None
    quality: float | None
    primary_quality: float | None
    judge_reason: str
    error: str
    created_at: datetime
    finished_at: datetime | None
    trajectory_url: str | None


class RoutingDecisionDetailOut(RoutingDecisionOut):
    features: dict[str, Any]
    estimates: dict[str, Any]
    shadows: list[ShadowRunOut]


class HandoffOut(Schema):
    id: int
    agent: str
    trace_id: str
    conversation_id: str
    end_user: str
    reason: str
    messages: list[Any]
    status: str
    assigned_to: str | None
    resolution: str
    created_at: datetime
    resolved_at: datetime | None
    decision_id: int | None
    trajectory_url: str


class HandoffListQuery(Schema):
    status: Literal["open", "claimed", "resolved"] | None = None
    limit: int = Field(100, ge=1, le=500)


class HandoffResolveIn(Schema):
    resolution: str = Field(min_length=1, max_length=10_000)


class RouterReportQuery(Schema):
    days: int = Field(7, ge=1, le=90)
