"""Costs on the dashboard when a model has no price: "—" with the reason when nothing was priced, the priced part
"+ N unpriced" when some was, never a $0 that reads as free. Trajectories are recorded with the OpenTelemetry SDK
(tracing.demo's recorder) and stored through ingest."""

from __future__ import annotations

import html
import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.test import Client
from django.utils import timezone

from agent_registry.models import Role
from agent_registry.tests.factories import AgentFactory, MembershipFactory, UserFactory
from frontend.templatetags.keel import unpriced_note, usd
from frontend.tests import traces
from tracing import demo
from tracing.models import Trajectory

pytestmark = pytest.mark.django_db

SELF_HOSTED = "acme/support-llama-8b"
ON_PREMISES = demo.AgentSpec(
    slug="on-prem",
    model=SELF_HOSTED,
    prompt_name="on-prem/system",
    variables={},
    tools=demo.RIDE_TOOLS,
    model_ms=(100, 200),
)
DARK_NOTE = (
    f"No price for model {SELF_HOSTED}: 2 model calls without a cost. A price added later prices new calls only."
)
MIXED_NOTE = (
    f"No price for model {SELF_HOSTED}: 2 model calls without a cost, not in this sum. "
    "A price added later prices new calls only."
)


def _mixed(workspace, key: str) -> Trajectory:
    """A gpt-4o agent that hands a question to a sub-agent on the self-hosted model (two calls)."""
    recorder = demo.Recorder(traces.SUPPORT.slug)
    recorder.ids.begin(key)
    dialogue = demo.Dialogue(
        agent=traces.SUPPORT,
        session_id="s-mixed",
        user_id="rider-1",
        system_prompt="You are ride support.",
        prompt_version=1,
    )
    turn = demo.Turn(recorder, dialogue, demo.Dice(key), timezone.now() - timedelta(minutes=3))
    with turn.agent_run(tags=["refund"]):
        turn.user("Is the surge fee on trip T-9 refundable?")
        turn.delegate(
            "policy-checker",
            "You check refund eligibility.",
            "Surge fee on T-9 charged in error. Eligible?",
            "search_policy",
            {"topic": "surge fee"},
            {"section": "4.5", "text": "Refunded in full."},
            "Eligible: refunded in full.",
            model=SELF_HOSTED,
        )
        turn.answer("Yes, I've refunded the surge fee.")
    traces.ingest(workspace, recorder)
    return Trajectory.objects.get(workspace=workspace, trace_id=demo.trace_hex(key))


@pytest.fixture
def costs(workspace):
    AgentFactory.create(workspace=workspace, slug="ride-support", name="Ride support")
    AgentFactory.create(workspace=workspace, slug="on-prem", name="On premises")
    priced = traces.conversation(
        workspace, "priced", session="s-priced", started_at=timezone.now() - timedelta(hours=1)
    )
    dark = traces.conversation(workspace, "dark", session="s-dark", agent=ON_PREMISES)
    mixed = _mixed(workspace, "mixed")
    return priced, dark, mixed


@pytest.fixture
def client(workspace):
    user = UserFactory.create(username="fin")
    MembershipFactory.create(workspace=workspace, user=user, role=Role.VIEWER)
    client = Client()
    client.force_login(user)
    return client


def _row(page: str, trace_id: str) -> str:
    rows: list[str] = re.findall(r"<tr[ >].*?</tr>", page, re.S)
    (row,) = [row for row in rows if trace_id[:8] in row]
    return row


def test_the_stored_figures_the_pages_show(costs):
    priced, dark, mixed = costs
    assert (priced.cost_usd is not None and priced.cost_usd > 0, priced.unpriced_call_count) == (True, 0)
    assert (dark.cost_usd, dark.unpriced_call_count, dark.unpriced_models) == (None, 2, [SELF_HOSTED])
    assert mixed.cost_usd is not None
    assert mixed.cost_usd > 0
    assert (mixed.unpriced_call_count, mixed.unpriced_models) == (2, [SELF_HOSTED])


def test_the_list_shows_a_dash_with_the_reason_for_no_price_and_the_priced_part_plus_the_unpriced_calls(
    costs, client, workspace
):
    priced, dark, mixed = costs

    page = client.get(f"/w/{workspace.slug}/trajectories/").content.decode()

    dark_row, mixed_row, priced_row = (_row(page, t.trace_id) for t in (dark, mixed, priced))
    assert f'title="{html.escape(DARK_NOTE)}"' in dark_row
    assert ">—<" in dark_row
    assert "$0<" not in dark_row
    assert f'title="{html.escape(MIXED_NOTE)}"' in mixed_row
    assert f"{usd(mixed.cost_usd)} + 2 unpriced" in mixed_row
    assert usd(priced.cost_usd) in priced_row
    assert "unpriced" not in priced_row


