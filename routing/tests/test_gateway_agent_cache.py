"""What the gateway keeps per process between requests (routing/selectors.py, config/process_cache.py):
the key is checked on every request, and a kept router configuration or prompt version is used only
while what it was read from is unchanged, and for a few seconds at most."""

from __future__ import annotations

import weakref
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agent_registry import services as registry_services
from agent_registry.models import Prompt
from config.process_cache import TtlCache
from routing import selectors, services
from routing.models import ModelTarget, RoutingDecision
from routing.tests.conftest import Gateway, gateway_agent
from tracing.models import Trajectory

pytestmark = pytest.mark.django_db


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    for cache in (selectors.router_configs_cache, selectors.prompt_versions_cache):
        monkeypatch.setattr(cache, "clock", clock)
        cache.clear()
    return clock


def _context(gateway: Gateway) -> selectors.GatewayAgent:
    return selectors.gateway_agent_context(api_key=gateway.key, slug=gateway.agent.slug)


def _reads(queries: CaptureQueriesContext, table: str) -> int:
    """Statements that read `table` on their own (not the prepared statement that fingerprints it)."""
    return sum(
        1
        for query in queries.captured_queries
        if f'FROM "{table}"' in query["sql"] and not query["sql"].startswith(("PREPARE", "EXECUTE"))
    )


# --- The cache itself ----------------------------------------------------------------------------


def test_an_entry_lives_until_its_time_is_up():
    clock = Clock()
    cache: TtlCache[str, int] = TtlCache(seconds=5, size=10, clock=clock)
    cache.put("a", 1)

    clock.now += 4.9
    assert cache.get("a") == 1
    clock.now += 0.1
    assert cache.get("a") is None
    assert len(cache) == 0


def test_a_full_cache_drops_the_least_recently_used_entry():
    cache: TtlCache[str, int] = TtlCache(seconds=60, size=2, clock=Clock())
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # now "b" is the least recently used
    cache.put("c", 3)

    assert (cache.get("a"), cache.get("b"), cache.get("c")) == (1, None, 3)
    assert len(cache) == 2


def test_discard_and_clear_forget_entries():
    cache: TtlCache[str, int] = TtlCache(seconds=60, size=10, clock=Clock())
    cache.put("a", 1)
    cache.put("b", 2)
    cache.discard("a")
    assert (cache.get("a"), cache.get("b")) == (None, 2)
    cache.clear()
    assert len(cache) == 0


# --- The gateway's agent -------------------------------------------------------------------------


def test_the_context_is_what_the_uncached_selectors_read(gateway, clock):
    context = _context(gateway)

    assert context.agent == gateway.agent
    assert context.agent.workspace_id == gateway.workspace.pk
    assert context.agent.current_requirements_id == gateway.agent.current_requirements_id
    assert context.config == selectors.router_config_find(agent=gateway.agent)
    assert context.config is not None
    assert (context.config.single_call_target, context.config.agentic_target) == (gateway.fast, gateway.strong)
    assert context.production_version == selectors.production_prompt_version(agent=gateway.agent)


def test_a_second_request_reads_neither_the_router_configuration_nor_the_prompt_again(gateway, clock):
    _context(gateway)

    with CaptureQueriesContext(connection) as queries:
        context = _context(gateway)

    assert [query["sql"].split(" ", 1)[0] for query in queries.captured_queries] == ["EXECUTE"]
    assert context.config is not None
    assert context.config.single_call_target == gateway.fast
    assert context.production_version is not None


def test_each_request_gets_its_own_copies(gateway, clock):
    first = _context(gateway)
    assert first.config is not None
    assert first.config.single_call_target is not None
    first.config.single_call_target.consecutive_failures = 99

    second = _context(gateway)
    assert second.config is not None
    assert second.config.single_call_target is not None
    assert second.config.single_call_target.consecutive_failures == 0


def test_a_copy_shares_no_list_or_dict_with_the_kept_instance(gateway, clock):
    first = _context(gateway)
    assert first.config is not None
    assert first.production_version is not None
    rules, intents = list(first.config.rules), dict(first.config.intents)
    template = list(first.production_version.template)
    first.config.rules.append({"name": "added in place"})
    first.config.intents["added"] = ["in place"]
    first.production_version.template.append({"role": "user", "content": "added in place"})
    first.production_version.prompt.name = "renamed in place"

    second = _context(gateway)

    assert second.config is not None
    assert second.production_version is not None
    assert (second.config.rules, second.config.intents) == (rules, intents)
    assert second.production_version.template == template
    assert second.production_version.prompt.name != "renamed in place"
    assert second.config.single_call_target == gateway.fast
    assert second.config.single_call_target is not first.config.single_call_target


