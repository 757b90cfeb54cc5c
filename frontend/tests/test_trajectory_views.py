"""The trajectory list (filters, ordering, pages), the step-through view, human scores, sessions and the
home page's card. Trajectories are recorded with the OpenTelemetry SDK and stored through ingest."""

from __future__ import annotations

import base64
import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agent_registry import services as registry_services
from agent_registry.tests.factories import AgentFactory
from frontend import views
from frontend.tests import traces
from frontend.tests.conftest import db_state
from tracing import demo
from tracing import services as tracing_services
from tracing.models import Score, ScoreSource, Trajectory
from tracing.tests.factories import TrajectoryFactory

pytestmark = pytest.mark.django_db

SHOPPING = demo.AgentSpec(
    slug="shopping",
    model="gpt-4o-mini",
    prompt_name="shopping/system",
    variables={},
    tools=demo.SHOPPING_TOOLS,
    model_ms=(200, 400),
)


@pytest.fixture
def traffic(tenant):
    """Three more trajectories beside the tenant's own (5 minutes old, session-1, rider-1, prompt v1)."""
    workspace = tenant.workspace
    AgentFactory.create(workspace=workspace, slug="shopping", name="Shopping")
    recent = traces.conversation(
        workspace,
        "recent",
        question="Refund my cancelled ride please",
        tools=[
            ("lookup_trip", {"trip_id": "T-2"}, {"status": "cancelled"}),
            ("issue_refund", {"trip_id": "T-2", "amount_usd": 7}, {"refunded": 7}),
        ],
        session="s-a",
        user="rider-a",
        started_at=timezone.now() - timedelta(hours=2),
    )
    failed = traces.conversation(
        workspace,
        "failed",
        question="Where is my refund?",
        tools=[("lookup_payment", {"trip_id": "T-3"}, {"error": "timeout"})],
        failing_tool="lookup_payment",
        session="s-b",
        user="rider-b",
        tags=("refund", "tool-error"),
        prompt_version=2,
        started_at=timezone.now() - timedelta(days=3),
    )
    shopping = traces.conversation(
        workspace,
        "shoes",
        question="running shoes for flat feet",
        tools=[("search_catalog", {"query": "running shoes"}, {"results": []})],
        session="s-c",
        user="shopper-c",
        answer="Here are three pairs from the catalog.",
        tags=("search",),
        started_at=timezone.now() - timedelta(days=40),
        agent=SHOPPING,
    )
    for trajectory, value in ((recent, 5), (failed, 2)):
        tracing_services.score_create(
            trajectory=trajectory, name="helpfulness", data_type="numeric", value=value, source=ScoreSource.HUMAN
        )
    return {"own": tenant.trajectory, "recent": recent, "failed": failed, "shopping": shopping}


def _listed(response) -> list[str]:
    return [trajectory.trace_id for trajectory in response.context["page"].items]


# --- The list ---------------------------------------------------------------------------------------------


def test_the_list_shows_the_workspaces_trajectories_and_their_figures(tenant, other_tenant, traffic, member_client):
    response = member_client.get(f"/w/{tenant.workspace.slug}/trajectories/")
    content = response.content.decode()

    assert response.status_code == 200
    assert set(_listed(response)) == {t.trace_id for t in traffic.values()}
    assert other_tenant.trajectory.trace_id not in content
    recent = traffic["recent"]
    assert f"/w/acme/trajectories/{recent.trace_id}/" in content
    assert "Refund my cancelled ride please" in content
    assert f"/w/acme/sessions/{recent.session_id}/" in content
    assert "helpfulness · 5" in content
    assert "Ride support" in content
    assert "Shopping" in content
    for heading in ("Time", "Agent", "Trajectory", "Status", "Steps", "Tokens", "Cost", "Latency", "Session", "Scores"):
        assert f">{heading}" in content
    assert '<span class="badge badge-error">Error</span>' in content


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("agent=shopping", {"shopping"}),
        ("period=24h", {"own", "recent"}),
        ("period=7d", {"own", "recent", "failed"}),
        ("status=error", {"failed"}),
        ("tag=tool-error", {"failed"}),
        ("tag=refund", {"own", "recent", "failed"}),
        ("session=s-a", {"recent"}),
        ("user=rider-b", {"failed"}),
        ("prompt=support/triage", {"own", "recent", "failed"}),
        ("prompt=support/triage&prompt_version=2", {"failed"}),
        ("score=helpfulness", {"recent", "failed"}),
        ("score=helpfulness&score_min=4", {"recent"}),
        ("score=helpfulness&score_max=3", {"failed"}),
        ("q=shoes", {"shopping"}),
        ("q=REFUND", {"own", "recent", "failed"}),
        ("status=ok&period=24h&q=cancelled", {"recent"}),
    ],
)
def test_filters_return_the_matching_trajectories(tenant, traffic, member_client, query, expected):
    response = member_client.get(f"/w/{tenant.workspace.slug}/trajectories/?{query}")

    assert response.status_code == 200
    assert set(_listed(response)) == {traffic[name].trace_id for name in expected}


