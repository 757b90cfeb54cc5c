"""The replay page as a user watches it: the header's status follows the run, and a replay stopped at a
divergence asks for a stub to run again with."""

from __future__ import annotations

import json
import re

import pytest
from django.test import Client

from agent_registry.models import Membership, Role, Workspace
from agent_registry.tests.factories import MembershipFactory, UserFactory
from tracing import replay
from tracing.models import Replay
from tracing.tests.replay_fakes import call, say

pytestmark = pytest.mark.django_db


def _client(workspace: Workspace, role: Role) -> Client:
    membership: Membership = MembershipFactory.create(workspace=workspace, user=UserFactory.create(), role=role)
    client = Client()
    client.force_login(membership.user)
    return client


def _url(found: Replay) -> str:
    return f"/w/{found.workspace.slug}/replays/{found.pk}/"


def test_the_headers_status_follows_the_replay_while_the_page_polls(recorded, workspace, fake_llm):
    client = _client(workspace, Role.MEMBER)
    created = replay.replay_create(original=recorded.trajectory, from_step=7)
    page = client.get(_url(created)).content.decode()
    fake_llm.script = [say("Refunded.")]
    replay.replay_execute(replay_id=created.pk)

    partial = client.get(_url(created), headers={"HX-Request": "true"}).content.decode()

    assert '<span id="replay-status-badge" class="badge badge-replay-pending" data-replay-status>Pending</span>' in page
    assert '<h2 id="progress-title">Pending</h2>' in page  # not "Running" before a worker took it
    # The poll's answer replaces the header's badge too (out of band), or it would say "Pending" forever.
    assert (
        '<span id="replay-status-badge" class="badge badge-replay-done" data-replay-status hx-swap-oob="true">'
        "Done</span>"
    ) in partial


def _offered(page: str) -> dict[str, str]:
    """The hidden fields of the page's "run again with this stub" form."""
    form = re.search(r"<form [^>]*data-replay-stub-form>(.*?)</form>", page, re.S)
    assert form is not None, "the page offers no stub form"
    fields = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', form.group(1)))
    fields.pop("csrfmiddlewaretoken", None)  # the test client does not check it
    return fields


def test_a_replay_stopped_at_a_divergence_asks_for_a_stub_and_runs_again_with_it(recorded, workspace, fake_llm):
    client = _client(workspace, Role.MEMBER)
    fake_llm.script = [call("lookup_trip", {"trip_id": "T2"})]
    stopped = replay.replay_execute(
        replay_id=replay.replay_create(
            original=recorded.trajectory, from_step=3, prompt_version=recorded.version_2, model="fake-replay/bigger"
        ).pk
    )
    assert stopped is not None
    assert stopped.status == "stopped_divergence"

    offered = _offered(client.get(_url(stopped)).content.decode())
    response = client.post(
        f"/w/{workspace.slug}/trajectories/{recorded.trajectory.trace_id}/replays/",
        {**offered, "stub_result": '{"trip_id": "T2", "status": "completed"}'},
    )

    assert offered == {
        "from_step": "3",
        "prompt_version": "ride-support/system:2",
        "model": "fake-replay/bigger",
        "max_steps": "20",
        "divergence": "stub",
    }
    again = Replay.objects.exclude(pk=stopped.pk).get()
    assert response.status_code == 302
    assert response["Location"] == _url(again)
    assert (again.from_step, again.prompt_version, again.model, again.divergence_policy, again.stub_result) == (
        3,
        recorded.version_2,
        "fake-replay/bigger",
        "stub",
        {"trip_id": "T2", "status": "completed"},
    )
    fake_llm.script = [call("lookup_trip", {"trip_id": "T2"}), say("Trip T2 is completed.")]
    finished = replay.replay_execute(replay_id=again.pk)
    assert finished is not None
    assert finished.status == "done"
    assert json.loads(fake_llm.requests[-1].messages[-1]["content"]) == {"trip_id": "T2", "status": "completed"}


def test_a_viewer_is_not_offered_the_stub_form(recorded, workspace, fake_llm):
    fake_llm.script = [call("lookup_trip", {"trip_id": "T2"})]
    stopped = replay.replay_execute(replay_id=replay.replay_create(original=recorded.trajectory, from_step=3).pk)
    assert stopped is not None

    page = _client(workspace, Role.VIEWER).get(_url(stopped)).content.decode()

    assert "Stopped at a divergence" in page
    assert "data-replay-stub-form" not in page
