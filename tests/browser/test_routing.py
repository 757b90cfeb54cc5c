"""Routing in a real Chromium: add a model target (its key typed once, never shown back), edit an agent's
router (shadow rate and a new rule), read the router report, and flag a cache hit as false; screenshots of
the router, its report and the cache review (docs/screenshots/router.png, router-report.png,
cache-review.png). The data is the demo workspace, whose routing traffic the demo seeds."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import Page, expect

from agent_registry.models import Agent, Workspace
from config import crypto
from routing.models import CacheHit, ModelTarget, RouterConfig
from routing.tests.factories import CacheEntryFactory, CacheHitFactory
from tests.browser.pages import SCREENSHOTS, log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PROVIDER_KEY = "sk-typed-once-in-the-browser"


def _screenshot(page: Page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    expect(page.locator("main h1").first).to_be_visible()
    full = page.evaluate("document.documentElement.scrollHeight")
    page.set_viewport_size({"width": 1440, "height": max(900, min(full, 2400))})
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(SCREENSHOTS / name))
    page.set_viewport_size({"width": 1440, "height": 900})
    assert (SCREENSHOTS / name).stat().st_size > 10_000


def _unreviewed_hit(agent: Agent) -> CacheHit:
    hit = CacheHit.objects.filter(agent=agent, false_hit__isnull=True).order_by("-created_at").first()
    if hit is not None:
        return hit
    target = ModelTarget.objects.filter(workspace=agent.workspace).order_by("pk").first()
    entry = CacheEntryFactory.create(
        workspace=agent.workspace, agent=agent, model_target=target, request_text="How do I change my card?"
    )
    return CacheHitFactory.create(entry=entry, request_text="How can I change the card I pay with?", similarity=0.94)


def test_add_a_target_edit_the_router_and_flag_a_cache_hit(page: Page, seeded: dict[str, Any]) -> None:
    base = seeded["url"]
    workspace: Workspace = seeded["workspace"]
    agent = Agent.objects.get(workspace=workspace, slug="ride-support")
    page.set_viewport_size({"width": 1440, "height": 900})
    log_in(page, base)

    # Model targets: add a local model server with a key.
    page.goto(f"{base}/w/{workspace.slug}/")
    page.get_by_role("navigation", name="Workspace").get_by_role("link", name="Model targets").click()
    expect(page.get_by_role("heading", name="Model targets", level=1)).to_be_visible()
    form = page.locator("#target-form")
    form.get_by_label("Alias").fill("local-qwen")
    form.get_by_label("litellm model").fill("openai/qwen2.5-7b-instruct")
    form.get_by_label("API base").fill("http://127.0.0.1:9/v1")
    form.get_by_label("API key").fill(PROVIDER_KEY)
    form.get_by_label("Fallbacks").fill("")
    form.get_by_role("button", name="Add target").click()
    expect(page.get_by_text("Added the model target local-qwen.")).to_be_visible()
    row = page.locator('#targets tr[data-target="local-qwen"]')
    expect(row).to_contain_text("openai/qwen2.5-7b-instruct")
    expect(row.locator("[data-health]")).to_have_text("Healthy")
    assert PROVIDER_KEY not in page.content()
    target = ModelTarget.objects.get(workspace=workspace, alias="local-qwen")
    assert crypto.decrypt(target.api_key_encrypted) == PROVIDER_KEY

    # The agent's Router tab: shadow a fifth of the traffic and send lost items to the agentic tier.
    page.goto(f"{base}/w/{workspace.slug}/agents/{agent.slug}/")
    page.get_by_role("navigation", name=agent.name).get_by_role("link", name="Router", exact=True).click()
    expect(page.get_by_role("heading", name="Router configuration")).to_be_visible()
    page.get_by_label("Shadow rate, %").fill("20")
    rules = page.locator("#rules")
    before = rules.locator("[data-row]").count()
    rules.get_by_role("button", name="+ Add rule").click()
    new_rule = rules.locator("[data-row]").nth(before)
    new_rule.get_by_label("Name").fill("lost-items")
    new_rule.get_by_label("Kind").select_option("keywords")
    new_rule.get_by_label("Value").fill("lost item, forgot my, left my")
    new_rule.get_by_label("Send to").select_option("agentic")
    new_rule.get_by_label("Reason").fill("finding an item needs the trip lookup")
    page.get_by_role("button", name="Save router").click()
    expect(page.get_by_text(f"Saved the router of {agent.name}.")).to_be_visible()
    expect(page.get_by_label("Shadow rate, %")).to_have_value("20.0")
    config = RouterConfig.objects.get(agent=agent)
    assert config.shadow_rate == 0.2
    assert config.rules[-1] == {
        "name": "lost-items",
        "kind": "keywords",
        "value": "lost item, forgot my, left my",
        "to_tier": "agentic",
        "reason": "finding an item needs the trip lookup",
    }
    _screenshot(page, "router.png")

    # Its report: the tier mix and what it cost, drawn per day.
    page.get_by_role("navigation", name="Router pages").get_by_role("link", name="Report").click()
    expect(page.get_by_role("heading", name="Per tier")).to_be_visible()
    expect(page.locator("[data-router-chart='mix'][data-drawn]")).to_be_visible()
    _screenshot(page, "router-report.png")

    # The cache review: flag a hit as false, in place.
    hit = _unreviewed_hit(agent)
    page.get_by_role("navigation", name="Workspace").get_by_role("link", name="Cache review").click()
    page.get_by_label("Agent", exact=True).select_option(agent.slug)
    page.get_by_role("button", name="Show").click()
    expect(page.locator("#threshold-table")).to_be_visible()
    card = page.locator(f'[data-hit="{hit.pk}"]')
    expect(card).to_have_attribute("data-verdict", "unreviewed")
    card.get_by_role("button", name="False hit").click()
    expect(page.locator(f'[data-hit="{hit.pk}"]')).to_have_attribute("data-verdict", "false_hit")
    flagged = CacheHit.objects.get(pk=hit.pk)
    assert flagged.false_hit is True
    assert flagged.reviewed_by is not None
    # Reloaded, the threshold table counts the verdict too.
    page.reload()
    expect(page.locator(f'[data-hit="{hit.pk}"]')).to_have_attribute("data-verdict", "false_hit")
    _screenshot(page, "cache-review.png")
