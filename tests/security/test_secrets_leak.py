"""Secrets never leak: distinctive values for every kind of secret Keel holds (a provider's API key, a
Langfuse secret key, a tool endpoint's secret, an alert webhook's secret, a Keel API key, a user's
password) go in through the API and the dashboard; then every path that could echo one is exercised
(reads in the API, the dashboard and the admin, bad input, a gateway call whose provider refuses the key
and echoes it back, a tool endpoint and a Langfuse server that do the same, a webhook delivery, a
training export); and then everything the run wrote is searched: each response, every log record
(captured at DEBUG, with its extra fields and exception text), standard output, every text and JSON
column of every table but the encrypted ones and the hashes, and every file under MEDIA_ROOT.

The servers on the loopback interface are fakes written here: each answers with an error that quotes the
request's Authorization header, as careless real services do."""

from __future__ import annotations

import base64
import json
import logging
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from agent_registry.models import User, Workspace
from agent_registry.tests.factories import MembershipFactory
from guardrails import services as guardrail_services
from routing.models import AgentTool, ModelTarget, RouterConfig
from routing.tests.conftest import gateway_agent
from routing.tests.fakes import FAKE_PROVIDER, call, fake_gateway_provider, say
from tracing import alerts
from tracing import tasks as tracing_tasks
from tracing.models import AlertDelivery, AlertRule, IngestBatch, LangfuseExport, LangfuseMirror, Trajectory
from trainer_bridge import services as trainer_services

pytestmark = pytest.mark.django_db

PROVIDER_KEY = "sk-leakprobe-PROVIDER-4f1c2a9e7d"
LANGFUSE_SECRET = "sk-lf-leakprobe-LANGFUSE-8b3d6e"
LANGFUSE_PUBLIC = "pk-lf-leakprobe"
TOOL_SECRET = "leakprobe-TOOL-SECRET-2c7f9a"
WEBHOOK_SECRET = "leakprobe-WEBHOOK-5e1b8d"
PASSWORD = "leakprobe-PASSWORD-9a4c3f!"

# Columns that hold a secret on purpose: ciphertext, a hash of a key, a password hash.
SECRET_COLUMNS = ("_encrypted", "key_hash", "password")
LOGGERS = ("", "LiteLLM", "LiteLLM Router", "LiteLLM Proxy", "httpx", "httpcore", "langfuse", "celery", "django")


