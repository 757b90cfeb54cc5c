"""Evals in a real Chromium: open a completed run from the suites page and read its subgroup table with the
worst group highlighted; start a run with "Run now" and watch the page's polling follow it to completed
(no Celery worker runs here: the test executes the run itself, as a worker would); add a trajectory to a
new dataset from the step-through view. The workspace is built like the view tests': a suite on the
gateway's fake provider, runs executed by evals.runs."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import Page, expect
from pytest_django.live_server_helper import LiveServer

from agent_registry.models import Role
from agent_registry.tests.factories import MembershipFactory, UserFactory
from evals import runs
from evals.models import DatasetItem, Run, RunStatus, Suite
from frontend.tests import traces
from frontend.tests.test_evals_views import FIRST_ANSWERS, _execute, _suite
from routing.tests import conftest as routing_fixtures
from routing.tests.conftest import Gateway
from routing.tests.fakes import FakeGatewayLLM, say
from tests.browser.pages import log_in

fake = routing_fixtures.fake
gateway = routing_fixtures.gateway

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def site(gateway: Gateway, live_server: LiveServer) -> dict[str, Any]:
    """The gateway's workspace with the "answers" suite, a member who signs in, and the live server's URL."""
    user = UserFactory.create(username="mia")
    MembershipFactory.create(workspace=gateway.workspace, user=user, role=Role.MEMBER)
    return {"url": live_server.url, "workspace": gateway.workspace, "suite": _suite(gateway), "username": "mia"}


def test_a_completed_runs_subgroup_table_highlights_the_worst_group(
    page: Page, site: dict[str, Any], fake: FakeGatewayLLM
) -> None:
    suite: Suite = site["suite"]
    run = _execute(suite, fake, FIRST_ANSWERS)
    base, slug = site["url"], site["workspace"].slug
    log_in(page, base, site["username"])

    page.goto(f"{base}/w/{slug}/")
    page.get_by_role("navigation", name="Workspace").get_by_role("link", name="Suites").click()
    expect(page.get_by_role("heading", name="Eval suites", level=1)).to_be_visible()
    row = page.locator('#suites tr[data-suite="answers"]')
    expect(row.locator("[data-run-status]")).to_have_text("Completed")
    row.get_by_role("link", name=f"#{run.pk}").click()

    expect(page.get_by_role("heading", name=run.name, level=1)).to_be_visible()
    intent = page.locator('table[data-subgroups="intent"]')
    expect(intent.locator("[data-worst-name]")).to_have_text("receipts")
    expect(intent.locator('tr[data-group="receipts"]')).to_have_class("is-worst")
    expect(intent.locator('tr[data-group="receipts"]')).to_contain_text("worst")
    expect(intent.locator('tr[data-group="refunds"]')).not_to_have_class("is-worst")
    expect(page.locator('table[data-subgroups="language"] tr.is-worst')).to_have_attribute("data-group", "es")
    expect(page.locator('[data-report="says_ok"] tr[data-k="4"]')).to_contain_text("75.0%")

    # Drill down: a sample's trajectory link leads to the step-through view of that trace.
    sample_link = page.locator('#item-0 [data-sample="1"] a[data-trace]')
    trace_id = sample_link.get_attribute("data-trace")
    assert trace_id
    assert sample_link.get_attribute("href") == f"/w/{slug}/trajectories/{trace_id}/"


def test_run_now_and_watch_the_progress_reach_completed(page: Page, site: dict[str, Any], fake: FakeGatewayLLM) -> None:
    base, slug = site["url"], site["workspace"].slug
    log_in(page, base, site["username"])
    page.goto(f"{base}/w/{slug}/evals/")

    page.locator('#suites tr[data-suite="answers"]').get_by_role("button", name="Run answers now").click()

    run = Run.objects.get(suite=site["suite"])
    expect(page.get_by_text(f"Started run #{run.pk} of answers (4 items, k = 4).")).to_be_visible()
    progress = page.locator("#run-progress")
    expect(progress).to_have_attribute("data-status", "queued")
    expect(progress.locator("[data-progress-status]")).to_have_text("Queued")
    expect(page.get_by_role("progressbar", name="Run progress")).to_have_attribute("aria-valuenow", "0")

    # No Celery worker runs in this test: execute the run here, as the worker the task went to would.
    fake.script("fast", *[say("ok")] * 16)
    executed = runs.run_execute(run_id=run.pk)
    assert executed is not None
    assert executed.status == RunStatus.COMPLETED

    # The page polls every 2 s; once the run stops it reloads and shows the report.
    expect(progress.locator("[data-progress-status]")).to_have_text("Completed", timeout=15_000)
    expect(page.locator("#run-progress")).to_have_attribute("data-status", "completed")
    expect(page.get_by_role("progressbar", name="Run progress")).to_have_attribute("aria-valuenow", "4")
    expect(page.locator('[data-report="says_ok"] [data-overall]')).to_contain_text("1.000")
    expect(page.get_by_role("button", name="Cancel run")).to_have_count(0)


def test_add_a_trajectory_to_a_new_dataset_from_the_step_through_view(page: Page, site: dict[str, Any]) -> None:
    base, slug = site["url"], site["workspace"].slug
    trajectory = traces.conversation(site["workspace"], "acme/refund", question="I was charged twice for T-9")
    log_in(page, base, site["username"])
    page.goto(f"{base}/w/{slug}/trajectories/{trajectory.trace_id}/")

    card = page.locator("#dataset")
    expect(card.get_by_role("heading", name="Add to dataset")).to_be_visible()
    card.get_by_label("Or a new dataset").fill("hard-cases")
    card.get_by_role("button", name="Add to dataset").click()

    expect(page.get_by_text("Added the trajectory to the dataset hard-cases: version 1 has 1 item.")).to_be_visible()
    item = DatasetItem.objects.get(version__dataset__name="hard-cases")
    assert item.source_trace_id == trajectory.trace_id
    assert item.version.version == 1

    # The new dataset is offered the next time, and naming it again is refused beside the field.
    card = page.locator("#dataset")
    expect(card.get_by_label("Dataset", exact=True)).to_contain_text("hard-cases")
    card.get_by_label("Or a new dataset").fill("hard-cases")
    card.get_by_role("button", name="Add to dataset").click()
    expect(page.locator("#dataset-new-name-error")).to_contain_text("a dataset named 'hard-cases' exists")
    assert DatasetItem.objects.filter(version__dataset__name="hard-cases").count() == 1
