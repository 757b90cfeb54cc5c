"""Replays from the dashboard: starting one from a step, its progress while it runs, and the side-by-side
diff once done. The model is a fake litellm provider (tracing.tests.replay_fakes); nothing reaches the
network."""

from __future__ import annotations

import pytest
from opentelemetry import trace

from agent_registry import services as registry_services
from agent_registry.tests.factories import AgentFactory
from frontend.tests import traces
from frontend.tests.conftest import db_state
from tracing import demo, replay
from tracing.models import Replay, ReplayStatus
from tracing.tests.replay_fakes import call, fake_provider, network_forbid, say

pytestmark = pytest.mark.django_db


@pytest.fixture
def fake_llm(monkeypatch):
    network_forbid(monkeypatch)
    with fake_provider() as fake:
        yield fake


def _start(client, tenant, **data):
    """The tenant's trajectory: 0 agent, 1 system, 2 user, 3 LLM call → 4 lookup_trip, 5 LLM call (the answer)."""
    form = {"from_step": "3", "prompt_version": "", "model": "", "divergence": "stop", "max_steps": "5", **data}
    return client.post(f"/w/{tenant.workspace.slug}/trajectories/{tenant.trajectory.trace_id}/replays/", form)


def test_a_member_starts_a_replay_from_a_step(tenant, member_client):
    response = _start(member_client, tenant, prompt_version="support/triage:2", model="fake-replay/cheaper")

    created = Replay.objects.exclude(pk=tenant.replay.pk).get()
    assert response.status_code == 302
    assert response["Location"] == f"/w/{tenant.workspace.slug}/replays/{created.pk}/"
    assert (created.original, created.from_step, created.model, created.divergence_policy, created.max_steps) == (
        tenant.trajectory,
        3,
        "fake-replay/cheaper",
        "stop",
        5,
    )
    assert created.prompt_version is not None
    assert (created.prompt_version.prompt, created.prompt_version.version) == (tenant.prompt, 2)
    assert created.created_by is not None
    assert created.created_by.username == "mia"
    assert created.status == ReplayStatus.PENDING


def test_a_running_replay_page_polls_every_second(tenant, member_client):
    page = member_client.get(f"/w/{tenant.workspace.slug}/replays/{tenant.replay.pk}/")
    partial = member_client.get(
        f"/w/{tenant.workspace.slug}/replays/{tenant.replay.pk}/", headers={"HX-Request": "true"}
    )

    assert page.status_code == 200
    assert 'hx-trigger="every 1s"' in page.content.decode()
    assert "Waiting for a worker" in page.content.decode()
    assert partial.content.decode().lstrip().startswith('<div id="replay-status" hx-get=')
    assert "<html" not in partial.content.decode()


def test_a_finished_replay_shows_where_it_parts_from_the_original(tenant, member_client, fake_llm):
    _start(member_client, tenant, model="fake-replay/cheaper")
    created = Replay.objects.exclude(pk=tenant.replay.pk).get()
    fake_llm.script = [call("lookup_trip", {"trip_id": "T-1"}), say("Your refund is on its way.")]

    replay.replay_execute(replay_id=created.pk)
    created.refresh_from_db()
    url = f"/w/{tenant.workspace.slug}/replays/{created.pk}/"
    partial = member_client.get(url, headers={"HX-Request": "true"})
    page = member_client.get(url)
    content = page.content.decode()

    assert created.status == ReplayStatus.DONE
    assert created.replay_trajectory is not None
    assert 'hx-trigger="every 1s"' not in partial.content.decode()
    assert "Original and replay, side by side" in partial.content.decode()
    replayed = page.context["replayed"]
    assert [(row.pair.status, row.pair.label) for row in replayed] == [
        ("same", "assistant"),
        ("same", "tool lookup_trip"),
        ("changed", "assistant"),
    ]
    assert [row.is_first_difference for row in replayed] == [False, False, True]
    assert "They part here" in content
    assert "Your refund is on its way." in content
    assert "I refunded the duplicate charge." in content
    # Links both ways: to the original and the replay's trajectory, and back from each.
    original_url = f"/w/{tenant.workspace.slug}/trajectories/{tenant.trajectory.trace_id}/"
    replay_url = f"/w/{tenant.workspace.slug}/trajectories/{created.replay_trajectory.trace_id}/"
    assert original_url in content
    assert replay_url in content
    assert f'href="{url}">replay {created.pk}</a>' in member_client.get(original_url).content.decode()
    replay_page = member_client.get(replay_url).content.decode()
    assert f'href="{url}">replay {created.pk}</a>' in replay_page
    assert "Replay of" in replay_page


