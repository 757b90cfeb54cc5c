"""Training in a real Chromium: build a curation in the builder and watch its preview follow the form, save
it, export it as ART with one click and watch the export page's polling follow the export to succeeded and
offer the file (no Celery worker runs here: the test writes the export itself, as the worker the task went
to would); and read a training job's page with its metric charts and the reward-hacking flag. The data is
the view tests': an eval run whose k answers per item form groups (trainer_bridge/tests/conftest.py)."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import Page, expect
from pytest_django.live_server_helper import LiveServer

from agent_registry import services as registry_services
from agent_registry.models import Role
from agent_registry.tests.factories import MembershipFactory, UserFactory
from evals.models import Run
from routing.tests.conftest import Gateway
from tests.browser.pages import log_in
from trainer_bridge import jobs, services
from trainer_bridge.models import Curation, Export, JobStatus
from trainer_bridge.tests import conftest as training_fixtures
from trainer_bridge.tests.test_exports import _curation

fake = training_fixtures.fake
gateway = training_fixtures.gateway
media = training_fixtures.media
run = training_fixtures.run

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def site(gateway: Gateway, run: Run, live_server: LiveServer) -> dict[str, Any]:
    """The gateway's workspace with a finished k = 4 eval run, a member who signs in, and the server's URL."""
    user = UserFactory.create(username="mia")
    MembershipFactory.create(workspace=gateway.workspace, user=user, role=Role.MEMBER)
    return {"url": live_server.url, "workspace": gateway.workspace, "run": run, "username": "mia"}


def test_build_a_curation_with_its_live_preview_then_export_it(page: Page, site: dict[str, Any]) -> None:
    base, slug, run = site["url"], site["workspace"].slug, site["run"]
    log_in(page, base, site["username"])
    page.goto(f"{base}/w/{slug}/")
    page.get_by_role("navigation", name="Workspace").get_by_role("link", name="Curations").click()
    expect(page.get_by_role("heading", name="Curations", level=1)).to_be_visible()
    page.get_by_role("link", name="New curation").click()

    form = page.locator("#curation-form")
    form.get_by_label("Name", exact=True).fill("from-run")
    form.get_by_label("Eval runs").select_option(str(run.pk))
    form.get_by_label("Grouping").select_option("dataset_item")
    form.get_by_label("Reward source").select_option("run_score")
    form.get_by_label("Score or evaluator name").fill("says_ok")
    form.get_by_label("Score or evaluator name").blur()

    # The preview follows the form: two items have mixed answers; one of each identical answer is kept.
    preview = page.locator("#preview")
    expect(preview.locator("[data-preview-groups]")).to_have_text("2")
    expect(preview.locator("[data-preview-rollouts]")).to_have_text("4")
    expect(preview.locator("[data-preview-trajectories]")).to_have_text("16")
    form.get_by_label("Drop near-identical rollouts").uncheck()
    expect(preview.locator("[data-preview-rollouts]")).to_have_text("8")
    form.get_by_label("Drop near-identical rollouts").check()
    expect(preview.locator("[data-preview-rollouts]")).to_have_text("4")
    expect(preview.locator('[data-group-sizes] tr[data-size="2"]')).to_contain_text("2")
    assert not Curation.objects.exists()

    form.get_by_role("button", name="Save curation").click()
    expect(page.get_by_text("Saved the curation from-run.")).to_be_visible()
    expect(page.get_by_role("heading", name="from-run", level=1)).to_be_visible()
    expect(page.locator("#preview [data-preview-groups]")).to_have_text("2")

    page.get_by_role("button", name="Export as ART trajectory groups").click()
    export = Export.objects.get()
    expect(page.get_by_text("Exporting from-run as ART trajectory groups: 2 groups.")).to_be_visible()
    progress = page.locator("#export-progress")
    expect(progress).to_have_attribute("data-status", "queued")
    expect(page.get_by_role("progressbar", name="Export progress")).to_have_attribute("aria-valuenow", "0")
    expect(page.get_by_role("link", name="Download")).to_have_count(0)

    # No Celery worker runs in this test: write the export here, as the worker the task went to would.
    done = services.export_execute(export_id=export.pk)
    assert done is not None
    assert done.status == JobStatus.SUCCEEDED

    # The page polls every 2 s; once the export stops it reloads with the file and its manifest.
    expect(progress.locator("[data-progress-status]")).to_have_text("Succeeded", timeout=15_000)
    expect(page.get_by_role("progressbar", name="Export progress")).to_have_attribute("aria-valuenow", "2")
    download = page.get_by_role("link", name="Download")
    expect(download).to_have_attribute("href", f"/w/{slug}/training/exports/{export.pk}/download/")
    expect(page.locator("[data-manifest-sha256]")).to_have_text(done.sha256)
    with page.expect_download() as info:
        download.click()
    assert info.value.suggested_filename == f"export-{export.pk}-art.jsonl"


def test_a_training_jobs_page_shows_its_charts_and_the_reward_hacking_flag(
    page: Page, site: dict[str, Any], gateway: Gateway
) -> None:
    base, slug, run = site["url"], site["workspace"].slug, site["run"]
    export = services.export_create(curation=_curation(gateway, run), format="art", dispatch=False)
    assert services.export_execute(export_id=export.pk) is not None
    export.refresh_from_db()
    job = jobs.job_create(export=export, method="grpo", base_model="tiny", config={"steps": 4}, name="grpo-1")
    key, _ = registry_services.apikey_create(workspace=gateway.workspace, name="gpu", scopes=["train"])
    assert jobs.job_claim(api_key=key, worker="gpu-1") is not None
    for step, values in [
        (0, {"validation_score": 0.60}),
        (1, {"loss": 0.9, "policy_reward": 0.40, "kl": 0.0}),
        (2, {"loss": 0.7, "policy_reward": 0.55, "kl": 0.01, "validation_score": 0.62}),
    ]:
        jobs.job_metrics_record(job=job, api_key=key, step=step, values=values)
    log_in(page, base, site["username"])
    page.goto(f"{base}/w/{slug}/training/jobs/")
    page.get_by_role("link", name="grpo-1").click()

    expect(page.get_by_role("heading", name="grpo-1", level=1)).to_be_visible()
    flag = page.locator("#reward-hacking")
    expect(flag).to_be_hidden()
    for index in range(4):
        expect(page.locator(f'[data-training-chart="{index}"]')).to_have_attribute("data-drawn", "true")
    expect(page.locator('[data-training-chart="0"]')).to_have_attribute("data-points", "3")

    # The worker reports two more steps: the reward rose while the validation score fell. The page, polling
    # every 5 s while the job runs, raises the flag and extends its charts.
    for step, values in [
        (3, {"loss": 0.5, "policy_reward": 0.70, "kl": 0.02}),
        (4, {"loss": 0.4, "policy_reward": 0.85, "kl": 0.03, "validation_score": 0.50}),
    ]:
        jobs.job_metrics_record(job=job, api_key=key, step=step, values=values)

    expect(flag).to_be_visible(timeout=15_000)
    expect(flag).to_contain_text("Possible reward hacking.")
    expect(flag).to_contain_text("the validation score fell from 0.620 to 0.500")
    expect(page.locator('[data-training-chart="0"]')).to_have_attribute("data-points", "5")
    expect(page.locator("[data-state-text]")).to_contain_text("Step 4 of 4")
    expect(page.locator('#latest-metrics tr[data-metric="validation_score"] td')).to_have_text("0.5000")
