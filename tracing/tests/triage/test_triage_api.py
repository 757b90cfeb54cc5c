"""The triage API: settings per agent, review samples and decisions, informativeness; scoped to the
key's workspace and agents (401 without a key, 403 without the scope, 404 for another workspace's rows)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client
from django.utils import timezone

from agent_registry.tests.factories import AgentFactory
from tracing import triage
from tracing.models import ReviewItem, ReviewSample, TriageSettings
from tracing.tests.factories import TrajectoryFactory, signal_instance

pytestmark = pytest.mark.django_db

NOW = timezone.now()


@pytest.fixture
def agents(workspace, other_workspace):
    ride = AgentFactory.create(workspace=workspace, slug="ride-support")
    theirs = AgentFactory.create(workspace=other_workspace, slug="ride-support")
    for agent in (ride, theirs):
        for index in range(6):
            TrajectoryFactory.create(
                workspace=agent.workspace,
                agent=agent,
                signals=[signal_instance("loop")] if index % 2 else [],
                triage_score=0.6 if index % 2 else 0.0,
                started_at=NOW - timedelta(hours=1, minutes=index),
            )
    return ride, theirs


def _state():
    return (
        list(TriageSettings.objects.values_list("agent_id", "weights")),
        list(ReviewSample.objects.values_list("pk", flat=True)),
        list(ReviewItem.objects.values_list("pk", "status")),
    )


def test_settings_round_trip_with_effective_values(workspace, agents, api_client_for):
    client = api_client_for(workspace)

    empty = client.get("/api/v1/agents/ride-support/triage-settings")
    saved = client.put(
        "/api/v1/agents/ride-support/triage-settings",
        {
            "language": "en",
            "phrases": {"en": {"quit": {"mode": "extend", "phrases": ["i'm out"]}}},
            "weights": {"loop": 0.9},
            "thresholds": {"loop_repeats": 4},
            "limits": {"token_budget": 20000},
            "handoff_tools": ["page_human"],
            "review_budget_per_day": 10,
            "review_strategies": ["signal", "random"],
        },
        content_type="application/json",
    )

    assert empty.status_code == 200
    assert empty.json()["updated_at"] is None
    assert empty.json()["effective_weights"]["loop"] == 0.6
    assert saved.status_code == 200, saved.content
    body = saved.json()
    assert (body["effective_weights"]["loop"], body["effective_thresholds"]["loop_repeats"]) == (0.9, 4)
    assert body["recomputing"] == 6
    assert client.get("/api/v1/agents/ride-support/triage-settings").json()["phrases"] == {
        "en": {"quit": {"mode": "extend", "phrases": ["i'm out"]}}
    }


def test_invalid_settings_are_a_422_naming_the_field(workspace, agents, api_client_for):
    response = api_client_for(workspace).put(
        "/api/v1/agents/ride-support/triage-settings",
        {"weights": {"vibes": 0.5}},
        content_type="application/json",
    )

    assert response.status_code == 422
    assert response.json()["code"] == "triage_settings_invalid"
    assert response.json()["errors"] == [{"field": "weights.vibes", "message": "unknown signal"}]
    assert TriageSettings.objects.count() == 0


def test_draw_a_sample_review_an_item_and_read_informativeness(workspace, agents, api_client_for):
    client = api_client_for(workspace)

    drawn = client.post(
        "/api/v1/review/samples", {"strategy": "signal", "budget": 5, "hours": 24}, content_type="application/json"
    )
    assert drawn.status_code == 201, drawn.content
    sample = drawn.json()
    assert (sample["strategy"], sample["item_count"]) == ("signal", 3)
    assert all(item["signal_names"] == ["loop"] for item in sample["items"])
    decided = client.put(
        f"/api/v1/review/items/{sample['items'][0]['id']}",
        {"status": "reviewed", "informative": True, "failure_mode": "loop", "note": "same call thrice"},
        content_type="application/json",
    )
    report = client.get("/api/v1/review/informativeness").json()

    assert decided.status_code == 200
    assert (decided.json()["status"], decided.json()["informative"]) == ("reviewed", True)
    assert report["overall"] == [
        {
            "strategy": "signal",
            "label": "Signal-based",
            "reviewed": 1,
            "informative": 1,
            "share": 1.0,
            "ci_low": pytest.approx(0.2065, abs=1e-4),
            "ci_high": 1.0,
        }
    ]
    assert report["by_agent"][0]["agent"] == "ride-support"
    assert report["signal_vs_random"]["verdict"] == "needs_reviews"
    assert client.get(f"/api/v1/review/samples/{sample['id']}").json()["reviewed_count"] == 1
    assert [row["id"] for row in client.get("/api/v1/review/samples").json()] == [sample["id"]]
    assert "reward_hacking" in [mode["value"] for mode in client.get("/api/v1/review/failure-modes").json()]


def test_a_window_start_without_an_offset_is_utc(workspace, agents, api_client_for):
    """Only the start given: the end is now, with an offset; a start without one is read as UTC, not a 500."""
    client = api_client_for(workspace)
    start = (NOW - timedelta(hours=2)).astimezone(UTC).replace(tzinfo=None, microsecond=0)

    drawn = client.post(
        "/api/v1/review/samples",
        {"strategy": "random", "budget": 10, "window_start": start.isoformat()},
        content_type="application/json",
    )

    assert drawn.status_code == 201, drawn.content
    assert datetime.fromisoformat(drawn.json()["window_start"]) == start.replace(tzinfo=UTC)
    assert drawn.json()["item_count"] == 6


def test_without_a_key_every_endpoint_is_401(agents):
    client = Client()
    before = _state()

    assert client.get("/api/v1/agents/ride-support/triage-settings").status_code == 401
    assert (
        client.put("/api/v1/agents/ride-support/triage-settings", {}, content_type="application/json").status_code
        == 401
    )
    assert client.get("/api/v1/review/samples").status_code == 401
    assert (
        client.post("/api/v1/review/samples", {"strategy": "random"}, content_type="application/json").status_code
        == 401
    )
    assert client.get("/api/v1/review/informativeness").status_code == 401
    assert _state() == before


def test_a_read_key_cannot_write(workspace, agents, api_client_for):
    client = api_client_for(workspace, scopes=["read"])
    before = _state()

    settings = client.put("/api/v1/agents/ride-support/triage-settings", {}, content_type="application/json")
    sample = client.post("/api/v1/review/samples", {"strategy": "random"}, content_type="application/json")

    assert (settings.status_code, sample.status_code) == (403, 403)
    assert settings.json()["code"] == "insufficient_scope"
    assert _state() == before


def test_another_workspaces_rows_are_not_found(workspace, other_workspace, agents, api_client_for):
    _, theirs = agents
    their_sample = triage.review_sample_create(
        workspace=other_workspace,
        agent=theirs,
        strategy="random",
        window_start=NOW - timedelta(days=1),
        window_end=NOW,
        budget=3,
    )
    their_item = their_sample.items.first()
    assert their_item is not None
    client = api_client_for(workspace)
    before = _state()

    assert client.get(f"/api/v1/review/samples/{their_sample.pk}").status_code == 404
    decided = client.put(
        f"/api/v1/review/items/{their_item.pk}", {"status": "skipped"}, content_type="application/json"
    )
    assert decided.status_code == 404
    assert client.get("/api/v1/review/samples").json() == []
    assert client.get("/api/v1/review/informativeness", {"agent": "nobody"}).status_code == 404
    assert _state() == before


def test_a_key_limited_to_an_agent_sees_only_that_agents_queues(workspace, agents, api_client_for):
    shop = AgentFactory.create(workspace=workspace, slug="shopping")
    triage.review_sample_create(
        workspace=workspace, strategy="random", window_start=NOW - timedelta(days=1), window_end=NOW, budget=3
    )
    limited = api_client_for(workspace, agents=[shop])
    before = _state()

    assert limited.get("/api/v1/review/samples").json() == []
    assert limited.get("/api/v1/agents/ride-support/triage-settings").status_code == 404
    workspace_wide = limited.post("/api/v1/review/samples", {"strategy": "random"}, content_type="application/json")
    assert workspace_wide.status_code == 403
    assert _state() == before
    own = limited.post(
        "/api/v1/review/samples", {"strategy": "random", "agent": "shopping"}, content_type="application/json"
    )
    assert own.status_code == 201
    assert own.json()["agent"] == "shopping"
