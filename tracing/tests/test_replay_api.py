"""The replay API: create, read, list, diff; refusals; two workspaces."""

from __future__ import annotations

from typing import Any

import pytest

from agent_registry.tests.factories import AgentFactory
from tracing import replay
from tracing.models import Replay
from tracing.tests.replay_fakes import (
    ANSWER,
    Recorded,
    call,
    refund_recorded,
    say,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def client(workspace, api_client_for):
    return api_client_for(workspace)


def _replays_url(recorded: Recorded) -> str:
    return f"/api/v1/trajectories/{recorded.trajectory.trace_id}/replays"


def _create(client, recorded: Recorded, **body: Any) -> dict[str, Any]:
    response = client.post(_replays_url(recorded), {"from_step": 3, **body}, content_type="application/json")
    assert response.status_code == 202, response.json()
    created: dict[str, Any] = response.json()
    return created


def test_a_replay_is_accepted_with_202_and_queued(client, recorded, workspace):
    response = client.post(
        _replays_url(recorded),
        {
            "from_step": 3,
            "prompt_version": {"name": "ride-support/system", "version": 2},
            "divergence": "stub",
            "stub_result": {"status": "unknown"},
            "max_steps": 6,
        },
        content_type="application/json",
    )

    assert response.status_code == 202
    body = response.json()
    created = Replay.objects.get(workspace=workspace)
    assert body == {
        "id": created.pk,
        "status": "pending",
        "original_trace_id": recorded.trajectory.trace_id,
        "replay_trace_id": None,
        "from_step": 3,
        "prompt_version": {"name": "ride-support/system", "version": 2},
        "model": "",
        "divergence_policy": "stub",
        "stub_result": {"status": "unknown"},
        "max_steps": 6,
        "progress": {"steps_done": 0, "steps_planned": 3},
        "divergence": None,
        "error": "",
        "attempts": 0,
        "created_at": body["created_at"],
        "claimed_at": None,
        "finished_at": None,
    }
    assert created.prompt_version == recorded.version_2
    assert created.created_via_key is not None
    assert created.created_via_key.workspace == workspace


def test_a_finished_replay_reads_with_its_progress_new_trace_and_diff(client, recorded, fake_llm):
    fake_llm.script = [call("lookup_trip", {"trip_id": "T9"})]
    created = _create(client, recorded, prompt_version={"name": "ride-support/system", "version": 2})
    replay.replay_execute(replay_id=created["id"])

    body = client.get(f"/api/v1/replays/{created['id']}").json()
    listed = client.get(_replays_url(recorded)).json()
    diff = client.get(f"/api/v1/replays/{created['id']}/diff").json()

    finished = Replay.objects.get(pk=created["id"])
    assert (body["status"], body["progress"]) == ("stopped_divergence", {"steps_done": 1, "steps_planned": 1})
    assert body["replay_trace_id"] == finished.trace_id
    assert body["divergence"] == {"step": 3, "tool_name": "lookup_trip", "arguments": {"trip_id": "T9"}}
    assert body["finished_at"] is not None
    assert [item["id"] for item in listed] == [created["id"]]
    assert (diff["replay_id"], diff["original_trace_id"], diff["replay_trace_id"]) == (
        created["id"],
        recorded.trajectory.trace_id,
        finished.trace_id,
    )
    assert (diff["original_start"], diff["replay_start"], diff["first_difference"]) == (3, 3, 3)
    assert diff["steps"][3] == {
        "status": "changed",
        "replayed": True,
        "original_index": 3,
        "replay_index": 3,
        "kind": "llm_call",
        "label": "assistant",
        "changes": [
            {
                "field": "tool_calls",
                "original": [{"name": "lookup_trip", "arguments": {"trip_id": "T1"}}],
                "replay": [{"name": "lookup_trip", "arguments": {"trip_id": "T9"}}],
            }
        ],
    }
    assert diff["totals"]["original"]["llm_calls"] == 3
    assert diff["totals"]["replay"]["llm_calls"] == 1
    new_trajectory = client.get(f"/api/v1/trajectories/{finished.trace_id}").json()
    assert new_trajectory["replay_of"] == recorded.trajectory.trace_id
    assert "replay" in new_trajectory["tags"]


def test_replays_are_listed_newest_first(client, recorded):
    first = _create(client, recorded)
    second = _create(client, recorded, from_step=5, model="fake-replay/bigger")

    listed = client.get(_replays_url(recorded)).json()

    assert [(item["id"], item["from_step"], item["model"]) for item in listed] == [
        (second["id"], 5, "fake-replay/bigger"),
        (first["id"], 3, ""),
    ]


def test_an_unknown_step_is_422_and_nothing_is_stored(client, recorded):
    response = client.post(_replays_url(recorded), {"from_step": 42}, content_type="application/json")

    assert response.status_code == 422
    assert response.json() == {
        "detail": "the trajectory has no step 42 (it has steps 0 to 7)",
        "code": "replay_step_not_found",
        "errors": [{"field": "from_step", "message": "the trajectory has no step 42 (it has steps 0 to 7)"}],
    }
    assert not Replay.objects.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"from_step": -1}, "from_step"),
        ({}, "from_step"),
        ({"from_step": 3, "divergence": "ask"}, "divergence"),
        ({"from_step": 3, "max_steps": 0}, "max_steps"),
        ({"from_step": 3, "model": ""}, "model"),
        ({"from_step": 3, "prompt_version": {"name": "ride-support/system"}}, "prompt_version.version"),
    ],
)
def test_a_malformed_body_is_422_and_nothing_is_stored(client, recorded, body, field):
    response = client.post(_replays_url(recorded), body, content_type="application/json")

    assert response.status_code == 422
    assert response.json()["code"] == "validation_error"
    assert [error["field"] for error in response.json()["errors"]] == [field]
    assert not Replay.objects.exists()


