"""Shared steps of the browser tests: signing in, and where screenshots go."""

from __future__ import annotations

from pathlib import Path

from playwright.sync_api import Page, expect

from agent_registry import demo as registry_demo
from agent_registry.tests.factories import PASSWORD

SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"


def log_in(page: Page, base_url: str, username: str = registry_demo.DEMO_USERNAME) -> None:
    """Sign in through the login form (the demo login, or a factory-made user's)."""
    password = registry_demo.DEMO_PASSWORD if username == registry_demo.DEMO_USERNAME else PASSWORD
    page.goto(f"{base_url}/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", level=1)).to_be_visible()