def test_ordering_by_cost_on_the_dashboard_leaves_the_unknown_cost_last(costs, client, workspace):
    priced, dark, mixed = costs
    expensive_first = sorted((priced, mixed), key=lambda t: t.cost_usd or Decimal(0), reverse=True)

    for order, expected in (("-cost", [*expensive_first, dark]), ("cost", [*reversed(expensive_first), dark])):
        page = client.get(f"/w/{workspace.slug}/trajectories/?order={order}").context["page"]
        assert [t.trace_id for t in page.items] == [t.trace_id for t in expected]


def test_the_trajectory_page_says_which_model_has_no_price(costs, client, workspace):
    _, dark, mixed = costs

    dark_page = client.get(f"/w/{workspace.slug}/trajectories/{dark.trace_id}/").content.decode()
    mixed_page = client.get(f"/w/{workspace.slug}/trajectories/{mixed.trace_id}/").content.decode()

    assert f'title="{html.escape(DARK_NOTE)}"' in dark_page
    assert f"no price for {SELF_HOSTED}" in dark_page
    assert f"{usd(mixed.cost_usd)} + 2 unpriced" in mixed_page


def test_the_session_pages_show_an_unknown_cost_as_unknown(costs, client, workspace):
    _, _, mixed = costs

    listed = client.get(f"/w/{workspace.slug}/sessions/")
    dark_session = client.get(f"/w/{workspace.slug}/sessions/s-dark/")
    mixed_session = client.get(f"/w/{workspace.slug}/sessions/s-mixed/")

    sessions = {session.session_id: session for session in listed.context["sessions"]}
    assert (sessions["s-dark"].cost_usd, sessions["s-dark"].unpriced_calls) == (None, 2)
    assert (sessions["s-mixed"].cost_usd, sessions["s-mixed"].unpriced_calls) == (mixed.cost_usd, 2)
    assert (sessions["s-priced"].unpriced_calls, "s-priced" in sessions) == (0, True)
    assert (sessions["s-dark"].unpriced_models, sessions["s-priced"].unpriced_models) == ((SELF_HOSTED,), ())
    listed_page = listed.content.decode()
    assert f"{usd(mixed.cost_usd)} + 2 unpriced" in listed_page
    assert f'title="{html.escape(DARK_NOTE)}"' in listed_page  # the tooltip names the model, as on the session page
    assert (dark_session.context["cost_usd"], dark_session.context["unpriced_calls"]) == (None, 2)
    assert dark_session.context["unpriced_models"] == [SELF_HOSTED]
    assert f'title="{html.escape(DARK_NOTE)}"' in dark_session.content.decode()
    assert mixed_session.context["cost_usd"] == mixed.cost_usd
    assert f"{usd(mixed.cost_usd)} + 2 unpriced" in mixed_session.content.decode()


@pytest.mark.parametrize(
    ("calls", "models", "cost", "note"),
    [
        (1, [], None, "1 model call without a cost. A price added later prices new calls only."),
        (
            3,
            ["a", "b"],
            Decimal("0.01"),
            "No price for models a, b: 3 model calls without a cost, not in this sum. "
            "A price added later prices new calls only.",
        ),
    ],
)
def test_the_note_names_the_models_when_it_knows_them(calls, models, cost, note):
    assert unpriced_note(calls, models, cost) == note


def test_the_home_pages_total_cost_counts_the_unpriced_calls_beside_the_priced_sum(costs, client, workspace):
    priced, _, mixed = costs  # the third, unpriced throughout, adds its 2 calls to the count

    page = client.get(f"/w/{workspace.slug}/").content.decode()

    card = page[page.index("Total cost") :][:1200]
    assert f"{usd(priced.cost_usd + mixed.cost_usd)} + 4 unpriced" in card
    assert "4 model calls without a cost, not in this sum" in card


def test_the_home_pages_total_cost_is_unknown_when_no_call_was_priced(client, workspace):
    AgentFactory.create(workspace=workspace, slug="on-prem", name="On premises")
    traces.conversation(workspace, "dark", session="s-dark", agent=ON_PREMISES)

    page = client.get(f"/w/{workspace.slug}/").content.decode()

    card = page[page.index("Total cost") :][:1200]
    assert ">—<" in card
    assert "$0<" not in card
