"""Langfuse's `POST /api/public/scores`: what the Langfuse SDK's `create_score` sends, stored on the
trajectory it names, or kept until that trajectory arrives (the SDK flushes scores and spans apart)."""

from __future__ import annotations

import base64
import json
import os
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections
from django.test import Client
from django.utils import timezone
from langfuse import Langfuse

from agent_registry import services as registry_services
from agent_registry.tests.factories import AgentFactory
from tracing import services
from tracing.models import PendingScore, Score
from tracing.tests.agent_traces import refund_conversation

pytestmark = pytest.mark.django_db


def _client(workspace: Any, agents: Any = ()) -> tuple[Client, Any]:
    api_key, raw = registry_services.apikey_create(workspace=workspace, name="app", scopes=["ingest"], agents=agents)
    # Langfuse clients authenticate with Basic auth: public key as user, Keel's key as password.
    token = base64.b64encode(f"pk-lf-app:{raw}".encode()).decode()
    return Client(headers={"Authorization": f"Basic {token}"}), api_key


def _post(client: Client, body: Any) -> Any:
    return client.post("/api/public/scores", data=json.dumps(body), content_type="application/json")


def _ingest(otel: Any, api_key: Any) -> str:
    trace_id = refund_conversation(otel.tracer())
    services.ingest_otlp_accept(
        api_key=api_key, body=otel.protobuf(), content_type="application/x-protobuf", content_encoding=""
    )
    return trace_id


def _scores(trace_id: str) -> list[tuple[Any, ...]]:
    return sorted(
        Score.objects.filter(trajectory__trace_id=trace_id).values_list(
            "name", "data_type", "value", "string_value", "span_id", "comment", "external_id"
        )
    )


def test_scores_of_a_stored_trace_are_attached_at_once(otel, workspace):
    client, api_key = _client(workspace)
    trace_id = _ingest(otel, api_key)
    span_id = next(span.span_id for span in otel.spans() if span.span_type == "generation")

    response = _post(
        client,
        [
            {"id": "s-1", "traceId": trace_id, "name": "helpful", "value": 0.9, "comment": "clear"},
            {
                "traceId": trace_id.upper(),
                "observationId": span_id,
                "name": "correct",
                "value": 1.0,
                "dataType": "BOOLEAN",
            },
            {"traceId": trace_id, "name": "topic", "value": "refund", "dataType": "CATEGORICAL"},
        ],
    )

    assert (response.status_code, response.json()) == (202, {"message": "Accepted"})
    assert _scores(trace_id) == [
        ("correct", "boolean", 1.0, "", span_id, "", ""),
        ("helpful", "numeric", 0.9, "", "", "clear", "s-1"),
        ("topic", "categorical", None, "refund", "", "", ""),
    ]
    assert not PendingScore.objects.exists()


def test_a_score_sent_before_its_trace_waits_for_it(otel, workspace):
    client, api_key = _client(workspace)
    trace_id = refund_conversation(otel.tracer())

    response = _post(client, [{"id": "early", "traceId": trace_id, "name": "helpful", "value": 0.5}])
    assert services.pending_scores_attach() == 0  # the trace has not come yet
    services.ingest_otlp_accept(
        api_key=api_key, body=otel.protobuf(), content_type="application/x-protobuf", content_encoding=""
    )
    attached = services.pending_scores_attach()

    assert response.status_code == 202
    assert attached == 1
    assert _scores(trace_id) == [("helpful", "numeric", 0.5, "", "", "", "early")]
    assert not PendingScore.objects.exists()


def test_a_score_sent_again_with_its_id_is_stored_once_with_the_last_value(otel, workspace):
    client, api_key = _client(workspace)
    trace_id = _ingest(otel, api_key)

    for value in (0.2, 0.2, 0.7):
        assert _post(client, [{"id": "s-9", "traceId": trace_id, "name": "helpful", "value": value}]).status_code == 202

    assert _scores(trace_id) == [("helpful", "numeric", 0.7, "", "", "", "s-9")]


def test_scores_keel_cannot_take_are_reported_and_the_others_stored(otel, workspace):
    client, api_key = _client(workspace)
    trace_id = _ingest(otel, api_key)

    response = _post(
        client,
        [
            {"traceId": trace_id, "name": "note", "value": "free text", "dataType": "TEXT"},
            {"traceId": trace_id, "name": "ok", "value": 1.0},
            {"sessionId": "s-1", "name": "session score", "value": 1.0},
            {"traceId": "not-hex", "name": "x", "value": 1.0},
            {"traceId": trace_id, "name": "bad", "value": "high", "dataType": "NUMERIC"},
            "not an object",
        ],
    )

    assert response.status_code == 207
    body = response.json()
    assert (body["accepted"], body["rejected"]) == (1, 5)
    assert [error["message"].split(":")[0] for error in body["errors"]] == [
        "score 0",
        "score 2",
        "score 3",
        "score 4",
        "score 5",
    ]
    assert "TEXT" in body["errors"][0]["message"]
    assert _scores(trace_id) == [("ok", "numeric", 1.0, "", "", "", "")]


