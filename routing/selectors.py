"""Reads of the gateway's data plane, always scoped to a workspace (or an agent already scoped to one)."""

from __future__ import annotations

from functools import lru_cache

from django.db import connection, transaction
from pgvector.django import CosineDistance

from agent_registry import requirements
from agent_registry.models import Agent, ApiKey, PromptVersion, RequirementsVersion, Workspace
from agent_registry.selectors import apikey_agent_ids
from config.errors import NotFound
from routing import router
from routing.models import CacheEntry, ModelTarget, RouterConfig, RoutingDecision


class ModelNotFound(NotFound):
    code = "model_not_found"


def gateway_agent_get(*, api_key: ApiKey, slug: str) -> Agent:
    """The agent a key may call through the gateway (its workspace, within the key's agents)."""
    allowed = apikey_agent_ids(api_key=api_key)
    agent = Agent.objects.filter(workspace_id=api_key.workspace_id, slug=slug).first()
    if agent is None or (allowed is not None and agent.pk not in allowed):
        raise ModelNotFound(f"there is no agent {slug!r} this key may call (model 'agent/{slug}')")
    return agent


def gateway_target_get(*, workspace: Workspace, alias: str) -> ModelTarget:
    target = ModelTarget.objects.filter(workspace=workspace, alias=alias, enabled=True).first()
    if target is None:
        raise ModelNotFound(f"there is no model target {alias!r}; call an agent as 'agent/<slug>' or a target alias")
    return target


def gateway_models(*, api_key: ApiKey) -> tuple[list[Agent], list[ModelTarget]]:
    """What `/v1/models` lists for a key: its agents, and the workspace's enabled targets (a key limited
    to agents may call only those agents)."""
    allowed = apikey_agent_ids(api_key=api_key)
    agents = Agent.objects.filter(workspace_id=api_key.workspace_id).order_by("slug")
    if allowed is not None:
        return list(agents.filter(pk__in=allowed)), []
    return list(agents), list(
        ModelTarget.objects.filter(workspace_id=api_key.workspace_id, enabled=True).order_by("alias")
    )


def router_config_find(*, agent: Agent) -> RouterConfig | None:
    return (
        RouterConfig.objects.select_related("single_call_target", "agentic_target", "judge_target", "embedding_target")
        .filter(agent=agent)
        .first()
    )


def production_prompt_version(*, agent: Agent) -> PromptVersion | None:
    """The prompt version the gateway applies: the production version of the agent's `<slug>/system`
    prompt, else of its first prompt (by name) that has a production label."""
    versions = PromptVersion.objects.select_related("prompt").filter(prompt__agent=agent, labels__name="production")
    preferred = versions.filter(prompt__name=f"{agent.slug}/system").first()
    return preferred or versions.order_by("prompt__name").first()


@lru_cache(maxsize=512)
def _requirements(version_id: int) -> requirements.Requirements | None:
    # Requirements versions are immutable, so their parsed answers (and what they derive) can be kept
    # per process: the gateway reads them on every request.
    answers = RequirementsVersion.objects.filter(pk=version_id).values_list("answers", flat=True).first()
    return None if answers is None else requirements.Requirements.model_validate(answers)


@lru_cache(maxsize=512)
def _derived(version_id: int) -> requirements.DerivedConfiguration | None:
    answers = _requirements(version_id)
    return None if answers is None else requirements.derived_configuration(answers)


def derived_configuration(*, agent: Agent) -> requirements.DerivedConfiguration | None:
    if agent.current_requirements_id is None:
        return None
    return _derived(agent.current_requirements_id)


def requirements_of(*, agent: Agent) -> requirements.Requirements | None:
    if agent.current_requirements_id is None:
        return None
    return _requirements(agent.current_requirements_id)


def routing_neighbours(*, agent: Agent, embedding: list[float], limit: int) -> list[router.Neighbour]:
    """The agent's past requests nearest to this one whose outcome is known (cache hits aside)."""
    with transaction.atomic(), connection.cursor() as cursor:
        # An HNSW scan with a filter can end early; let pgvector keep scanning until enough rows pass.
        cursor.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
        rows = list(
            RoutingDecision.objects.filter(agent=agent, quality__isnull=False, cache_hit=False, embedding__isnull=False)
            .annotate(distance=CosineDistance("embedding", embedding))
            .order_by("distance")
            .values_list("distance", "tier", "quality", "cost_usd", "latency_ms")[:limit]
        )
    return [
        router.Neighbour(
            similarity=max(0.0, 1.0 - float(distance)),
            tier=tier,
            quality=quality,
            cost_usd=None if cost is None else float(cost),
            latency_ms=None if latency is None else float(latency),
        )
        for distance, tier, quality, cost, latency in rows
    ]


def conversation_tier(*, agent: Agent, conversation_id: str) -> str | None:
    if not conversation_id:
        return None
    return (
        RoutingDecision.objects.filter(agent=agent, conversation_id=conversation_id)
        .order_by("-created_at")
        .values_list("tier", flat=True)
        .first()
    )


def cache_entry_count(*, agent: Agent) -> int:
    return CacheEntry.objects.filter(agent=agent).count()
