"""The router report compares the chosen answer with its shadows on the judge's scores, whatever quality
the decision took from elsewhere."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from agent_registry.tests.factories import AgentFactory
from routing import reports
from routing.models import OutcomeStatus, ShadowRun, ShadowStatus
from routing.tests.factories import RoutingDecisionFactory

pytestmark = pytest.mark.django_db


def test_the_report_compares_the_chosen_answer_on_the_judges_score_not_on_its_signal_quality(workspace):
    agent = AgentFactory.create(workspace=workspace)
    # The outcome refresh gave the decision the unremarkable signal quality before its shadow was judged.
    decision = RoutingDecisionFactory.create(
        agent=agent,
        tier="chain",
        status=OutcomeStatus.OK,
        quality=0.75,
        quality_source="signals",
        cost_usd=Decimal("0.0002"),
        latency_ms=300,
    )
    ShadowRun.objects.create(
        decision=decision,
        tier="single_call",
        status=ShadowStatus.DONE,
        quality=0.6,
        primary_quality=0.9,
        cost_usd=Decimal("0.00002"),
        latency_ms=40,
    )
    other = RoutingDecisionFactory.create(
        agent=AgentFactory.create(workspace=workspace), tier="single_call", status=OutcomeStatus.OK, quality=0.1
    )
    ShadowRun.objects.create(decision=other, tier="chain", status=ShadowStatus.DONE, quality=0.9, primary_quality=0.1)
    now = timezone.now()

    view = reports.router_report(agent=agent, since=now - timedelta(days=1), until=now + timedelta(minutes=1))

    report = view.report
    assert (report.total, report.compared, report.comparable) == (1, 1, 1)
    assert report.best_tier_rate == 1.0
    assert (report.cheapest_quality, report.router_quality, report.best_quality) == (0.6, 0.9, 0.9)
    assert report.quality_gap_recovered == pytest.approx(1.0)
    chain = report.tier("chain")
    assert chain is not None
    assert chain.mean_quality == 0.75  # the tier's own quality stays the decision's