def test_one_score_as_older_clients_send_it(otel, workspace):
    client, api_key = _client(workspace)
    trace_id = _ingest(otel, api_key)

    stored = _post(client, {"id": "one", "traceId": trace_id, "name": "helpful", "value": 1})
    refused = _post(client, {"traceId": trace_id, "name": "helpful"})
    not_scores = _post(client, "helpful")

    assert (stored.status_code, stored.json()) == (200, {"id": "one"})
    assert (refused.status_code, refused.json()["code"]) == (422, "score_invalid")
    assert (not_scores.status_code, not_scores.json()["code"]) == (422, "score_invalid")
    assert len(_scores(trace_id)) == 1


def test_a_key_limited_to_an_agent_scores_only_its_traces(otel, workspace):
    theirs = AgentFactory.create(workspace=workspace, slug="billing")
    _, ingest_key = _client(workspace)
    trace_id = _ingest(otel, ingest_key)  # the ride-support agent's
    client, _ = _client(workspace, agents=[theirs])

    response = _post(client, [{"traceId": trace_id, "name": "helpful", "value": 1.0}])

    assert response.status_code == 207
    assert "may not score" in response.json()["errors"][0]["message"]
    assert _scores(trace_id) == []


def test_scores_whose_trace_never_comes_do_not_hold_back_the_others(otel, workspace):
    client, api_key = _client(workspace)
    never = [{"traceId": f"{number:032x}", "name": "helpful", "value": 1.0} for number in range(1, 4)]
    trace_id = refund_conversation(otel.tracer())
    assert _post(client, [*never, {"traceId": trace_id, "name": "late", "value": 0.5}]).status_code == 202
    services.ingest_otlp_accept(
        api_key=api_key, body=otel.protobuf(), content_type="application/x-protobuf", content_encoding=""
    )

    attached = services.pending_scores_attach(limit=2)

    assert attached == 1
    assert [row[0] for row in _scores(trace_id)] == ["late"]
    assert PendingScore.objects.count() == 3


def test_a_score_whose_trace_never_comes_is_dropped_after_a_week(workspace):
    client, _ = _client(workspace)
    assert _post(client, [{"traceId": "ab" * 16, "name": "helpful", "value": 1.0}]).status_code == 202

    services.pending_scores_attach(now=timezone.now() + timedelta(days=services.PENDING_SCORE_DAYS - 1))
    assert PendingScore.objects.count() == 1
    services.pending_scores_attach(now=timezone.now() + timedelta(days=services.PENDING_SCORE_DAYS, minutes=1))
    assert not PendingScore.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_the_langfuse_sdk_scores_a_trace_and_an_observation(live_server, monkeypatch, workspace):
    for name in list(os.environ):
        if name.startswith("LANGFUSE_"):
            monkeypatch.delenv(name)
    monkeypatch.setitem(connections.settings["default"], "CONN_MAX_AGE", 0)
    _, raw = registry_services.apikey_create(workspace=workspace, name="app", scopes=["ingest"])
    langfuse = Langfuse(base_url=live_server.url, public_key=f"pk-lf-{uuid.uuid4().hex}", secret_key=raw)
    try:
        with langfuse.start_as_current_observation(name="answer") as root:
            with langfuse.start_as_current_observation(name="llm", as_type="generation", model="gpt-4o-mini") as llm:
                observation_id = llm.id
            trace_id = root.trace_id
        langfuse.create_score(name="helpful", value=0.75, trace_id=trace_id, comment="to the point")
        langfuse.create_score(
            name="grounded", value=1, trace_id=trace_id, observation_id=observation_id, data_type="BOOLEAN"
        )
        langfuse.create_score(name="topic", value="refund", trace_id=trace_id, data_type="CATEGORICAL")
        langfuse.flush()
    finally:
        langfuse.shutdown()
    services.pending_scores_attach()  # for those that came before the spans

    assert [row[:5] for row in _scores(trace_id)] == [
        ("grounded", "boolean", 1.0, "", observation_id),
        ("helpful", "numeric", 0.75, "", ""),
        ("topic", "categorical", None, "refund", ""),
    ]
