"""Factories for the registry. `requirements_answers()` builds a valid, feasible answer set that tests
change one field at a time."""

from __future__ import annotations

import copy
from collections import abc
from typing import Any

from factory.declarations import LazyAttribute, Sequence, SubFactory
from factory.django import DjangoModelFactory, Password

from agent_registry import services
from agent_registry.models import Agent, Membership, Prompt, Role, User, Workspace

PASSWORD = "correct horse battery staple"


class UserFactory(DjangoModelFactory[User]):
    class Meta:
        model = User
        django_get_or_create = ("username",)

    username = Sequence(lambda n: f"user{n}")
    email = LazyAttribute(lambda user: f"{user.username}@example.com")
    password = Password(PASSWORD)


class WorkspaceFactory(DjangoModelFactory[Workspace]):
    class Meta:
        model = Workspace
        django_get_or_create = ("slug",)

    slug = Sequence(lambda n: f"workspace-{n}")
    name = LazyAttribute(lambda workspace: workspace.slug.replace("-", " ").title())


class MembershipFactory(DjangoModelFactory[Membership]):
    class Meta:
        model = Membership

    workspace = SubFactory(WorkspaceFactory)
    user = SubFactory(UserFactory)
    role = Role.MEMBER


class AgentFactory(DjangoModelFactory[Agent]):
    class Meta:
        model = Agent

    workspace = SubFactory(WorkspaceFactory)
    slug = Sequence(lambda n: f"agent-{n}")
    name = LazyAttribute(lambda agent: agent.slug.replace("-", " ").title())
    description = "An agent made by a test."


class PromptFactory(DjangoModelFactory[Prompt]):
    """A prompt with no version yet; `prompt_with_versions` publishes versions through the services."""

    class Meta:
        model = Prompt

    agent = SubFactory(AgentFactory)
    workspace = LazyAttribute(lambda prompt: prompt.agent.workspace)
    name = Sequence(lambda n: f"prompt-{n}")


_ANSWERS: dict[str, Any] = {
    "error_surface": {
        "decision_authority": "bounded_autonomy",
        "error_cost": {"worse_direction": "false_positive", "description": "Wrong refunds cost money.", "ratio": 3},
        "recoverability": "days",
        "actions": [
            {"name": "lookup_trip", "mode": "execute", "stakes": "low"},
            {
                "name": "issue_refund",
                "mode": "execute",
                "stakes": "moderate",
                "side_effects": True,
                "autonomy_limit_usd": "20",
            },
        ],
    },
    "io_gap": {
        "steps_median": 2,
        "steps_p95": 5,
        "steps_predictable": True,
        "output_verifiable_from_input": False,
        "atomic_operations": ["extraction", "classification", "decision_action"],
    },
    "constraints": {
        "latency": {"latency_class": "conversational", "hard_ceiling_ms": 30000},
        "cost": {"per_request_ceiling_usd": "0.50", "single_call_cost_usd": "0.01"},
        "privacy": {"pii_handling": "pseudonymize"},
        "governance": "policy_compliance_auditing",
    },
    "pareto": {
        "quality_vs_speed": 30,
        "autonomy_vs_control": 60,
        "generality_vs_reliability": 50,
        "primary_axis": "quality_speed",
    },
    "evaluation": {
        "output_metrics": [{"name": "resolution_rate", "target": 0.7}],
        "trajectory_metrics": [{"name": "policy_compliance_rate", "target": 0.99}],
    },
    "routing": {
        "mode": "adaptive",
        "enabled_tiers": ["single_call", "chain", "human"],
        "default_tier": "single_call",
        "escalation_rules": [{"trigger": "keywords", "value": "unsafe, assault", "to_tier": "human"}],
    },
}


def requirements_answers(**changes: Any) -> dict[str, Any]:
    """A valid answer set with no feasibility errors; `changes` use dotted paths, e.g.
    `requirements_answers(**{"io_gap.steps_p95": 1})`."""
    answers = copy.deepcopy(_ANSWERS)
    for path, value in changes.items():
        *parents, leaf = path.split(".")
        node = answers
        for key in parents:
            node = node[key]
        node[leaf] = value
    return answers


# Changes (for `requirements_answers`) that leave the router no tier: an inline latency wall rules out the
# only tier enabled, the agentic one.
NO_TIER_LEFT = {
    "constraints.latency.latency_class": "inline",
    "constraints.latency.hard_ceiling_ms": 1500,
    "routing.mode": "single_level",
    "routing.enabled_tiers": ["agentic"],
    "routing.default_tier": "agentic",
    "routing.escalation_rules": [],
}


def agent_with_requirements(**kwargs: Any) -> Agent:
    agent = AgentFactory.create(**kwargs)
    services.requirements_version_create(agent=agent, answers=requirements_answers(), message="initial")
    return agent


def prompt_with_versions(
    *,
    agent: Agent,
    name: str = "greeting",
    templates: abc.Sequence[Any] = ("Hello {{name}}!",),
    type: str = "text",
    labels: abc.Mapping[int, abc.Sequence[str]] | None = None,
    config: abc.Mapping[str, Any] | None = None,
) -> Prompt:
    """A prompt of `agent` with one version per template (v1, v2, ...), published through the services;
    `labels` maps a version number to the labels it gets, e.g. `{1: ["production"], 2: ["staging"]}`."""
    labels = labels or {}
    first, *rest = templates
    version = services.prompt_create(
        agent=agent, name=name, type=type, template=first, config=config, labels=labels.get(1, ())
    )
    prompt = version.prompt
    for number, template in enumerate(rest, start=2):
        services.prompt_version_create(prompt=prompt, template=template, config=config, labels=labels.get(number, ()))
    return prompt
