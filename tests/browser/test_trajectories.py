"""Trajectories in a real Chromium: filtering the list, reading a trajectory step by step with the keyboard,
scoring a step, running a counterfactual replay and reading its diff, and screenshots of the pages
(docs/screenshots/). The data is the demo workspace's week of traffic (tracing.demo), recorded with the
OpenTelemetry SDK and ingested through Keel's own path."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from agent_registry.models import Workspace
from tests.browser.pages import SCREENSHOTS, log_in
from tracing import replay, selectors, tasks
from tracing.models import Replay, ReplayStatus, Score, Trajectory
from tracing.tests.replay_fakes import call, fake_provider, say

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _matching(workspace: Workspace, **filters: Any) -> int:
    page = selectors.trajectory_list(workspace=workspace, filters=selectors.TrajectoryFilter(**filters), limit=100)
    return len(page.items)


def _rows(page: Page):
    return page.locator("#trajectory-results tbody tr:not(#trajectory-more)")


def test_filter_open_step_through_and_score(page: Page, seeded: dict[str, Any]) -> None:
    base = seeded["url"]
    workspace: Workspace = seeded["workspace"]
    log_in(page, base)
    page.get_by_role("link", name="Trajectories", exact=True).click()
    expect(page.get_by_role("heading", name="Trajectories", level=1)).to_be_visible()
    expect(_rows(page)).to_have_count(50)

    # Filtering redraws the table in place and keeps the URL shareable.
    page.get_by_label("Status").select_option("error")
    expect(page).to_have_url(re.compile(r"/trajectories/\?status=error$"))
    expect(_rows(page)).to_have_count(_matching(workspace, status="error"))
    page.get_by_label("Status").select_option("")
    page.get_by_label("Search").fill("phone")
    expect(page).to_have_url(re.compile(r"q=phone"))
    phone = _matching(workspace, search="phone")
    assert phone >= 2
    expect(_rows(page)).to_have_count(phone)
    page.reload()
    expect(page.get_by_label("Search")).to_have_value("phone")
    expect(_rows(page)).to_have_count(phone)

    # Open a trajectory; the first step is selected and the keyboard moves through the steps.
    _rows(page).first.locator(".trajectory-cell a").click()
    expect(page.get_by_role("heading", name="Steps")).to_be_visible()
    page.locator("main").focus()
    page.keyboard.press("j")
    expect(page.locator("#step-1")).to_be_focused()
    expect(page.locator("#step-1")).to_have_class(re.compile("is-selected"))
    expect(page.locator('[data-panel="step"]')).to_have_text("1")
    page.keyboard.press("j")
    page.keyboard.press("ArrowDown")
    expect(page.locator("#step-3")).to_be_focused()
    page.keyboard.press("k")
    expect(page.locator("#step-2")).to_be_focused()
    expect(page).to_have_url(re.compile(r"#step-2$"))
    page.keyboard.press("j")
    page.keyboard.press("Enter")
    expect(page.locator("#step-3")).to_have_class(re.compile("is-expanded"))
    assert page.evaluate(
        "Array.from(document.querySelectorAll('#step-3 .step-body details')).every((details) => details.open)"
    )

    # Score the selected step.
    page.get_by_role("link", name="Score this step").click()
    form = page.locator("#score-form")
    expect(form.get_by_label("Attach to")).to_have_value(re.compile("^[0-9a-f]{16}$"))
    form.get_by_label("Name").fill("understood_the_rider")
    form.get_by_label("Boolean").check()
    expect(form.get_by_label("Value")).to_be_hidden()
    form.get_by_label("Verdict").select_option("false")
    form.get_by_label("Comment").fill("Answered a refund question nobody asked.")
    form.get_by_role("button", name="Add score").click()
    expect(page.locator(".messages")).to_contain_text("Added the score understood_the_rider = no")
    score = Score.objects.get(name="understood_the_rider")
    assert (score.value, score.source, score.comment) == (0.0, "human", "Answered a refund question nobody asked.")
    assert score.span_id
    expect(page.locator("#scores")).to_contain_text("understood_the_rider")


def test_tree_view_collapses_a_sub_agent(page: Page, seeded: dict[str, Any]) -> None:
    base = seeded["url"]
    long = Trajectory.objects.filter(workspace=seeded["workspace"]).order_by("-step_count").first()
    assert long is not None
    steps = selectors.trajectory_view(trajectory=long).steps
    # The demo's sub-agent runs inside the ride agent's ask_agent tool call (depth 2).
    sub_agent = next(step for step in steps if step.kind == "agent" and step.depth > 0)
    inside = [step.index for step in steps[sub_agent.index + 1 :] if step.depth > sub_agent.depth]
    log_in(page, base)
    page.goto(f"{base}/w/{seeded['workspace'].slug}/trajectories/{long.trace_id}/")

    page.get_by_role("button", name="Tree").click()
    toggle = page.locator(f"#step-{sub_agent.index} [data-step-toggle]")
    toggle.click()
    expect(toggle).to_have_attribute("aria-expanded", "false")
    for index in inside:
        expect(page.locator(f"#step-{index}")).to_be_hidden()
    page.get_by_role("button", name="Timeline").click()
    expect(page.locator(f"#step-{inside[0]}")).to_be_visible()


def test_start_a_replay_and_read_the_diff(page: Page, seeded: dict[str, Any], monkeypatch) -> None:
    # The test runs the replay itself (below), as a worker would; no message goes to the broker.
    queued: list[int] = []
    monkeypatch.setattr(tasks.replay_execute, "delay", queued.append)
    base = seeded["url"]
    workspace: Workspace = seeded["workspace"]
    # A recorded conversation the demo has not replayed, nor one of its replays (they keep its tags).
    original = (
        Trajectory.objects.filter(
            workspace=workspace, tags__contains=["double-charge"], replay_of__isnull=True, replay_runs__isnull=True
        )
        .order_by("trace_id")
        .first()
    )
    assert original is not None
    view = selectors.trajectory_view(trajectory=original)
    first_call = next(step for step in view.steps if step.kind == "llm_call")
    lookup = view.tool_calls[0]
    log_in(page, base)
    page.goto(f"{base}/w/{workspace.slug}/trajectories/{original.trace_id}/")

    page.locator(f"#step-{first_call.index} .step-head").click()
    page.get_by_role("link", name="Replay from here").click()
    replay_form = page.locator("#replay")
    expect(replay_form.get_by_label("From step")).to_be_focused()
    expect(replay_form.get_by_label("From step")).to_have_value(str(first_call.index))
    replay_form.get_by_label("Prompt version").select_option(label="ride-support/system v1")
    replay_form.locator("#id_model").fill("fake-replay/support-v1")
    replay_form.get_by_role("button", name="Start replay").click()

    expect(page.get_by_role("heading", name=re.compile(r"^Replay \d+$"))).to_be_visible()
    expect(page.locator("#replay-status")).to_have_attribute("hx-trigger", "every 1s")
    created = Replay.objects.get(original=original)
    assert queued == [created.pk]
    assert created.prompt_version is not None
    assert created.prompt_version.version == 1

    with fake_provider() as fake:
        fake.script = [
            call("lookup_trip", lookup.arguments),
            say("I've passed your case to a colleague, who will refund the duplicate charge today."),
        ]
        finished = replay.replay_execute(replay_id=created.pk)
    assert finished is not None
    assert finished.status == ReplayStatus.DONE

    # The page was polling: the diff appears without a reload.
    expect(page.locator(".diff-marker")).to_have_text("They part here")
    expect(page.locator("#replay-status")).not_to_have_attribute("hx-trigger", "every 1s")
    expect(page.locator(".is-first-difference")).to_contain_text("I've passed your case to a colleague")
    page.get_by_role("link", name="Replay trajectory").click()
    expect(page.get_by_text("Replay of")).to_be_visible()
    page.get_by_role("link", name=f"replay {created.pk}", exact=True).click()
    expect(page.get_by_role("heading", name="Original and replay, side by side")).to_be_visible()
    _screenshot(page, "replay-diff.png")


def _screenshot(page: Page, name: str, height: int | None = None) -> None:
    """The whole page; or, with `height`, its top (a 500-step page is unreadable as one image)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    expect(page.locator("main h1").first).to_be_visible()
    # A viewport as tall as the image, so sticky bars sit where a reader expects them, not mid-page.
    full = page.evaluate("document.documentElement.scrollHeight")
    page.set_viewport_size({"width": 1440, "height": height or max(900, full)})
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(SCREENSHOTS / name), full_page=height is None)
    page.set_viewport_size({"width": 1440, "height": 900})
    assert (SCREENSHOTS / name).stat().st_size > 10_000


def test_screenshots_of_the_trajectory_pages(page: Page, seeded: dict[str, Any]) -> None:
    base = seeded["url"]
    workspace: Workspace = seeded["workspace"]
    page.set_viewport_size({"width": 1440, "height": 900})
    log_in(page, base)
    long = Trajectory.objects.filter(workspace=workspace).order_by("-step_count").first()
    session = Trajectory.objects.filter(workspace=workspace, tags__contains=["rephrased"]).order_by("trace_id").first()
    assert long is not None
    assert session is not None

    page.goto(f"{base}/w/{workspace.slug}/trajectories/?period=24h")
    _screenshot(page, "trajectories.png")
    page.goto(f"{base}/w/{workspace.slug}/trajectories/{long.trace_id}/?step=5")
    expect(page.locator("#step-5")).to_have_class(re.compile("is-selected"))
    page.locator("#step-4 details").first.evaluate("(details) => { details.open = true; }")
    _screenshot(page, "trajectory.png", height=2200)
    page.goto(f"{base}/w/{workspace.slug}/sessions/{session.session_id}/")
    _screenshot(page, "sessions.png")