def test_a_custom_time_range_is_read_as_utc(tenant, traffic, member_client):
    after = (timezone.now() - timedelta(days=4)).strftime("%Y-%m-%dT%H:%M")
    before = (timezone.now() - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M")

    response = member_client.get(
        f"/w/{tenant.workspace.slug}/trajectories/?period=custom&started_after={after}&started_before={before}"
    )

    assert _listed(response) == [traffic["failed"].trace_id]
    assert "data-custom-range hidden" not in response.content.decode()


def test_an_invalid_filter_is_reported_and_the_others_still_apply(tenant, traffic, member_client):
    response = member_client.get(f"/w/{tenant.workspace.slug}/trajectories/?status=error&score_min=lots")

    assert response.status_code == 200
    assert _listed(response) == [traffic["failed"].trace_id]
    assert "Some filters were left out" in response.content.decode()
    assert "Score at least: Enter a number." in response.content.decode()


@pytest.mark.parametrize(
    ("order", "field"),
    [
        ("", "-started_at"),
        ("started_at", "started_at"),
        ("-cost", "-cost_usd"),
        ("cost", "cost_usd"),
        ("-latency", "-latency_ms"),
        ("latency", "latency_ms"),
        ("-steps", "-step_count"),
        ("steps", "step_count"),
        ("-tokens", "-total_tokens"),
        ("tokens", "total_tokens"),
    ],
)
def test_the_list_orders_by_time_cost_latency_steps_and_tokens(tenant, traffic, member_client, order, field):
    response = member_client.get(f"/w/{tenant.workspace.slug}/trajectories/?order={order}")

    tie = "-pk" if field.startswith("-") else "pk"
    expected = list(
        Trajectory.objects.filter(workspace=tenant.workspace).order_by(field, tie).values_list("trace_id", flat=True)
    )
    assert _listed(response) == expected


def test_pages_continue_with_a_cursor_and_load_more_appends_rows(tenant, traffic, member_client, monkeypatch):
    monkeypatch.setattr(views, "TRAJECTORY_PAGE_SIZE", 2)
    url = f"/w/{tenant.workspace.slug}/trajectories/"
    newest_first = list(
        Trajectory.objects.filter(workspace=tenant.workspace)
        .order_by("-started_at", "-pk")
        .values_list("trace_id", flat=True)
    )

    first = member_client.get(url, {"tag": "", "order": ""})
    more = re.search(r'hx-get="([^"]+)" hx-target="#trajectory-more"', first.content.decode())
    assert more is not None
    next_url = more.group(1).replace("&amp;", "&")
    appended = member_client.get(next_url, headers={"HX-Request": "true", "HX-Target": "trajectory-more"})
    without_script = member_client.get(next_url)

    assert _listed(first) == newest_first[:2]
    assert "tag=" not in next_url  # empty filters are left out of shared links
    assert _listed(appended) == newest_first[2:]
    assert appended.content.decode().lstrip().startswith("<tr")
    assert "<html" not in appended.content.decode()
    assert "Load more" not in appended.content.decode()
    assert _listed(without_script) == newest_first[2:]
    assert "Back to the first page" in without_script.content.decode()


def test_a_cursor_from_nowhere_falls_back_to_the_first_page(tenant, traffic, member_client):
    response = member_client.get(f"/w/{tenant.workspace.slug}/trajectories/?cursor=not-a-cursor")

    assert response.status_code == 200
    assert len(_listed(response)) == 4
    assert "That page link is no longer valid" in response.content.decode()


@pytest.mark.parametrize("order", ["latency", "-steps"])
def test_a_cursor_whose_value_does_not_fit_the_order_falls_back_to_the_first_page(
    tenant, traffic, member_client, order
):
    forged = base64.urlsafe_b64encode(b'["abc", 1]').decode()

    response = member_client.get(f"/w/{tenant.workspace.slug}/trajectories/", {"order": order, "cursor": forged})

    assert response.status_code == 200
    assert len(_listed(response)) == 4
    assert "That page link is no longer valid" in response.content.decode()


def test_htmx_filtering_redraws_only_the_results(tenant, traffic, member_client):
    response = member_client.get(
        f"/w/{tenant.workspace.slug}/trajectories/?status=error",
        headers={"HX-Request": "true", "HX-Target": "trajectory-results"},
    )
    content = response.content.decode()

    assert content.lstrip().startswith('<section class="card card-flush" id="trajectory-results"')
    assert "<html" not in content
    assert _listed(response) == [traffic["failed"].trace_id]


def test_the_agent_tab_lists_only_that_agents_trajectories(tenant, traffic, member_client):
    response = member_client.get(f"/w/{tenant.workspace.slug}/agents/shopping/trajectories/?agent=ride-support")

    assert _listed(response) == [traffic["shopping"].trace_id]
    assert 'aria-current="page">Trajectories</a>' in response.content.decode()


def test_the_sidebar_links_trajectories_and_sessions(tenant, member_client):
    content = member_client.get(f"/w/{tenant.workspace.slug}/trajectories/").content.decode()

    assert f'href="/w/{tenant.workspace.slug}/trajectories/" aria-current="page">' in content
    assert f'href="/w/{tenant.workspace.slug}/sessions/">' in content


# --- The step-through view --------------------------------------------------------------------------------


def test_the_step_through_view_renders_each_kind_of_step_for_people(tenant, traffic, member_client):
    failed = traffic["failed"]

    response = member_client.get(f"/w/{tenant.workspace.slug}/trajectories/{failed.trace_id}/")
    content = response.content.decode()
    steps = response.context["steps"]

    assert response.status_code == 200
    assert [item.step.kind for item in steps] == ["agent", "message", "message", "llm_call", "tool_call", "llm_call"]
    # The header's totals.
    assert response.context["trajectory"] == failed
    assert f"{failed.total_tokens:,}" in content
    assert "first at step 4" in content
    assert f"/w/acme/sessions/{failed.session_id}/" in content
    assert f'href="/w/acme/prompts/{tenant.prompt.pk}/#v2">support/triage v2</a>' in content
    # The system prompt folds away; the user speaks in a bubble; the model's call names its tool.
    assert '<details class="bubble bubble-system"><summary>System prompt' in content
    assert '<div class="bubble bubble-user">' in content
    assert "calls lookup_payment" in content
    # Tool arguments and results as formatted JSON; the failed call in red with its error.
    assert '<pre class="json">{\n  &quot;trip_id&quot;: &quot;T-3&quot;\n}</pre>' in content
    assert re.search(r'<li class="step kind-tool_call is-error is-selected" id="step-4"', content)
    assert "TimeoutError: lookup_payment timed out" in content
    # The first error is the step the page opens on, and the waterfall has a bar per span.
    assert response.context["selected"].index == 4
    assert len(response.context["bars"]) == 4
    assert content.count('<a class="wf-row') == 4


def test_a_step_can_be_chosen_in_the_url(tenant, member_client):
    response = member_client.get(f"/w/{tenant.workspace.slug}/trajectories/{tenant.trajectory.trace_id}/?step=5")

    assert response.context["selected"].index == 5
    assert 'id="step-5" data-step="5"' in response.content.decode()
    # A digit int() does not read (str.isdigit() says yes to '²') opens the default step, not a 500.
    odd = member_client.get(f"/w/{tenant.workspace.slug}/trajectories/{tenant.trajectory.trace_id}/", {"step": "²"})
    assert odd.status_code == 200


def test_span_content_is_escaped_everywhere(tenant, member_client):
    script = '<script>alert("owned")</script>'
    image = '<img src=x onerror="alert(1)">'
    hostile = traces.conversation(
        tenant.workspace,
        "hostile",
        question=f"Hi {script}",
        tools=[(f"lookup_trip{image}", {"trip_id": script}, {"note": image})],
        answer=f"Done {image}",
        session=f"sess-{script}",
        tags=(script,),
    )
    pages = [
        f"/w/{tenant.workspace.slug}/trajectories/",
        f"/w/{tenant.workspace.slug}/trajectories/{hostile.trace_id}/",
        f"/w/{tenant.workspace.slug}/sessions/",
        f"/w/{tenant.workspace.slug}/trajectories/{hostile.trace_id}/?step=4",
    ]

    for page in pages:
        content = member_client.get(page).content.decode()
        assert "<script>alert" not in content, page
        assert "<img src=x" not in content, page
        assert "&lt;script&gt;alert" in content, page
    detail = member_client.get(pages[1]).content.decode()
    assert "&lt;img src=x onerror=" in detail
    session = member_client.get(f"/w/{tenant.workspace.slug}/sessions/{hostile.session_id}/").content.decode()
    assert "<script>alert" not in session
    assert "&lt;img src=x onerror=" in session


def test_a_500_step_trajectory_renders_with_a_bounded_number_of_queries(tenant, member_client):
    short = traces.long_trajectory(tenant.workspace, "short", tool_calls=3)
    long = traces.long_trajectory(tenant.workspace, "long", tool_calls=250)

    def render(trajectory: Trajectory) -> tuple[int, int]:
        with CaptureQueriesContext(connection) as queries:
            response = member_client.get(f"/w/{tenant.workspace.slug}/trajectories/{trajectory.trace_id}/")
        assert response.status_code == 200
        return len(response.context["steps"]), len(queries.captured_queries)

    short_steps, short_queries = render(short)
    long_steps, long_queries = render(long)

    assert long_steps >= 500
    assert short_steps < 20
    assert long_queries == short_queries
    assert long_queries <= 16


# --- Scores -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "stored"),
    [
        ({"name": "helpfulness", "data_type": "numeric", "value": "4.5"}, ("numeric", 4.5, "")),
        ({"name": "resolved", "data_type": "boolean", "verdict": "false"}, ("boolean", 0.0, "")),
        ({"name": "intent", "data_type": "categorical", "category": " refund "}, ("categorical", None, "refund")),
        (
            {"name": "better_answer", "data_type": "correction", "correction": "Refunded $7.00 to your card."},
            ("correction", None, "Refunded $7.00 to your card."),
        ),
    ],
)
def test_a_member_scores_the_trajectory(tenant, member_client, data, stored):
    url = f"/w/{tenant.workspace.slug}/trajectories/{tenant.trajectory.trace_id}/"

    response = member_client.post(url + "scores/", {**data, "comment": "checked by hand"})

    score = Score.objects.get(trajectory=tenant.trajectory)
    assert response.status_code == 302
    assert response["Location"] == url + "#scores"
    assert (score.data_type, score.value, score.string_value) == stored
    assert (score.name, score.span_id, score.source, score.comment) == (
        data["name"],
        "",
        "human",
        "checked by hand",
    )
    assert score.created_by is not None
    assert score.created_by.username == "mia"
    page = member_client.get(url).content.decode()
    assert data["name"] in page
    assert "by mia" in page


