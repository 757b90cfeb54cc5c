"""The speculative single call (routing/speculation.py): the single call starts before the learned router has
decided, its answer is taken when the router chooses the single call, and a call the router did not choose
is paid for and recorded, not sent."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone
from litellm.exceptions import InternalServerError

from routing import reports, selectors, speculation
from routing.models import ChainStep, RoutingDecision
from routing.tests.conftest import Gateway, past_decisions
from routing.tests.fakes import FAKE_PROVIDER, say
from tracing import services as tracing_services
from tracing.models import IngestBatch, Span, Trajectory

pytestmark = pytest.mark.django_db

SIMPLE = "Where can I find the receipt for my ride last Tuesday?"
WAIT_SECONDS = 5.0


@pytest.fixture
def speculative(gateway: Gateway) -> Gateway:
    gateway.config.speculative_single_call = True
    gateway.config.save()
    return gateway


class NeighbourProbe:
    """Holds the neighbour search until the fake provider has received a request (at most WAIT_SECONDS), and
    says whether it had: with speculation the model call is under way while the router looks up neighbours."""

    def __init__(self, gateway: Gateway, monkeypatch: pytest.MonkeyPatch) -> None:
        self.called = threading.Event()
        self.model_called_first: list[bool] = []
        fake, search = gateway.fake, selectors.routing_neighbours
        receive = fake._next

        def received(*args: Any, **kwargs: Any) -> Any:
            self.called.set()
            return receive(*args, **kwargs)

        def held(**kwargs: Any) -> Any:
            self.model_called_first.append(self.called.wait(WAIT_SECONDS))
            return search(**kwargs)

        monkeypatch.setattr(fake, "_next", received)
        monkeypatch.setattr(selectors, "routing_neighbours", held)


def _stored(gateway: Gateway, trace_id: str) -> Trajectory:
    for batch_id in IngestBatch.objects.filter(status="pending").values_list("pk", flat=True):
        tracing_services.span_batch_process(batch_id=batch_id)
    return Trajectory.objects.get(workspace=gateway.workspace, trace_id=trace_id)


def _generations(gateway: Gateway, trace_id: str) -> list[Span]:
    trajectory = _stored(gateway, trace_id)
    return list(Span.objects.filter(trajectory=trajectory, span_type="generation").order_by("start_time_ns"))


def _metadata(span: Span) -> dict[str, Any]:
    return json.loads(span.data).get("metadata") or {}


def test_the_single_call_is_under_way_while_the_router_looks_up_neighbours_and_its_answer_is_sent(
    speculative, monkeypatch
):
    probe = NeighbourProbe(speculative, monkeypatch)

    response = speculative.ask(SIMPLE)

    assert response.status_code == 200
    body = response.json()
    assert body["keel"]["tier"] == "single_call"
    assert body["choices"][0]["message"]["content"] == f"fast answers: {SIMPLE}"
    assert probe.model_called_first == [True]
    assert [received.model for received in speculative.fake.received] == ["fast"]  # one call, not two
    decision = RoutingDecision.objects.get(trace_id=body["keel"]["trace_id"])
    assert decision.features["speculative"] is True
    (generation,) = _generations(speculative, decision.trace_id)
    assert _metadata(generation)["speculative"] == "used"


def test_without_the_setting_the_router_decides_before_the_model_is_called(gateway, monkeypatch):
    monkeypatch.setattr(f"{__name__}.WAIT_SECONDS", 0.2)  # the probe waits in vain: keep the test short
    probe = NeighbourProbe(gateway, monkeypatch)

    body = gateway.ask(SIMPLE).json()

    assert probe.model_called_first == [False]
    assert "speculative" not in RoutingDecision.objects.get(trace_id=body["keel"]["trace_id"]).features


def test_a_call_the_router_did_not_choose_is_paid_for_recorded_and_not_sent(speculative, monkeypatch):
    ChainStep.objects.create(agent=speculative.agent, position=1, name="answer", instructions="Answer.")
    past_decisions(speculative, SIMPLE, {"single_call": 0.2, "chain": 0.95})
    probe = NeighbourProbe(speculative, monkeypatch)  # so the speculative call is the fake's first
    speculative.fake.script("fast", say("the speculative answer"))
    tracing_services.model_price_set(
        workspace=speculative.workspace,
        model=f"{FAKE_PROVIDER}/fast",
        input_usd_per_million=Decimal("1"),
        output_usd_per_million=Decimal("10"),
    )

    body = speculative.ask(SIMPLE).json()

    assert probe.model_called_first == [True]
    assert body["keel"]["tier"] == "chain"
    assert body["choices"][0]["message"]["content"] == f"fast answers: {SIMPLE}"  # the chain step's, not the first
    assert [received.model for received in speculative.fake.received].count("fast") == 2  # speculative + step
    decision = RoutingDecision.objects.get(trace_id=body["keel"]["trace_id"])
    assert decision.features["speculative"] is False
    # The request's cost, which the router learns from, is the chain step's and the unused call's.
    assert decision.cost_usd == 2 * Decimal("0.00012000")  # each: 40 input tokens at $1/M, 8 output at $10/M
    generations = _generations(speculative, decision.trace_id)
    unused = [span for span in generations if _metadata(span).get("speculative") == "not used"]
    assert len(unused) == 1
    assert unused[0].name.startswith("speculative single call")
    assert _metadata(unused[0])["tier"] == "chain"
    trajectory = _stored(speculative, decision.trace_id)
    assert trajectory.llm_call_count == len(generations) == 2
    # The unused call's tokens and cost are the trajectory's too: they were paid for.
    assert trajectory.input_tokens == sum(span.input_tokens or 0 for span in generations)


def test_a_request_a_rule_decides_starts_no_speculative_call(speculative):
    body = speculative.ask("The driver was unsafe and I want to report it").json()

    assert body["keel"]["tier"] == "human"
    assert speculative.fake.received == []
    assert "speculative" not in RoutingDecision.objects.get(trace_id=body["keel"]["trace_id"]).features


@pytest.mark.parametrize("case", ["cache", "stream"])
def test_no_speculation_with_the_cache_on_or_for_a_stream(speculative, monkeypatch, case):
    monkeypatch.setattr(f"{__name__}.WAIT_SECONDS", 0.2)
    probe = NeighbourProbe(speculative, monkeypatch)
    if case == "cache":
        speculative.config.cache_enabled = True
        speculative.config.save()

    response = speculative.ask(SIMPLE, stream=case == "stream")

    assert response.status_code == 200
    assert probe.model_called_first == [False]


def test_a_speculative_call_that_fails_is_the_single_calls_first_attempt_and_the_retry_answers(speculative):
    outage = InternalServerError("upstream 500", llm_provider=FAKE_PROVIDER, model="fast")
    speculative.fake.script("fast", outage)

    body = speculative.ask(SIMPLE).json()

    assert body["choices"][0]["message"]["content"] == f"fast answers: {SIMPLE}"
    assert [received.model for received in speculative.fake.received] == ["fast", "fast"]  # max_retries=1
    speculative.fast.refresh_from_db()
    assert speculative.fast.consecutive_failures == 0  # the retry's success healed it
    (generation,) = _generations(speculative, body["keel"]["trace_id"])
    assert _metadata(generation)["attempts"] == 2


def test_an_unused_call_that_failed_is_recorded_on_the_target_and_the_trajectory(speculative):
    ChainStep.objects.create(agent=speculative.agent, position=1, name="answer", instructions="Answer.")
    past_decisions(speculative, SIMPLE, {"single_call": 0.2, "chain": 0.95})
    outage = InternalServerError("upstream 500", llm_provider=FAKE_PROVIDER, model="fast")
    speculative.fake.script("fast", outage)

    response = speculative.ask(SIMPLE)

    assert response.status_code == 200
    body = response.json()
    assert body["keel"]["tier"] == "chain"
    speculative.fast.refresh_from_db()
    assert "upstream 500" in speculative.fast.last_error
    trajectory = _stored(speculative, body["keel"]["trace_id"])
    assert trajectory.status == "ok"  # what failed was not part of the answer
    failed = Span.objects.get(trajectory=trajectory, name__startswith="speculative single call")
    assert _metadata(failed)["speculative"] == "not used"


def test_a_full_pool_starts_nothing_and_frees_its_slot_when_a_call_ends():
    pool = speculation._Pool(1)
    release = threading.Event()
    first = pool.submit(lambda: release.wait(WAIT_SECONDS))

    assert first is not None
    assert pool.submit(lambda: None) is None
    release.set()
    first.result(WAIT_SECONDS)
    for _ in range(100):  # the slot is freed by the future's callback, just after its result is set
        second = pool.submit(lambda: "ran")
        if second is not None:
            break
        threading.Event().wait(0.01)
    assert second is not None
    assert second.result(WAIT_SECONDS) == "ran"


def test_the_router_report_counts_speculative_calls_and_what_the_unused_ones_cost(speculative):
    ChainStep.objects.create(agent=speculative.agent, position=1, name="answer", instructions="Answer.")
    tracing_services.model_price_set(
        workspace=speculative.workspace,
        model=f"{FAKE_PROVIDER}/fast",
        input_usd_per_million=Decimal("1"),
        output_usd_per_million=Decimal("10"),
    )
    taken = speculative.ask(SIMPLE).json()  # no past requests: the estimate keeps the single call
    past_decisions(speculative, SIMPLE, {"single_call": 0.2, "chain": 0.95})
    unused = speculative.ask(SIMPLE).json()
    speculative.ask("The driver was unsafe and I want to report it")  # a rule decides: none started
    now = timezone.now()

    summary = reports.speculation_summary(agent=speculative.agent, since=now - timedelta(hours=1), until=now)

    assert (taken["keel"]["tier"], unused["keel"]["tier"]) == ("single_call", "chain")
    assert (summary.started, summary.taken, summary.unused) == (2, 1, 1)
    assert summary.unused_cost_usd == pytest.approx(0.00012)
    assert reports.router_report(agent=speculative.agent, since=now - timedelta(hours=1), until=now).speculation == (
        summary
    )