def test_a_replay_that_diverges_says_so(tenant, member_client, fake_llm):
    _start(member_client, tenant, model="fake-replay/cheaper")
    created = Replay.objects.exclude(pk=tenant.replay.pk).get()
    fake_llm.script = [call("issue_refund", {"trip_id": "T-1", "amount_usd": 99})]

    replay.replay_execute(replay_id=created.pk)
    content = member_client.get(f"/w/{tenant.workspace.slug}/replays/{created.pk}/").content.decode()

    assert "Stopped at a divergence" in content
    assert "the model called <code>issue_refund</code> with arguments the recording never saw" in content
    assert "&quot;amount_usd&quot;: 99" in content


def test_the_prompt_versions_offered_are_the_trajectory_agents(tenant, member_client):
    other_agent = AgentFactory.create(workspace=tenant.workspace, slug="other")
    registry_services.prompt_create(agent=other_agent, name="other/system", type="text", template="Hi")
    before = db_state()

    page = member_client.get(f"/w/{tenant.workspace.slug}/trajectories/{tenant.trajectory.trace_id}/")
    refused = _start(member_client, tenant, prompt_version="other/system:1")

    choices = [value for value, _ in page.context["replay_form"].fields["prompt_version"].choices]
    assert choices == ["", "support/triage:2", "support/triage:1", "support/welcome:1"]
    assert refused.status_code == 422
    assert db_state() == before
    assert "Select a valid choice" in refused.context["replay_form"].errors["prompt_version"][0]


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        ({"from_step": "99"}, "from_step", "the trajectory has no step 99"),
        ({"from_step": "-1"}, "from_step", "greater than or equal to 0"),
        ({"stub_result": '{"ok": true}'}, "stub_result", 'served only under the divergence policy "stub"'),
        ({"divergence": "stub", "stub_result": "{not json"}, "stub_result", "Not valid JSON"),
        ({"max_steps": "500"}, "max_steps", "less than or equal to 50"),
        ({"divergence": "guess"}, "divergence", "Select a valid choice"),
    ],
)
def test_an_invalid_replay_is_refused_and_nothing_is_stored(tenant, member_client, data, field, message):
    before = db_state()

    response = _start(member_client, tenant, **data)

    assert response.status_code == 422
    assert db_state() == before
    assert any(message in error for error in response.context["replay_form"].errors[field])


def test_a_trajectory_still_running_cannot_be_replayed(tenant, member_client):
    recorder = demo.Recorder("ride-support")
    recorder.ids.begin("unfinished")
    root = recorder.tracer.start_span("invoke_agent ride-support")
    with trace.use_span(root, end_on_exit=False):
        recorder.tracer.start_span(
            "chat gpt-4o", attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o"}
        ).end()
    traces.ingest(tenant.workspace, recorder)
    before = db_state()

    response = member_client.post(
        f"/w/{tenant.workspace.slug}/trajectories/{demo.trace_hex('unfinished')}/replays/",
        {"from_step": "0", "divergence": "stop"},
    )

    assert response.status_code == 422
    assert db_state() == before
    assert "is still running" in response.context["replay_form"].non_field_errors()[0]


def test_a_viewer_cannot_start_a_replay_and_nothing_changes(tenant, viewer_client):
    before = db_state()

    response = _start(viewer_client, tenant)

    assert response.status_code == 403
    assert db_state() == before
