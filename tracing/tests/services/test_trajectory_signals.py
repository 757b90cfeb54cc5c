from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from agent_registry import services as registry_services
from agent_registry.tests.factories import AgentFactory, requirements_answers
from tracing import services
from tracing.models import Trajectory
from tracing.tests.agent_traces import refund_conversation

pytestmark = pytest.mark.django_db


def _ingest(otel, workspace, api_key=None):
    if api_key is None:
        api_key, _ = registry_services.apikey_create(workspace=workspace, name="k", scopes=["ingest", "read"])
    services.ingest_otlp_accept(
        api_key=api_key, body=otel.protobuf(), content_type="application/x-protobuf", content_encoding=""
    )
    otel.exporter.clear()


def test_signals_are_computed_as_spans_arrive_and_stored_for_filtering(otel, workspace):
    failing = refund_conversation(otel.tracer(), tool_fails=True, session="bad")
    fine = refund_conversation(otel.tracer(), session="good")
    _ingest(otel, workspace)

    failed = Trajectory.objects.get(trace_id=failing)
    assert "failure" in failed.signal_names
    (failure,) = [instance for instance in failed.signals if instance["signal"] == "failure"]
    assert failure["level"] in {"warning", "error"}
    assert failure["why"]
    assert failed.triage_score > Trajectory.objects.get(trace_id=fine).triage_score
    assert "failure" not in Trajectory.objects.get(trace_id=fine).signal_names
    assert failed.signal_errors == []


def test_the_api_filters_by_signal_and_orders_by_triage_score(otel, workspace, api_client_for):
    failing = refund_conversation(otel.tracer(), tool_fails=True, session="bad")
    fine = refund_conversation(otel.tracer(), session="good")
    _ingest(otel, workspace)
    client = api_client_for(workspace, scopes=["read"])

    only_failures = client.get("/api/v1/trajectories", {"signal": "failure"}).json()["items"]
    by_triage = client.get("/api/v1/trajectories", {"order": "-triage_score"}).json()["items"]

    assert [item["trace_id"] for item in only_failures] == [failing]
    assert [item["trace_id"] for item in by_triage] == [failing, fine]
    assert by_triage[0]["triage_score"] > by_triage[1]["triage_score"]
    assert "failure" in [signal["signal"] for signal in by_triage[0]["signals"]]


def test_an_agents_requirements_set_its_step_limit_for_exhaustion():
    from tracing.services import signal_config_for_agent

    agent = AgentFactory.create()
    registry_services.requirements_version_create(
        agent=agent,
        answers=requirements_answers(**{"routing.enabled_tiers": ["single_call", "agentic", "human"]}),
    )

    config = signal_config_for_agent(agent.pk)

    assert config.max_steps == 10  # twice the p95 of 5 steps
    assert config.time_budget_seconds == 30.0


def test_recompute_restores_signals_from_the_stored_spans(otel, workspace):
    failing = refund_conversation(otel.tracer(), tool_fails=True)
    _ingest(otel, workspace)
    expected = Trajectory.objects.get(trace_id=failing)
    Trajectory.objects.filter(pk=expected.pk).update(signals=[], signal_names=[], triage_score=0)

    output = io.StringIO()
    call_command("signals_recompute", "--workspace", workspace.slug, "--sync", stdout=output)

    assert output.getvalue() == "1 trajectories recomputed\n"

    recomputed = Trajectory.objects.get(pk=expected.pk)
    assert (recomputed.signal_names, recomputed.triage_score) == (expected.signal_names, expected.triage_score)
    assert recomputed.signals == expected.signals


def test_recompute_names_an_unknown_workspace():
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="no workspace 'nowhere'"):
        call_command("signals_recompute", "--workspace", "nowhere", "--sync")
