"""Guardrails in a real Chromium: open the approval queue, approve a held tool call with a note (the audit trail
records who), and read an agent's guardrail policy; screenshots of the queue and the policy
(docs/screenshots/guardrails-approvals.png, guardrails-policy.png). The data is the demo workspace, whose
guardrails the demo seeds."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import Page, expect

from agent_registry import demo as registry_demo
from agent_registry.models import Agent, Workspace
from guardrails.models import ApprovalEvent, ApprovalRequest, ApprovalStatus
from guardrails.tests.factories import ApprovalRequestFactory
from tests.browser.pages import SCREENSHOTS, log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _screenshot(page: Page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    expect(page.locator("main h1").first).to_be_visible()
    full = page.evaluate("document.documentElement.scrollHeight")
    page.set_viewport_size({"width": 1440, "height": max(900, min(full, 2400))})
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(SCREENSHOTS / name))
    page.set_viewport_size({"width": 1440, "height": 900})
    assert (SCREENSHOTS / name).stat().st_size > 10_000


def _pending_approval(agent: Agent) -> ApprovalRequest:
    """The oldest pending request of the agent, as the queue lists it first; one is made if the demo left none."""
    pending = (
        ApprovalRequest.objects.filter(agent=agent, status=ApprovalStatus.PENDING).order_by("created_at", "pk").first()
    )
    if pending is not None:
        return pending
    return ApprovalRequestFactory.create(
        agent=agent, conversation_id="browser-refund", arguments={"trip_id": "T-1042", "amount": 64}
    )


def test_approve_a_held_tool_call_and_read_the_policy(page: Page, seeded: dict[str, Any]) -> None:
    base = seeded["url"]
    workspace: Workspace = seeded["workspace"]
    agent = Agent.objects.get(workspace=workspace, slug="ride-support")
    approval = _pending_approval(agent)
    page.set_viewport_size({"width": 1440, "height": 900})
    log_in(page, base)

    # The queue: the held call is listed with the pending ones.
    page.goto(f"{base}/w/{workspace.slug}/")
    page.get_by_role("navigation", name="Workspace").get_by_role("link", name="Approvals").click()
    expect(page.get_by_role("heading", name="Approvals", level=1)).to_be_visible()
    row = page.locator(f'#pending tr[data-approval="{approval.pk}"]')
    expect(row).to_contain_text(approval.tool)
    expect(row).to_contain_text(agent.name)
    _screenshot(page, "guardrails-approvals.png")

    # Its page: the call beside its trajectory; approve it with a note.
    row.get_by_role("link", name=approval.tool).click()
    expect(page.locator("#approval-status")).to_have_attribute("data-status", "pending")
    page.get_by_label("Note").fill("Refund checked against the receipt.")
    page.get_by_role("button", name="Approve").click()
    expect(page.get_by_text(f"Approved the call of {approval.tool}.")).to_be_visible()
    expect(page.locator("#approval-status")).to_have_attribute("data-status", "approved")
    expect(page.get_by_role("button", name="Approve")).to_have_count(0)
    expect(page.locator('#events tr[data-event="approved"]')).to_contain_text(registry_demo.DEMO_USERNAME)
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.APPROVED
    assert approval.decided_by is not None
    assert approval.decided_by.username == registry_demo.DEMO_USERNAME
    assert approval.decision_note == "Refund checked against the receipt."
    assert ApprovalEvent.objects.filter(approval=approval, kind="approved").count() == 1

    # The agent's Guardrails tab: the policy in force, its mandatory checks and the editor.
    page.goto(f"{base}/w/{workspace.slug}/agents/{agent.slug}/")
    page.get_by_role("navigation", name=agent.name).get_by_role("link", name="Guardrails", exact=True).click()
    expect(page.get_by_role("heading", name="Policy in force")).to_be_visible()
    expect(page.locator("#mandatory li").first).to_be_visible()
    expect(page.get_by_role("button", name="Save policy")).to_be_visible()
    _screenshot(page, "guardrails-policy.png")
