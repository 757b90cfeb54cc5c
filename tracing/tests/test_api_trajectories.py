from __future__ import annotations

import base64
from datetime import timedelta
from decimal import Decimal

import orjson
import pytest
from django.utils import timezone

from agent_registry import services as registry_services
from agent_registry.tests.factories import AgentFactory
from tracing import services, signals
from tracing.models import Score, Trajectory
from tracing.tests.agent_traces import long_conversation, refund_conversation
from tracing.tests.factories import TrajectoryFactory

pytestmark = pytest.mark.django_db


def _ingest(otel, workspace):
    api_key, _ = registry_services.apikey_create(workspace=workspace, name="k", scopes=["ingest"])
    services.ingest_otlp_accept(
        api_key=api_key, body=otel.protobuf(), content_type="application/x-protobuf", content_encoding=""
    )
    otel.exporter.clear()


@pytest.fixture
def traces(otel, workspace):
    AgentFactory.create(workspace=workspace, slug="ride-support")
    AgentFactory.create(workspace=workspace, slug="shopping")
    ids = {
        "a": refund_conversation(otel.tracer(), session="s-1"),
        "b": refund_conversation(otel.tracer(), session="s-1", tool_fails=True),
        "c": refund_conversation(otel.tracer(), session="s-2", agent="shopping"),
    }
    _ingest(otel, workspace)
    return ids


def test_the_list_filters_and_pages_with_a_cursor(traces, workspace, api_client_for):
    client = api_client_for(workspace, scopes=["read"])

    errors = client.get("/api/v1/trajectories", {"status": "error"}).json()["items"]
    by_agent = client.get("/api/v1/trajectories", {"agent": "shopping"}).json()["items"]
    by_session = client.get("/api/v1/trajectories", {"session_id": "s-1"}).json()["items"]
    first = client.get("/api/v1/trajectories", {"limit": 2, "order": "started_at"}).json()
    second = client.get(
        "/api/v1/trajectories", {"limit": 2, "order": "started_at", "cursor": first["next_cursor"]}
    ).json()

    assert [item["trace_id"] for item in errors] == [traces["b"]]
    assert [item["trace_id"] for item in by_agent] == [traces["c"]]
    assert sorted(item["trace_id"] for item in by_session) == sorted([traces["a"], traces["b"]])
    assert [item["trace_id"] for item in first["items"] + second["items"]] == [traces["a"], traces["b"], traces["c"]]
    assert second["next_cursor"] is None
    item = first["items"][0]
    assert (item["agent"], item["steps"], item["llm_calls"], item["tool_calls"]) == ("ride-support", 5, 2, 1)
    assert item["tokens"] == {"input": 260, "output": 50, "total": 310}


def test_bad_list_queries_are_422(traces, workspace, api_client_for):
    client = api_client_for(workspace, scopes=["read"])

    assert client.get("/api/v1/trajectories", {"order": "sideways"}).status_code == 422
    assert client.get("/api/v1/trajectories", {"cursor": "not-a-cursor"}).json()["code"] == "invalid_query"
    assert client.get("/api/v1/trajectories", {"agent": "nobody"}).status_code == 404
    misspelt = client.get("/api/v1/trajectories", {"signal": "loops"})
    assert (misspelt.status_code, misspelt.json()["code"]) == (422, "invalid_query")
    assert "loop, exhaustion" in misspelt.json()["detail"]
    assert client.get("/api/v1/trajectories", {"signal": "loop"}).status_code == 200


def test_the_prompt_filter_takes_a_name_with_a_colon_whole_unless_a_version_follows(workspace, api_client_for):
    from agent_registry.tests.factories import prompt_with_versions
    from tracing.tests.factories import TrajectoryFactory

    agent = AgentFactory.create(workspace=workspace)
    colon = prompt_with_versions(agent=agent, name="support:triage", templates=["a", "b"])
    plain = prompt_with_versions(agent=agent, name="support", templates=["c"])
    colon_v1, colon_v2 = colon.versions.order_by("version")
    on_colon_v1 = TrajectoryFactory.create(workspace=workspace, agent=agent)
    on_colon_v1.prompt_versions.add(colon_v1)
    on_colon_v2 = TrajectoryFactory.create(workspace=workspace, agent=agent)
    on_colon_v2.prompt_versions.add(colon_v2)
    on_plain = TrajectoryFactory.create(workspace=workspace, agent=agent)
    on_plain.prompt_versions.add(plain.versions.get())
    client = api_client_for(workspace, scopes=["read"])

    def listed(prompt):
        response = client.get("/api/v1/trajectories", {"prompt": prompt, "order": "started_at"})
        assert response.status_code == 200
        return sorted(item["trace_id"] for item in response.json()["items"])

    assert listed("support:triage") == sorted([on_colon_v1.trace_id, on_colon_v2.trace_id])
    assert listed("support:triage:2") == [on_colon_v2.trace_id]
    assert listed("support:1") == [on_plain.trace_id]
    assert listed("support:latest") == []


