"""Factories for tracing rows whose triage is given, not computed: sampling, review and alert tests set
the signals, scores, lengths and times they need (ingest tests record real spans instead)."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone
from factory.declarations import LazyAttribute, LazyFunction, Sequence, SubFactory
from factory.django import DjangoModelFactory

from agent_registry.tests.factories import AgentFactory, WorkspaceFactory
from tracing import signals
from tracing.models import Alert, AlertRule, Trajectory


def signal_instance(
    name: str, *, kind: str = "", level: str = "warning", severity: float = 0.6, steps=(1,)
) -> dict[str, object]:
    """One stored signal instance, as tracing.services.signal_report_json writes it."""
    return {
        "signal": name,
        "kind": kind or name,
        "category": signals.SIGNAL_CATEGORIES[name],
        "severity": severity,
        "level": level,
        "steps": list(steps),
        "snippets": [f"evidence of {name}"],
        "why": f"Why {name} fired.",
    }


class TrajectoryFactory(DjangoModelFactory[Trajectory]):
    class Meta:
        model = Trajectory

    workspace = SubFactory(WorkspaceFactory)
    agent = SubFactory(AgentFactory, workspace=LazyAttribute(lambda agent: agent.factory_parent.workspace))
    trace_id = Sequence(lambda n: f"{n:032x}")
    name = "invoke_agent"
    status = "ok"
    started_at = LazyFunction(lambda: timezone.now() - timedelta(minutes=10))
    ended_at = LazyAttribute(lambda trajectory: trajectory.started_at + timedelta(seconds=3))
    step_count = 6
    signal_names = LazyAttribute(lambda trajectory: sorted({i["signal"] for i in trajectory.signals}))
    signals = LazyFunction(list)
    triage_score = 0.0


class AlertRuleFactory(DjangoModelFactory[AlertRule]):
    class Meta:
        model = AlertRule

    agent = SubFactory(AgentFactory)
    workspace = LazyAttribute(lambda rule: rule.agent.workspace)
    name = "Loop rate"
    signal = "loop"
    threshold = 0.02
    window_minutes = 60
    min_trajectories = 20
    severity = "warning"
    cooldown_minutes = 60


class AlertFactory(DjangoModelFactory[Alert]):
    """An alert as tracing.alerts writes one, for pages that list alerts (evaluation has its own tests)."""

    class Meta:
        model = Alert

    rule = SubFactory(AlertRuleFactory)
    workspace = LazyAttribute(lambda alert: alert.rule.workspace)
    agent = LazyAttribute(lambda alert: alert.rule.agent)
    signal = LazyAttribute(lambda alert: alert.rule.signal)
    severity = LazyAttribute(lambda alert: alert.rule.severity)
    threshold = LazyAttribute(lambda alert: alert.rule.threshold)
    fired_at = LazyFunction(lambda: timezone.now().replace(second=0, microsecond=0))
    window_end = LazyAttribute(lambda alert: alert.fired_at)
    window_start = LazyAttribute(lambda alert: alert.fired_at - timedelta(minutes=alert.rule.window_minutes))
    observed_rate = 0.25
    matching_count = 5
    trajectory_count = 20
