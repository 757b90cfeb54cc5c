"""Celery entry points of the guardrails: the sweeps that keep approvals and budget reservations honest."""

from __future__ import annotations

from celery import shared_task

from guardrails import budgets, services


@shared_task(name="guardrails.approval_requests_expire", ignore_result=True, soft_time_limit=50, time_limit=60)
def approval_requests_expire() -> None:
    """Scheduled by beat: expire approval requests past their time, pending or approved and unused."""
    services.approval_requests_expire()


@shared_task(name="guardrails.budget_reservations_release", ignore_result=True, soft_time_limit=50, time_limit=60)
def budget_reservations_release() -> None:
    """Scheduled by beat: settle reservations whose request never came back, as spent in full."""
    budgets.budget_reservations_release_stale()
