from __future__ import annotations

import base64
import gzip
import json
import threading
import time
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from agent_registry import services as registry_services
from tracing import otlp, services
from tracing.models import IngestBatch, Span, Trajectory
from tracing.tests.agent_traces import refund_conversation
from tracing.tests.conftest import otlp_json_document

pytestmark = pytest.mark.django_db
PROTOBUF = "application/x-protobuf"


@pytest.fixture
def ingest_client(workspace):
    _, raw_key = registry_services.apikey_create(workspace=workspace, name="agent", scopes=["ingest"])
    return Client(headers={"Authorization": f"Bearer {raw_key}"})


@pytest.fixture(autouse=True)
def fresh_backlog():
    services.backlog.reset()
    yield
    services.backlog.reset()


def _nothing_stored() -> bool:
    return not (Span.objects.exists() or Trajectory.objects.exists() or IngestBatch.objects.exists())


def test_protobuf_export_is_stored_before_it_is_answered_with_an_empty_response(otel, ingest_client, workspace):
    trace_id = refund_conversation(otel.tracer())

    response = ingest_client.post("/v1/traces", otel.protobuf(), content_type=PROTOBUF)

    assert response.status_code == 200
    assert response["Content-Type"] == PROTOBUF
    answer = ExportTraceServiceResponse.FromString(response.content)
    assert not answer.HasField("partial_success")
    trajectory = Trajectory.objects.get(workspace=workspace, trace_id=trace_id)
    assert (trajectory.span_count, trajectory.status, trajectory.input_tokens) == (4, "ok", 260)
    assert Span.objects.filter(workspace=workspace, trajectory=trajectory).count() == 4
    assert not IngestBatch.objects.exists()  # no worker is involved


def test_json_and_gzip_bodies_are_accepted(otel, ingest_client, workspace):
    refund_conversation(otel.tracer())
    document = json.dumps(otlp_json_document(otel.request())).encode()

    as_json = ingest_client.post("/v1/traces", document, content_type="application/json")
    as_gzip = ingest_client.post(
        "/v1/traces", gzip.compress(otel.protobuf()), content_type=PROTOBUF, headers={"Content-Encoding": "gzip"}
    )

    assert (as_json.status_code, as_json.json()) == (200, {})
    assert as_gzip.status_code == 200
    assert Span.objects.filter(workspace=workspace).count() == 4  # the same spans twice are stored once
    assert Trajectory.objects.get(workspace=workspace).span_count == 4


def test_invalid_spans_are_rejected_with_partial_success_and_the_rest_stored(otel, ingest_client, workspace):
    refund_conversation(otel.tracer())
    document = otlp_json_document(otel.request())
    spans = document["resourceSpans"][0]["scopeSpans"][0]["spans"]
    spans[0]["spanId"] = "0000000000000000"

    response = ingest_client.post("/v1/traces", json.dumps(document), content_type="application/json")

    assert response.status_code == 200
    body = response.json()
    assert body["partialSuccess"]["rejectedSpans"] == "1"
    assert "span" in body["partialSuccess"]["errorMessage"]
    assert Span.objects.filter(workspace=workspace).count() == 3


def test_a_request_sent_as_application_protobuf_is_answered_in_protobuf(ingest_client, workspace):
    from tracing.tests.conftest import pb_request, pb_span

    request = pb_request(pb_span(), pb_span(span_id=b"\x00" * 8, name="zero span id"))

    response = ingest_client.post("/v1/traces", request.SerializeToString(), content_type="application/protobuf")

    assert response.status_code == 200
    assert response["Content-Type"] == "application/protobuf"
    answer = ExportTraceServiceResponse.FromString(response.content)
    assert answer.partial_success.rejected_spans == 1
    assert "span id" in answer.partial_success.error_message
    assert Span.objects.filter(workspace=workspace).count() == 1


@pytest.mark.parametrize(
    ("body", "content_type", "status", "code"),
    [
        (b"\xff\xff\xff garbage", PROTOBUF, 400, "invalid_payload"),
        (b"{not json", "application/json", 400, "invalid_payload"),
        (b"{}", "text/plain", 415, "unsupported_content_type"),
    ],
)
def test_bad_bodies_get_a_clear_4xx_and_nothing_is_stored(ingest_client, body, content_type, status, code):
    response = ingest_client.post("/v1/traces", body, content_type=content_type)

    assert response.status_code == status
    assert response.json()["code"] == code
    assert response.json()["detail"]
    assert _nothing_stored()


