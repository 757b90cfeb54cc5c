"""Eval runs end to end on the fake provider: k samples through the gateway, scores, the report, resuming
after a dead worker without repeating samples, pausing on a provider outage, bounded concurrency."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import litellm
import pytest
from django.utils import timezone

from agent_registry import services as registry_services
from agent_registry.models import PromptVersion
from evals import dataset_items, runs, services
from evals.models import Run, RunItem, RunItemStatus, RunSample, RunScore, RunStatus
from routing.tests import conftest as routing_fixtures
from routing.tests.conftest import Gateway
from routing.tests.fakes import FakeGatewayLLM, say

fake = routing_fixtures.fake
gateway = routing_fixtures.gateway

pytestmark = pytest.mark.django_db

QUESTIONS = (
    ("Where is my receipt?", "en", "receipts"),
    ("¿Dónde está mi recibo?", "es", "receipts"),
    ("Refund my double charge", "en", "refunds"),
    ("Devuélvanme el cobro doble", "es", "refunds"),
)


def _dataset(gw: Gateway, questions: tuple[tuple[str, str, str], ...] = QUESTIONS) -> Any:
    dataset = services.dataset_create(workspace=gw.workspace, name="regressions", agent=gw.agent)
    items = [
        dataset_items.ItemData(
            input_messages=({"role": "user", "content": text},),
            reference_output="ok",
            metadata={"tags": {"language": language, "intent": intent}, "variables": {"company": "Acme"}},
        )
        for text, language, intent in questions
    ]
    services.dataset_version_create_from_items(dataset=dataset, items=items)
    return dataset


def _suite(gw: Gateway, *, samples: int = 4, concurrency: int = 1, name: str = "answers", **fields: Any) -> Any:
    evaluator = services.evaluator_create(
        workspace=gw.workspace, name="says_ok", config={"type": "regex", "pattern": r"\bok\b", "flags": ["IGNORECASE"]}
    )
    return services.suite_create(
        workspace=gw.workspace,
        name=name,
        agent=gw.agent,
        dataset=_dataset(gw) if "dataset" not in fields else fields.pop("dataset"),
        samples=samples,
        concurrency=concurrency,
        tier=fields.pop("tier", "single_call"),
        evaluators_used=[evaluator],
        **fields,
    )


def _script(fake: FakeGatewayLLM, answers: list[str]) -> None:
    fake.script("fast", *[say(answer) for answer in answers])


def test_a_run_samples_each_item_k_times_and_reports_pass_at_k_and_the_worst_group(
    gateway: Gateway, fake: FakeGatewayLLM
) -> None:
    suite = _suite(gateway, samples=4)
    # Item by item, sample by sample (one worker): en receipts passes 1 of 4, es receipts 0 of 4, refunds all.
    _script(
        fake,
        ["ok", "no", "no", "no"] + ["no"] * 4 + ["ok"] * 4 + ["ok"] * 4,
    )
    queued = runs.run_create(suite=suite, dispatch=False)
    assert queued.status == RunStatus.QUEUED
    assert queued.item_count == 4

    run = runs.run_execute(run_id=queued.pk)

    assert run is not None
    assert run.status == RunStatus.COMPLETED
    assert RunSample.objects.filter(item__run=run).count() == 16
    report = run.report["says_ok"]
    assert report["evaluator_version"] == 1
    overall = report["overall"]
    assert overall["pass_at_k"]["1"] == pytest.approx((0.25 + 0 + 1 + 1) / 4)
    assert overall["pass_at_k"]["4"] == pytest.approx(3 / 4)
    assert "16" not in overall["pass_at_k"]  # k = 16 needs 16 samples
    assert overall["ci"][0] <= overall["mean"] <= overall["ci"][1]
    worst = report["worst_groups"]["intent"]
    assert worst["name"] == "receipts"
    # Every sample went through the gateway pinned to the production prompt version and the tier.
    received = [r for r in fake.received if r.model == "fast"]
    assert len(received) == 16
    assert all("Acme" in str(r.messages[0]["content"]) for r in received)
    trace_ids = set(RunSample.objects.filter(item__run=run).values_list("trace_id", flat=True))
    assert len(trace_ids) == 16
    assert "" not in trace_ids


def test_pinned_requests_skip_the_cache_and_store_no_routing_decision(gateway: Gateway, fake: FakeGatewayLLM) -> None:
    from routing.models import RoutingDecision

    gateway.config.cache_enabled = True
    gateway.config.save()
    suite = _suite(gateway, samples=2)
    run = runs.run_execute(run_id=runs.run_create(suite=suite, dispatch=False).pk)
    assert run is not None
    assert run.status == RunStatus.COMPLETED
    assert len([r for r in fake.received if r.model == "fast"]) == 8  # nothing answered from the cache
    assert not RoutingDecision.objects.filter(agent=gateway.agent).exists()


def test_a_run_uses_the_prompt_version_it_was_made_with(gateway: Gateway, fake: FakeGatewayLLM) -> None:
    prompt = gateway.agent.prompts.get()
    registry_services.prompt_version_create(
        prompt=prompt, template=[{"role": "system", "content": "v2 of {{company}}'s assistant"}], labels=["staging"]
    )
    suite = _suite(gateway, samples=1, prompt_label="staging")
    run = runs.run_create(suite=suite, dispatch=False)
    assert run.prompt_version is not None
    assert run.prompt_version.version == 2
    runs.run_execute(run_id=run.pk)
    assert all("v2 of Acme" in str(r.messages[0]["content"]) for r in fake.received if r.model == "fast")


def test_the_same_idempotency_key_gives_the_same_run_and_a_finished_run_is_not_run_again(
    gateway: Gateway, fake: FakeGatewayLLM
) -> None:
    suite = _suite(gateway, samples=1)
    first = runs.run_create(suite=suite, idempotency_key="nightly-2026-11-24", dispatch=False)
    again = runs.run_create(suite=suite, idempotency_key="nightly-2026-11-24", dispatch=False)
    assert again.pk == first.pk
    assert Run.objects.count() == 1
    runs.run_execute(run_id=first.pk)
    calls = len(fake.received)
    assert runs.run_execute(run_id=first.pk) is None  # redelivered task: nothing to do
    assert len(fake.received) == calls


def test_a_run_whose_worker_died_resumes_without_repeating_finished_items_or_samples(
    gateway: Gateway, fake: FakeGatewayLLM
) -> None:
    suite = _suite(gateway, samples=4)
    run = runs.run_create(suite=suite, dispatch=False)
    # A worker claimed the run, finished item 0 and two samples of item 1, and was killed.
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING, claimed_at=timezone.now())
    driver = runs._Driver(
        run=Run.objects.get(pk=run.pk), built=runs._build(run), api_key=runs.runner_key(run.workspace)
    )
    first = runs._item_claim(driver.run)
    assert first is not None
    runs._item_execute(driver, first)
    second = runs._item_claim(driver.run)
    assert second is not None
    for index in range(2):
        runs._sample_from_gateway(driver, second, index).save()
    assert len(fake.received) == 6

    # Another worker cannot take it while the lease holds...
    assert runs.run_execute(run_id=run.pk) is None
    # ...and does once it has run out.
    Run.objects.filter(pk=run.pk).update(claimed_at=timezone.now() - timedelta(seconds=runs.LEASE_SECONDS + 1))
    assert run.pk in runs.runs_sweep()
    resumed = runs.run_execute(run_id=run.pk)

    assert resumed is not None
    assert resumed.status == RunStatus.COMPLETED
    assert len(fake.received) == 16  # 6 before the crash, 10 after: nothing asked twice
    assert RunSample.objects.filter(item__run=run).count() == 16
    assert RunScore.objects.filter(sample__item__run=run).count() == 16
    assert resumed.items_done == 4


def test_a_provider_outage_pauses_the_run_with_its_reason_and_it_resumes_later(
    gateway: Gateway, fake: FakeGatewayLLM
) -> None:
    suite = _suite(gateway, samples=1)
    outage = litellm.ServiceUnavailableError(  # type: ignore[attr-defined]
        message="upstream down", llm_provider="fake-gateway", model="fast"
    )
    # Every attempt fails: the fast target's retry and then nothing else (no fallbacks).
    fake.script("fast", *[outage] * (runs.OUTAGE_LIMIT * 2))
    run = runs.run_execute(run_id=runs.run_create(suite=suite, dispatch=False).pk)

    assert run is not None
    assert run.status == RunStatus.PAUSED
    assert "unreachable" in run.pause_reason
    assert "upstream down" in run.pause_reason
    assert run.items_errored == 0
    assert not RunItem.objects.filter(run=run).exclude(status=RunItemStatus.PENDING).exists()
    assert runs.run_execute(run_id=run.pk) is None  # the pause holds until resume_after
    assert run.pk not in runs.runs_sweep()

    Run.objects.filter(pk=run.pk).update(resume_after=timezone.now() - timedelta(seconds=1))
    assert run.pk in runs.runs_sweep()
    resumed = runs.run_execute(run_id=run.pk)
    assert resumed is not None
    assert resumed.status == RunStatus.COMPLETED
    assert resumed.items_done == 4


def test_a_request_the_gateway_refuses_errors_the_sample_and_is_not_scored(
    gateway: Gateway, fake: FakeGatewayLLM
) -> None:
    suite = _suite(gateway, samples=1, tier="chain")  # the agent has no chain steps: 409 for every request
    run = runs.run_execute(run_id=runs.run_create(suite=suite, dispatch=False).pk)
    assert run is not None
    # Every item errored, so the run measured nothing: it fails and says why, where it used to say
    # "completed" with an empty report (evals/tests/test_run_failure.py has the rest of that rule).
    assert run.status == RunStatus.FAILED
    assert run.error.startswith("every item errored (4 of 4); the most common error (4 items): ")
    assert (run.items_done, run.items_errored) == (0, 4)
    assert not RunScore.objects.filter(sample__item__run=run).exists()
    assert run.report["says_ok"]["overall"]["mean"] is None


def test_cancelling_a_run_stops_it_between_items(gateway: Gateway, fake: FakeGatewayLLM) -> None:
    suite = _suite(gateway, samples=1)
    run = runs.run_create(suite=suite, dispatch=False)
    runs.run_cancel(run=run)
    assert runs.run_execute(run_id=run.pk) is None
    assert Run.objects.get(pk=run.pk).status == RunStatus.CANCELLED
    assert fake.received == []


def test_comparing_two_prompt_versions_gives_deltas_with_an_interval_and_a_p_value(
    gateway: Gateway, fake: FakeGatewayLLM
) -> None:
    prompt = gateway.agent.prompts.get()
    registry_services.prompt_version_create(prompt=prompt, template=[{"role": "system", "content": "v2"}])
    suite = _suite(gateway, samples=2)
    v2 = PromptVersion.objects.get(prompt=prompt, version=2)
    _script(fake, ["ok"] * 8)
    baseline = runs.run_execute(run_id=runs.run_create(suite=suite, dispatch=False).pk)
    _script(fake, ["no"] * 8)
    candidate = runs.run_execute(run_id=runs.run_create(suite=suite, prompt_version=v2, dispatch=False).pk)
    assert baseline is not None
    assert candidate is not None

    comparison = runs.runs_compare(baseline=baseline, candidate=candidate)["metrics"]["says_ok"]
    assert comparison["items"] == 4
    assert comparison["mean_delta"] == pytest.approx(-1.0)
    assert comparison["ci"] == [-1.0, -1.0]
    assert comparison["p_value"] == pytest.approx(2 / 16)  # 4 paired items, exact sign-flip test
    assert comparison["worsened"] == 4


@pytest.mark.django_db(transaction=True)
def test_a_run_keeps_at_most_its_concurrency_of_items_in_flight(gateway: Gateway, fake: FakeGatewayLLM) -> None:
    gw = gateway
    questions = tuple((f"question {n}", "en", f"intent-{n % 3}") for n in range(9))
    dataset = _dataset(gw, questions)
    in_flight = 0
    peak = 0
    lock = threading.Lock()
    original = fake.completion

    def slow_completion(*args: Any, **kwargs: Any) -> Any:
        nonlocal in_flight, peak
        with lock:
            in_flight += 1
            peak = max(peak, in_flight)
        time.sleep(0.05)
        try:
            return original(*args, **kwargs)
        finally:
            with lock:
                in_flight -= 1

    fake.completion = slow_completion  # type: ignore[method-assign]
    suite = _suite(gw, samples=2, concurrency=3, dataset=dataset)
    run = runs.run_execute(run_id=runs.run_create(suite=suite, dispatch=False).pk)

    assert run is not None
    assert run.status == RunStatus.COMPLETED
    assert run.items_done == 9
    assert RunSample.objects.filter(item__run=run).count() == 18
    assert 2 <= peak <= 3


def test_an_eval_request_routed_to_a_person_puts_nothing_in_the_hand_off_queue(
    gateway: Gateway, fake: FakeGatewayLLM
) -> None:
    from routing.models import Handoff

    suite = _suite(gateway, samples=1, tier="human")
    run = runs.run_execute(run_id=runs.run_create(suite=suite, dispatch=False).pk)

    assert run is not None
    assert run.status == RunStatus.COMPLETED
    assert not Handoff.objects.filter(agent=gateway.agent).exists()
    sample = RunSample.objects.filter(item__run=run).first()
    assert sample is not None
    assert sample.output["facts"]["escalated"] is True
    assert fake.received == []
