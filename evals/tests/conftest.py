"""Fixtures for the dataset tests: trajectories ingested the way production ingests them."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from agent_registry import services as registry_services
from agent_registry.models import Workspace
from agent_registry.tests.factories import AgentFactory
from tracing import services as tracing_services
from tracing.tests.agent_traces import refund_conversation
from tracing.tests.conftest import OtelRecorder, otel  # noqa: F401 - the fixture, for this package's tests


@pytest.fixture
def record_trajectory(otel: OtelRecorder) -> Callable[..., str]:  # noqa: F811 - the fixture imported above
    """Record a refund conversation in a workspace (through ingest and span processing); its trace id."""

    def record(workspace: Workspace, *, question: str = "I was charged twice for a cancelled ride") -> str:
        if not workspace.agents.filter(slug="ride-support").exists():
            AgentFactory.create(workspace=workspace, slug="ride-support")
        trace_id = refund_conversation(otel.tracer(), question=question)
        api_key, _ = registry_services.apikey_create(workspace=workspace, name="ingest", scopes=["ingest"])
        tracing_services.ingest_otlp_accept(
            api_key=api_key, body=otel.protobuf(), content_type="application/x-protobuf", content_encoding=""
        )
        otel.exporter.clear()
        return trace_id

    return record
