"""The Langfuse bridge against a local HTTP server that records what the real langfuse SDK sends."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from agent_registry import services as registry_services
from agent_registry.tests.factories import AgentFactory
from tracing import langfuse_bridge, services
from tracing.models import ExportStatus, LangfuseExport, LangfuseMirror, Trajectory
from tracing.tests.agent_traces import refund_conversation

pytestmark = pytest.mark.django_db


class RecordingLangfuse:
    """A stand-in for a Langfuse server: records every request; answers with `status` (default 200)."""

    def __init__(self) -> None:
        self.requests: list[dict[str, object]] = []
        self.status = 200
        self.redirect_to = ""  # when set, every request is answered 307 to this URL plus its path
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                recorder.requests.append({"path": self.path, "headers": dict(self.headers), "body": json.loads(body)})
                if recorder.redirect_to:
                    self.send_response(307)
                    self.send_header("Location", recorder.redirect_to + self.path)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                answer = b"{}" if self.path.endswith("/traces") else b'{"message": "Accepted"}'
                code = recorder.status if recorder.status != 200 or self.path.endswith("/traces") else 202
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def paths(self) -> list[object]:
        return [request["path"] for request in self.requests]


@pytest.fixture
def langfuse(settings) -> Iterator[RecordingLangfuse]:
    # The recording Langfuse listens on 127.0.0.1, which Keel refuses unless the operator permits it.
    settings.KEEL_OUTBOUND_ALLOW_PRIVATE = True
    server = RecordingLangfuse()
    server.thread.start()
    yield server
    server.server.shutdown()
    server.server.server_close()


@pytest.fixture
def mirrored(workspace, langfuse):
    return langfuse_bridge.langfuse_mirror_configure(
        workspace=workspace, host=langfuse.url, public_key="pk-lf-keel", secret_key="sk-lf-secret"
    )


def _ingest(otel, workspace, **conversation):
    agent = AgentFactory.create(workspace=workspace, slug="ride-support")
    trace_id = refund_conversation(otel.tracer(), **conversation)
    api_key, _ = registry_services.apikey_create(workspace=workspace, name="k", scopes=["ingest"], agents=[agent])
    services.ingest_otlp_accept(
        api_key=api_key, body=otel.protobuf(), content_type="application/x-protobuf", content_encoding=""
    )
    return trace_id


def _deliver_all() -> list[bool]:
    return [
        langfuse_bridge.langfuse_export_deliver(export_id=pk)
        for pk in LangfuseExport.objects.values_list("pk", flat=True)
    ]


def test_spans_reach_langfuses_otlp_endpoint_with_langfuse_attributes(otel, workspace, mirrored, langfuse):
    trace_id = _ingest(otel, workspace, prompt=("ride-support/system", "2"))

    assert _deliver_all() == [True]

    (request,) = langfuse.requests
    assert request["path"] == "/api/public/otel/v1/traces"
    headers = request["headers"]
    assert headers["Authorization"] == "Basic " + base64.b64encode(b"pk-lf-keel:sk-lf-secret").decode()
    assert headers["x-langfuse-ingestion-version"] == "4"
    spans = [
        span
        for resource in request["body"]["resourceSpans"]
        for scope in resource["scopeSpans"]
        for span in scope["spans"]
    ]
    assert len(spans) == 4
    assert {span["traceId"] for span in spans} == {trace_id}
    by_name: dict[str, list[dict[str, Any]]] = {}
    for span in spans:
        attributes = {a["key"]: next(iter(a["value"].values())) for a in span["attributes"]}
        by_name.setdefault(span["name"], []).append(attributes)
    root = by_name["invoke_agent ride-support"][0]
    assert root["langfuse.observation.type"] == "agent"
    assert root["langfuse.trace.name"] == "invoke_agent ride-support"
    assert root["langfuse.session.id"] == "session-1"
    first_chat = by_name["chat gpt-4o"][0]
    assert first_chat["langfuse.observation.type"] == "generation"
    assert first_chat["langfuse.observation.model.name"] == "gpt-4o"
    assert json.loads(first_chat["langfuse.observation.usage_details"]) == {"input": 100, "output": 20, "total": 120}
    assert json.loads(first_chat["langfuse.observation.input"]) == [
        {"role": "user", "content": "I was charged twice for a cancelled ride"}
    ]
    assert first_chat["langfuse.observation.prompt.name"] == "ride-support/system"
    tool = by_name["execute_tool lookup_trip"][0]
    assert tool["langfuse.observation.type"] == "tool"

    mirror = LangfuseMirror.objects.get(workspace=workspace)
    assert (mirror.delivered_spans, mirror.last_error) == (4, "")
    assert mirror.last_success_at is not None
    assert LangfuseExport.objects.get().status == ExportStatus.DONE


def test_scores_reach_langfuses_scores_api(otel, workspace, mirrored, langfuse):
    trace_id = _ingest(otel, workspace)
    trajectory = Trajectory.objects.get(trace_id=trace_id)
    score = services.score_create(trajectory=trajectory, name="resolved", data_type="boolean", value=True, comment="ok")
    services.score_create(trajectory=trajectory, name="fix", data_type="correction", string_value="Refund $12.")

    assert _deliver_all() == [True, True, True]

    bodies = [request["body"] for request in langfuse.requests if request["path"] == "/api/public/scores"]
    assert bodies == [
        [
            {
                "id": f"keel-score-{score.pk}",
                "traceId": trace_id,
                "name": "resolved",
                "value": 1.0,
                "dataType": "BOOLEAN",
                "comment": "ok",
            }
        ],
        [
            {
                "id": f"keel-score-{score.pk + 1}",
                "traceId": trace_id,
                "name": "fix",
                "value": "Refund $12.",
                "dataType": "CORRECTION",
            }
        ],
    ]
    assert LangfuseMirror.objects.get(workspace=workspace).delivered_scores == 2


def test_a_failing_langfuse_is_retried_with_backoff_and_the_error_is_visible(otel, workspace, mirrored, langfuse):
    langfuse.status = 500
    _ingest(otel, workspace)

    assert _deliver_all() == [False]
    export = LangfuseExport.objects.get()
    assert (export.status, export.attempts) == (ExportStatus.PENDING, 1)
    assert "500" in export.last_error
    assert export.next_attempt_at > timezone.now() + timedelta(seconds=3)
    mirror = LangfuseMirror.objects.get(workspace=workspace)
    assert "500" in mirror.last_error
    assert mirror.last_success_at is None

    # Not due yet: a redelivered task does nothing; once due, it is sent again and succeeds.
    assert langfuse_bridge.langfuse_export_deliver(export_id=export.pk) is False
    LangfuseExport.objects.filter(pk=export.pk).update(next_attempt_at=timezone.now() - timedelta(minutes=1))
    assert langfuse_bridge.langfuse_export_due() == [export.pk]
    langfuse.status = 200
    assert langfuse_bridge.langfuse_export_deliver(export_id=export.pk) is True
    assert LangfuseExport.objects.get().status == ExportStatus.DONE
    assert len(langfuse.requests) == 2


def test_after_too_many_attempts_a_delivery_fails_for_good_until_retried(otel, workspace, mirrored, langfuse):
    langfuse.status = 401
    _ingest(otel, workspace)
    export = LangfuseExport.objects.get()
    LangfuseExport.objects.filter(pk=export.pk).update(attempts=langfuse_bridge.MAX_ATTEMPTS - 1)

    assert langfuse_bridge.langfuse_export_deliver(export_id=export.pk) is False
    assert LangfuseExport.objects.get().status == ExportStatus.FAILED

    assert langfuse_bridge.langfuse_export_retry_failed(workspace=workspace) == 1
    langfuse.status = 200
    assert langfuse_bridge.langfuse_export_deliver(export_id=export.pk) is True


def test_without_a_mirror_nothing_is_queued(otel, workspace, langfuse):
    _ingest(otel, workspace)

    assert LangfuseExport.objects.count() == 0
    assert langfuse.requests == []


def test_the_secret_key_is_stored_encrypted_and_never_returned(workspace, langfuse, api_client_for):
    client = api_client_for(workspace)

    configured = client.put(
        "/api/v1/integrations/langfuse",
        data={"host": langfuse.url, "public_key": "pk-lf-1", "secret_key": "sk-lf-very-secret"},
        content_type="application/json",
    )

    assert configured.status_code == 200
    assert configured.json()["secret_key_set"] is True
    assert "sk-lf-very-secret" not in configured.content.decode()
    stored = LangfuseMirror.objects.get(workspace=workspace)
    assert "sk-lf-very-secret" not in stored.secret_key_encrypted
    kept = client.put(
        "/api/v1/integrations/langfuse",
        data={"host": langfuse.url, "public_key": "pk-lf-2"},
        content_type="application/json",
    )
    assert kept.status_code == 200
    assert LangfuseMirror.objects.get(workspace=workspace).secret_key_encrypted == stored.secret_key_encrypted


def test_a_new_host_needs_the_secret_key_again(workspace, langfuse, api_client_for):
    client = api_client_for(workspace)
    langfuse_bridge.langfuse_mirror_configure(
        workspace=workspace, host=langfuse.url, public_key="pk-lf-1", secret_key="sk-lf-very-secret"
    )
    stored = LangfuseMirror.objects.get(workspace=workspace)

    moved = client.put(
        "/api/v1/integrations/langfuse",
        data={"host": "https://collector.example.net", "public_key": "pk-lf-1"},
        content_type="application/json",
    )

    assert moved.status_code == 422
    assert moved.json()["errors"] == [{"field": "secret_key", "message": "required when the host changes"}]
    unchanged = LangfuseMirror.objects.get(workspace=workspace)
    assert (unchanged.host, unchanged.secret_key_encrypted) == (langfuse.url, stored.secret_key_encrypted)
    moved_with_secret = client.put(
        "/api/v1/integrations/langfuse",
        data={"host": "https://collector.example.net", "public_key": "pk-lf-1", "secret_key": "sk-lf-other"},
        content_type="application/json",
    )
    assert moved_with_secret.status_code == 200
    assert LangfuseMirror.objects.get(workspace=workspace).host == "https://collector.example.net"


def test_mirror_settings_are_per_workspace(workspace, other_workspace, langfuse, api_client_for):
    langfuse_bridge.langfuse_mirror_configure(workspace=workspace, host=langfuse.url, public_key="pk", secret_key="sk")

    mine = api_client_for(workspace, scopes=["read"]).get("/api/v1/integrations/langfuse")
    theirs = api_client_for(other_workspace, scopes=["read"]).get("/api/v1/integrations/langfuse")
    bad = api_client_for(workspace).put(
        "/api/v1/integrations/langfuse", data={"host": "ftp://x", "public_key": ""}, content_type="application/json"
    )

    assert (mine.status_code, mine.json()["public_key"]) == (200, "pk")
    assert (theirs.status_code, theirs.json()["code"]) == (404, "langfuse_mirror_not_found")
    assert bad.status_code == 422
    assert LangfuseMirror.objects.get(workspace=workspace).host == langfuse.url


def test_the_api_shows_pending_and_failed_deliveries(otel, workspace, mirrored, langfuse):
    langfuse.status = 503
    _ingest(otel, workspace)
    _deliver_all()
    _, raw_key = registry_services.apikey_create(workspace=workspace, name="r", scopes=["read"])

    status = Client(headers={"Authorization": f"Bearer {raw_key}"}).get("/api/v1/integrations/langfuse").json()

    assert (status["pending"], status["failed"], status["delivered_spans"]) == (1, 0, 0)
    assert "503" in status["last_error"]


@pytest.mark.parametrize(
    ("host", "message"),
    [
        ("http://127.0.0.1:3000", "127.0.0.1 is loopback"),
        ("http://169.254.169.254", "169.254.169.254 is a cloud metadata address"),
        ("http://[fd00::5]:3000", "fd00::5 is private"),
        ("http://langfuse.internal:3000", "langfuse.internal resolves to 10.0.0.9, which is private"),
    ],
)
def test_a_host_on_an_internal_address_is_a_422_naming_the_field(workspace, api_client_for, fake_dns, host, message):
    fake_dns["langfuse.internal"] = ["10.0.0.9"]

    response = api_client_for(workspace).put(
        "/api/v1/integrations/langfuse",
        data={"host": host, "public_key": "pk-lf-1", "secret_key": "sk-lf-1"},
        content_type="application/json",
    )

    assert response.status_code == 422, response.content
    assert response.json()["code"] == "langfuse_settings_invalid"
    ((error),) = response.json()["errors"]
    assert error["field"] == "host"
    assert error["message"].startswith(message)
    assert not LangfuseMirror.objects.exists()


def _mirror_on_a_permitted_name(workspace, langfuse, fake_dns, settings) -> int:
    """The mirror on `langfuse.internal`, which the operator permits by name only and which resolves to the
    receiver on 127.0.0.1; returns the receiver's port."""
    settings.KEEL_OUTBOUND_ALLOW_PRIVATE = False
    settings.KEEL_OUTBOUND_ALLOWED_HOSTS = ["langfuse.internal"]
    fake_dns["langfuse.internal"] = ["127.0.0.1"]
    port: int = langfuse.server.server_address[1]
    langfuse_bridge.langfuse_mirror_configure(
        workspace=workspace, host=f"http://langfuse.internal:{port}", public_key="pk", secret_key="sk"
    )
    return port


