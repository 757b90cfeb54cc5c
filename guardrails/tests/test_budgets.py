"""Budgets: reserving the estimated maximum, settling, refusing over a limit (nothing held), soft-limit
alerts once per period, the scopes a request matches, estimates, and the sweep of stale reservations."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from agent_registry import services as registry_services
from agent_registry.tests.factories import AgentFactory
from guardrails import budgets, selectors
from guardrails.exceptions import BudgetExceeded, BudgetExists, BudgetInvalid
from guardrails.models import BudgetAlert, BudgetReservation, BudgetUsage
from guardrails.tests.factories import BudgetFactory
from tracing import pricing

pytestmark = pytest.mark.django_db


def usage_state():
    return list(
        BudgetUsage.objects.order_by("pk").values_list(
            "budget_id", "spent_usd", "reserved_usd", "spent_tokens", "reserved_tokens"
        )
    )


def reserve(workspace, usd="0.10", tokens=100, **scope):
    return budgets.budget_reserve(
        workspace_id=workspace.pk, estimated_usd=Decimal(usd), estimated_tokens=tokens, **scope
    )


def test_no_budget_holds_nothing(workspace):
    reservation = reserve(workspace)

    assert reservation == budgets.Reservation(None, (), Decimal("0.10"), 100)
    assert BudgetReservation.objects.count() == 0
    budgets.budget_settle(reservation=reservation, actual_usd=Decimal("0.05"), actual_tokens=50)


def test_reserve_then_settle_counts_the_actual_and_releases_the_rest(workspace):
    budget = BudgetFactory.create(workspace=workspace, limit_usd=Decimal("1.00"), limit_tokens=10_000)

    reservation = reserve(workspace, usd="0.30", tokens=1000)
    usage = BudgetUsage.objects.get()
    assert (usage.budget_id, usage.spent_usd, usage.reserved_usd, usage.reserved_tokens) == (
        budget.pk,
        Decimal(0),
        Decimal("0.30"),
        1000,
    )
    budgets.budget_settle(reservation=reservation, actual_usd=Decimal("0.12"), actual_tokens=400)
    budgets.budget_settle(reservation=reservation, actual_usd=Decimal("0.12"), actual_tokens=400)  # once only

    assert usage_state() == [(budget.pk, Decimal("0.12"), Decimal(0), 400, 0)]
    assert BudgetReservation.objects.get().settled_at is not None


def test_a_request_over_the_limit_is_refused_and_holds_nothing(workspace):
    budget = BudgetFactory.create(workspace=workspace, limit_usd=Decimal("0.50"))
    budgets.budget_settle(reservation=reserve(workspace, usd="0.40"), actual_usd=Decimal("0.40"), actual_tokens=1)
    before = usage_state()

    with pytest.raises(BudgetExceeded) as refused:
        reserve(workspace, usd="0.20")

    assert refused.value.status == 429
    assert refused.value.code == "budget_exceeded"
    assert refused.value.detail == (
        "the daily budget of the workspace is spent: $0.1000 of $0.5000 left, this request may cost up to $0.2000"
    )
    assert refused.value.extra["budget"] == {"id": budget.pk, "scope": "workspace", "scope_value": "", "period": "day"}
    assert 0 < refused.value.extra["retry_after"] <= 86_400
    assert usage_state() == before
    assert BudgetReservation.objects.count() == 1
    assert list(BudgetAlert.objects.values_list("kind", flat=True)) == ["exceeded"]


def test_token_limits_hold_too(workspace):
    BudgetFactory.create(workspace=workspace, limit_tokens=1000, period="month")
    reserve(workspace, usd="0", tokens=800)

    with pytest.raises(BudgetExceeded, match="200 of 1000 tokens left, this request may use up to 300"):
        reserve(workspace, usd="0", tokens=300)


def test_reservations_in_flight_count_against_the_limit(workspace):
    BudgetFactory.create(workspace=workspace, limit_usd=Decimal("1.00"))
    reserve(workspace, usd="0.60")

    with pytest.raises(BudgetExceeded):
        reserve(workspace, usd="0.60")


def test_every_matching_scope_is_checked_and_the_first_broken_is_named(workspace):
    agent = AgentFactory.create(workspace=workspace)
    key, _ = registry_services.apikey_create(workspace=workspace, name="k", scopes=["gateway"])
    BudgetFactory.create(workspace=workspace, limit_usd=Decimal("100"))
    BudgetFactory.create(workspace=workspace, scope="agent", scope_value=str(agent.pk), limit_usd=Decimal("100"))
    BudgetFactory.create(workspace=workspace, scope="api_key", scope_value=str(key.pk), limit_usd=Decimal("100"))
    user_budget = BudgetFactory.create(
        workspace=workspace, scope="end_user", scope_value="alice", limit_usd=Decimal("0.05")
    )
    BudgetFactory.create(workspace=workspace, scope="end_user", scope_value="bob", limit_usd=Decimal("0"))

    reservation = reserve(workspace, usd="0.05", agent_id=agent.pk, api_key_id=key.pk, end_user="alice")
    with pytest.raises(BudgetExceeded) as refused:
        reserve(workspace, usd="0.01", agent_id=agent.pk, api_key_id=key.pk, end_user="alice")

    assert len(reservation.usage_ids) == 4
    assert refused.value.extra["budget"]["id"] == user_budget.pk
    assert "end user alice" in refused.value.detail


def test_another_workspaces_budget_does_not_apply(workspace, other_workspace):
    BudgetFactory.create(workspace=other_workspace, limit_usd=Decimal("0"))

    assert reserve(workspace).id is None


def test_a_soft_limit_alerts_once_per_period(workspace):
    budget = BudgetFactory.create(workspace=workspace, limit_usd=Decimal("1.00"), soft_limit_share=0.5)

    for _ in range(3):
        budgets.budget_settle(reservation=reserve(workspace, usd="0.25"), actual_usd=Decimal("0.25"), actual_tokens=1)

    alert = BudgetAlert.objects.get()
    assert (alert.budget_id, alert.kind, alert.period_start) == (budget.pk, "soft_limit", timezone.now().date())
    assert alert.detail == "the daily budget of the workspace has reached 50% of its limit"


def test_unknown_actuals_are_taken_as_the_estimate(workspace):
    budget = BudgetFactory.create(workspace=workspace, limit_usd=Decimal("1.00"))

    budgets.budget_settle(reservation=reserve(workspace, usd="0.30", tokens=10), actual_usd=None, actual_tokens=None)

    assert usage_state() == [(budget.pk, Decimal("0.30"), Decimal(0), 10, 0)]


def test_stale_reservations_are_settled_in_full_by_the_sweep(workspace):
    budget = BudgetFactory.create(workspace=workspace, limit_usd=Decimal("1.00"))
    stale = reserve(workspace, usd="0.30")
    fresh = reserve(workspace, usd="0.20")
    BudgetReservation.objects.filter(pk=stale.id).update(created_at=timezone.now() - timedelta(hours=1))

    assert budgets.budget_reservations_release_stale() == 1

    assert usage_state() == [(budget.pk, Decimal("0.30"), Decimal("0.20"), 100, 100)]
    assert BudgetReservation.objects.get(pk=fresh.id).settled_at is None


def test_periods_start_on_the_utc_day_and_month():
    moment = datetime(2026, 3, 17, 23, 30, tzinfo=UTC)

    assert budgets.period_start("day", moment) == date(2026, 3, 17)
    assert budgets.period_start("month", moment) == date(2026, 3, 1)


def test_retry_after_counts_to_the_next_period():
    assert budgets.seconds_to_next_period("day", datetime(2026, 3, 17, 23, 30, tzinfo=UTC)) == 1800
    assert budgets.seconds_to_next_period("month", datetime(2026, 12, 31, 23, 0, tzinfo=UTC)) == 3600


def test_a_new_day_starts_from_nothing(workspace):
    budget = BudgetFactory.create(workspace=workspace, limit_usd=Decimal("1.00"))
    yesterday = timezone.now().date() - timedelta(days=1)
    BudgetUsage.objects.create(budget=budget, period_start=yesterday, spent_usd=Decimal("1.00"))

    reservation = reserve(workspace, usd="0.90")

    assert BudgetUsage.objects.get(pk=reservation.usage_ids[0]).period_start == timezone.now().date()


def test_the_estimate_is_the_input_and_max_tokens_at_the_models_price():
    prices = {"acme/small": pricing.ModelPrice.per_million(Decimal(1), Decimal(2))}
    messages = [{"role": "user", "content": "x" * 300}]

    usd, tokens = budgets.request_cost_estimate(model="acme/small", messages=messages, max_tokens=1000, prices=prices)

    assert tokens == 107 + 1000  # 300 // 3 + 4 per message + 3
    assert usd == (Decimal(107) * 1 + Decimal(1000) * 2) / 1_000_000


def test_an_unpriced_model_reserves_tokens_only():
    usd, tokens = budgets.request_cost_estimate(model="nobody/knows", messages=[], max_tokens=None)

    assert (usd, tokens) == (Decimal(0), 3 + budgets.DEFAULT_MAX_OUTPUT_TOKENS)


def test_budget_create_refuses_duplicates_and_bad_scopes(workspace, other_workspace):
    agent = AgentFactory.create(workspace=workspace)
    budgets.budget_create(workspace=workspace, scope="agent", period="day", agent=agent, limit_usd=Decimal(5))

    with pytest.raises(BudgetExists):
        budgets.budget_create(workspace=workspace, scope="agent", period="day", agent=agent, limit_usd=Decimal(9))
    with pytest.raises(BudgetInvalid, match="needs its end user"):
        budgets.budget_create(workspace=workspace, scope="end_user", period="day", limit_usd=Decimal(1))
    with pytest.raises(BudgetInvalid, match="limit_usd, limit_tokens or both"):
        budgets.budget_create(workspace=workspace, scope="workspace", period="day")
    with pytest.raises(BudgetInvalid, match="another workspace"):
        budgets.budget_create(workspace=other_workspace, scope="agent", period="day", agent=agent, limit_usd=Decimal(1))
    assert [(b.scope, b.limit_usd) for b in selectors.budget_list(workspace=workspace)] == [("agent", Decimal(5))]
    assert list(selectors.budget_list(workspace=other_workspace)) == []


def test_budget_status_shows_the_current_period(workspace):
    budget = BudgetFactory.create(workspace=workspace, limit_usd=Decimal("1.00"), soft_limit_share=0.1)
    budgets.budget_settle(reservation=reserve(workspace, usd="0.30"), actual_usd=Decimal("0.20"), actual_tokens=5)
    reserve(workspace, usd="0.10")

    (status,) = selectors.budget_status_list(workspace=workspace)

    assert (status.budget, status.spent_usd, status.reserved_usd, status.spent_tokens, status.reserved_tokens) == (
        budget,
        Decimal("0.20"),
        Decimal("0.10"),
        5,
        100,
    )
    assert (status.soft_limit_reached, status.exhausted) == (True, False)


def test_budgets_matching_reads_what_the_orm_reads(workspace, other_workspace, django_assert_num_queries):
    agent = AgentFactory.create(workspace=workspace)
    key, _ = registry_services.apikey_create(workspace=workspace, name="k", scopes=["gateway"])
    BudgetFactory.create(workspace=workspace, limit_usd=Decimal("100"))
    BudgetFactory.create(workspace=workspace, scope="agent", scope_value=str(agent.pk), limit_usd=Decimal("7"))
    BudgetFactory.create(workspace=workspace, scope="agent", scope_value="999999", limit_usd=Decimal("7"))
    BudgetFactory.create(workspace=workspace, scope="api_key", scope_value=str(key.pk), limit_tokens=500)
    BudgetFactory.create(workspace=workspace, scope="end_user", scope_value="alice", limit_usd=Decimal("0.05"))
    BudgetFactory.create(workspace=other_workspace, limit_usd=Decimal("1"))

    def ids(found):
        return sorted(budget.pk for budget in found)

    for scope in (
        {},
        {"agent_id": agent.pk},
        {"api_key_id": key.pk, "end_user": "alice"},
        {"agent_id": agent.pk, "api_key_id": key.pk, "end_user": "alice"},
        {"end_user": "bob"},
        {"end_user": "alice" + "x" * 300},
    ):
        arguments = {"agent_id": None, "api_key_id": None, "end_user": ""} | scope
        expected = list(budgets._matching(workspace_id=workspace.pk, **budgets._scope_values(**arguments)))
        with django_assert_num_queries(1):
            found = budgets.budgets_matching(workspace_id=workspace.pk, **arguments)
        assert ids(found) == ids(expected)
        assert {budget.pk: budget.limit_usd for budget in found} == {budget.pk: budget.limit_usd for budget in expected}