def test_missing_prompt_variables_are_422(client, workspace):
    recorded = refund_recorded(workspace, metadata={})

    response = client.post(
        _replays_url(recorded),
        {"from_step": 3, "prompt_version": {"name": "ride-support/system", "version": 2}},
        content_type="application/json",
    )

    assert response.status_code == 422
    assert response.json()["code"] == "missing_variables"
    assert not Replay.objects.exists()


def test_an_unknown_prompt_version_is_404(client, recorded):
    response = client.post(
        _replays_url(recorded),
        {"from_step": 3, "prompt_version": {"name": "ride-support/system", "version": 9}},
        content_type="application/json",
    )

    assert (response.status_code, response.json()["code"]) == (404, "prompt_version_not_found")
    assert not Replay.objects.exists()


def test_the_diff_of_an_unfinished_replay_is_409(client, recorded):
    created = _create(client, recorded)

    response = client.get(f"/api/v1/replays/{created['id']}/diff")

    assert response.status_code == 409
    assert response.json() == {
        "detail": f"replay {created['id']} has no trajectory to compare yet (it is pending)",
        "code": "replay_conflict",
    }


def test_an_unknown_replay_is_404(client):
    response = client.get("/api/v1/replays/999999")

    assert response.status_code == 404
    assert response.json() == {"detail": "no replay 999999", "code": "replay_not_found"}


def test_creating_a_replay_needs_the_write_scope(recorded, workspace, api_client_for):
    reader = api_client_for(workspace, scopes=("read",))

    response = reader.post(_replays_url(recorded), {"from_step": 3}, content_type="application/json")

    assert (response.status_code, response.json()["code"]) == (403, "insufficient_scope")
    assert not Replay.objects.exists()


def test_another_workspace_sees_none_of_it(client, recorded, other_workspace, api_client_for, fake_llm):
    fake_llm.script = [say(ANSWER)]
    created = _create(client, recorded, from_step=7)
    replay.replay_execute(replay_id=created["id"])
    theirs = api_client_for(other_workspace)

    refused = theirs.post(_replays_url(recorded), {"from_step": 3}, content_type="application/json")
    # Now the same trajectory, trace id and all, in their workspace too: ours stay out of their sight.
    refund_recorded(other_workspace)
    listed = theirs.get(_replays_url(recorded))
    read = theirs.get(f"/api/v1/replays/{created['id']}")
    diff = theirs.get(f"/api/v1/replays/{created['id']}/diff")

    assert (refused.status_code, refused.json()["code"]) == (404, "trajectory_not_found")
    assert (listed.status_code, listed.json()) == (200, [])
    assert (read.status_code, read.json()["code"]) == (404, "replay_not_found")
    assert (diff.status_code, diff.json()["code"]) == (404, "replay_not_found")
    assert Replay.objects.count() == 1


def test_a_key_limited_to_another_agent_does_not_see_the_replay(client, recorded, workspace, api_client_for):
    created = _create(client, recorded)
    other_agent = AgentFactory.create(workspace=workspace, slug="billing")
    limited = api_client_for(workspace, agents=[other_agent])

    assert limited.get(f"/api/v1/replays/{created['id']}").status_code == 404
    assert limited.get(_replays_url(recorded)).status_code == 404