def test_an_oversized_body_gets_413(ingest_client, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000

    response = ingest_client.post("/v1/traces", b"x" * 2000, content_type=PROTOBUF)

    assert (response.status_code, response.json()["code"]) == (413, "payload_too_large")
    assert _nothing_stored()


def test_a_gzip_bomb_gets_413(ingest_client, settings):
    settings.KEEL_MAX_DECOMPRESSED_BYTES = 10_000

    response = ingest_client.post(
        "/v1/traces", gzip.compress(b"\0" * 1_000_000), content_type=PROTOBUF, headers={"Content-Encoding": "gzip"}
    )

    assert response.status_code == 413
    assert _nothing_stored()


def test_a_request_that_gets_no_turn_in_time_answers_429_with_retry_after_and_stores_nothing(
    otel, ingest_client, settings
):
    settings.KEEL_INGEST_CONCURRENCY = 1
    settings.KEEL_INGEST_MAX_QUEUE_SECONDS = 0
    refund_conversation(otel.tracer())

    with services.ingest_gate.turn():  # another request of the process is being stored
        refused = ingest_client.post("/v1/traces", otel.protobuf(), content_type=PROTOBUF)
    stored = ingest_client.post("/v1/traces", otel.protobuf(), content_type=PROTOBUF)

    assert refused.status_code == 429
    assert refused["Retry-After"] == "1"
    assert refused.json()["code"] == "ingest_backlog_full"
    assert refused.json()["detail"] == "every turn to store a request stayed taken for 0 s; retry shortly"
    assert stored.status_code == 200
    assert Span.objects.count() == 4


def test_a_request_refused_a_turn_is_not_decoded(otel, ingest_client, settings, monkeypatch):
    settings.KEEL_INGEST_CONCURRENCY = 1
    settings.KEEL_INGEST_MAX_QUEUE_SECONDS = 0
    refund_conversation(otel.tracer())
    decoded: list[int] = []
    decode = otlp.decode_request

    def decode_counted(body: bytes, *args: Any, **kwargs: Any) -> Any:
        decoded.append(len(body))
        return decode(body, *args, **kwargs)

    monkeypatch.setattr(otlp, "decode_request", decode_counted)

    with services.ingest_gate.turn():
        refused = ingest_client.post("/v1/traces", otel.protobuf(), content_type=PROTOBUF)
    refused_decodes = len(decoded)
    stored = ingest_client.post("/v1/traces", otel.protobuf(), content_type=PROTOBUF)

    assert refused.status_code == 429
    assert refused_decodes == 0
    assert stored.status_code == 200
    assert len(decoded) == 1


@pytest.mark.django_db(transaction=True)
def test_a_request_waits_for_a_turn_that_frees_in_time(otel, ingest_client, settings):
    settings.KEEL_INGEST_CONCURRENCY = 1
    settings.KEEL_INGEST_MAX_QUEUE_SECONDS = 30
    refund_conversation(otel.tracer())
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        with services.ingest_gate.turn():
            taken.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    taken.wait(30)
    answers: list[int] = []

    def post() -> None:
        try:
            answers.append(ingest_client.post("/v1/traces", otel.protobuf(), content_type=PROTOBUF).status_code)
        finally:
            connection.close()  # this thread's own

    waiting = threading.Thread(target=post)
    waiting.start()
    waiting.join(0.5)
    was_waiting = waiting.is_alive() and not Span.objects.exists()
    release.set()
    holder.join()
    waiting.join(30)

    assert was_waiting
    assert answers == [200]
    assert Span.objects.count() == 4


@pytest.mark.django_db(transaction=True)
def test_a_request_that_finds_the_line_for_a_turn_full_is_refused_at_once(otel, ingest_client, settings):
    settings.KEEL_INGEST_CONCURRENCY = 1
    settings.KEEL_INGEST_WAITING = 1
    settings.KEEL_INGEST_MAX_QUEUE_SECONDS = 30
    refund_conversation(otel.tracer())
    body = otel.protobuf()
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        with services.ingest_gate.turn():
            taken.set()
            release.wait(30)

    answers: list[int] = []

    def post() -> None:
        try:
            answers.append(ingest_client.post("/v1/traces", body, content_type=PROTOBUF).status_code)
        finally:
            connection.close()  # this thread's own

    holder, waiting = threading.Thread(target=hold), threading.Thread(target=post)
    holder.start()
    taken.wait(30)
    waiting.start()
    for _ in range(3000):  # until the request has reached the line (no time is asserted)
        if services.ingest_gate.waiting:
            break
        time.sleep(0.01)
    refused = ingest_client.post("/v1/traces", body, content_type=PROTOBUF)
    release.set()
    holder.join()
    waiting.join(30)

    assert refused.status_code == 429
    assert refused["Retry-After"] == "1"
    assert refused.json()["detail"] == (
        "the line for a turn to store a request is full (1 storing, 1 waiting); retry shortly"
    )
    assert answers == [200]
    assert Span.objects.count() == 4


def test_a_request_keel_fails_to_write_is_kept_as_a_batch_and_acknowledged(otel, ingest_client, monkeypatch):
    trace_id = refund_conversation(otel.tracer())
    body = otel.protobuf()
    write = services.spans_write

    def broken(**kwargs):
        raise KeyError("a bug in assembling the trajectory")

    monkeypatch.setattr(services, "spans_write", broken)
    response = ingest_client.post("/v1/traces", body, content_type=PROTOBUF)
    monkeypatch.setattr(services, "spans_write", write)

    assert response.status_code == 200
    assert not Span.objects.exists()
    batch = IngestBatch.objects.get()
    assert (batch.source, batch.status, batch.span_count, bytes(batch.body)) == ("otlp", "pending", 4, body)
    assert services.span_batch_process(batch_id=batch.pk) == 4
    assert Trajectory.objects.get(trace_id=trace_id).span_count == 4


def test_a_database_that_went_away_answers_503_and_nothing_is_kept(otel, ingest_client, monkeypatch):
    from django.db import OperationalError

    refund_conversation(otel.tracer())

    def unreachable(**kwargs):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(services, "spans_write", unreachable)
    response = ingest_client.post("/v1/traces", otel.protobuf(), content_type=PROTOBUF)

    assert response.status_code == 503
    assert response["Retry-After"] == "1"
    assert response.json()["code"]
    assert _nothing_stored()


# The queued path: JSON trajectories are stored as batches that workers turn into spans.
REFUND_TRAJECTORY = {
    "name": "refund",
    "agent": "ride-support",
    "messages": [
        {"role": "user", "content": "I was charged twice"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "lookup_trip", "arguments": '{"trip_id": "T1"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"status": "cancelled"}'},
        {"role": "assistant", "content": "Refunded."},
    ],
}  # 4 spans


def _post_trajectory(client: Client) -> Any:
    return client.post("/api/v1/ingest/trajectories", json.dumps(REFUND_TRAJECTORY), content_type="application/json")


def test_a_full_backlog_answers_429_with_retry_after_and_stores_nothing(ingest_client, settings):
    settings.KEEL_INGEST_BACKLOG_SPANS = 5
    assert _post_trajectory(ingest_client).status_code == 202
    services.backlog.reset()

    response = _post_trajectory(ingest_client)

    assert response.status_code == 429
    assert response["Retry-After"] == "1"
    assert response.json()["code"] == "ingest_backlog_full"
    assert "4 spans are waiting" in response.json()["detail"]
    assert IngestBatch.objects.count() == 1


def test_a_batch_waiting_too_long_answers_429_until_the_workers_catch_up(ingest_client, settings):
    from datetime import timedelta

    from django.utils import timezone

    settings.KEEL_INGEST_MAX_QUEUE_SECONDS = 2
    assert _post_trajectory(ingest_client).status_code == 202
    IngestBatch.objects.update(received_at=timezone.now() - timedelta(seconds=5))
    services.backlog.reset()

    refused = _post_trajectory(ingest_client)

    assert refused.status_code == 429
    assert "oldest waiting batch has waited" in refused.json()["detail"]
    assert IngestBatch.objects.count() == 1
    services.span_batch_process(batch_id=IngestBatch.objects.get().pk)
    services.backlog.reset()
    assert _post_trajectory(ingest_client).status_code == 202


def test_without_a_key_or_with_a_key_lacking_the_ingest_scope_nothing_is_stored(otel, workspace):
    refund_conversation(otel.tracer())
    _, read_key = registry_services.apikey_create(workspace=workspace, name="reader", scopes=["read"])

    anonymous = Client().post("/v1/traces", otel.protobuf(), content_type=PROTOBUF)
    wrong_scope = Client(headers={"Authorization": f"Bearer {read_key}"}).post(
        "/v1/traces", otel.protobuf(), content_type=PROTOBUF
    )
    bad_key = Client(headers={"Authorization": "Bearer keel_000000000000_nope"}).post(
        "/v1/traces", otel.protobuf(), content_type=PROTOBUF
    )

    assert (anonymous.status_code, anonymous.json()["code"]) == (401, "unauthenticated")
    assert (wrong_scope.status_code, wrong_scope.json()["code"]) == (403, "insufficient_scope")
    assert bad_key.status_code == 401
    assert _nothing_stored()


def test_langfuse_clients_use_their_own_path_with_basic_auth(otel, workspace):
    refund_conversation(otel.tracer())
    _, raw_key = registry_services.apikey_create(workspace=workspace, name="langfuse", scopes=["ingest"])
    basic = base64.b64encode(f"pk-lf-anything:{raw_key}".encode()).decode()

    response = Client(headers={"Authorization": f"Basic {basic}"}).post(
        "/api/public/otel/v1/traces", otel.protobuf(), content_type=PROTOBUF
    )

    assert response.status_code == 200
    assert Span.objects.filter(workspace=workspace).count() == 4


def test_get_is_not_allowed(ingest_client):
    assert ingest_client.get("/v1/traces").status_code == 405


def test_json_trajectories_become_spans(ingest_client, workspace):
    _, raw_key = registry_services.apikey_create(workspace=workspace, name="json", scopes=["ingest"])
    client = Client(headers={"Authorization": f"Bearer {raw_key}"})
    trajectory = {
        "name": "refund",
        "agent": "ride-support",
        "session_id": "s-9",
        "reward": 1.0,
        "tools": [{"type": "function", "function": {"name": "lookup_trip", "parameters": {"type": "object"}}}],
        "messages": [
            {"role": "user", "content": "I was charged twice"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "lookup_trip", "arguments": '{"trip_id": "T1"}'},
                    }
                ],
                "usage": {"input_tokens": 50, "output_tokens": 10},
            },
            {"role": "tool", "tool_call_id": "c1", "content": '{"status": "cancelled"}'},
            {"role": "assistant", "content": "Refunded."},
        ],
    }

    first = client.post("/api/v1/ingest/trajectories", json.dumps(trajectory), content_type="application/json")
    again = client.post("/api/v1/ingest/trajectories", json.dumps(trajectory), content_type="application/json")

    assert first.status_code == 202
    assert first.json()["accepted_spans"] == 4
    assert first.json()["trace_ids"] == again.json()["trace_ids"]
    for batch in IngestBatch.objects.all():
        services.span_batch_process(batch_id=batch.pk)
    (trace_id,) = first.json()["trace_ids"]
    assert Span.objects.filter(trace_id=trace_id).count() == 4
    stored = Span.objects.get(trace_id=trace_id, span_type="tool")
    assert stored.tool_name == "lookup_trip"


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
        # A reward must be a finite number.
        *(
            ({"reward": reward, "messages": [{"role": "user", "content": "hi"}]}, "reward")
            for reward in ("NaN", "Infinity", "-inf")
        ),
    ],
)
def test_json_trajectories_with_errors_name_the_field_and_store_nothing(ingest_client, document, field):
    response = ingest_client.post("/api/v1/ingest/trajectories", json.dumps(document), content_type="application/json")

    assert response.status_code == 422
    body = response.json()
    assert body["code"] == "trajectory_invalid"
    assert body["errors"][0]["field"] == field
    assert IngestBatch.objects.count() == 0


