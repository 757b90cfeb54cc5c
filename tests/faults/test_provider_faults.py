"""A model provider that times out, answers 500, answers garbage or answers with no choices, reached over
real HTTP (tests/faults/provider.py) so that litellm's and the openai client's own timeout and parsing run.

The gateway retries a target as its `max_retries` says, then falls back; when every attempt failed the
caller gets a clean 502 `{"detail", "code"}` (never a 500, never a Python traceback), and the request's
trajectory shows the failure and each attempt. An eval run whose provider answers garbage pauses with
the reason rather than erroring its items, and finishes once the provider is back.

Already covered elsewhere, on the in-process fake provider: a retry then a fallback, every target
failing with a 502, cooldowns (routing/tests/test_gateway.py), a provider outage pausing a run
(evals/tests/test_runs.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import orjson
import pytest
from django.test import Client
from django.utils import timezone

from agent_registry import services as registry_services
from agent_registry.models import Agent, Workspace
from config import crypto
from evals import runs
from evals.models import Run, RunItem, RunItemStatus, RunSample, RunStatus
from evals.tests.test_runs import _suite
from routing.models import ModelTarget, RouterConfig, RoutingDecision
from routing.tests.conftest import gateway_agent
from routing.tests.test_gateway import _stream_live
from tests.celery.processes import PROCESS_TESTS
from tests.faults.provider import Fault, FaultyProvider, FaultyProviderServer
from tests.faults.traffic import record_facts
from tracing import services as tracing_services
from tracing.models import IngestBatch, Span, Trajectory

pytestmark = [pytest.mark.django_db, PROCESS_TESTS]

PRIMARY_TIMEOUT_SECONDS = 2.0


@dataclass
class Wired:
    workspace: Workspace
    agent: Agent
    primary: ModelTarget
    backup: ModelTarget
    client: Client

    def ask(self, text: str, **body: Any) -> Any:
        payload = {
            "model": f"agent/{self.agent.slug}",
            "messages": [{"role": "user", "content": text}],
            "variables": {"company": "Acme"},
            **body,
        }
        return self.client.post("/v1/chat/completions", data=json.dumps(payload), content_type="application/json")


@pytest.fixture
def provider() -> Iterator[FaultyProvider]:
    with FaultyProviderServer() as provider:
        yield provider


@pytest.fixture
def wired(workspace: Workspace, provider: FaultyProvider) -> Wired:
    """An agent served by the single-call tier from `primary` (one retry, then `backup`), both on the fake."""
    single_call_only: dict[str, Any] = {
        "routing.mode": "single_level",
        "routing.enabled_tiers": ["single_call"],
        "routing.default_tier": "single_call",
        "routing.escalation_rules": [],
    }
    agent = gateway_agent(workspace, **single_call_only)

    def target(alias: str, **fields: Any) -> ModelTarget:
        return ModelTarget.objects.create(
            workspace=workspace,
            alias=alias,
            model=f"openai/{alias}",
            api_base=provider.url,
            api_key_encrypted=crypto.encrypt("sk-fake-provider"),
            tier="single_call",
            **fields,
        )

    backup = target("backup", max_retries=0, timeout_seconds=30.0)
    primary = target("primary", max_retries=1, timeout_seconds=PRIMARY_TIMEOUT_SECONDS, fallbacks=["backup"])
    RouterConfig.objects.create(agent=agent, single_call_target=primary, cache_enabled=False)
    _, raw = registry_services.apikey_create(workspace=workspace, name="gateway", scopes=["gateway"])
    return Wired(workspace, agent, primary, backup, Client(headers={"Authorization": f"Bearer {raw}"}))


def _trajectory(workspace: Workspace, trace_id: str) -> tuple[Trajectory, list[dict[str, Any]]]:
    """The ingest worker's step for what the gateway stored, then the trajectory and its generation spans."""
    for batch_id in IngestBatch.objects.filter(status="pending").values_list("pk", flat=True):
        tracing_services.span_batch_process(batch_id=batch_id)
    trajectory = Trajectory.objects.get(workspace=workspace, trace_id=trace_id)
    generations = [
        {"status": status, "status_message": message, **orjson.loads(data)}
        for status, message, data in Span.objects.filter(
            workspace=workspace, trace_id=trace_id, span_type="generation"
        ).values_list("status", "status_message", "data")
    ]
    return trajectory, generations