@pytest.mark.parametrize("order", ["latency", "-steps", "cost", "started_at", "-tokens", "triage_score"])
def test_a_cursor_whose_value_does_not_fit_the_order_is_422(traces, workspace, api_client_for, order):
    client = api_client_for(workspace, scopes=["read"])
    # Well-formed (base64 of [value, pk]) but not a value of the ordered field.
    forged = base64.urlsafe_b64encode(orjson.dumps(["abc", 1])).decode()

    response = client.get("/api/v1/trajectories", {"order": order, "cursor": forged})

    assert response.status_code == 422
    assert response.json() == {"detail": "the cursor is not one this API gave out", "code": "invalid_query"}


def test_the_detail_lists_each_calls_new_inputs_unless_asked_for_all(traces, workspace, api_client_for):
    client = api_client_for(workspace, scopes=["read"])

    compact = client.get(f"/api/v1/trajectories/{traces['a']}").json()
    full = client.get(f"/api/v1/trajectories/{traces['a']}", {"include_inputs": "true"}).json()

    assert [step["kind"] for step in compact["step_details"]] == [
        "agent",
        "message",
        "llm_call",
        "tool_call",
        "llm_call",
    ]
    calls = [step for step in compact["step_details"] if step["kind"] == "llm_call"]
    full_calls = [step for step in full["step_details"] if step["kind"] == "llm_call"]
    assert [call["input_message_count"] for call in calls] == [1, 1]
    assert [len(call["input_messages"]) for call in full_calls] == [1, 1]
    assert calls[0]["input_messages"] == [{"role": "user", "content": "I was charged twice for a cancelled ride"}]
    assert calls[1]["input_messages"] == []  # the same history again: nothing new to show
    assert compact["conversation"][0] == {"role": "user", "content": "I was charged twice for a cancelled ride"}
    (tool,) = compact["tool_calls_detail"]
    assert (tool["name"], tool["arguments"], tool["result"]) == (
        "lookup_trip",
        {"trip_id": "T-1"},
        {"status": "cancelled"},
    )


def test_the_detail_returns_the_detectors_that_failed(otel, workspace, api_client_for, monkeypatch):
    def broken(analysis):
        raise ValueError("boom")

    monkeypatch.setattr(
        signals,
        "DETECTORS",
        tuple((name, broken if name == "loop" else detector) for name, detector in signals.DETECTORS),
    )
    trace_id = refund_conversation(otel.tracer(), tool_fails=True)
    _ingest(otel, workspace)
    client = api_client_for(workspace, scopes=["read"])

    detail = client.get(f"/api/v1/trajectories/{trace_id}").json()

    assert detail["signal_errors"] == [{"detector": "loop", "message": "ValueError: boom"}]
    assert "failure" in [signal["signal"] for signal in detail["signals"]]


def test_the_detail_of_a_trajectory_every_detector_read_has_no_signal_errors(traces, workspace, api_client_for):
    client = api_client_for(workspace, scopes=["read"])

    assert client.get(f"/api/v1/trajectories/{traces['b']}").json()["signal_errors"] == []


def test_scores_are_added_and_bad_ones_refused(traces, workspace, api_client_for):
    client = api_client_for(workspace)

    created = client.post(
        f"/api/v1/trajectories/{traces['a']}/scores",
        data={"name": "helpfulness", "data_type": "numeric", "value": 4},
        content_type="application/json",
    )
    bad = client.post(
        f"/api/v1/trajectories/{traces['a']}/scores",
        data={"name": "resolved", "data_type": "boolean", "value": 7},
        content_type="application/json",
    )

    assert created.status_code == 201
    assert (created.json()["name"], created.json()["value"], created.json()["source"]) == ("helpfulness", 4.0, "api")
    assert (bad.status_code, bad.json()["code"]) == (422, "score_invalid")
    assert list(Score.objects.values_list("name", flat=True)) == ["helpfulness"]
    listed = client.get("/api/v1/trajectories", {"score": "helpfulness>=3"}).json()["items"]
    assert [item["trace_id"] for item in listed] == [traces["a"]]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "intent", "data_type": "categorical", "value": 3, "string_value": "billing"}, "value"),
        ({"name": "fix", "data_type": "correction", "value": 1, "string_value": "Refund $12."}, "value"),
        ({"name": "helpfulness", "data_type": "numeric", "value": 4, "string_value": "good"}, "string_value"),
    ],
)
def test_a_score_with_a_value_its_type_does_not_take_is_refused(traces, workspace, api_client_for, body, field):
    response = api_client_for(workspace).post(
        f"/api/v1/trajectories/{traces['a']}/scores", data=body, content_type="application/json"
    )

    assert (response.status_code, response.json()["code"]) == (422, "score_invalid")
    assert [error["field"] for error in response.json()["errors"]] == [field]
    assert not Score.objects.exists()