class EchoServer:
    """Answers every request with an error that quotes its Authorization header: 401 under /provider/ (as
    an OpenAI-compatible provider that refuses the key) and /langfuse/, 500 elsewhere (a tool endpoint, a
    webhook receiver). Keeps what it received."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                authorization = self.headers.get("Authorization", "")
                server.received.append({"path": self.path, "authorization": authorization, "body": body})
                refused = self.path.startswith(("/provider/", "/langfuse/"))
                answer = {
                    "error": {
                        "message": f"Incorrect API key provided: {authorization}",
                        "type": "invalid_request_error",
                        "code": "invalid_api_key",
                    },
                    "headers": dict(self.headers),
                }
                data = json.dumps(answer).encode()
                self.send_response(401 if refused else 500)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    yield server
    server.close()


@dataclass
class Written:
    """Everything the run wrote where a person or another system could read it."""

    responses: list[tuple[str, bytes]] = field(default_factory=list)

    def keep(self, label: str, response: Any) -> Any:
        if getattr(response, "streaming", False):
            content = b"".join(response.streaming_content)
            for close in response._resource_closers:
                close()
        else:
            content = response.content
        headers = "\n".join(f"{name}: {value}" for name, value in response.items())
        self.responses.append((label, headers.encode() + b"\n" + content))
        return response


def _variants(secret: str) -> list[bytes]:
    """A secret as text, in JSON (escaped), as hex (a bytea cast to text) and in base64."""
    raw = secret.encode()
    return [raw, json.dumps(secret)[1:-1].encode(), raw.hex().encode(), base64.b64encode(raw)]


def _log_text(records: list[logging.LogRecord]) -> str:
    formatter = logging.Formatter()
    parts = []
    for record in records:
        parts.append(record.getMessage())
        parts.append(repr({key: value for key, value in record.__dict__.items() if key not in ("msg", "args")}))
        if record.exc_info:
            parts.append(formatter.formatException(record.exc_info))
    return "\n".join(parts)


def _database_text() -> dict[str, str]:
    """Every column of every table as text, but those that hold a secret on purpose."""
    found: dict[str, str] = {}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = 'public' ORDER BY table_name, ordinal_position"
        )
        columns = cursor.fetchall()
        for table, column in columns:
            if any(marker in column for marker in SECRET_COLUMNS):
                continue
            cursor.execute(f'SELECT string_agg("{column}"::text, E\'\\n\') FROM "{table}"')
            (text,) = cursor.fetchone()
            if text:
                found[f"{table}.{column}"] = text
    return found


def _post(client: Client, path: str, body: Any, method: str = "post") -> Any:
    return getattr(client, method)(path, data=json.dumps(body), content_type="application/json")


def test_no_secret_reaches_a_response_a_log_a_column_or_a_file(
    workspace: Workspace,
    echo: EchoServer,
    settings: Any,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings.MEDIA_ROOT = tmp_path / "media"
    # The echo server stands in for the webhook receiver and Langfuse on 127.0.0.1, which Keel refuses to
    # send to unless the operator permits it (tracing/outbound.py).
    settings.KEEL_OUTBOUND_ALLOW_PRIVATE = True
    for name in LOGGERS:
        caplog.set_level(logging.DEBUG, logger=name)
    written = Written()
    owner = User.objects.create_user(username="owner", password=PASSWORD, is_staff=True, is_superuser=True)
    MembershipFactory.create(workspace=workspace, user=owner, role="owner")
    agent = gateway_agent(workspace)
    ws, slug = workspace.slug, agent.slug

    # --- Sign in (a wrong password first), and make a Keel key in the dashboard -----------------------------
    browser = Client()
    written.keep("login wrong", browser.post("/login/", {"username": "owner", "password": PASSWORD + "x"}))
    written.keep("login", browser.post("/login/", {"username": "owner", "password": PASSWORD}))
    created = browser.post(f"/w/{ws}/keys/", {"name": "admin", "scopes": ["read", "write", "gateway", "ingest"]})
    assert created.status_code == 200
    found = re.search(r'id="secret" value="([^"]+)"', created.content.decode())
    assert found is not None
    raw_key = found.group(1)
    api = Client(headers={"Authorization": f"Bearer {raw_key}"})

    # --- Secrets in, through the API ---------------------------------------------------------------------------
    written.keep(
        "target create",
        _post(
            api,
            "/api/v1/model-targets",
            {
                "alias": "leaky",
                "model": "openai/gpt-leak",
                "api_base": f"{echo.url}/provider/v1",
                "api_key": PROVIDER_KEY,
                "max_retries": 0,
            },
        ),
    )
    written.keep(
        "target patch",
        _post(api, "/api/v1/model-targets/leaky", {"api_key": PROVIDER_KEY, "timeout_seconds": 5}, "patch"),
    )
    written.keep(
        "target bad input",
        _post(
            api,
            "/api/v1/model-targets",
            {"alias": "bad", "model": "openai/x", "api_key": PROVIDER_KEY, "timeout_seconds": -1},
        ),
    )
    written.keep(
        "tool create",
        _post(
            api,
            f"/api/v1/agents/{slug}/tools",
            {
                "name": "lookup_trip",
                "description": "Find a trip",
                "endpoint_url": f"{echo.url}/tool",
                "endpoint_secret": TOOL_SECRET,
            },
        ),
    )
    written.keep(
        "mirror",
        _post(
            api,
            "/api/v1/integrations/langfuse",
            {"host": f"{echo.url}/langfuse", "public_key": LANGFUSE_PUBLIC, "secret_key": LANGFUSE_SECRET},
            "put",
        ),
    )
    written.keep(
        "alert rule",
        _post(
            api,
            "/api/v1/alert-rules",
            {
                "agent": slug,
                "name": "Errors",
                "signal": "error_status",
                "threshold": 0.0,
                "min_trajectories": 1,
                "webhook_url": f"{echo.url}/webhook",
                "webhook_secret": WEBHOOK_SECRET,
            },
        ),
    )
    policy = api.get(f"/api/v1/agents/{slug}/guardrail-policy").json()["policy"]
    saved = written.keep(
        "policy", _post(api, f"/api/v1/agents/{slug}/guardrail-policy", {**policy, "rotate_canary": True}, "put")
    )
    assert saved.status_code == 200, saved.content
    written.keep(
        "a provider key as a Keel key",
        Client(headers={"Authorization": f"Bearer {PROVIDER_KEY}"}).get("/api/v1/agents"),
    )
    assert ModelTarget.objects.get(alias="leaky").api_key_encrypted
    assert AgentTool.objects.get(name="lookup_trip").endpoint_secret_encrypted

    # --- The gateway: the single call's provider refuses the key; the agentic tier's tool endpoint echoes ---
    with fake_gateway_provider() as fake:
        helper = ModelTarget.objects.create(workspace=workspace, alias="helper", model=f"{FAKE_PROVIDER}/helper")
        RouterConfig.objects.create(
            agent=agent,
            single_call_target=ModelTarget.objects.get(alias="leaky"),
            agentic_target=helper,
            min_neighbours=4,
            rules=[{"name": "tools", "kind": "keywords", "value": "lookup", "to_tier": "agentic", "reason": "a tool"}],
        )
        fake.script("helper", call("lookup_trip", {"trip_id": "T1"}), say("I could not look it up."))
        chat = {"model": f"agent/{slug}", "variables": {"company": "Acme"}}
        for label, text, stream in (
            ("gateway", "hello", False),
            ("gateway stream", "hello", True),
            ("gateway tool", "lookup my trip", False),
        ):
            written.keep(
                label,
                _post(
                    api,
                    "/v1/chat/completions",
                    {**chat, "messages": [{"role": "user", "content": text}], "stream": stream},
                ),
            )
    assert any(entry["authorization"] == f"Bearer {PROVIDER_KEY}" for entry in echo.received)
    assert any(entry["authorization"] == f"Bearer {TOOL_SECRET}" for entry in echo.received)

    # --- The ingest worker stores what the gateway recorded; the Langfuse mirror and the alert webhook -----
    # --- deliver to servers that quote the credentials (each through its Celery task, as a worker runs it) --
    for batch_id in IngestBatch.objects.filter(status="pending").values_list("pk", flat=True):
        tracing_tasks.span_batch_process.apply(args=(batch_id,))
    for export_id in LangfuseExport.objects.filter(workspace=workspace).values_list("pk", flat=True):
        tracing_tasks.langfuse_export_deliver.apply(args=(export_id,))
    rule = AlertRule.objects.get(workspace=workspace)
    # The window ends at the last whole minute: evaluate a minute on, when it holds these trajectories.
    assert alerts.alert_rule_evaluate(rule=rule, now=timezone.now() + timedelta(minutes=1)) is not None
    for delivery_id in AlertDelivery.objects.filter(alert__rule=rule).values_list("pk", flat=True):
        tracing_tasks.alert_delivery_deliver.apply(args=(delivery_id,))
    assert any(entry["path"].startswith("/langfuse/") for entry in echo.received), (
        LangfuseExport.objects.count(),
        Trajectory.objects.count(),
        [e["path"] for e in echo.received],
    )
    assert any(entry["path"] == "/webhook" for entry in echo.received)

    # --- A training export of what the gateway recorded ---------------------------------------------------------
    Trajectory.objects.filter(workspace=workspace).update(reward=1.0)
    curation = trainer_services.curation_create(
        workspace=workspace,
        name="everything",
        query={},
        grouping="first_request",
        reward={"source": "trajectory"},
        filters={"min_group_size": 1, "drop_equal_rewards": False},
    )
    export = trainer_services.export_create(curation=curation, format="openai", dispatch=False)
    assert trainer_services.export_execute(export_id=export.pk) is not None
    written.keep("export download", api.get(f"/api/v1/exports/{export.pk}/download"))

    # --- Everything a person or a client reads ----------------------------------------------------------------
    trace_ids = list(Trajectory.objects.filter(workspace=workspace).values_list("trace_id", flat=True))
    mirror = LangfuseMirror.objects.get(workspace=workspace)
    tool = AgentTool.objects.get(name="lookup_trip")
    reads = [
        "/api/v1/model-targets", "/api/v1/model-targets/leaky", f"/api/v1/agents/{slug}/tools",
        f"/api/v1/agents/{slug}/router", "/api/v1/integrations/langfuse", "/api/v1/alert-rules", "/api/v1/alerts",
        "/api/v1/keys", "/api/v1/audit-events", "/api/v1/trajectories", "/api/v1/routing-decisions",
        *(f"/api/v1/trajectories/{trace_id}" for trace_id in trace_ids),
    ]  # fmt: skip
    for path in reads:
        written.keep(path, api.get(path))
    pages = [
        f"/w/{ws}/", f"/w/{ws}/keys/", f"/w/{ws}/model-targets/", f"/w/{ws}/model-targets/leaky/",
        f"/w/{ws}/agents/{slug}/router/", f"/w/{ws}/agents/{slug}/router/tools/{tool.name}/",
        f"/w/{ws}/integrations/", f"/w/{ws}/agents/{slug}/alert-rules/",
        f"/w/{ws}/agents/{slug}/alert-rules/{rule.pk}/",
        f"/w/{ws}/alerts/", f"/w/{ws}/audit-log/", f"/w/{ws}/trajectories/", f"/w/{ws}/routing-decisions/",
        f"/w/{ws}/training/exports/{export.pk}/", f"/w/{ws}/agents/{slug}/guardrails/",
        *(f"/w/{ws}/trajectories/{trace_id}/" for trace_id in trace_ids),
        "/admin/agent_registry/apikey/", "/admin/agent_registry/auditevent/", "/admin/tracing/langfusemirror/",
        f"/admin/tracing/langfusemirror/{mirror.pk}/change/", "/admin/tracing/langfuseexport/",
        "/admin/guardrails/guardrailpolicy/", "/admin/agent_registry/user/",
        f"/admin/agent_registry/user/{owner.pk}/change/",
    ]  # fmt: skip
    for path in pages:
        response = written.keep(path, browser.get(path))
        assert response.status_code == 200, path

    # --- Search ---------------------------------------------------------------------------------------------
    secrets = {
        "provider key": PROVIDER_KEY,
        "Langfuse secret key": LANGFUSE_SECRET,
        "Langfuse Basic credential": base64.b64encode(f"{LANGFUSE_PUBLIC}:{LANGFUSE_SECRET}".encode()).decode(),
        "tool endpoint secret": TOOL_SECRET,
        "webhook secret": WEBHOOK_SECRET,
        "password": PASSWORD,
        "Keel API key": raw_key,
        # Generated, not given: the canary secret that marks the agent's system prompts, and Django's key.
        "guardrail canary secret": guardrail_services.guardrail_policy_get(agent=agent).canary_secret,
        "Django SECRET_KEY": settings.SECRET_KEY,
    }
    captured = capsys.readouterr()
    places: dict[str, bytes] = {
        **{f"response {label}": content for label, content in written.responses},
        "log records": _log_text(caplog.records).encode(),
        "standard output": captured.out.encode(),
        "standard error": captured.err.encode(),
        **{f"column {name}": text.encode() for name, text in _database_text().items()},
        **{f"file {path}": path.read_bytes() for path in Path(settings.MEDIA_ROOT).rglob("*") if path.is_file()},
    }
    # The one place a Keel key may appear: the page that creates it shows it once.
    leaks = sorted(
        f"{what} in {place}"
        for what, secret in secrets.items()
        for place, content in places.items()
        if any(variant in content for variant in _variants(secret))
    )
    assert leaks == [], "\n".join(leaks)
    assert raw_key.encode() in created.content  # shown once, where it is made

    # The encrypted columns hold ciphertext, not the secret.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT string_agg(api_key_encrypted, ',') FROM routing_modeltarget)"
            " || (SELECT string_agg(endpoint_secret_encrypted, ',') FROM routing_agenttool)"
            " || (SELECT string_agg(secret_key_encrypted, ',') FROM tracing_langfusemirror)"
            " || (SELECT string_agg(webhook_secret_encrypted, ',') FROM tracing_alertrule)"
            " || (SELECT string_agg(canary_secret_encrypted, ',') FROM guardrails_guardrailpolicy)"
            " || (SELECT string_agg(key_hash || password, ',') FROM agent_registry_apikey, agent_registry_user)"
        )
        (ciphertext,) = cursor.fetchone()
    assert ciphertext
    assert not any(variant in ciphertext.encode() for secret in secrets.values() for variant in _variants(secret))
    # The echoes reached the places searched, with the secrets taken out (so the search could have failed).
    for place in (
        "column routing_modeltarget.last_error",
        "column tracing_langfusemirror.last_error",
        "column tracing_span.data",
        "response gateway",
    ):
        assert b"[redacted]" in places[place], place
    assert any(place.startswith("file ") for place in places)
    assert caplog.records


def test_redact_takes_out_each_form_of_a_known_secret_and_any_bearer_or_basic_credential() -> None:
    from config.redact import REDACTED, basic_credential, redact, redact_value

    basic = basic_credential("pk-lf-1", LANGFUSE_SECRET)
    text = (
        f"401: key {PROVIDER_KEY} refused; headers {{'Authorization': 'Bearer {TOOL_SECRET}'}}; "
        f"Basic {basic}; bearer some-unknown-token-1234; a short one: abc"
    )

    cleaned = redact(text, PROVIDER_KEY, "abc")

    assert cleaned == (
        f"401: key {REDACTED} refused; headers {{'Authorization': 'Bearer {REDACTED}'}}; "
        f"Basic {REDACTED}; bearer {REDACTED}; a short one: abc"
    )
    assert redact_value({"error": [f"echo {WEBHOOK_SECRET}"], WEBHOOK_SECRET: 1}, WEBHOOK_SECRET) == {
        "error": [f"echo {REDACTED}"],
        REDACTED: 1,
    }
