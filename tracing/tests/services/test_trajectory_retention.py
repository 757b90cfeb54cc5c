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
    Trajectory.objects.filter(session_id__startswith="old").update(started_at=long_ago, ended_at=long_ago)
    Trajectory.objects.filter(session_id="ancient").update(started_at=long_ago, ended_at=long_ago)
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
    eight_days_ago = timezone.now() - timedelta(days=8)
    Trajectory.objects.filter(session_id="a").update(started_at=eight_days_ago, ended_at=eight_days_ago)

    assert services.trajectory_retention_sweep() == {agent.pk: 1}
    assert list(Trajectory.objects.values_list("session_id", flat=True)) == ["b"]


def test_the_sweep_takes_the_agents_in_turns_a_batch_each(otel, workspace, monkeypatch):
    # An agent with a large backlog used to hold the others back until the daily task's time ran out.
    busy = AgentFactory.create(workspace=workspace, slug="busy", trace_retention_days=7)
    quiet = AgentFactory.create(workspace=workspace, slug="quiet", trace_retention_days=7)
    _ingest(otel, workspace, busy, ["b1", "b2", "b3"])
    _ingest(otel, workspace, quiet, ["q1"])
    eight_days_ago = timezone.now() - timedelta(days=8)
    Trajectory.objects.update(started_at=eight_days_ago, ended_at=eight_days_ago)
    batches = []
    batch = services._retention_batch

    def recorded(*, agent, cutoff, batch_size):
        count = batch(agent=agent, cutoff=cutoff, batch_size=batch_size)
        batches.append((agent.slug, count))
        return count

    monkeypatch.setattr(services, "_retention_batch", recorded)

    assert services.trajectory_retention_sweep(batch_size=1) == {busy.pk: 3, quiet.pk: 1}
    assert batches == [("busy", 1), ("quiet", 1), ("busy", 1), ("quiet", 0), ("busy", 1), ("busy", 0)]
    assert not Trajectory.objects.exists()