def _calls(provider: FaultyProvider) -> dict[str, list[str]]:
    """What each target was answered, in order, for record_facts: a fault's name, or "answer"."""
    return {
        model: [fault.value if fault else "answer" for fault in provider.calls(model)]
        for model in ("primary", "backup")
    }


def test_a_timeout_and_a_500_are_retried_then_the_fallback_answers_and_the_trajectory_shows_both(wired, provider):
    provider.script("primary", Fault.SLOW, Fault.ERROR_500)

    response = wired.ask("hello")

    assert response.status_code == 200
    body = response.json()
    assert body["choices"][0]["message"]["content"] == provider.answer("backup")
    assert provider.calls("primary") == [Fault.SLOW, Fault.ERROR_500]
    assert provider.calls("backup") == [None]
    trajectory, (generation,) = _trajectory(wired.workspace, response["X-Keel-Trace-Id"])
    assert trajectory.status == "ok"
    assert generation["status"] == "ok"
    assert generation["metadata"]["target"] == "backup"
    assert generation["metadata"]["attempts"] == 3
    first, second = generation["metadata"]["failed_attempts"]
    assert first.startswith("Timeout: ")
    assert second.startswith("InternalServerError: ")
    assert "the fake provider failed" in second
    wired.primary.refresh_from_db()
    wired.backup.refresh_from_db()
    assert (wired.primary.consecutive_failures, wired.backup.consecutive_failures) == (2, 0)
    record_facts(
        "provider timeout, then 500, then the fallback",
        status=response.status_code,
        provider_calls=_calls(provider),
        answered_by=generation["metadata"]["target"],
        attempts_in_the_trajectory=generation["metadata"]["attempts"],
        trajectory_status=trajectory.status,
    )


@pytest.mark.parametrize(
    ("primary_faults", "backup_fault", "said"),
    [
        pytest.param((Fault.ERROR_500, Fault.ERROR_500), Fault.ERROR_500, "the fake provider failed", id="500s"),
        pytest.param((Fault.GARBAGE, Fault.GARBAGE), Fault.GARBAGE, "Bad Gateway from a proxy", id="not-json"),
        pytest.param((Fault.NO_CHOICES, Fault.NO_CHOICES), Fault.NO_CHOICES, "no choices", id="no-choices"),
        pytest.param((Fault.SLOW, Fault.NULL_MESSAGE), Fault.NO_CHOICES, "Invalid response object", id="mixed"),
    ],
)
def test_when_every_attempt_fails_the_caller_gets_a_clean_502_and_the_trajectory_records_each_attempt(
    wired, provider, primary_faults, backup_fault, said
):
    provider.script("primary", *primary_faults)
    provider.script("backup", backup_fault)

    response = wired.ask("hello")

    assert response.status_code == 502
    body = response.json()
    assert body["code"] == "provider_error"
    assert body["error"]["code"] == "provider_error"
    assert body["detail"].startswith("every model target failed (3 attempts)")
    assert said in json.dumps(body)
    assert [attempt["target"] for attempt in body["attempts"]] == ["primary", "primary", "backup"]
    # The provider's failure, not Keel's insides: litellm puts a Python traceback into some of its errors.
    assert "Traceback" not in json.dumps(body)
    assert ".py" not in json.dumps(body)
    assert provider.calls("primary") == list(primary_faults)
    assert provider.calls("backup") == [backup_fault]

    decision = RoutingDecision.objects.get(agent=wired.agent)
    assert decision.status == "error"
    trajectory, (generation,) = _trajectory(wired.workspace, decision.trace_id)
    assert trajectory.status == "error"
    assert generation["status"] == "error"
    assert generation["status_message"] == body["detail"][:1000]
    assert generation["metadata"]["attempts"] == body["attempts"]
    record_facts(
        f'every attempt fails, the 502 says "{said}"',
        status=response.status_code,
        code=body["code"],
        provider_calls=_calls(provider),
        attempts_in_the_answer=len(body["attempts"]),
        attempts_in_the_trajectory=len(generation["metadata"]["attempts"]),
        traceback_in_the_answer="Traceback" in json.dumps(body),
        trajectory_status=trajectory.status,
    )