def test_kept_entries_expire(gateway, clock):
    _context(gateway)
    clock.now += selectors.GATEWAY_CACHE_SECONDS - 0.1
    with CaptureQueriesContext(connection) as queries:
        _context(gateway)
    assert _reads(queries, "routing_routerconfig") == 0

    clock.now += 0.1
    with CaptureQueriesContext(connection) as queries:
        _context(gateway)
    assert _reads(queries, "routing_routerconfig") == 1
    assert _reads(queries, "agent_registry_promptversion") == 1


def test_a_changed_router_configuration_is_used_on_the_next_request(gateway, clock):
    assert gateway.ask("Where is my receipt?").json()["choices"][0]["message"]["content"].startswith("fast")

    services.router_config_update(agent=gateway.agent, single_call_target=gateway.strong)

    response = gateway.ask("Where is my receipt?")
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "strong answers: Where is my receipt?"
    assert [received.model for received in gateway.fake.received] == ["fast", "strong"]


def test_a_changed_target_is_used_on_the_next_request(gateway, clock):
    _context(gateway)

    services.model_target_update(target=gateway.fast, timeout_seconds=7.5)
    context = _context(gateway)
    assert context.config is not None
    assert context.config.single_call_target is not None
    assert context.config.single_call_target.timeout_seconds == 7.5


def test_a_target_health_written_with_update_is_seen_on_the_next_request(gateway, clock):
    # Failures and cooldowns are written with UPDATE, which leaves updated_at as it was.
    _context(gateway)
    until = timezone.now() + timedelta(minutes=5)
    ModelTarget.objects.filter(pk=gateway.fast.pk).update(consecutive_failures=3, cooldown_until=until)

    context = _context(gateway)
    assert context.config is not None
    assert context.config.single_call_target is not None
    target = context.config.single_call_target
    assert (target.consecutive_failures, target.cooldown_until) == (3, until)


def test_a_deleted_target_is_gone_on_the_next_request(gateway, clock):
    _context(gateway)

    services.model_target_delete(target=gateway.strong)

    context = _context(gateway)
    assert context.config is not None
    assert context.config.agentic_target is None


def test_a_moved_production_label_is_used_on_the_next_request(gateway, clock):
    gateway.ask("Where is my receipt?")
    prompt = Prompt.objects.get(agent=gateway.agent, name="ride-support/system")
    version = registry_services.prompt_version_create(
        prompt=prompt,
        template=[{"role": "system", "content": "You are {{company}}'s new assistant."}],
        config=None,
        labels=(),
    )
    registry_services.prompt_label_move(prompt=prompt, label="production", version=version)

    gateway.ask("Where is my receipt?")

    systems = [received.messages[0]["content"] for received in gateway.fake.received]
    assert systems[0].startswith("You are Acme's ride support assistant.")
    assert systems[1].startswith("You are Acme's new assistant.")


def test_an_agent_without_router_configuration_or_production_prompt(workspace, clock):
    agent = registry_services.agent_create(workspace=workspace, slug="bare", name="Bare")
    key, _ = registry_services.apikey_create(workspace=workspace, name="k", scopes=["gateway"])

    context = selectors.gateway_agent_context(api_key=key, slug="bare")

    assert (context.agent, context.config, context.production_version) == (agent, None, None)


def test_the_system_prompt_is_preferred_over_other_production_prompts(gateway, clock):
    registry_services.prompt_create(
        agent=gateway.agent, name="a-first-by-name", type="text", template="Other.", labels=["production"]
    )

    context = _context(gateway)

    assert context.production_version is not None
    assert context.production_version.prompt.name == "ride-support/system"
    assert context.production_version == selectors.production_prompt_version(agent=gateway.agent)


def test_an_agent_without_a_system_prompt_is_served_its_first_production_prompt_by_name(workspace, clock):
    agent = registry_services.agent_create(workspace=workspace, slug="faq", name="FAQ")
    key, _ = registry_services.apikey_create(workspace=workspace, name="k", scopes=["gateway"])
    registry_services.prompt_create(agent=agent, name="faq/zz-later", type="text", template="Z.", labels=["production"])
    first = registry_services.prompt_create(
        agent=agent, name="faq/answers", type="text", template="A.", labels=["production"]
    )

    context = selectors.gateway_agent_context(api_key=key, slug="faq")

    assert context.production_version == first == selectors.production_prompt_version(agent=agent)
    assert context.unlabelled_prompt is None


