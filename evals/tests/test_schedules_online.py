"""Cron schedules (one run per slot, however many beats tick), online rules over live gateway traffic
(sampled, delayed, once per trajectory, backfill), regression alerts when a label moves, and proposals
from the evaluation commitment."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from agent_registry import selectors as registry_selectors
from agent_registry import services as registry_services
from agent_registry.models import PromptVersion
from evals import exceptions, online, regressions, runs, schedules, services
from evals.models import OnlineEvaluation, OnlineRule, RegressionAlert, Run, RunStatus, RunTrigger, Suite
from evals.tests.test_runs import _script, _suite
from routing.tests import conftest as routing_fixtures
from routing.tests.conftest import Gateway
from routing.tests.fakes import FakeGatewayLLM
from tracing import services as tracing_services
from tracing.models import IngestBatch, Score, ScoreSource, Trajectory

fake = routing_fixtures.fake
gateway = routing_fixtures.gateway

pytestmark = pytest.mark.django_db


def _process_spans() -> None:
    for batch_id in IngestBatch.objects.filter(status="pending").values_list("pk", flat=True):
        tracing_services.span_batch_process(batch_id=batch_id)


# --- Schedules ------------------------------------------------------------------------------------------


def test_slots_are_the_latest_cron_time_at_or_before_now() -> None:
    at = datetime(2026, 11, 24, 2, 0, 0, tzinfo=UTC)
    assert schedules.slot_latest("0 2 * * *", at) == at
    assert schedules.slot_latest("0 2 * * *", at + timedelta(hours=5)) == at
    assert schedules.slot_latest("nightly", at - timedelta(minutes=1)) == at - timedelta(days=1)
    assert schedules.slot_next("nightly", at) == at + timedelta(days=1)
    assert schedules.cron_error("0 2 * *") is not None
    assert schedules.cron_error("61 2 * * *") is not None
    assert schedules.cron_error("weekly") is None


def test_a_schedule_makes_one_run_per_slot_however_often_beat_ticks(gateway: Gateway, fake: FakeGatewayLLM) -> None:
    suite = _suite(gateway, samples=1)
    start = datetime(2026, 11, 24, 1, 30, tzinfo=UTC)
    services.suite_update(suite=suite, schedule_cron="0 2 * * *", schedule_enabled=True)
    Suite.objects.filter(pk=suite.pk).update(schedule_last_slot=schedules.slot_latest("0 2 * * *", start))

    assert schedules.schedules_tick(now=start + timedelta(minutes=10)) == []  # 01:40: not due
    made = schedules.schedules_tick(now=start + timedelta(minutes=31))  # 02:01
    assert len(made) == 1
    assert made[0].trigger == RunTrigger.SCHEDULE
    assert made[0].scheduled_for == datetime(2026, 11, 24, 2, 0, tzinfo=UTC)
    # A second beat process ticking the same minute, and the next minutes: still one run.
    assert schedules.schedules_tick(now=start + timedelta(minutes=31)) == []
    assert schedules.schedules_tick(now=start + timedelta(minutes=45)) == []
    # Even a beat that did not see the update makes no second run for the slot: the slot is unique.
    Suite.objects.filter(pk=suite.pk).update(schedule_last_slot=None)
    again = schedules.schedules_tick(now=start + timedelta(minutes=32))
    assert [run.pk for run in again] == [made[0].pk]
    assert Run.objects.filter(suite=suite).count() == 1
    # The next night.
    assert len(schedules.schedules_tick(now=start + timedelta(days=1, minutes=31))) == 1


def test_switching_a_schedule_on_does_not_run_a_past_slot(gateway: Gateway, fake: FakeGatewayLLM) -> None:
    suite = _suite(gateway, samples=1)
    services.suite_update(suite=suite, schedule_cron="* * * * *", schedule_enabled=True)
    # Ticks within the minute it was switched on, and at the next: read from the suite, since a minute can turn
    # between switching it on and a tick at timezone.now() (that tick would then rightly run the new slot).
    suite.refresh_from_db()
    switched_on = suite.schedule_last_slot
    assert switched_on is not None
    assert schedules.schedules_tick(now=switched_on + timedelta(seconds=59)) == []
    assert len(schedules.schedules_tick(now=switched_on + timedelta(minutes=1))) == 1


def test_a_bad_cron_expression_is_refused_naming_the_field(gateway: Gateway, fake: FakeGatewayLLM) -> None:
    suite = _suite(gateway, samples=1)
    with pytest.raises(exceptions.SuiteInvalid) as caught:
        services.suite_update(suite=suite, schedule_cron="every night", schedule_enabled=True)
    assert caught.value.extra["errors"][0]["field"] == "schedule_cron"
    suite.refresh_from_db()
    assert suite.schedule_enabled is False


@pytest.mark.parametrize("expression", ["0 0 31 2 *", "0 0 30 2 *", "15 4 31 4,6,9,11 *"])
def test_a_cron_expression_that_names_no_date_is_refused(
    gateway: Gateway, fake: FakeGatewayLLM, expression: str
) -> None:
    # Each field is valid, but no month has that day: croniter finds no slot, which was a 500.
    assert schedules.cron_error(expression) == f"{expression!r} never matches a date"
    suite = _suite(gateway, samples=1)
    with pytest.raises(exceptions.SuiteInvalid) as caught:
        services.suite_update(suite=suite, schedule_cron=expression, schedule_enabled=True)
    assert caught.value.extra["errors"] == [
        {"field": "schedule_cron", "message": f"{expression!r} never matches a date"}
    ]
    suite.refresh_from_db()
    assert (suite.schedule_cron, suite.schedule_enabled) == ("", False)


# --- Online rules ---------------------------------------------------------------------------------------


def _traffic(gw: Gateway, count: int) -> list[str]:
    trace_ids = []
    for n in range(count):
        response = gw.ask(f"where is my receipt number {n}?")
        assert response.status_code == 200, response.content
        trace_ids.append(response.json()["keel"]["trace_id"])
    _process_spans()
    return trace_ids


def _rule(gw: Gateway, **fields: Any) -> Any:
    evaluator = services.evaluator_create(
        workspace=gw.workspace, name="mentions_receipt", config={"type": "regex", "pattern": "receipt"}
    )
    steps = services.evaluator_create(workspace=gw.workspace, name="few_steps", config={"type": "steps", "max": 3})
    return online.online_rule_create(
        agent=gw.agent, name="live-quality", evaluators_used=[evaluator, steps], delay_seconds=0, **fields
    )


def test_an_online_rule_scores_live_trajectories_once_each(gateway: Gateway, fake: FakeGatewayLLM) -> None:
    rule = _rule(gateway)
    trace_ids = _traffic(gateway, 3)

    assert online.rule_tick(rule=rule, now=timezone.now() + timedelta(seconds=1)) == 3
    rule.refresh_from_db()
    assert OnlineEvaluation.objects.filter(rule=rule).count() == 3
    scores = Score.objects.filter(trajectory__trace_id__in=trace_ids, name="mentions_receipt")
    assert scores.count() == 3
    assert all(score.source == ScoreSource.EVALUATOR and score.value == 1.0 for score in scores)
    assert all("mentions_receipt v1" in score.comment for score in scores)
    assert Score.objects.filter(trajectory__trace_id__in=trace_ids, name="few_steps").count() == 3
    # Nothing new: nothing evaluated twice.
    assert online.rule_tick(rule=rule, now=timezone.now() + timedelta(seconds=2)) == 0
    summary = online.rule_summary(rule=rule)
    assert summary["trajectories"] == 3
    assert summary["evaluators"]["mentions_receipt"]["mean"] == 1.0


def test_an_online_rule_waits_for_its_delay_and_skips_eval_traffic(gateway: Gateway, fake: FakeGatewayLLM) -> None:
    rule = _rule(gateway)
    OnlineRule.objects.filter(pk=rule.pk).update(delay_seconds=600)
    rule.refresh_from_db()
    _traffic(gateway, 2)
    assert online.rule_tick(rule=rule, now=timezone.now()) == 0  # too recent
    # The eval runs' own gateway traffic is tagged and never sampled.
    suite = _suite(gateway, samples=1)
    runs.run_execute(run_id=runs.run_create(suite=suite, dispatch=False).pk)
    _process_spans()
    assert Trajectory.objects.filter(tags__contains=["eval"]).count() == 4
    assert online.rule_tick(rule=rule, now=timezone.now() + timedelta(seconds=601)) == 2


def test_sampling_is_stable_and_near_the_rate() -> None:
    picks = [online.sampled(7, f"{n:032x}", 0.25) for n in range(4000)]
    assert picks == [online.sampled(7, f"{n:032x}", 0.25) for n in range(4000)]
    assert 0.22 < sum(picks) / len(picks) < 0.28
    assert not any(online.sampled(7, f"{n:032x}", 0.0) for n in range(100))


def test_a_backfill_scores_a_past_range_and_repeats_nothing(gateway: Gateway, fake: FakeGatewayLLM) -> None:
    rule = _rule(gateway, enabled=False)
    _traffic(gateway, 4)
    start, end = timezone.now() - timedelta(hours=1), timezone.now() + timedelta(seconds=1)
    assert online.rule_backfill(rule=rule, start=start, end=end) == 4
    assert online.rule_backfill(rule=rule, start=start, end=end) == 0
    assert OnlineEvaluation.objects.filter(rule=rule).count() == 4


def test_a_rule_filter_with_an_unknown_key_is_refused(gateway: Gateway) -> None:
    with pytest.raises(exceptions.OnlineRuleInvalid) as caught:
        _rule(gateway, filter={"colour": "red"})
    assert caught.value.extra["errors"][0]["field"] == "filter.colour"


# --- Regressions ----------------------------------------------------------------------------------------


def test_moving_the_production_label_runs_the_new_version_and_alerts_on_a_regression(
    gateway: Gateway, fake: FakeGatewayLLM
) -> None:
    prompt = gateway.agent.prompts.get()
    suite = _suite(gateway, samples=2)
    _script(fake, ["ok"] * 8)
    runs.run_execute(run_id=runs.run_create(suite=suite, dispatch=False).pk)
    registry_services.prompt_version_create(prompt=prompt, template=[{"role": "system", "content": "terse v2"}])
    v2 = PromptVersion.objects.get(prompt=prompt, version=2)
    registry_services.prompt_label_move(prompt=prompt, label="production", version=v2)

    made = regressions.label_moves_check()
    assert len(made) == 1
    candidate = made[0]
    assert candidate.prompt_version == v2
    assert candidate.baseline is not None
    assert regressions.label_moves_check() == []  # one run per move and suite
    _script(fake, ["no"] * 8)
    finished = runs.run_execute(run_id=candidate.pk)
    assert finished is not None
    assert finished.status == RunStatus.COMPLETED

    alert = RegressionAlert.objects.get()
    assert alert.metric == "says_ok"
    assert alert.candidate_run_id == candidate.pk
    assert alert.comparison["mean_delta"] == pytest.approx(-1.0)
    assert "v2" in alert.message
    assert "v1" in alert.message


def test_a_label_move_to_an_equally_good_version_raises_no_alert(gateway: Gateway, fake: FakeGatewayLLM) -> None:
    prompt = gateway.agent.prompts.get()
    suite = _suite(gateway, samples=1)
    _script(fake, ["ok"] * 4)
    runs.run_execute(run_id=runs.run_create(suite=suite, dispatch=False).pk)
    registry_services.prompt_version_create(prompt=prompt, template=[{"role": "system", "content": "v2"}])
    registry_services.prompt_label_move(
        prompt=prompt, label="production", version=PromptVersion.objects.get(prompt=prompt, version=2)
    )
    (candidate,) = regressions.label_moves_check()
    _script(fake, ["ok"] * 4)
    runs.run_execute(run_id=candidate.pk)
    assert not RegressionAlert.objects.exists()


# --- Proposals ------------------------------------------------------------------------------------------


def test_suites_and_rules_are_proposed_from_the_evaluation_commitment(gateway: Gateway) -> None:
    proposal = services.suites_propose(agent=gateway.agent)
    answers = registry_selectors.requirements_current(agent=gateway.agent)
    assert answers is not None
    output_names = [metric.name for metric in answers.evaluation.output_metrics]
    trajectory_names = [metric.name for metric in answers.evaluation.trajectory_metrics]
    if output_names:
        (suite,) = proposal.suites
        assert suite.proposed
        assert suite.schedule_cron == schedules.PRESETS["nightly"]
        assert [link.evaluator.name for link in suite.suite_evaluators.all()] == output_names
    if trajectory_names:
        (rule,) = proposal.rules
        assert sorted(e.name for e in rule.evaluators.all()) == sorted(trajectory_names)
    # Proposing again leaves what exists alone.
    again = services.suites_propose(agent=gateway.agent)
    assert again.suites == []
    assert again.rules == []


# --- Calibration ----------------------------------------------------------------------------------------


def test_an_evaluators_calibration_compares_it_with_people_on_the_same_trajectories(
    gateway: Gateway, fake: FakeGatewayLLM, api_client_for: Any
) -> None:
    from evals import selectors

    rule = _rule(gateway)
    trace_ids = _traffic(gateway, 4)
    online.rule_tick(rule=rule, now=timezone.now() + timedelta(seconds=1))  # the evaluator says 1.0 for all four
    people = {trace_ids[0]: 1.0, trace_ids[1]: 1.0, trace_ids[2]: 0.0, trace_ids[3]: 3.0}  # 3.0 is off-scale
    for trace_id, value in people.items():
        tracing_services.score_create(
            trajectory=Trajectory.objects.get(trace_id=trace_id),
            name="mentions_receipt",
            data_type="numeric",
            value=value,
            source=ScoreSource.HUMAN,
        )

    found = selectors.evaluator_calibration(workspace=gateway.workspace, name="mentions_receipt")

    assert found.skipped == 1
    assert found.calibration.n == 3
    assert found.calibration.agreement == pytest.approx(2 / 3)
    assert found.calibration.mean_absolute_error == pytest.approx(1 / 3)
    assert found.calibration.cohen_kappa == pytest.approx(0.0)  # always "pass": no better than chance
    assert found.calibration.pearson is None  # the evaluator never varies
    client = api_client_for(gateway.workspace, scopes=("read",))
    body = client.get("/api/v1/evaluators/mentions_receipt/calibration").json()
    assert (body["n"], body["skipped"]) == (3, 1)
