"""Triage in a real Chromium: the review queue worked with the keyboard alone, informativeness per sampling
strategy updating as decisions land, an alert and the trajectories behind it, the signal-rate charts, and
screenshots of the pages (docs/screenshots/review.png, alerts.png, signals.png). The data is the demo
workspace (tracing.demo: a week of traffic, triage settings, review queues, alert rules and their alerts)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from agent_registry import demo as registry_demo
from agent_registry.models import Workspace
from tests.browser.pages import SCREENSHOTS, log_in
from tracing import triage
from tracing.models import Alert, ReviewItem, ReviewSample

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


def _row(page: Page, strategy: str):
    return page.locator(f'#informativeness tr[data-strategy="{strategy}"]')


def test_review_two_items_with_the_keyboard_and_see_informativeness_update(page: Page, seeded: dict[str, Any]) -> None:
    base = seeded["url"]
    workspace: Workspace = seeded["workspace"]
    page.set_viewport_size({"width": 1440, "height": 900})
    log_in(page, base)
    queue = ReviewSample.objects.get(workspace=workspace, strategy="signal", seed="demo:signal")
    before = triage.review_informativeness(workspace=workspace).comparison.signal
    pending = list(queue.items.filter(status="pending").order_by("position"))
    assert len(pending) >= 2

    page.get_by_role("navigation", name="Workspace").get_by_role("link", name="Review", exact=True).click()
    expect(page.get_by_role("heading", name="Review", level=1)).to_be_visible()
    expect(_row(page, "signal").locator("td").nth(0)).to_have_text(str(before.reviewed))
    page.get_by_role("link", name=f"Signal-based #{queue.pk}").click()
    page.get_by_role("link", name=re.compile(r"Continue reviewing")).click()
    expect(page.locator("[data-review-progress]")).to_have_text(f"{pending[0].position} of {queue.budget}")
    expect(page.get_by_role("heading", name="Steps")).to_be_visible()
    expect(page.locator("#signals .signal-item").first).to_be_visible()

    # Item one: informative, the first failure mode offered (a signal that fired), then Enter.
    page.locator("main").focus()
    page.keyboard.press("y")
    page.keyboard.press("1")
    expect(page.locator("[data-review-save]")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator("[data-review-progress]")).to_have_text(f"{pending[1].position} of {queue.budget}")

    # Item two: not informative, no failure mode, a note, saved from the note with Ctrl+Enter.
    page.locator("main").focus()
    page.keyboard.press("n")
    page.keyboard.press("c")
    expect(page.get_by_label("Note")).to_be_focused()
    page.keyboard.type("Only the latency ceiling fired.")
    page.keyboard.press("Control+Enter")
    expect(page.get_by_text("That was the last one")).to_be_visible()

    first, second = (ReviewItem.objects.get(pk=item.pk) for item in pending[:2])
    assert (first.status, first.informative) == ("reviewed", True)
    assert first.reviewer is not None
    assert first.reviewer.username == registry_demo.DEMO_USERNAME
    assert first.failure_mode in triage.fired_signals(first.trajectory) or first.failure_mode in first.signal_names
    assert (second.status, second.informative, second.note) == ("reviewed", False, "Only the latency ceiling fired.")

    page.get_by_role("navigation", name="Workspace").get_by_role("link", name="Review", exact=True).click()
    after = triage.review_informativeness(workspace=workspace).comparison.signal
    assert (after.reviewed, after.informative) == (before.reviewed + 2, before.informative + 1)
    expect(_row(page, "signal").locator("td").nth(0)).to_have_text(str(after.reviewed))
    expect(_row(page, "signal").locator("td").nth(1)).to_have_text(str(after.informative))
    expect(page.locator("[data-verdict]")).to_contain_text("Signal-based")
    _screenshot(page, "review.png")


def test_an_alert_links_to_the_trajectories_behind_it(page: Page, seeded: dict[str, Any]) -> None:
    base = seeded["url"]
    workspace: Workspace = seeded["workspace"]
    page.set_viewport_size({"width": 1440, "height": 900})
    log_in(page, base)
    alert = Alert.objects.filter(workspace=workspace, signal="error_status").select_related("agent").get()
    open_alerts = Alert.objects.filter(workspace=workspace, acknowledged_at__isnull=True).count()

    # The alerts' badge (hand-offs have one too).
    badge = page.locator(".nav-badge[title*='not acknowledged']")
    expect(badge).to_contain_text(str(open_alerts))
    page.get_by_role("navigation", name="Workspace").get_by_role("link", name=re.compile(r"^Alerts")).click()
    expect(page.get_by_role("heading", name="Alerts", level=1)).to_be_visible()
    row = page.locator(f"#alert-{alert.pk}")
    expect(row).to_contain_text("Error rate this week")
    expect(row).to_contain_text(f"{alert.matching_count} of {alert.trajectory_count}")
    _screenshot(page, "alerts.png")

    row.get_by_role("link", name=re.compile(r"Trajectories")).click()
    expect(page).to_have_url(re.compile(r"status=error"))
    rows = page.locator("#trajectory-results tbody tr:not(#trajectory-more)")
    expect(rows).to_have_count(alert.matching_count)
    assert set(alert.trace_ids) == {
        link.split("/")[-2] for link in rows.locator(".trajectory-cell > a").evaluate_all("(a) => a.map(x => x.href)")
    }

    page.go_back()
    row.get_by_role("button", name="Acknowledge").click()
    expect(page.get_by_text(f"Acknowledged the alert on {alert.agent.name}")).to_be_visible()
    if open_alerts > 1:
        expect(badge).to_contain_text(str(open_alerts - 1))
    else:
        expect(badge).to_have_count(0)


def test_signal_rates_per_prompt_version(page: Page, seeded: dict[str, Any]) -> None:
    base = seeded["url"]
    workspace: Workspace = seeded["workspace"]
    page.set_viewport_size({"width": 1440, "height": 900})
    log_in(page, base)

    page.goto(f"{base}/w/{workspace.slug}/agents/shopping-assistant/signals/")
    expect(page.get_by_role("heading", name="Shopping assistant", level=1)).to_be_visible()
    charts = page.locator("[data-signal-chart]")
    expect(charts.first).to_have_attribute("data-drawn", "true")
    expect(page.locator(".u-legend").first).to_contain_text("shopping-assistant/system v1")
    expect(page.locator(".u-legend").first).to_contain_text("shopping-assistant/system v2")
    _screenshot(page, "signals.png")
