"""The chain tier with steps that run prompt versions: their variables, and what the caller gets when one is
missing."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agent_registry.tests.factories import prompt_with_versions
from routing import services
from routing.models import RoutingDecision
from routing.tests.conftest import Gateway
from routing.tests.fakes import say
from routing.tests.test_gateway import _stored

pytestmark = pytest.mark.django_db


def _chain_of_one_prompt_step(gateway: Gateway, template: str, config: dict[str, object] | None = None) -> None:
    gateway.config.rules = [{"name": "chain", "kind": "keywords", "value": "compare", "to_tier": "chain"}]
    gateway.config.save()
    prompt = prompt_with_versions(agent=gateway.agent, name="classify", templates=(template,), config=config)
    services.chain_steps_set(
        agent=gateway.agent, steps=[{"name": "classify", "prompt_version": prompt.versions.get().pk}]
    )


def test_a_chain_step_whose_prompt_needs_a_variable_the_request_lacks_is_a_422_naming_it_and_recorded(gateway):
    _chain_of_one_prompt_step(gateway, "Classify {{company}}'s request for the {{region}} desk.")

    response = gateway.ask("Compare my last two trips")

    assert response.status_code == 422
    body = response.json()
    assert body["code"] == "missing_variables"
    assert "classify" in body["detail"]
    assert "region" in body["detail"]
    assert body["errors"] == [{"field": "variables.region", "message": "required by chain step classify"}]
    assert gateway.fake.received == []  # no model was asked
    decision = RoutingDecision.objects.get(agent=gateway.agent)
    assert (decision.tier, decision.status) == ("chain", "error")
    trajectory = _stored(gateway, decision.trace_id)
    assert trajectory.status == "error"


def test_a_chain_step_renders_its_prompt_with_its_version_defaults_and_the_request_variables(gateway):
    _chain_of_one_prompt_step(
        gateway, "Classify {{company}}'s request for the {{region}} desk.", config={"variables": {"region": "EU"}}
    )
    gateway.fake.script("fast", say("a comparison"))

    response = gateway.ask("Compare my last two trips")

    assert response.status_code == 200
    assert gateway.fake.received[0].messages[0] == {
        "role": "system",
        "content": "Classify Acme's request for the EU desk.",
    }


def _chain(gateway: Gateway, *steps: dict[str, object]) -> None:
    gateway.config.rules = [{"name": "chain", "kind": "keywords", "value": "compare", "to_tier": "chain"}]
    gateway.config.save()
    services.chain_steps_set(agent=gateway.agent, steps=list(steps))


def test_a_changed_chain_is_not_answered_from_the_cache_of_the_old_one(gateway):
    gateway.config.cache_enabled = True
    _chain(gateway, {"name": "answer", "instructions": "Answer briefly."})
    gateway.fake.script("fast", say("the old chain's answer"), say("the new chain's answer"))

    first = gateway.ask("Compare my last two trips").json()
    repeat = gateway.ask("Compare my last two trips").json()
    services.chain_steps_set(agent=gateway.agent, steps=[{"name": "answer", "instructions": "Answer in detail."}])
    changed = gateway.ask("Compare my last two trips").json()

    assert (first["keel"]["cache_hit"], repeat["keel"]["cache_hit"]) == (False, True)
    assert changed["keel"]["cache_hit"] is False
    assert changed["choices"][0]["message"]["content"] == "the new chain's answer"
    assert [r.messages[0]["content"] for r in gateway.fake.received] == ["Answer briefly.", "Answer in detail."]


def test_a_cached_chain_request_reads_the_agents_steps_once(gateway):
    gateway.config.cache_enabled = True
    _chain(gateway, {"name": "classify", "instructions": "Classify."}, {"name": "answer", "instructions": "Answer."})
    gateway.fake.script("fast", say("a comparison"), say("the answer"))

    with CaptureQueriesContext(connection) as queries:
        body = gateway.ask("Compare my last two trips").json()

    assert (body["keel"]["tier"], body["keel"]["cache_hit"]) == ("chain", False)
    step_reads = [q["sql"] for q in queries.captured_queries if 'FROM "routing_chainstep"' in q["sql"]]
    assert len(step_reads) == 1, step_reads


def test_a_chain_step_whose_model_target_is_disabled_runs_on_the_agents_single_call_target(gateway):
    _chain(
        gateway,
        {"name": "classify", "instructions": "Classify."},
        {"name": "answer", "instructions": "Answer.", "model_target": "strong"},
    )
    services.model_target_update(target=gateway.strong, enabled=False)
    gateway.fake.script("fast", say("a comparison"), say("the answer"))

    body = gateway.ask("Compare my last two trips").json()

    assert body["choices"][0]["message"]["content"] == "the answer"
    assert [r.model for r in gateway.fake.received] == ["fast", "fast"]