def test_a_stream_that_fails_to_open_falls_back_and_a_garbled_stream_ends_with_an_error_event(wired, provider):
    _stream_live(wired.agent)
    provider.script("primary", Fault.ERROR_500, Fault.ERROR_500)

    opened = wired.ask("hello", stream=True)

    assert opened.status_code == 200
    events = [line.removeprefix(b"data: ") for line in b"".join(opened.streaming_content).split(b"\n\n") if line]
    assert events[-1] == b"[DONE]"
    text = "".join(
        (json.loads(event)["choices"][0]["delta"].get("content") or "") for event in events[:-1] if b"choices" in event
    )
    assert text.strip() == provider.answer("backup")

    provider.script("primary", Fault.STREAM_GARBAGE)
    garbled = wired.ask("hello again", stream=True)

    assert garbled.status_code == 200
    events = [line.removeprefix(b"data: ") for line in b"".join(garbled.streaming_content).split(b"\n\n") if line]
    assert events[-1] == b"[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == "stream_interrupted"
    assert "Traceback" not in error["message"]
    decision = RoutingDecision.objects.filter(agent=wired.agent).latest("pk")
    assert decision.status == "error"
    trajectory, _ = _trajectory(wired.workspace, decision.trace_id)
    assert trajectory.status == "error"
    record_facts(
        "stream: fails to open, then garbled",
        opened_status=opened.status_code,
        opened_answered_by_the_fallback=text.strip() == provider.answer("backup"),
        garbled_status=garbled.status_code,
        garbled_final_error=error["code"],
        garbled_trajectory_status=trajectory.status,
        provider_calls=_calls(provider),
    )


def test_an_eval_run_whose_provider_answers_garbage_pauses_with_the_reason_and_finishes_once_it_is_back(
    wired, provider
):
    suite = _suite(wired, samples=1)
    # More failures than the run can meet before it pauses: every attempt on every target fails.
    provider.script("primary", *[Fault.NO_CHOICES] * 20)
    provider.script("backup", *[Fault.GARBAGE] * 20)

    paused = runs.run_execute(run_id=runs.run_create(suite=suite, dispatch=False).pk)

    assert paused is not None
    assert paused.status == RunStatus.PAUSED
    assert "no choices" in paused.pause_reason
    assert paused.items_errored == 0
    assert set(RunItem.objects.filter(run=paused).values_list("status", flat=True)) == {RunItemStatus.PENDING}
    assert not RunSample.objects.filter(item__run=paused).exists()
    asked = len(provider.received)
    assert asked == runs.OUTAGE_LIMIT * 3  # each item the run tried: primary twice, then the backup

    provider.scripts.clear()  # the provider is back
    Run.objects.filter(pk=paused.pk).update(resume_after=timezone.now() - timedelta(seconds=1))
    assert paused.pk in runs.runs_sweep()
    resumed = runs.run_execute(run_id=paused.pk)

    assert resumed is not None
    assert resumed.status == RunStatus.COMPLETED
    assert (resumed.items_done, resumed.items_errored) == (4, 0)
    outputs = RunSample.objects.filter(item__run=resumed).values_list("output_text", flat=True)
    assert sorted(outputs) == [provider.answer("primary")] * 4
    assert len(provider.received) == asked + 4
    record_facts(
        "eval run against a provider answering garbage",
        paused_status=paused.status,
        provider_requests_before_the_pause=asked,
        items_errored_while_paused=paused.items_errored,
        resumed_status=resumed.status,
        items_done=resumed.items_done,
        items_errored=resumed.items_errored,
        provider_requests_after_the_resume=len(provider.received) - asked,
    )