def test_the_queue_holds_at_most_what_the_workers_store_in_a_few_seconds(ingest_client, settings):
    settings.KEEL_INGEST_MAX_QUEUE_SECONDS = 2
    settings.KEEL_INGEST_BACKLOG_FLOOR_SPANS = 6
    # The workers just stored 40 spans in 10 s: 4 spans/s, so 8 spans may wait (above the floor of 6).
    for _ in range(10):
        assert _post_trajectory(ingest_client).status_code == 202
        services.span_batch_process(batch_id=IngestBatch.objects.latest("pk").pk)
        services.backlog.reset()

    assert _post_trajectory(ingest_client).status_code == 202  # 4 waiting
    services.backlog.reset()
    assert _post_trajectory(ingest_client).status_code == 202  # 8 waiting
    services.backlog.reset()
    refused = _post_trajectory(ingest_client)

    assert refused.status_code == 429
    assert "the workers store about 4 spans/s, so Keel queues at most 8" in refused.json()["detail"]
    assert IngestBatch.objects.filter(status="pending").count() == 2


def test_requests_between_two_reads_of_the_queue_count_what_the_process_let_in(ingest_client, settings):
    # The queue is read at most once a second; what the process accepted since counts as waiting.
    settings.KEEL_INGEST_BACKLOG_FLOOR_SPANS = 6

    first = _post_trajectory(ingest_client)
    second = _post_trajectory(ingest_client)

    assert first.status_code == 202
    assert second.status_code == 429
    assert second["Retry-After"] == "1"
    assert "4 spans are waiting" in second.json()["detail"]
    assert IngestBatch.objects.count() == 1


