"""Settings in a real Chromium: an agent's trace retention, mirroring the workspace to Langfuse (the secret
key typed once and never shown back) and a model price, and a screenshot of the integrations page
(docs/screenshots/integrations.png). The data is the demo workspace; the mirror points at a port nothing
listens on, and nothing is delivered."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from agent_registry.models import Agent, Workspace
from config import crypto
from tests.browser.pages import SCREENSHOTS, log_in
from tracing.models import LangfuseMirror, ModelPriceOverride

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SECRET_KEY = "sk-lf-typed-once"


def _screenshot(page: Page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    expect(page.locator("main h1").first).to_be_visible()
    # A viewport as tall as the page, so the image holds all of it.
    full = page.evaluate("document.documentElement.scrollHeight")
    page.set_viewport_size({"width": 1440, "height": max(900, min(full, 2400))})
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(SCREENSHOTS / name))
    page.set_viewport_size({"width": 1440, "height": 900})
    assert (SCREENSHOTS / name).stat().st_size > 10_000


def test_set_the_retention_and_mirror_to_langfuse(page: Page, seeded: dict[str, Any], settings: Any) -> None:
    base = seeded["url"]
    workspace: Workspace = seeded["workspace"]
    agent = Agent.objects.get(workspace=workspace, slug="ride-support")
    page.set_viewport_size({"width": 1440, "height": 900})
    log_in(page, base)

    # The agent's Settings tab: keep its trajectories for 30 days.
    page.goto(f"{base}/w/{workspace.slug}/agents/{agent.slug}/")
    page.get_by_role("navigation", name=agent.name).get_by_role("link", name="Settings", exact=True).click()
    expect(page.get_by_role("heading", name="Agent settings")).to_be_visible()
    expect(page.locator("[data-retention]")).to_contain_text("kept forever")
    page.get_by_label("Trace retention").fill("30")
    page.get_by_role("button", name="Save settings").click()
    expect(page.get_by_text(f"Saved the settings of {agent.name}.")).to_be_visible()
    expect(page.locator("[data-retention]")).to_contain_text("more than 30 days ago are deleted")
    expect(page.get_by_label("Trace retention")).to_have_value("30")
    assert Agent.objects.get(pk=agent.pk).trace_retention_days == 30

    # Integrations: nothing mirrored yet; set up the mirror.
    page.get_by_role("navigation", name="Workspace").get_by_role("link", name="Integrations").click()
    expect(page.get_by_role("heading", name="Integrations", level=1)).to_be_visible()
    mirror_card = page.locator("#langfuse")
    expect(mirror_card.get_by_text("Not mirroring to Langfuse")).to_be_visible()
    mirror_card.get_by_role("link", name="Set up mirroring").click()
    form = page.locator("#langfuse-settings")
    form.get_by_label("Host").fill("http://127.0.0.1:9")
    form.get_by_label("Public key").fill("pk-lf-demo")
    form.get_by_label("Secret key").fill(SECRET_KEY)
    expect(form.get_by_label("Mirror new spans and scores")).to_be_checked()
    form.get_by_role("button", name="Save mirror settings").click()
    # A host on Keel's own machine is refused until the operator permits such addresses.
    expect(page.locator("#langfuse-settings").get_by_text("127.0.0.1 is loopback")).to_be_visible()
    assert not LangfuseMirror.objects.filter(workspace=workspace).exists()
    settings.KEEL_OUTBOUND_ALLOW_PRIVATE = True
    form = page.locator("#langfuse-settings")
    form.get_by_label("Secret key").fill(SECRET_KEY)
    form.get_by_role("button", name="Save mirror settings").click()
    expect(page.get_by_text("this workspace mirrors new spans and scores to http://127.0.0.1:9")).to_be_visible()
    expect(mirror_card.get_by_text("mirroring", exact=True)).to_be_visible()
    expect(mirror_card.locator("[data-mirror-pending]")).to_have_text("0")
    expect(mirror_card.locator("[data-mirror-failed]")).to_have_text("0")
    expect(mirror_card.get_by_role("button", name="Retry failed deliveries")).to_be_disabled()
    expect(form.get_by_label("Secret key")).to_have_value("")
    assert SECRET_KEY not in page.content()
    mirror = LangfuseMirror.objects.get(workspace=workspace)
    assert (mirror.host, mirror.public_key, mirror.enabled) == ("http://127.0.0.1:9", "pk-lf-demo", True)
    assert crypto.decrypt(mirror.secret_key_encrypted) == SECRET_KEY

    # A negotiated price for the ride-support model.
    prices = page.locator("#price-form")
    prices.get_by_label("Model", exact=True).fill("gpt-4o")
    prices.get_by_label("Input, USD per 1M tokens").fill("2.25")
    prices.get_by_label("Output, USD per 1M tokens").fill("9")
    prices.get_by_label("Cache read, USD per 1M tokens").fill("1.125")
    prices.get_by_role("button", name="Save price").click()
    expect(page.get_by_text("Saved the price of gpt-4o")).to_be_visible()
    row = page.locator('#model-prices tr[data-model="gpt-4o"]')
    expect(row).to_contain_text("$2.25")
    expect(row).to_contain_text("$1.125")
    price = ModelPriceOverride.objects.get(workspace=workspace, model="gpt-4o")
    assert (price.input_usd_per_million, price.output_usd_per_million, price.cache_read_usd_per_million) == (
        Decimal("2.25"),
        Decimal("9"),
        Decimal("1.125"),
    )
    _screenshot(page, "integrations.png")

    # A price set by mistake is removed: litellm's price map prices the model's new spans again.
    row.get_by_role("button", name="Remove the price of gpt-4o").click()
    expect(page.get_by_text("Removed the price of gpt-4o")).to_be_visible()
    expect(page.locator('#model-prices tr[data-model="gpt-4o"]')).to_have_count(0)
    assert not ModelPriceOverride.objects.filter(workspace=workspace, model="gpt-4o").exists()
