"""Span ingest with its config kept per process (config/config_cache.py, on outside tests): a batch after the
first reads no price, prompt, key, agent, triage setting or mirror row, although it reads them inside the
transaction that stores its spans; a committed change is seen by the next batch once its notification has
arrived.

Transactional tests: the triggers notify at commit."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from agent_registry import services as registry_services
from agent_registry.models import Agent, Prompt
from agent_registry.tests.factories import AgentFactory
from config.tests.listening import settled, until
from tracing import otlp, services
from tracing.models import LangfuseMirror, ModelPriceOverride, Trajectory, TriageSettings
from tracing.tests.agent_traces import refund_conversation

pytestmark = pytest.mark.django_db(transaction=True)

# What ingest reads of the config tables: prices, the prompt versions spans name, the key's agents, the
# workspace's agents, the agent's requirements and triage settings, whether the workspace has a mirror.
CONFIG_READS = (
    "tracing_modelpriceoverride",
    "agent_registry_promptversion",
    "agent_registry_apikey_agents",
    'FROM "agent_registry_agent"',
    "tracing_triagesettings",
    "tracing_langfusemirror",
)


def _ingest(otel, api_key, **conversation) -> tuple[str, list[str]]:
    """One OTLP request of a new trace, stored as the web process stores it; its trace id and statements."""
    otel.exporter.clear()
    trace_id = refund_conversation(otel.tracer(), **conversation)
    with CaptureQueriesContext(connection) as captured:
        services.ingest_otlp_accept(
            api_key=api_key, body=otel.protobuf(), content_type=otlp.CONTENT_TYPE_PROTOBUF, content_encoding=""
        )
    return trace_id, [query["sql"] for query in captured.captured_queries]


def _config_reads(statements: list[str]) -> list[str]:
    return [table for table in CONFIG_READS if any(table in sql for sql in statements)]


@pytest.fixture
def key(workspace):
    agent = AgentFactory.create(workspace=workspace, slug="ride-support")
    registry_services.prompt_create(
        agent=agent, name="ride-support/system", type="chat", template=[{"role": "system", "content": "Help."}]
    )
    api_key, _ = registry_services.apikey_create(workspace=workspace, name="ingest", scopes=["ingest"], agents=[agent])
    return api_key


def test_a_batch_after_the_first_reads_no_config(otel, key, config_listener):
    settled(config_listener)
    prompt = ("ride-support/system", "1")
    _, first = _ingest(otel, key, prompt=prompt)
    trace_id, second = _ingest(otel, key, prompt=prompt)

    assert _config_reads(first) == list(CONFIG_READS)
    assert _config_reads(second) == []
    trajectory = Trajectory.objects.get(trace_id=trace_id)
    assert trajectory.agent is not None
    assert trajectory.agent.slug == "ride-support"
    assert list(trajectory.prompt_versions.values_list("version", flat=True)) == [1]


def test_a_new_price_prices_the_next_batch(otel, key, workspace, config_listener):
    settled(config_listener)
    _ingest(otel, key)

    since = config_listener.notifications
    services.model_price_set(
        workspace=workspace,
        model="gpt-4o",
        input_usd_per_million=Decimal("1"),
        output_usd_per_million=Decimal("2"),
    )
    until(lambda: config_listener.notifications > since)
    trace_id, _ = _ingest(otel, key)

    # (100 + 160) input tokens at $1 per million, (20 + 30) output tokens at $2 per million.
    assert Trajectory.objects.get(trace_id=trace_id).cost_usd == Decimal("0.00036000")


def test_an_agent_created_for_a_trace_is_found_by_the_next_batch(otel, workspace, config_listener):
    api_key, _ = registry_services.apikey_create(workspace=workspace, name="ingest", scopes=["ingest"])
    settled(config_listener)

    first, _ = _ingest(otel, api_key, agent="checkout-helper")
    second, _ = _ingest(otel, api_key, agent="checkout-helper")  # at once: the notification may still be on its way

    (agent,) = Agent.objects.filter(workspace=workspace, slug="checkout-helper")
    assert set(Trajectory.objects.values_list("trace_id", "agent")) == {(first, agent.pk), (second, agent.pk)}


def test_a_change_of_prices_triage_settings_or_mirror_notifies_but_a_delivery_status_does_not(
    workspace, config_listener
):
    agent = AgentFactory.create(workspace=workspace)
    settled(config_listener)

    def notified(change: Callable[[], object]) -> bool:
        since: int = config_listener.notifications
        change()
        settled(config_listener)
        return bool(config_listener.notifications > since)

    assert notified(
        lambda: ModelPriceOverride.objects.create(
            workspace=workspace, model="m", input_usd_per_million=1, output_usd_per_million=2
        )
    )
    assert notified(lambda: TriageSettings.objects.create(agent=agent, language="de"))
    mirror = LangfuseMirror.objects.create(
        workspace=workspace, host="http://langfuse.invalid", public_key="pk", secret_key_encrypted="x", enabled=False
    )
    assert notified(lambda: LangfuseMirror.objects.filter(pk=mirror.pk).update(enabled=True))
    assert not notified(lambda: LangfuseMirror.objects.filter(pk=mirror.pk).update(last_error="timed out"))
    assert not notified(lambda: LangfuseMirror.objects.filter(pk=mirror.pk).update(delivered_spans=10))


def test_inside_a_callers_transaction_ingest_reads_what_that_transaction_wrote(otel, key, workspace, config_listener):
    settled(config_listener)
    _ingest(otel, key, prompt=("ride-support/system", "production"))  # kept: no production version yet
    prompt = Prompt.objects.get(workspace=workspace, name="ride-support/system")

    with transaction.atomic():
        registry_services.prompt_version_create(
            prompt=prompt, template=[{"role": "system", "content": "Help more."}], labels=["production"]
        )
        trace_id, _ = _ingest(otel, key, prompt=("ride-support/system", "production"))

    trajectory = Trajectory.objects.get(trace_id=trace_id)
    assert list(trajectory.prompt_versions.values_list("version", flat=True)) == [2]