def test_spans_without_a_resource_are_rejected_and_a_request_with_nothing_storable_is_400(otel, ingest_client):
    refund_conversation(otel.tracer())
    document = otlp_json_document(otel.request())
    with_resource = json.loads(json.dumps(document))
    del document["resourceSpans"][0]["resource"]
    mixed = {"resourceSpans": [*with_resource["resourceSpans"], *document["resourceSpans"]]}

    nothing = ingest_client.post("/v1/traces", json.dumps(document), content_type="application/json")
    partial = ingest_client.post("/v1/traces", json.dumps(mixed), content_type="application/json")

    assert (nothing.status_code, nothing.json()["code"]) == (400, "invalid_payload")
    assert nothing.json()["detail"] == "no span can be stored: rejected 4 spans: 4 missing resource"
    assert partial.status_code == 200
    assert partial.json()["partialSuccess"] == {
        "rejectedSpans": "4",
        "errorMessage": "rejected 4 spans: 4 missing resource",
    }
    assert Span.objects.count() == 4


def test_a_protobuf_request_without_resources_is_400(otel, ingest_client):
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    refund_conversation(otel.tracer())
    request = otel.request()
    stripped = ExportTraceServiceRequest()
    stripped.CopyFrom(request)
    stripped.resource_spans[0].ClearField("resource")

    response = ingest_client.post("/v1/traces", stripped.SerializeToString(), content_type=PROTOBUF)

    assert response.status_code == 400
    assert "missing resource" in response.json()["detail"]
    assert _nothing_stored()