def test_a_member_scores_one_step(tenant, member_client):
    url = f"/w/{tenant.workspace.slug}/trajectories/{tenant.trajectory.trace_id}/"
    steps = member_client.get(url).context["steps"]
    tool_step = next(item for item in steps if item.step.kind == "tool_call")

    response = member_client.post(
        url + "scores/",
        {"name": "redundant", "data_type": "boolean", "verdict": "true", "span_id": tool_step.step.span_id},
    )

    score = Score.objects.get(trajectory=tenant.trajectory)
    assert response.status_code == 302
    assert (score.span_id, score.value) == (tool_step.step.span_id, 1.0)
    page = member_client.get(url)
    assert page.context["scores"] == [(score, tool_step.index)]
    assert f'data-step-link="{tool_step.index}">step {tool_step.index}</a>' in page.content.decode()


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        ({"name": "helpfulness", "data_type": "numeric"}, "value", "A numeric score needs a value."),
        ({"name": "resolved", "data_type": "boolean"}, "verdict", "Choose yes or no."),
        ({"name": "intent", "data_type": "categorical", "category": "  "}, "category", "needs a category"),
        ({"name": "fix", "data_type": "correction"}, "correction", "Write the corrected output."),
        ({"name": "", "data_type": "numeric", "value": "1"}, "name", "This field is required."),
        ({"name": "x", "data_type": "stars", "value": "1"}, "data_type", "Select a valid choice."),
        ({"name": "x", "data_type": "numeric", "value": "1", "span_id": "0123456789abcdef"}, "span_id", "no such step"),
    ],
)
def test_an_invalid_score_is_refused_and_nothing_is_stored(tenant, member_client, data, field, message):
    before = db_state()

    response = member_client.post(f"/w/{tenant.workspace.slug}/trajectories/{tenant.trajectory.trace_id}/scores/", data)

    assert response.status_code == 422
    assert db_state() == before
    assert any(message in error for error in response.context["score_form"].errors[field])


