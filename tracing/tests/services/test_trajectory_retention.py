from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from agent_registry import services as registry_services
from agent_registry.tests.factories import AgentFactory
from tracing import services
from tracing.models import Score, Span, Trajectory
from tracing.tests.agent_traces import refund_conversation

pytestmark = pytest.mark.django_db


def _ingest(otel, workspace, agent, sessions):
    for session in sessions:
        refund_conversation(otel.tracer(), agent=agent.slug, session=session)
    api_key, _ = registry_services.apikey_create(workspace=workspace, name="k", scopes=["ingest"], agents=[agent])
    services.ingest_otlp_accept(
        api_key=api_key, body=otel.protobuf(), content_type="application/x-protobuf", content_encoding=""
    )
    otel.exporter.clear()


def test_retention_deletes_old_trajectories_of_the_agent_only_in_small_batches(otel, workspace):
    kept_agent = AgentFactory.create(workspace=workspace, slug="keeps-everything")
    agent = AgentFactory.create(workspace=workspace, slug="ride-support", trace_retention_days=30)
    _ingest(otel, workspace, agent, ["old-1", "old-2", "old-3", "new"])
    _ingest(otel, workspace, kept_agent, ["ancient"])
    long_ago = timezone.now() - timedelta(days=45)
    Trajectory.objects.filter(session_id__startswith="old").update(ended_at=long_ago)
    Trajectory.objects.filter(session_id="ancient").update(ended_at=long_ago)
    old = Trajectory.objects.filter(session_id="old-1").get()
    Score.objects.create(workspace=workspace, trajectory=old, name="ok", data_type="boolean", value=1, source="api")

    deleted = services.trajectory_retention_apply(agent=agent, days=30, batch_size=2)

    assert deleted == 3
    assert sorted(Trajectory.objects.values_list("session_id", flat=True)) == ["ancient", "new"]
    assert Span.objects.filter(workspace=workspace).count() == 8
    assert Score.objects.count() == 0


def test_the_sweep_applies_each_agents_own_retention(otel, workspace):
    agent = AgentFactory.create(workspace=workspace, slug="ride-support", trace_retention_days=7)
    _ingest(otel, workspace, agent, ["a", "b"])
    Trajectory.objects.filter(session_id="a").update(ended_at=timezone.now() - timedelta(days=8))

    assert services.trajectory_retention_sweep() == {agent.pk: 1}
    assert list(Trajectory.objects.values_list("session_id", flat=True)) == ["b"]
