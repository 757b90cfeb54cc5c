"""The gateway with its config kept per process (config/config_cache.py, on outside tests): a request after
the first reads no key, agent, policy or budget row, and a committed change is seen by the next request
once its notification has arrived.

Transactional tests: the triggers notify at commit."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agent_registry import services as registry_services
from config.tests.listening import settled, until
from guardrails import budgets
from routing.tests.conftest import Gateway

pytestmark = pytest.mark.django_db(transaction=True)


def _statements(gateway: Gateway, text: str) -> list[str]:
    with CaptureQueriesContext(connection) as captured:
        response = gateway.ask(text)
    assert response.status_code == 200, response.content
    return [query["sql"] for query in captured.captured_queries]


def test_a_request_after_the_first_reads_no_config(gateway: Gateway, config_listener):
    settled(config_listener)
    first = _statements(gateway, "Where is my receipt?")
    second = _statements(gateway, "Where is my receipt for trip T2?")

    # The key with its workspace, the agent (a prepared statement), its guardrail policy, the budgets.
    config_reads = (
        'FROM "agent_registry_apikey" k',
        "keel_gateway_agent",
        "guardrails_guardrailpolicy",
        "guardrails_budget",
    )
    assert all(any(table in sql for sql in first) for table in config_reads)
    assert not [sql for sql in second if any(table in sql for table in config_reads)]
    assert len(second) < len(first)


def test_a_revoked_key_is_refused_once_the_change_is_notified(gateway: Gateway, config_listener):
    settled(config_listener)
    assert gateway.ask("Where is my receipt?").status_code == 200

    since = config_listener.notifications
    registry_services.apikey_revoke(api_key=gateway.key)
    until(lambda: config_listener.notifications > since)

    assert gateway.ask("Where is my receipt?").status_code == 401


def test_a_new_production_prompt_applies_to_the_next_request(gateway: Gateway, config_listener):
    settled(config_listener)
    assert gateway.ask("Where is my receipt?").status_code == 200
    assert gateway.fake.received[-1].messages[0]["content"].startswith("You are Acme's ride support assistant.")

    since = config_listener.notifications
    registry_services.prompt_version_create(
        prompt=gateway.agent.prompts.get(),
        template=[{"role": "system", "content": "You are {{company}}'s new assistant."}],
        labels=["production"],
    )
    until(lambda: config_listener.notifications > since)
    settled(config_listener)

    assert gateway.ask("Where is my receipt?").status_code == 200
    assert gateway.fake.received[-1].messages[0]["content"].startswith("You are Acme's new assistant.")


def test_a_new_budget_holds_the_next_request(gateway: Gateway, config_listener):
    settled(config_listener)
    assert gateway.ask("Where is my receipt?").status_code == 200

    since = config_listener.notifications
    budgets.budget_create(workspace=gateway.workspace, scope="workspace", period="day", limit_tokens=1)
    until(lambda: config_listener.notifications > since)

    assert gateway.ask("Where is my receipt?").status_code == 429
