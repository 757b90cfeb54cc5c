"""Stored XSS in a real Chromium: a trajectory whose every string is a script payload, sent through the
ingest endpoints (OTLP/JSON and the plain JSON format), read step by step in the step-through view. No
dialog opens, no element of a payload exists in the DOM at any step, and the page breaks no rule of the
Content-Security-Policy (a violation would mean markup got through and only the policy stopped it)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from playwright.sync_api import ConsoleMessage, Dialog, Page, expect
from pytest_django.live_server_helper import LiveServer

from agent_registry import services as registry_services
from agent_registry.models import Role
from agent_registry.tests.factories import PASSWORD, AgentFactory, MembershipFactory, UserFactory, WorkspaceFactory
from tests.browser.pages import log_in
from tests.security.payloads import hex_id, json_trajectory, otlp_document, payload
from tracing import services as tracing_services
from tracing.models import BatchStatus, IngestBatch, Trajectory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Anything a payload could have put in the page, or made run.
INJECTED = "[id^='xss-'], [onerror], [onload], img[src='x'], svg[onload]"


def _ingest(workspace: Any) -> dict[str, str]:
    _, raw = registry_services.apikey_create(workspace=workspace, name="agent", scopes=["ingest"])
    agent = Client(headers={"Authorization": f"Bearer {raw}"})
    session = payload("session")
    otlp_trace = hex_id(0xB0B, 32)
    otlp = agent.post("/v1/traces", json.dumps(otlp_document(otlp_trace, session)), content_type="application/json")
    # OTLP is stored by the time it is answered; the JSON trajectory waits in a batch for the worker.
    assert otlp.status_code == 200
    assert Trajectory.objects.filter(workspace=workspace, trace_id=otlp_trace).exists()
    plain = agent.post(
        "/api/v1/ingest/trajectories", json.dumps(json_trajectory(session)), content_type="application/json"
    )
    assert plain.status_code == 202
    (batch_id,) = IngestBatch.objects.filter(status=BatchStatus.PENDING).values_list("pk", flat=True)
    tracing_services.span_batch_process(batch_id=batch_id)
    (json_trace,) = plain.json()["trace_ids"]
    assert Trajectory.objects.filter(workspace=workspace, trace_id=json_trace).exists()
    return {"otlp": otlp_trace, "json": json_trace}


def test_a_malicious_trajectory_is_only_text_in_the_step_through_view(page: Page, live_server: LiveServer) -> None:
    workspace = WorkspaceFactory.create(slug="xss", name="XSS")
    AgentFactory.create(workspace=workspace, slug="ride-support", name="Ride support")
    reader = UserFactory.create(username="xss-reader")
    MembershipFactory.create(workspace=workspace, user=reader, role=Role.OWNER)
    trace_ids = _ingest(workspace)
    dialogs: list[str] = []
    violations: list[str] = []

    def on_dialog(dialog: Dialog) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    def on_console(message: ConsoleMessage) -> None:
        if "Content Security Policy" in message.text or "Content-Security-Policy" in message.text:
            violations.append(message.text)

    page.on("dialog", on_dialog)
    page.on("console", on_console)
    page.on("pageerror", lambda error: violations.append(f"page error: {error}"))
    log_in(page, live_server.url, username="xss-reader")

    for trace_id in trace_ids.values():
        page.goto(f"{live_server.url}/w/xss/trajectories/{trace_id}/")
        expect(page.get_by_role("heading", name="Steps")).to_be_visible()
        count = page.locator("[data-step]").count()
        assert count >= 3
        page.locator("main").focus()
        for _ in range(count):
            # The keyboard moves the selection; keel.js fills the step panel from the step's data.
            page.keyboard.press("j")
            expect(page.locator("[data-step].is-selected")).to_have_count(1)
            assert page.locator(INJECTED).count() == 0
        # The payloads are on the page, as text.
        assert 'alert("xss:' in page.locator("main").inner_text()

    page.get_by_role("link", name="Session", exact=True).first.click()
    expect(page.get_by_role("heading", level=1)).to_be_visible()
    assert "xss:session" in page.locator("main").inner_text()
    page.goto(f"{live_server.url}/w/xss/trajectories/")
    expect(page.locator("#trajectory-results tbody tr:not(#trajectory-more)")).to_have_count(2)

    assert page.locator(INJECTED).count() == 0
    assert dialogs == []
    assert violations == []


def test_the_api_docs_and_the_admin_run_under_the_policy(page: Page, live_server: LiveServer) -> None:
    """The policy is on every response: Swagger UI (ninja's static files) and Django's admin work under it."""
    violations: list[str] = []
    page.on("console", lambda message: violations.append(message.text) if "Content" in message.text else None)
    page.on("pageerror", lambda error: violations.append(f"page error: {error}"))
    UserFactory.create(username="xss-staff", is_staff=True, is_superuser=True)

    page.goto(f"{live_server.url}/api/v1/docs")
    # Building the schema takes seconds (more on a busy machine): a longer wait than expect's 5 s default.
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("Keel API", timeout=60_000)
    expect(page.locator(".opblock").first).to_be_visible()
    page.goto(f"{live_server.url}/admin/login/")
    page.get_by_label("Username").fill("xss-staff")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.goto(f"{live_server.url}/admin/agent_registry/agent/add/")
    expect(page.get_by_role("heading", name="Add agent")).to_be_visible()

    assert violations == []
