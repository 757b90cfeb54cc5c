"""The demo's gateway traffic: produced by the gateway on the demo's fake provider, varied enough to show
every routing page, and seeded once however often `demo_seed` runs."""

from __future__ import annotations

import pytest

from agent_registry import demo as registry_demo
from guardrails.models import GuardrailViolation
from routing import demo
from routing.models import CacheHit, Handoff, RoutingDecision, ShadowRun
from tracing.models import Span, Trajectory

pytestmark = pytest.mark.django_db


def test_the_demo_traffic_shows_every_tier_method_and_outcome(demo_workspace):
    # The guardrails demo sends requests of its own through the gateway; these are the routing demo's.
    decisions = RoutingDecision.objects.filter(workspace=demo_workspace).exclude(
        conversation_id__startswith="demo-guardrails"
    )

    assert decisions.count() == (
        len(demo.RIDE_WAVE) + len(demo.SHOPPING_WAVE) + len(demo.RIDE_SECOND_WAVE) + len(demo.RIDE_THIRD_WAVE)
    )
    ride = decisions.filter(agent__slug="ride-support")
    assert set(ride.values_list("tier", flat=True)) == {"single_call", "chain", "human"}
    assert {"rule", "estimate", "cold_start"} <= set(ride.values_list("method", flat=True))
    assert set(decisions.filter(agent__slug="shopping-assistant").values_list("tier", flat=True)) == {"single_call"}
    assert decisions.filter(cache_hit=True).exists()
    assert decisions.filter(quality__isnull=False).count() >= 20
    # Priced from the workspace's prices for the demo models, through the trajectories.
    assert ride.filter(tier="chain", cost_usd__gt=0).exists()
    assert ShadowRun.objects.filter(decision__workspace=demo_workspace, status="done", quality__isnull=False).exists()
    assert Handoff.objects.filter(workspace=demo_workspace, status="resolved").count() == 1
    # By rule: the safety report and the $240 dispute; by estimate: two password questions whose similar
    # past requests the judge scored low on every automated tier.
    assert Handoff.objects.filter(workspace=demo_workspace).count() == 4
    assert CacheHit.objects.filter(workspace=demo_workspace, false_hit__isnull=False).count() == 1
    # The third wave, with the speculative single call: each request started one, and the one the chain
    # served instead is on its trajectory, paid for and marked unused.
    third = ride.filter(conversation_id__startswith="demo-c")
    assert third.filter(features__has_key="speculative").count() == len(demo.RIDE_THIRD_WAVE)
    unused = third.filter(features__speculative=False).values_list("trace_id", flat=True)
    assert unused
    for trace_id in unused:
        names = Span.objects.filter(workspace=demo_workspace, trace_id=trace_id, span_type="generation").values_list(
            "name", flat=True
        )
        assert any(name.startswith("speculative single call") for name in names)


def test_every_request_is_a_trajectory_of_its_agent(demo_workspace):
    trace_ids = set(RoutingDecision.objects.filter(workspace=demo_workspace).values_list("trace_id", flat=True))
    # Eval runs answer through the gateway too (tagged `eval`); the trainer demo stores their trajectories.
    gateway = (
        Trajectory.objects.filter(workspace=demo_workspace, tags__contains=["gateway"])
        .exclude(tags__contains=["shadow"])
        .exclude(tags__contains=["eval"])
    )

    # Requests the input guardrails block are recorded before (and without) a routing decision.
    blocked = set(
        GuardrailViolation.objects.filter(workspace=demo_workspace, layer="input", action="block").values_list(
            "trace_id", flat=True
        )
    )
    assert set(gateway.values_list("trace_id", flat=True)) - blocked == trace_ids
    assert blocked & set(gateway.values_list("trace_id", flat=True))
    assert all(t.agent is not None for t in gateway.select_related("agent"))


def test_seeding_again_sends_nothing(demo_workspace):
    before = RoutingDecision.objects.count()

    assert demo.demo_routing_seed(demo_workspace) == 0
    registry_demo.demo_seed()

    assert RoutingDecision.objects.count() == before
