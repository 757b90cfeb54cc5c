"""Factories for routing rows. Every row's workspace follows its agent (or its decision's, its entry's),
so a factory never builds a row that straddles two tenants. Cache entries are embedded offline from
their request text unless a test passes the vector."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone
from factory.declarations import LazyAttribute, LazyFunction, Sequence, SubFactory
from factory.django import DjangoModelFactory

from agent_registry.tests.factories import AgentFactory, WorkspaceFactory
from routing import embedding
from routing.cache import system_hash
from routing.models import (
    CacheEntry,
    CacheHit,
    DecisionMethod,
    ModelTarget,
    RouterConfig,
    RoutingDecision,
    TierChoice,
)

SYSTEM_PROMPT = "You are the support desk of Acme. Answer briefly."


def _same_workspace_agent():
    return SubFactory(AgentFactory, workspace=LazyAttribute(lambda agent: agent.factory_parent.workspace))


class ModelTargetFactory(DjangoModelFactory[ModelTarget]):
    class Meta:
        model = ModelTarget

    workspace = SubFactory(WorkspaceFactory)
    alias = Sequence(lambda n: f"target-{n}")
    model = LazyAttribute(lambda target: f"fake/{target.alias}")


class RouterConfigFactory(DjangoModelFactory[RouterConfig]):
    class Meta:
        model = RouterConfig

    agent = SubFactory(AgentFactory)


class RoutingDecisionFactory(DjangoModelFactory[RoutingDecision]):
    class Meta:
        model = RoutingDecision

    workspace = SubFactory(WorkspaceFactory)
    agent = _same_workspace_agent()
    trace_id = Sequence(lambda n: f"{n:032x}")
    request_text = "Where is my order?"
    tier = TierChoice.SINGLE_CALL
    method = DecisionMethod.DEFAULT
    reason = "The agent's default tier."


class CacheEntryFactory(DjangoModelFactory[CacheEntry]):
    class Meta:
        model = CacheEntry

    workspace = SubFactory(WorkspaceFactory)
    agent = _same_workspace_agent()
    model_target = SubFactory(
        ModelTargetFactory, workspace=LazyAttribute(lambda target: target.factory_parent.workspace)
    )
    prompt_version = None
    system_hash = system_hash(SYSTEM_PROMPT)
    request_text = Sequence(lambda n: f"How do I reset the password of account {n}?")
    embedding = LazyAttribute(lambda entry: embedding.embed_offline(entry.request_text))
    response = LazyAttribute(
        lambda entry: {
            "message": {"role": "assistant", "content": f"An answer to: {entry.request_text}"},
            "usage": {"prompt_tokens": 20, "completion_tokens": 10},
            "model": entry.model_target.model,
        }
    )
    trace_id = Sequence(lambda n: f"{n:032x}")
    expires_at = LazyFunction(lambda: timezone.now() + timedelta(hours=1))


class CacheHitFactory(DjangoModelFactory[CacheHit]):
    class Meta:
        model = CacheHit

    entry = SubFactory(CacheEntryFactory)
    workspace = LazyAttribute(lambda hit: hit.entry.workspace)
    agent = LazyAttribute(lambda hit: hit.entry.agent)
    trace_id = Sequence(lambda n: f"{n + 1_000_000:032x}")
    request_text = LazyAttribute(lambda hit: hit.entry.request_text)
    similarity = 0.95
