"""Factories for the registry. `requirements_answers()` builds a valid, feasible answer set that tests
change one field at a time."""

from __future__ import annotations

import copy
from typing import Any

import factory

from agent_registry import services
from agent_registry.models import Agent, Membership, Role, User, Workspace


PASSWORD = "correct horse battery staple"


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = User
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda user: f"{user.username}@example.com")
    password = factory.django.Password(PASSWORD)


class WorkspaceFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Workspace
        django_get_or_create = ("slug",)

    slug = factory.Sequence(lambda n: f"workspace-{n}")
    name = factory.LazyAttribute(lambda workspace: workspace.slug.replace("-", " ").title())


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    workspace = factory.SubFactory(WorkspaceFactory)
    user = factory.SubFactory(UserFactory)
    role = Role.MEMBER


class AgentFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Agent

    workspace = factory.SubFactory(WorkspaceFactory)
    slug = factory.Sequence(lambda n: f"agent-{n}")
    name = factory.LazyAttribute(lambda agent: agent.slug.replace("-", " ").title())
    description = "An agent made by a test."


_ANSWERS: dict[str, Any] = {
    "error_surface": {
        "decision_authority": "bounded_autonomy",
        "error_cost": {"worse_direction": "false_positive", "description": "Wrong refunds cost money.", "ratio": 3},
        "recoverability": "days",
        "actions": [
            {"name": "lookup_trip", "mode": "execute", "stakes": "low"},
            {"name": "issue_refund", "mode": "execute", "stakes": "moderate", "autonomy_limit_usd": "20"},
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


def agent_with_requirements(**kwargs: Any) -> Agent:
    agent = AgentFactory(**kwargs)
    services.requirements_version_create(agent=agent, answers=requirements_answers(), message="initial")
    return agent
