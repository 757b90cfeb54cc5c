"""The dashboard in a real Chromium: live validation of requirements, deploying and rolling back a
prompt, keyboard access, and full-page screenshots of every main page (docs/screenshots/).

The data is built with the services, as a product team would build it: a ride-support agent modelled
on the framework's worked example (shared/seeds), a shopping assistant and a code-review agent whose
answers contradict each other, prompts with versions and labels, and API keys."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from agent_registry import selectors, services
from agent_registry.models import Agent, AgentStatus, Prompt, PromptLabel, Role, Workspace
from agent_registry.tests.factories import MembershipFactory, UserFactory, WorkspaceFactory
from tests.browser.pages import SCREENSHOTS, log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


RIDE_SUPPORT_V1: dict[str, Any] = {
    "error_surface": {
        "decision_authority": "bounded_autonomy",
        "error_cost": {
            "worse_direction": "false_positive",
            "description": "A wrongly issued refund is lost money and invites refund gaming; a wrongly denied "
            "one costs a re-contact.",
            "ratio": 3,
        },
        "recoverability": "days",
        "actions": [
            {
                "name": "lookup_trip",
                "description": "Trip by ID: route, fare, status",
                "mode": "execute",
                "stakes": "low",
            },
            {
                "name": "lookup_payment",
                "description": "Charges and refunds of a trip",
                "mode": "execute",
                "stakes": "low",
            },
            {
                "name": "issue_refund",
                "description": "Refund a charge to the rider's payment method",
                "mode": "execute",
                "stakes": "moderate",
                "side_effects": True,
                "autonomy_limit_usd": "20",
            },
            {
                "name": "modify_account",
                "description": "Change account settings",
                "mode": "recommend",
                "stakes": "high",
                "side_effects": True,
            },
        ],
        "notes": "Advisory for questions, bounded autonomy for small refunds, humans for disputes and safety.",
    },
    "io_gap": {
        "steps_median": 2,
        "steps_p95": 5,
        "steps_predictable": True,
        "output_verifiable_from_input": False,
        "atomic_operations": ["extraction", "classification", "generation", "decision_action"],
        "notes": "Double charge: extract claim, fetch trip, fetch payment, match policy, decide.",
    },
    "constraints": {
        "latency": {"latency_class": "conversational", "hard_ceiling_ms": 30000},
        "cost": {
            "per_request_ceiling_usd": "0.50",
            "per_resolution_ceiling_usd": "2.00",
            "comparison_point": "Human support agent",
            "comparison_cost_usd": "8.00",
            "single_call_cost_usd": "0.01",
            "expected_daily_requests": 40000,
        },
        "privacy": {
            "pii_handling": "pseudonymize",
            "may_see": "Trip IDs, fares, payment status",
            "may_infer": "Nothing about health or relationships from routes",
            "may_store": "Trajectories for 30 days",
            "may_transmit": "Trip IDs to the payments tool only",
        },
        "governance": "policy_compliance_auditing",
    },
    "pareto": {
        "quality_vs_speed": 25,
        "autonomy_vs_control": 65,
        "generality_vs_reliability": 55,
        "primary_axis": "quality_speed",
        "rationale": "A wrong resolution costs more than a slow one, up to the 2-3 minute abandonment cliff.",
    },
    "evaluation": {
        "output_metrics": [
            {"name": "resolution_rate", "description": "Closed without a human", "target": 0.7},
            {"name": "recontact_rate", "description": "Came back within 7 days", "target": 0.15, "comparator": "<="},
        ],
        "trajectory_metrics": [
            {"name": "policy_compliance_rate", "description": "Every action within policy", "target": 0.99},
        ],
    },
    "routing": {
        "mode": "adaptive",
        "enabled_tiers": ["single_call", "chain", "human"],
        "default_tier": "single_call",
        "signal": "classifier",
        "escalation_rules": [
            {"trigger": "keywords", "value": "unsafe, assault, harassed", "to_tier": "human", "reason": "Safety"},
            {"trigger": "intent", "value": "fare_adjustment", "to_tier": "chain", "reason": "Needs policy lookup"},
        ],
    },
}


def _ride_support_v2() -> dict[str, Any]:
    answers = copy.deepcopy(RIDE_SUPPORT_V1)
    answers["io_gap"]["steps_p95"] = 6
    answers["io_gap"]["steps_predictable"] = False
    answers["evaluation"]["output_metrics"].append(
        {"name": "csat", "description": "Post-chat survey, 1 to 5", "target": 4.2}
    )
    answers["evaluation"]["trajectory_metrics"] += [
        {"name": "action_appropriateness", "target": 0.95},
        {"name": "escalation_accuracy", "target": 0.9},
    ]
    answers["routing"]["escalation_rules"].append(
        {"trigger": "amount_over", "value": "20", "to_tier": "human", "reason": "Refunds above the autonomy limit"}
    )
    return answers


SHOPPING: dict[str, Any] = {
    "error_surface": {
        "decision_authority": "advisory",
        "error_cost": {"worse_direction": "symmetric", "ratio": 1},
        "recoverability": "instant",
        "actions": [{"name": "search_catalog", "mode": "execute", "stakes": "low"}],
    },
    "io_gap": {
        "steps_median": 1,
        "steps_p95": 2,
        "output_verifiable_from_input": True,
        "atomic_operations": ["generation", "classification"],
    },
    "constraints": {
        "latency": {"latency_class": "inline", "hard_ceiling_ms": 1500},
        "cost": {
            "per_request_ceiling_usd": "0.01",
            "single_call_cost_usd": "0.004",
            "expected_daily_requests": 2000000,
        },
        "privacy": {"pii_handling": "no_pii"},
        "governance": "output_monitoring",
    },
    "pareto": {
        "quality_vs_speed": 85,
        "autonomy_vs_control": 90,
        "generality_vs_reliability": 80,
        "primary_axis": "quality_speed",
    },
    "evaluation": {"output_metrics": [{"name": "click_through_rate", "target": 0.3}]},
    "routing": {"mode": "single_level", "enabled_tiers": ["single_call"], "default_tier": "single_call"},
}

CODE_REVIEW: dict[str, Any] = {
    "error_surface": {
        "decision_authority": "full_autonomy",
        "error_cost": {"worse_direction": "false_negative", "ratio": 10},
        "recoverability": "irreversible",
        "actions": [
            {"name": "read_diff", "mode": "execute", "stakes": "low"},
            {"name": "merge_pull_request", "mode": "execute", "stakes": "high", "side_effects": True},
        ],
    },
    "io_gap": {
        "steps_median": 8,
        "steps_p95": 30,
        "steps_predictable": False,
        "output_verifiable_from_input": False,
        "atomic_operations": ["transformation", "decision_action"],
    },
    "constraints": {
        "latency": {"latency_class": "asynchronous", "hard_ceiling_ms": 1800000},
        "cost": {"per_request_ceiling_usd": "2.00", "single_call_cost_usd": "0.05"},
        "privacy": {"pii_handling": "no_pii"},
        "governance": "policy_compliance_auditing",
    },
    "pareto": {
        "quality_vs_speed": 10,
        "autonomy_vs_control": 20,
        "generality_vs_reliability": 40,
        "primary_axis": "autonomy_control",
    },
    "evaluation": {"output_metrics": [{"name": "bugs_caught", "target": 0.8}]},
    "routing": {"mode": "single_level", "enabled_tiers": ["agentic"], "default_tier": "agentic"},
}

SUPPORT_CHAT_V1 = [
    {
        "role": "system",
        "content": "You are Ride support for {{company}}. Resolve trip and payment issues within policy.",
    },
    {"type": "placeholder", "name": "history"},
    {"role": "user", "content": "{{question}}"},
]
SUPPORT_CHAT_V2 = [
    {
        "role": "system",
        "content": "You are Ride support for {{company}}. Resolve trip and payment issues within policy.\n"
        "Refunds above $20 and anything about safety go to a human: say so, and hand over.",
    },
    {"type": "placeholder", "name": "history"},
    {"role": "user", "content": "{{question}}"},
]


def _demo(live_server_url: str) -> dict[str, Any]:
    workspace = WorkspaceFactory.create(slug="acme", name="Acme Mobility")
    WorkspaceFactory.create(slug="globex", name="Globex")
    dana = UserFactory.create(username="dana", first_name="Dana", is_staff=True)
    sam = UserFactory.create(username="sam", first_name="Sam")
    MembershipFactory.create(workspace=workspace, user=dana, role=Role.OWNER)
    MembershipFactory.create(workspace=workspace, user=sam, role=Role.MEMBER)

    ride = services.agent_create(
        workspace=workspace,
        slug="ride-support",
        name="Ride support",
        description="Resolves trip and payment issues in the rider app's support chat; escalates disputes "
        "and anything about safety to a human.",
        owner=dana,
        status=AgentStatus.ACTIVE,
    )
    services.requirements_version_create(
        agent=ride, answers=RIDE_SUPPORT_V1, message="First answers from the framing workshop", created_by=dana
    )
    services.requirements_version_create(
        agent=ride,
        answers=_ride_support_v2(),
        message="Commit to trajectory metrics; escalate refunds above the limit",
        created_by=sam,
    )
    shopping = services.agent_create(
        workspace=workspace,
        slug="product-search",
        name="Product search",
        description="Answers shopping questions in the search bar with products from the catalog.",
        owner=sam,
        status=AgentStatus.ACTIVE,
    )
    services.requirements_version_create(
        agent=shopping, answers=SHOPPING, message="Inline, cheap, advisory", created_by=sam
    )
    review = services.agent_create(
        workspace=workspace,
        slug="code-review",
        name="Code review",
        description="Reviews pull requests and merges the ones it approves.",
        owner=dana,
    )
    services.requirements_version_create(agent=review, answers=CODE_REVIEW, message="Draft", created_by=dana)
    services.agent_create(
        workspace=workspace, slug="refund-auditor", name="Refund auditor", owner=dana, status=AgentStatus.PAUSED
    )

    chat = services.prompt_create(
        agent=ride,
        name="support/system",
        type="chat",
        template=SUPPORT_CHAT_V1,
        config={"model": "gpt-4o-mini", "temperature": 0.2},
        commit_message="First system prompt",
        labels=["production"],
        created_by=dana,
    )
    services.prompt_version_create(
        prompt=chat.prompt,
        template=SUPPORT_CHAT_V2,
        config={"model": "gpt-4o-mini", "temperature": 0.1, "max_tokens": 600},
        commit_message="Say when a case goes to a human",
        labels=["staging"],
        created_by=sam,
    )
    triage = services.prompt_create(
        agent=ride,
        name="support/triage",
        type="text",
        template="Classify the rider's message into one of: {{intents}}.\n\nMessage: {{message}}\nIntent:",
        config={"model": "gpt-4o-mini", "temperature": 0},
        commit_message="Intent classifier for the router",
        labels=["production"],
        created_by=sam,
    )
    services.prompt_create(
        agent=shopping,
        name="search/answer",
        type="text",
        template="Recommend at most three products for: {{query}}\nCatalog results:\n{{results}}",
        config={"model": "gpt-4o-mini", "max_tokens": 200},
        labels=["production"],
        created_by=sam,
    )
    services.apikey_create(workspace=workspace, name="Production ingest", scopes=["ingest"], created_by=dana)
    services.apikey_create(
        workspace=workspace, name="Ride support gateway", scopes=["gateway", "read"], agents=[ride], created_by=dana
    )
    old, _ = services.apikey_create(
        workspace=workspace, name="Old staging key", scopes=["ingest", "write"], created_by=dana
    )
    services.apikey_revoke(api_key=old)
    services.worker_heartbeat_record(hostname="celery@worker-1")
    return {
        "workspace": workspace,
        "ride": ride,
        "chat": chat.prompt,
        "triage": triage.prompt,
        "url": live_server_url,
    }


@pytest.fixture
def demo(live_server) -> dict[str, Any]:
    return _demo(live_server.url)


def test_requirements_live_validation_and_save(page: Page, demo: dict[str, Any]) -> None:
    base = demo["url"]
    log_in(page, base, "sam")
    expect(page).to_have_url(f"{base}/w/acme/")
    page.get_by_role("link", name="Agents", exact=True).click()
    page.get_by_role("link", name="Ride support").first.click()
    page.get_by_role("link", name="Requirements", exact=True).click()
    expect(page.get_by_role("heading", name="Error surface")).to_be_visible()

    # A field error appears while editing, on the input it belongs to.
    page.locator("#f-io_gap-steps_p95").fill("1")
    error = page.locator('[data-error-for="io_gap.steps_p95"]')
    expect(error).to_contain_text("steps_p95 must be at least steps_median")
    expect(page.locator("#f-io_gap-steps_p95")).to_have_attribute("aria-invalid", "true")
    page.locator("#f-io_gap-steps_p95").fill("6")
    expect(error).to_be_empty()

    # An inline latency wall with the agentic tier enabled contradicts itself.
    page.get_by_label("Agentic loop").check()
    page.locator("#f-constraints-latency-latency_class").select_option("inline")
    feasibility = page.locator("#feasibility")
    expect(feasibility).to_contain_text("inline_latency_with_agentic_tier")
    expect(feasibility).to_contain_text("leaves no room for an agentic loop")
    expect(page.locator('[data-wrapper-for="constraints.latency.latency_class"]')).to_have_class(
        re.compile("is-flagged")
    )

    page.get_by_label("Commit message").fill("Try the agentic tier inline")
    page.get_by_role("button", name="Save as new version").click()

    expect(page.get_by_role("status").filter(has_text="Saved requirements v3")).to_be_visible()
    expect(page.locator(".messages")).to_contain_text("Feasibility error: An inline latency wall")
    expect(page.locator(".findings")).to_contain_text("inline_latency_with_agentic_tier")
    ride = selectors.agent_get(workspace=demo["workspace"], slug="ride-support")
    assert ride.current_requirements is not None
    assert ride.current_requirements.version == 3
    assert ride.current_requirements.message == "Try the agentic tier inline"
    assert ride.current_requirements.answers["constraints"]["latency"]["latency_class"] == "inline"
    assert ride.current_requirements.answers["routing"]["enabled_tiers"] == ["single_call", "chain", "agentic", "human"]


def test_rows_can_be_added_and_removed(page: Page, demo: dict[str, Any]) -> None:
    base = demo["url"]
    log_in(page, base, "sam")
    page.goto(f"{base}/w/acme/agents/ride-support/requirements/")
    page.get_by_role("button", name="+ Add action").click()
    # The new row's first input has the focus, so a keyboard user can type straight away.
    new_name = page.locator('input[name="error_surface.actions.4.name"]')
    expect(new_name).to_be_focused()
    new_name.fill("send_voucher")
    page.locator('select[name="error_surface.actions.4.mode"]').select_option("execute")
    page.locator('select[name="error_surface.actions.4.stakes"]').select_option("low")
    page.locator("#f-error_surface-actions-0").get_by_role("button", name="Remove this action").click()
    page.get_by_label("Commit message").fill("Vouchers instead of trip lookups")
    page.get_by_role("button", name="Save as new version").click()
    expect(page.get_by_role("status").filter(has_text="Saved requirements v3")).to_be_visible()

    ride = selectors.agent_get(workspace=demo["workspace"], slug="ride-support")
    assert ride.current_requirements is not None
    names = [action["name"] for action in ride.current_requirements.answers["error_surface"]["actions"]]
    assert names == ["lookup_payment", "issue_refund", "modify_account", "send_voucher"]


def _label_version(prompt: Prompt, label: str) -> int:
    return PromptLabel.objects.select_related("version").get(prompt=prompt, name=label).version.version


def test_publish_deploy_and_roll_back_a_prompt(page: Page, demo: dict[str, Any]) -> None:
    base = demo["url"]
    triage: Prompt = demo["triage"]
    log_in(page, base, "sam")
    page.goto(f"{base}/w/acme/prompts/")
    page.get_by_role("link", name="support/triage").click()
    expect(page.get_by_role("heading", name="support/triage", level=1)).to_be_visible()

    template = page.get_by_label("Template")
    expect(template).to_have_value(re.compile(r"Classify the rider's message"))
    template.fill("Classify the rider's message into exactly one of: {{intents}}.\n\nMessage: {{message}}\nIntent:")
    page.get_by_label("Commit message").fill("Exactly one intent")
    page.get_by_role("button", name="Publish v2").click()
    expect(page.locator(".messages")).to_contain_text("Published support/triage v2.")
    assert _label_version(triage, "production") == 1

    # Deploy: move production to v2.
    production = page.locator('form[data-label="production"]')
    production.get_by_label("Version for production").select_option("2")
    production.get_by_role("button", name="Move").click()
    expect(page.locator(".messages")).to_contain_text("production now points at v2.")
    expect(page.locator('form[data-label="production"]')).to_contain_text("→ v2")
    assert _label_version(triage, "production") == 2

    # The diff shows what changed between the two versions.
    diff = page.get_by_role("region", name="Template diff")
    expect(diff.locator(".diff-add")).to_contain_text("exactly one of")
    expect(diff.locator(".diff-del")).to_contain_text("into one of")

    # Roll back from the deployment history.
    page.get_by_role("button", name="Roll back to v1").click()
    expect(page.locator(".messages")).to_contain_text("production now points at v1.")
    assert _label_version(triage, "production") == 1
    moves = selectors.prompt_label_move_list(prompt=triage).values_list(
        "label", "from_version__version", "to_version__version"
    )
    assert list(moves[:2]) == [("production", 2, 1), ("production", 1, 2)]


def test_try_it_names_missing_variables(page: Page, demo: dict[str, Any]) -> None:
    base = demo["url"]
    log_in(page, base, "sam")
    page.goto(f"{base}/w/acme/prompts/{demo['triage'].pk}/")
    try_it = page.locator("#try-it")
    try_it.get_by_label("intents").fill("refund, lost_item, safety")
    try_it.get_by_role("button", name="Render").click()
    expect(page.locator("#try-it-result")).to_contain_text("Missing value for message")
    try_it.get_by_label("message").fill("I was charged twice")
    try_it.get_by_role("button", name="Render").click()
    expect(page.locator("#try-it-result .output")).to_contain_text("Message: I was charged twice")


def test_keyboard_reaches_the_skip_link_and_menus(page: Page, demo: dict[str, Any]) -> None:
    base = demo["url"]
    log_in(page, base, "dana")
    page.keyboard.press("Tab")
    expect(page.get_by_role("link", name="Skip to content")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator("main")).to_be_focused()
    user_menu = page.get_by_label("User menu for dana")
    # Focus and key press in one step: a focus change the skip link's navigation makes late (seen on a loaded
    # CI machine) cannot land between them and swallow the Enter.
    user_menu.press("Enter")
    expect(page.locator("details.menu", has=user_menu)).to_have_attribute("open", "")
    expect(page.get_by_role("link", name="Django admin")).to_be_visible()


def test_screenshots_of_every_main_page(page: Page, demo: dict[str, Any]) -> None:
    base = demo["url"]
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.set_viewport_size({"width": 1440, "height": 900})
    log_in(page, base, "dana")
    chat: Prompt = demo["chat"]
    ride: Agent = demo["ride"]
    workspace: Workspace = demo["workspace"]
    pages = {
        "home.png": f"/w/{workspace.slug}/",
        "agents.png": f"/w/{workspace.slug}/agents/",
        "agent.png": f"/w/{workspace.slug}/agents/{ride.slug}/",
        "requirements.png": f"/w/{workspace.slug}/agents/{ride.slug}/requirements/",
        "requirements-diff.png": f"/w/{workspace.slug}/agents/{ride.slug}/requirements/history/?a=1&b=2",
        "configuration.png": f"/w/{workspace.slug}/agents/{ride.slug}/configuration/",
        "prompt.png": f"/w/{workspace.slug}/prompts/{chat.pk}/?var.company=Acme&var.question=Where+is+my+refund%3F",
        "keys.png": f"/w/{workspace.slug}/keys/",
    }
    for name, path in pages.items():
        response = page.goto(base + path)
        assert response is not None
        assert response.status == 200, path
        expect(page.locator("main h1").first).to_be_visible()
        if name == "prompt.png":
            try_it = page.locator("#try-it")
            try_it.get_by_label("history").fill('[{"role": "user", "content": "I was charged twice"}]')
            try_it.get_by_role("button", name="Render").click()
            expect(page.locator("#try-it-result .output")).to_contain_text("You are Ride support for Acme")
        # A viewport as tall as the page, so sticky bars sit where a reader expects them, not mid-page.
        height = page.evaluate("document.documentElement.scrollHeight")
        page.set_viewport_size({"width": 1440, "height": max(900, height)})
        page.screenshot(path=str(SCREENSHOTS / name), full_page=True)
        page.set_viewport_size({"width": 1440, "height": 900})
        assert (SCREENSHOTS / name).stat().st_size > 10_000
