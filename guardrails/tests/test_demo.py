"""The demo's guardrails data: produced by the checks, the action boundary and the budget ledger on the
ride-support bot, and seeded once however often `demo_seed` runs."""

from __future__ import annotations

from decimal import Decimal

import pytest

from agent_registry import demo as registry_demo
from evals.models import RunSample
from guardrails import demo
from guardrails.models import (
    ApprovalEvent,
    ApprovalRequest,
    Budget,
    BudgetAlert,
    BudgetReservation,
    BudgetUsage,
    GuardrailViolation,
)
from tracing.models import Trajectory

pytestmark = pytest.mark.django_db


def _demo_violations(workspace):
    # The gateway's own traffic may record violations too; the seed's are the ride-support bot's with these sources.
    return GuardrailViolation.objects.filter(workspace=workspace, agent__slug="ride-support")


def test_the_checks_record_violations_on_every_layer(demo_workspace):
    found = set(_demo_violations(demo_workspace).values_list("layer", "check_name", "action", "source"))

    assert {
        ("input", "prompt_injection", "block", "user"),
        ("input", "pii", "redact", "user"),
        ("tool", "indirect_injection", "block", "tool_result"),
        ("output", "system_prompt_leakage", "block", "user"),
        ("output", "secrets", "redact", "user"),
    } <= found
    # Each points at one of the bot's trajectories.
    traces = set(
        _demo_violations(demo_workspace).exclude(check_name="action_boundary").values_list("trace_id", flat=True)
    )
    known = Trajectory.objects.filter(workspace=demo_workspace, agent__slug="ride-support").values_list(
        "trace_id", flat=True
    )
    assert len(traces) == 5
    assert traces <= set(known)


def test_refunds_over_the_limit_wait_for_a_person_and_over_the_ceiling_are_blocked(demo_workspace):
    approvals = ApprovalRequest.objects.filter(workspace=demo_workspace, conversation_id__startswith="demo-refund-")

    assert sorted(approvals.values_list("conversation_id", "status", "arguments__amount")) == [
        ("demo-refund-approved", "used", 35),
        ("demo-refund-pending", "pending", 64.5),
        ("demo-refund-rejected", "rejected", 92),
    ]
    rejected = approvals.get(status="rejected")
    assert approvals.filter(pk=rejected.pk).values_list("decided_by__username", "decision_note").get() == (
        registry_demo.DEMO_USERNAME,
        "The surcharge is in the published fare; offer an explanation, not a refund.",
    )
    assert list(ApprovalEvent.objects.filter(approval=rejected).values_list("kind", flat=True).order_by("pk")) == [
        "requested",
        "rejected",
        "refused",
    ]
    blocked = _demo_violations(demo_workspace).filter(check_name="action_boundary", action="block")
    assert sorted(blocked.values_list("evidence", flat=True)) == [
        "issue_refund: a person rejected this call (request "
        f"{rejected.pk}): The surcharge is in the published fare; offer an explanation, not a refund.",
        "issue_refund: issue_refund breaks the constraint issue_refund.amount <= 150",
    ]


def test_budgets_show_spend_and_the_refused_request_raised_an_alert(demo_workspace):
    budgets = {budget.scope: budget for budget in Budget.objects.filter(workspace=demo_workspace)}

    assert sorted(budgets) == ["agent", "api_key", "workspace"]
    usage = {usage.budget.scope: usage for usage in BudgetUsage.objects.filter(budget__workspace=demo_workspace)}
    # The evals demo's runs come after, through the gateway too: the workspace pays for them as well.
    samples = RunSample.objects.filter(item__run__workspace=demo_workspace, cost_usd__isnull=False)
    evals_spend = sum(cost for cost in samples.values_list("cost_usd", flat=True) if cost is not None)
    assert evals_spend > 0
    assert float(usage["workspace"].spent_usd) == pytest.approx(1.18 + evals_spend, abs=1e-6)
    assert usage["api_key"].spent_usd == Decimal("1.18")
    # The guardrails demo's own 40,000 tokens, the evals demo's runs on top, never past the daily limit.
    assert 40_000 < usage["agent"].spent_tokens <= demo.AGENT_DAILY_TOKENS
    assert all(item.reserved_usd == 0 and item.reserved_tokens == 0 for item in usage.values())
    assert list(BudgetAlert.objects.filter(workspace=demo_workspace).values_list("budget__scope", "kind")) == [
        ("agent", "exceeded")
    ]


def test_seeding_again_adds_nothing(demo_workspace):
    def counts():
        return (
            GuardrailViolation.objects.filter(workspace=demo_workspace).count(),
            ApprovalRequest.objects.filter(workspace=demo_workspace).count(),
            ApprovalEvent.objects.filter(approval__workspace=demo_workspace).count(),
            Budget.objects.filter(workspace=demo_workspace).count(),
            BudgetReservation.objects.filter(workspace=demo_workspace).count(),
            BudgetAlert.objects.filter(workspace=demo_workspace).count(),
        )

    before = counts()

    demo.demo_guardrails_seed(demo_workspace)
    registry_demo.demo_seed()

    assert counts() == before
    assert before[3] == 3