def test_viewers_see_scores_but_no_score_or_replay_form(tenant, viewer_client, member_client):
    tracing_services.score_create(
        trajectory=tenant.trajectory, name="resolved", data_type="boolean", value=True, source=ScoreSource.API
    )
    url = f"/w/{tenant.workspace.slug}/trajectories/{tenant.trajectory.trace_id}/"

    viewer = viewer_client.get(url).content.decode()
    member = member_client.get(url).content.decode()

    assert "resolved" in viewer
    assert 'id="score-form"' not in viewer
    assert "Start replay" not in viewer
    assert 'id="score-form"' in member
    assert "Start replay" in member


def test_a_viewer_cannot_score_and_nothing_changes(tenant, viewer_client):
    before = db_state()

    response = viewer_client.post(
        f"/w/{tenant.workspace.slug}/trajectories/{tenant.trajectory.trace_id}/scores/",
        {"name": "resolved", "data_type": "boolean", "verdict": "true"},
    )

    assert response.status_code == 403
    assert db_state() == before


def test_trajectories_of_another_workspace_are_not_found_under_ones_own(tenant, other_tenant, member_client):
    ws = tenant.workspace.slug
    theirs = other_tenant.trajectory
    before = db_state()

    assert member_client.get(f"/w/{ws}/trajectories/{theirs.trace_id}/").status_code == 404
    assert member_client.get(f"/w/{ws}/sessions/{theirs.session_id}x/").status_code == 404
    assert member_client.get(f"/w/{ws}/replays/{other_tenant.replay.pk}/").status_code == 404
    assert (
        member_client.post(
            f"/w/{ws}/trajectories/{theirs.trace_id}/scores/", {"name": "x", "data_type": "numeric", "value": "1"}
        ).status_code
        == 404
    )
    assert db_state() == before


