"""A session's totals, as the API's list and detail and the dashboard's pages give them, against its turns."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.test import Client

from agent_registry.models import Agent, Role
from agent_registry.tests.factories import AgentFactory, MembershipFactory, UserFactory
from frontend.templatetags.keel import usd
from tracing.models import Trajectory
from tracing.tests.agent_traces import refund_conversation

pytestmark = pytest.mark.django_db

# One refund conversation: gpt-4o calls of 100 + 160 input and 20 + 30 output tokens.
TURN_COST = Decimal("0.00115000")


@pytest.fixture
def turns(otel, workspace, other_workspace):
    AgentFactory.create(workspace=workspace, slug="ride-support")
    AgentFactory.create(workspace=workspace, slug="shopping")
    tracer = otel.tracer()
    ids = [
        refund_conversation(tracer, session="s-1"),
        refund_conversation(tracer, session="s-1", tool_fails=True),
        refund_conversation(tracer, session="s-1", agent="shopping"),
        refund_conversation(tracer, session="s-2"),
    ]
    otel.ingest(workspace)
    refund_conversation(tracer, session="s-1")
    otel.ingest(other_workspace)
    return ids


def test_a_sessions_totals_are_the_sums_of_its_turns_in_the_list_and_the_detail(turns, workspace, api_client_for):
    client = api_client_for(workspace, scopes=["read"])

    listed = {session["session_id"]: session for session in client.get("/api/v1/sessions").json()}
    detail = client.get("/api/v1/sessions/s-1").json()

    s1 = listed["s-1"]
    assert (s1["trajectory_count"], s1["total_tokens"], s1["cost_usd"], s1["error_count"]) == (
        3,
        930,
        "0.00345000",
        1,
    )
    assert [turn["trace_id"] for turn in detail["trajectories"]] == turns[:3]
    assert sum(turn["tokens"]["total"] for turn in detail["trajectories"]) == s1["total_tokens"]
    assert sum(Decimal(turn["cost"]) for turn in detail["trajectories"]) == Decimal(s1["cost_usd"]) == 3 * TURN_COST
    assert sum(turn["errors"] for turn in detail["trajectories"]) == s1["error_count"]
    assert (listed["s-2"]["trajectory_count"], listed["s-2"]["cost_usd"]) == (1, "0.00115000")


def test_a_key_for_one_agent_sees_the_sessions_totals_of_that_agents_turns(turns, workspace, api_client_for):
    shopping = Agent.objects.get(workspace=workspace, slug="shopping")
    client = api_client_for(workspace, scopes=["read"], agents=[shopping])

    listed = client.get("/api/v1/sessions").json()
    detail = client.get("/api/v1/sessions/s-1").json()

    assert [(s["session_id"], s["trajectory_count"], s["cost_usd"]) for s in listed] == [("s-1", 1, "0.00115000")]
    assert [turn["trace_id"] for turn in detail["trajectories"]] == [turns[2]]


def test_the_dashboards_session_pages_show_the_same_totals(turns, workspace):
    user = UserFactory.create(username="fin")
    MembershipFactory.create(workspace=workspace, user=user, role=Role.VIEWER)
    client = Client()
    client.force_login(user)

    listed = client.get(f"/w/{workspace.slug}/sessions/")
    detail = client.get(f"/w/{workspace.slug}/sessions/s-1/")

    (s1,) = [session for session in listed.context["sessions"] if session.session_id == "s-1"]
    assert (s1.trajectory_count, s1.total_tokens, s1.cost_usd, s1.error_count) == (3, 930, 3 * TURN_COST, 1)
    assert (detail.context["total_tokens"], detail.context["cost_usd"], detail.context["error_count"]) == (
        930,
        3 * TURN_COST,
        1,
    )
    assert Trajectory.objects.filter(workspace=workspace, session_id="s-1").count() == 3
    shown = usd(3 * TURN_COST)
    assert shown in listed.content.decode()
    assert shown in detail.content.decode()