@pytest.mark.django_db(transaction=False)
def test_random_and_mutated_bodies_never_get_a_server_error(otel, ingest_client):
    from hypothesis import HealthCheck, given
    from hypothesis import settings as hypothesis_settings
    from hypothesis import strategies as st

    refund_conversation(otel.tracer())
    valid = otel.protobuf()
    valid_json = json.dumps(otlp_json_document(otel.request())).encode()

    @hypothesis_settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(
        body=st.one_of(
            st.binary(max_size=2000),
            st.builds(
                lambda cut, junk: valid[:cut] + junk + valid[cut:], st.integers(0, len(valid)), st.binary(max_size=20)
            ),
            st.builds(
                lambda cut, junk: valid_json[:cut] + junk + valid_json[cut:],
                st.integers(0, len(valid_json)),
                st.binary(max_size=20),
            ),
        ),
        content_type=st.sampled_from(
            [PROTOBUF, "application/json", "text/plain", "application/x-protobuf; charset=utf-8"]
        ),
        encoding=st.sampled_from(["", "gzip", "deflate", "br"]),
    )
    def post(body: bytes, content_type: str, encoding: str) -> None:
        headers = {"Content-Encoding": encoding} if encoding else {}
        response = ingest_client.post("/v1/traces", body, content_type=content_type, headers=headers)
        assert response.status_code < 500, response.content
        if response.status_code >= 400:
            assert set(response.json()) >= {"detail", "code"}

    post()