# --- Sessions ---------------------------------------------------------------------------------------------


def test_sessions_list_their_turns_and_totals(tenant, other_tenant, member_client):
    first = tenant.trajectory
    second = traces.conversation(
        tenant.workspace,
        "second-turn",
        question="Thanks, when will I see it?",
        tools=(),
        answer="Within 3 to 5 days.",
        started_at=timezone.now() - timedelta(minutes=1),
    )

    response = member_client.get(f"/w/{tenant.workspace.slug}/sessions/")
    (session,) = response.context["sessions"]

    assert (session.session_id, session.trajectory_count, session.user_id) == ("session-1", 2, "rider-1")
    assert session.total_tokens == first.total_tokens + second.total_tokens
    assert session.cost_usd == first.cost_usd + second.cost_usd
    assert "/w/acme/sessions/session-1/" in response.content.decode()


def test_older_sessions_are_a_page_away_and_a_bad_page_link_shows_the_most_recent(tenant, member_client, monkeypatch):
    monkeypatch.setattr(views, "SESSION_PAGE_SIZE", 2)
    for number in range(3):
        TrajectoryFactory.create(
            workspace=tenant.workspace,
            agent=tenant.trajectory.agent,
            session_id=f"older-{number}",
            started_at=timezone.now() - timedelta(hours=1 + number),
        )
    url = f"/w/{tenant.workspace.slug}/sessions/"

    first = member_client.get(url)
    more = re.search(r'href="\?(cursor=[^"]+)">Older sessions', first.content.decode())
    assert more is not None
    second = member_client.get(f"{url}?{more.group(1).replace('&amp;', '&')}")
    broken = member_client.get(url, {"cursor": "not-a-cursor"})

    assert [s.session_id for s in first.context["sessions"]] == ["session-1", "older-0"]
    assert [s.session_id for s in second.context["sessions"]] == ["older-1", "older-2"]
    assert ">Older sessions</a>" not in second.content.decode()
    assert "Back to the most recent" in second.content.decode()
    assert [s.session_id for s in broken.context["sessions"]] == ["session-1", "older-0"]
    assert "That page link is no longer valid" in broken.content.decode()


