"""The gateway with its config kept per process (config/config_cache.py, on outside tests): a request after
the first reads no key, agent, policy or budget row, and a change another connection commits is seen by
the next request once its notification has arrived.

Transactional tests: the triggers notify at commit."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agent_registry import services as registry_services
from config import config_cache
from guardrails import budgets
from routing.tests.conftest import Gateway

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def listener(settings) -> Iterator[config_cache.Listener]:
    settings.KEEL_CONFIG_CACHE = True
    assert config_cache.listener.wait_listening(10)
    yield config_cache.listener
    config_cache.listener.stop()  # its connection would keep the test database from being dropped


def _settled(listener: config_cache.Listener) -> None:
    """Wait until what the test set up has been notified (no notification for 0.2 s)."""
    last, since = listener.notifications, time.monotonic()
    while time.monotonic() - since < 0.2:
        time.sleep(0.01)
        if listener.notifications != last:
            last, since = listener.notifications, time.monotonic()


def _statements(gateway: Gateway, text: str) -> list[str]:
    with CaptureQueriesContext(connection) as captured:
        response = gateway.ask(text)
    assert response.status_code == 200, response.content
    return [query["sql"] for query in captured.captured_queries]


def test_a_request_after_the_first_reads_no_config(gateway: Gateway, listener):
    _settled(listener)
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


def test_a_revoked_key_is_refused_once_the_change_is_notified(gateway: Gateway, listener):
    _settled(listener)
    assert gateway.ask("Where is my receipt?").status_code == 200

    since = listener.notifications
    registry_services.apikey_revoke(api_key=gateway.key)
    _until(lambda: listener.notifications > since)

    assert gateway.ask("Where is my receipt?").status_code == 401


def test_a_new_production_prompt_applies_to_the_next_request(gateway: Gateway, listener):
    _settled(listener)
    assert gateway.ask("Where is my receipt?").status_code == 200
    assert gateway.fake.received[-1].messages[0]["content"].startswith("You are Acme's ride support assistant.")

    since = listener.notifications
    registry_services.prompt_version_create(
        prompt=gateway.agent.prompts.get(),
        template=[{"role": "system", "content": "You are {{company}}'s new assistant."}],
        labels=["production"],
    )
    _until(lambda: listener.notifications > since)
    _settled(listener)

    assert gateway.ask("Where is my receipt?").status_code == 200
    assert gateway.fake.received[-1].messages[0]["content"].startswith("You are Acme's new assistant.")


def test_a_new_budget_holds_the_next_request(gateway: Gateway, listener):
    _settled(listener)
    assert gateway.ask("Where is my receipt?").status_code == 200

    since = listener.notifications
    budgets.budget_create(workspace=gateway.workspace, scope="workspace", period="day", limit_tokens=1)
    _until(lambda: listener.notifications > since)

    assert gateway.ask("Where is my receipt?").status_code == 429


def _until(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)
