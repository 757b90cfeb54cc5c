"""Concurrent reservations against one budget, on a transactional database with real threads: the
limit is never overshot, whatever the interleaving."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import pytest
from django.db import connection

from agent_registry.tests.factories import AgentFactory
from guardrails import budgets
from guardrails.exceptions import BudgetExceeded
from guardrails.models import BudgetAlert, BudgetUsage
from guardrails.tests.factories import BudgetFactory

pytestmark = pytest.mark.django_db(transaction=True)
THREADS = 10


def reserve_together(workspace, usd: str, tokens: int, **scope) -> list[budgets.Reservation | None]:
    start = threading.Barrier(THREADS)

    def attempt(_: int) -> budgets.Reservation | None:
        try:
            start.wait(timeout=10)
            return budgets.budget_reserve(
                workspace_id=workspace.pk, estimated_usd=Decimal(usd), estimated_tokens=tokens, **scope
            )
        except BudgetExceeded:
            return None
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        return [future.result() for future in [pool.submit(attempt, n) for n in range(THREADS)]]


def test_concurrent_reservations_cannot_overshoot_a_money_limit(workspace):
    BudgetFactory.create(workspace=workspace, limit_usd=Decimal("1.00"))

    outcomes = reserve_together(workspace, usd="0.30", tokens=10)

    assert sum(outcome is not None for outcome in outcomes) == 3
    usage = BudgetUsage.objects.get()
    assert usage.reserved_usd == Decimal("0.90")
    assert BudgetAlert.objects.filter(kind="exceeded").count() == 1


def test_concurrent_reservations_across_two_budgets_keep_both(workspace):
    agent = AgentFactory.create(workspace=workspace)
    BudgetFactory.create(workspace=workspace, limit_tokens=1000)
    BudgetFactory.create(
        workspace=workspace, scope="agent", scope_value=str(agent.pk), limit_tokens=450, period="month"
    )

    outcomes = reserve_together(workspace, usd="0", tokens=100, agent_id=agent.pk)

    assert sum(outcome is not None for outcome in outcomes) == 4
    assert sorted(BudgetUsage.objects.values_list("reserved_tokens", flat=True)) == [400, 400]


def test_settling_concurrently_keeps_the_ledger_exact(workspace):
    BudgetFactory.create(workspace=workspace, limit_usd=Decimal("10.00"))
    reservations = [
        budgets.budget_reserve(workspace_id=workspace.pk, estimated_usd=Decimal("0.50"), estimated_tokens=50)
        for _ in range(THREADS)
    ]
    start = threading.Barrier(THREADS)

    def settle(reservation: budgets.Reservation) -> None:
        try:
            start.wait(timeout=10)
            budgets.budget_settle(reservation=reservation, actual_usd=Decimal("0.10"), actual_tokens=10)
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        for future in [pool.submit(settle, reservation) for reservation in reservations]:
            future.result()

    usage = BudgetUsage.objects.get()
    assert (usage.spent_usd, usage.reserved_usd, usage.spent_tokens, usage.reserved_tokens) == (
        Decimal("1.00"),
        Decimal(0),
        100,
        0,
    )