def test_a_session_shows_its_turns_in_order_each_message_once(tenant, member_client):
    # A second turn that, like a real chat agent, resends the first turn's dialogue.
    recorder = demo.Recorder("ride-support")
    dialogue = demo.Dialogue(
        agent=traces.SUPPORT,
        session_id="chat-9",
        user_id="rider-9",
        system_prompt="You are ride support.",
        prompt_version=1,
    )
    for number, (question, answer) in enumerate((("Hello", "Hi! How can I help?"), ("My ride was late", "Sorry!"))):
        recorder.ids.begin(f"chat-9/{number}")
        turn = demo.Turn(recorder, dialogue, demo.Dice(number), timezone.now() - timedelta(minutes=10 - number))
        with turn.agent_run(tags=()):
            turn.user(question)
            turn.answer(answer)
    traces.ingest(tenant.workspace, recorder)

    response = member_client.get(f"/w/{tenant.workspace.slug}/sessions/chat-9/")
    turns = response.context["turns"]

    assert [entry.trajectory.trace_id for entry in turns] == [demo.trace_hex("chat-9/0"), demo.trace_hex("chat-9/1")]
    assert [[(m.role, m.text) for m in entry.turn.messages] for entry in turns] == [
        [("system", "You are ride support."), ("user", "Hello"), ("assistant", "Hi! How can I help?")],
        [("user", "My ride was late"), ("assistant", "Sorry!")],
    ]
    assert turns[1].turn.earlier == 3
    assert "3 messages from earlier turns above" in response.content.decode()


def test_an_unknown_session_is_not_found(tenant, member_client):
    assert member_client.get(f"/w/{tenant.workspace.slug}/sessions/nobody/").status_code == 404


# --- Home -------------------------------------------------------------------------------------------------


def test_home_summarises_the_last_24_hours(tenant, other_tenant, traffic, member_client):
    response = member_client.get(f"/w/{tenant.workspace.slug}/")
    recent = response.context["recent"]

    assert (recent.trajectory_count, recent.error_count) == (2, 0)
    assert recent.cost_usd == traffic["own"].cost_usd + traffic["recent"].cost_usd
    assert recent.cost_usd > Decimal(0)
    assert "Recent trajectories" in response.content.decode()
    assert "none ended in error" in response.content.decode()


def test_home_counts_errors_of_the_last_day(tenant, member_client):
    traces.conversation(tenant.workspace, "broken", failing_tool="lookup_trip", session="s-z")

    response = member_client.get(f"/w/{tenant.workspace.slug}/")

    assert (response.context["recent"].trajectory_count, response.context["recent"].error_count) == (2, 1)
    assert "50%" in response.content.decode()
    assert "1 ended in error" in response.content.decode()


def test_a_prompt_the_spans_name_is_linked_only_when_keel_has_it(tenant, member_client):
    registry_services.prompt_create(agent=tenant.agent, name="unused", type="text", template="Hi")
    response = member_client.get(f"/w/{tenant.workspace.slug}/trajectories/{tenant.trajectory.trace_id}/")

    assert [(v.prompt.name, v.version) for v in response.context["prompt_versions"]] == [("support/triage", 1)]