def test_a_system_prompt_without_the_production_label_is_not_replaced_by_another_prompt(gateway, clock):
    registry_services.prompt_create(
        agent=gateway.agent, name="a-first-by-name", type="text", template="Other.", labels=["production"]
    )
    system = Prompt.objects.get(agent=gateway.agent, name="ride-support/system")
    registry_services.prompt_label_delete(prompt=system, label="production")

    context = _context(gateway)

    assert context.production_version is None
    assert context.unlabelled_prompt == "ride-support/system"
    assert selectors.production_prompt_version(agent=gateway.agent) is None
    assert selectors.labelled_prompt_version(agent=gateway.agent, label="production") is None


def test_the_gateway_refuses_an_agent_whose_system_prompt_lost_its_label_and_records_the_refusal(gateway, clock):
    registry_services.prompt_create(
        agent=gateway.agent, name="a-first-by-name", type="text", template="Other.", labels=["production"]
    )
    system = Prompt.objects.get(agent=gateway.agent, name="ride-support/system")
    registry_services.prompt_label_delete(prompt=system, label="production")

    response = gateway.ask("Where is my receipt?")

    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "prompt_not_labelled"
    assert "'ride-support/system'" in error["message"]
    assert gateway.fake.received == []  # no model was called with another prompt, or none
    trajectory = Trajectory.objects.get(trace_id=response.headers["X-Keel-Trace-Id"])
    assert trajectory.status == "error"

    registry_services.prompt_label_move(prompt=system, label="production", version=system.versions.get(version=1))
    assert gateway.ask("Where is my receipt?").status_code == 200
    assert len(gateway.fake.received) == 1


# --- Who may call --------------------------------------------------------------------------------


def test_a_revoked_key_is_refused_on_the_next_request(gateway, clock):
    assert gateway.ask("Where is my receipt?").status_code == 200
    decisions = RoutingDecision.objects.count()

    registry_services.apikey_revoke(api_key=gateway.key)

    response = gateway.ask("Where is my receipt?")
    assert response.status_code == 401
    assert response.json()["code"] == "unauthenticated"
    assert RoutingDecision.objects.count() == decisions
    assert len(gateway.fake.received) == 1


def test_a_key_limited_to_other_agents_cannot_call_this_one(gateway, clock):
    other = gateway_agent(gateway.workspace, slug="billing")
    limited, _ = registry_services.apikey_create(
        workspace=gateway.workspace, name="limited", scopes=["gateway"], agents=[other]
    )

    assert selectors.gateway_agent_context(api_key=limited, slug="billing").agent == other
    with pytest.raises(selectors.ModelNotFound):
        selectors.gateway_agent_context(api_key=limited, slug=gateway.agent.slug)


def test_a_key_never_finds_another_workspace_agent_of_the_same_slug(gateway, other_workspace, clock):
    theirs = gateway_agent(other_workspace)
    their_key, _ = registry_services.apikey_create(workspace=other_workspace, name="theirs", scopes=["gateway"])
    _context(gateway)

    context = selectors.gateway_agent_context(api_key=their_key, slug=gateway.agent.slug)

    assert context.agent == theirs
    assert context.production_version is not None
    assert context.production_version.prompt.agent_id == theirs.pk
    assert context.config is None  # the other workspace's agent has no router configuration
    with pytest.raises(selectors.ModelNotFound):
        selectors.gateway_agent_context(api_key=their_key, slug="no-such-agent")


def test_a_statement_prepared_before_a_rollback_still_serves(gateway, clock):
    # PREPARE is not undone by a rollback: the session keeps the statement, and the process knows it.
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")
    selectors._prepared_sessions.pop(connection.connection, None)  # the process knows what the session lost

    def prepared_then_rolled_back() -> None:
        with transaction.atomic():
            _context(gateway)
            raise RuntimeError

    with pytest.raises(RuntimeError):
        prepared_then_rolled_back()

    assert _context(gateway).agent == gateway.agent


def test_a_session_that_has_the_statement_already_is_not_asked_to_prepare_it_again(gateway, clock, monkeypatch):
    _context(gateway)
    monkeypatch.setattr(selectors, "_prepared_sessions", weakref.WeakKeyDictionary())  # as if the process had forgotten

    with CaptureQueriesContext(connection) as queries:
        assert _context(gateway).agent == gateway.agent

    assert not any(query["sql"].startswith("PREPARE") for query in queries.captured_queries)