def test_a_score_names_its_step_by_span_id_in_any_case(traces, workspace, api_client_for):
    client = api_client_for(workspace)
    detail = client.get(f"/api/v1/trajectories/{traces['a']}").json()
    span_id = next(step["span_id"] for step in detail["step_details"] if step["kind"] == "tool_call")

    created = client.post(
        f"/api/v1/trajectories/{traces['a']}/scores",
        data={"name": "tool_ok", "data_type": "boolean", "value": True, "span_id": span_id.upper()},
        content_type="application/json",
    )

    assert created.status_code == 201
    assert created.json()["span_id"] == span_id
    assert list(Score.objects.values_list("span_id", flat=True)) == [span_id]


def test_a_session_id_with_slashes_has_its_detail(otel, workspace, api_client_for):
    AgentFactory.create(workspace=workspace, slug="ride-support")
    trace_id = refund_conversation(otel.tracer(), session="org-7/chat/42")
    _ingest(otel, workspace)
    client = api_client_for(workspace, scopes=["read"])

    listed = [session["session_id"] for session in client.get("/api/v1/sessions").json()]
    detail = client.get("/api/v1/sessions/org-7/chat/42")

    assert listed == ["org-7/chat/42"]
    assert detail.status_code == 200
    assert detail.json()["session_id"] == "org-7/chat/42"
    assert [item["trace_id"] for item in detail.json()["trajectories"]] == [trace_id]


def test_sessions_are_listed_a_page_at_a_time_with_the_next_cursor_in_headers(workspace, api_client_for):
    agent = AgentFactory.create(workspace=workspace, slug="ride-support")
    now = timezone.now()
    # Five sessions end at the same moment: the id orders them, so no page repeats or skips one.
    for number in range(9):
        started = now - timedelta(minutes=10 + (number if number >= 5 else 0))
        for turn in range(2):
            TrajectoryFactory.create(
                workspace=workspace,
                agent=agent,
                session_id=f"s-{number}",
                started_at=started + timedelta(seconds=turn),
                ended_at=started + timedelta(seconds=3 + turn),
            )
    client = api_client_for(workspace, scopes=["read"])

    seen: list[str] = []
    response = client.get("/api/v1/sessions", {"limit": 4})
    links = []
    while True:
        assert response.status_code == 200
        seen += [session["session_id"] for session in response.json()]
        if "X-Next-Cursor" not in response:
            break
        links.append(response["Link"])
        response = client.get("/api/v1/sessions", {"limit": 4, "cursor": response["X-Next-Cursor"]})

    assert seen == ["s-4", "s-3", "s-2", "s-1", "s-0", "s-5", "s-6", "s-7", "s-8"]
    assert len(links) == 2
    assert links[0].startswith("</api/v1/sessions?limit=4&cursor=")
    assert links[0].endswith('>; rel="next"')
    assert all(session["trajectory_count"] == 2 for session in client.get("/api/v1/sessions").json())


@pytest.mark.parametrize("cursor", ["nope", base64.urlsafe_b64encode(b'["yesterday", "s-1"]').decode(), "WzEsMl0"])
def test_a_sessions_cursor_this_api_never_gave_out_is_422(workspace, api_client_for, cursor):
    response = api_client_for(workspace, scopes=["read"]).get("/api/v1/sessions", {"cursor": cursor})

    assert (response.status_code, response.json()["code"]) == (422, "invalid_query")


def test_the_list_and_the_detail_write_times_and_amounts_alike(workspace, api_client_for):
    agent = AgentFactory.create(workspace=workspace, slug="ride-support")
    priced = TrajectoryFactory.create(workspace=workspace, agent=agent, session_id="s-1", cost_usd=Decimal("0.0012"))
    free = TrajectoryFactory.create(workspace=workspace, agent=agent, session_id="s-2", cost_usd=Decimal(0))
    client = api_client_for(workspace, scopes=["read"])

    listed = {item["trace_id"]: item for item in client.get("/api/v1/trajectories").json()["items"]}
    sessions = {session["session_id"]: session for session in client.get("/api/v1/sessions").json()}
    for trajectory in (priced, free):
        detail = client.get(f"/api/v1/trajectories/{trajectory.trace_id}").json()
        item = listed[trajectory.trace_id]
        assert {key: detail[key] for key in item} == item

    assert (listed[priced.trace_id]["cost"], listed[free.trace_id]["cost"]) == ("0.00120000", "0.00000000")
    assert (sessions["s-1"]["cost_usd"], sessions["s-2"]["cost_usd"]) == ("0.00120000", "0.00000000")
    assert listed[free.trace_id]["started_at"].endswith("Z")


