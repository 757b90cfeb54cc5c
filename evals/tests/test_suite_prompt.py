"""A suite on a label evaluates the prompt the gateway serves under it: when several prompts of the agent
carry "production", the one named "<slug>/system" (as `model: "agent/<slug>"` requests get), not the first
by name; and only a move of that prompt's label makes regression runs."""

from __future__ import annotations

import pytest

from agent_registry import services as registry_services
from agent_registry.models import PromptVersion
from evals import regressions, runs
from evals.tests.test_runs import _suite
from routing.tests import conftest as routing_fixtures
from routing.tests.conftest import Gateway

fake = routing_fixtures.fake
gateway = routing_fixtures.gateway

pytestmark = pytest.mark.django_db


def _second_production_prompt(gw: Gateway) -> PromptVersion:
    """A prompt sorted before "<slug>/system", also labelled production."""
    return registry_services.prompt_create(
        agent=gw.agent,
        name=f"{gw.agent.slug}/aaa-refund-policy",
        type="text",
        template="Refund up to {{autonomy_limit}}.",
        labels=["production"],
    )


def test_a_suite_on_production_runs_the_prompt_the_gateway_serves(gateway: Gateway) -> None:
    other = _second_production_prompt(gateway)
    suite = _suite(gateway, samples=1)

    run = runs.run_create(suite=suite, dispatch=False)

    assert run.prompt_version is not None
    assert run.prompt_version.prompt.name == f"{gateway.agent.slug}/system"
    assert run.prompt_version != other


def test_a_label_move_on_a_prompt_the_gateway_does_not_serve_makes_no_regression_run(gateway: Gateway) -> None:
    other = _second_production_prompt(gateway)
    _suite(gateway, samples=1)
    registry_services.prompt_version_create(prompt=other.prompt, template="Refund up to {{autonomy_limit}} now.")
    v2 = PromptVersion.objects.get(prompt=other.prompt, version=2)
    registry_services.prompt_label_move(prompt=other.prompt, label="production", version=v2)

    assert regressions.label_moves_check() == []

    system = gateway.agent.prompts.get(name=f"{gateway.agent.slug}/system")
    registry_services.prompt_version_create(prompt=system, template=[{"role": "system", "content": "v2"}])
    system_v2 = PromptVersion.objects.get(prompt=system, version=2)
    registry_services.prompt_label_move(prompt=system, label="production", version=system_v2)

    (made,) = regressions.label_moves_check()
    assert made.prompt_version == system_v2