def test_a_redirect_to_an_address_not_permitted_is_refused_at_delivery(otel, workspace, langfuse, fake_dns, settings):
    # The operator permits the Langfuse host by name only; it redirects to Keel's own loopback address.
    port = _mirror_on_a_permitted_name(workspace, langfuse, fake_dns, settings)
    langfuse.redirect_to = f"http://127.0.0.1:{port}/elsewhere"
    _ingest(otel, workspace)

    assert _deliver_all() == [False]

    export = LangfuseExport.objects.get()
    assert export.status == ExportStatus.PENDING
    assert export.last_error.startswith("refused: 127.0.0.1 is loopback: Keel sends only to public addresses")
    assert LangfuseMirror.objects.get(workspace=workspace).last_error == export.last_error
    assert langfuse.paths() == ["/api/public/otel/v1/traces"]  # the first hop only, never the redirect's


def test_a_permitted_name_is_connected_to_at_the_address_checked(otel, workspace, langfuse, fake_dns, settings):
    port = _mirror_on_a_permitted_name(workspace, langfuse, fake_dns, settings)
    _ingest(otel, workspace)

    assert _deliver_all() == [True]

    (request,) = langfuse.requests
    headers = request["headers"]
    assert isinstance(headers, dict)
    assert headers["Host"] == f"langfuse.internal:{port}"