def test_sessions_group_trajectories(traces, workspace, api_client_for):
    client = api_client_for(workspace, scopes=["read"])

    sessions = client.get("/api/v1/sessions").json()
    one = client.get("/api/v1/sessions/s-1").json()

    assert sorted((s["session_id"], s["trajectory_count"]) for s in sessions) == [("s-1", 2), ("s-2", 1)]
    assert [t["trace_id"] for t in one["trajectories"]] == [traces["a"], traces["b"]]
    assert client.get("/api/v1/sessions/nope").status_code == 404


def test_another_workspace_sees_nothing(traces, other_workspace, api_client_for):
    client = api_client_for(other_workspace)

    assert client.get("/api/v1/trajectories").json()["items"] == []
    assert client.get(f"/api/v1/trajectories/{traces['a']}").status_code == 404
    assert (
        client.post(
            f"/api/v1/trajectories/{traces['a']}/scores",
            data={"name": "x", "value": 1},
            content_type="application/json",
        ).status_code
        == 404
    )
    assert client.get("/api/v1/sessions").json() == []
    assert Score.objects.count() == 0


def test_a_key_limited_to_one_agent_sees_only_its_trajectories(traces, workspace):
    from django.test import Client

    shopping = workspace.agents.get(slug="shopping")
    _, raw_key = registry_services.apikey_create(workspace=workspace, name="s", scopes=["read"], agents=[shopping])
    client = Client(headers={"Authorization": f"Bearer {raw_key}"})

    items = client.get("/api/v1/trajectories").json()["items"]

    assert [item["trace_id"] for item in items] == [traces["c"]]
    assert client.get(f"/api/v1/trajectories/{traces['a']}").status_code == 404
    assert Trajectory.objects.count() == 3


def test_a_short_trajectory_keeps_no_view_and_its_detail_is_built_from_its_spans(traces, workspace, api_client_for):
    client = api_client_for(workspace, scopes=["read"])

    detail = client.get(f"/api/v1/trajectories/{traces['a']}").json()

    assert list(Trajectory.objects.values_list("view_document", flat=True)) == ["", "", ""]
    assert [step["kind"] for step in detail["step_details"]] == [
        "agent",
        "message",
        "llm_call",
        "tool_call",
        "llm_call",
    ]
    assert [message["role"] for message in detail["conversation"]] == ["user", "assistant", "assistant"]
    assert (detail["trace_id"], detail["steps"], detail["metadata"]) == (traces["a"], 5, {})


def test_a_long_trajectory_keeps_its_view_which_the_detail_sends_as_stored(otel, workspace, api_client_for):
    import orjson

    from tracing import selectors
    from tracing.steps import view_document_json

    AgentFactory.create(workspace=workspace, slug="ride-support")
    trace_id = long_conversation(otel.tracer(), turns=25)
    _ingest(otel, workspace)
    client = api_client_for(workspace, scopes=["read"])
    trajectory = Trajectory.objects.get(workspace=workspace, trace_id=trace_id)

    served = client.get(f"/api/v1/trajectories/{trace_id}")
    rebuilt = view_document_json(selectors.trajectory_view(trajectory=trajectory))
    Trajectory.objects.filter(pk=trajectory.pk).update(view_document="")
    built = client.get(f"/api/v1/trajectories/{trace_id}")

    assert trajectory.span_count == 51 >= services.VIEW_DOCUMENT_MIN_SPANS
    assert trajectory.view_document.encode() == rebuilt
    assert served.status_code == built.status_code == 200
    assert served.json() == built.json()
    assert served.json()["step_details"] == orjson.loads(rebuilt)["step_details"]
    assert [step["kind"] for step in served.json()["step_details"]][:4] == ["agent", "message", "llm_call", "tool_call"]
    assert served.json()["steps"] == trajectory.step_count == len(served.json()["step_details"])


def test_a_detail_with_integers_past_64_bits_is_written_whole(otel, workspace, api_client_for):
    AgentFactory.create(workspace=workspace, slug="ride-support")
    # Without tool spans, the results are read from the messages, by the standard library's JSON parser.
    trace_id = long_conversation(otel.tracer(), turns=50, tool_spans=False, big_number=True)
    _ingest(otel, workspace)
    client = api_client_for(workspace, scopes=["read"])

    stored = client.get(f"/api/v1/trajectories/{trace_id}")
    full = client.get(f"/api/v1/trajectories/{trace_id}", {"include_inputs": "true"})

    assert Trajectory.objects.get(trace_id=trace_id).view_document
    assert stored.status_code == full.status_code == 200
    results = [call["result"] for call in stored.json()["tool_calls_detail"]]
    assert results[0] == {"trip": 0, "status": "done", "ref": 123456789012345678901234567}
    assert full.content.count(b"123456789012345678901234567") >= 49
