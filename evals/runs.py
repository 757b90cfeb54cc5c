"""Eval runs: made from a suite, executed by a Celery worker, resumable, reported.

A run fixes what it uses when it is made: the dataset version's items (copied into `RunItem`s), the
prompt version a label pointed to, the evaluators' versions (`Run.evaluators`). Executing it:

- the worker claims the run (a lease, renewed as items finish) and works through pending items with
  `run.concurrency` threads; each item gets its k samples through the gateway (pinned to the run's prompt
  version and tier, never answered from the cache) or from its recorded trajectory, then every evaluator
  scores them (a group evaluator sees the k samples together);
- every finished sample and score is stored at once, so a worker killed mid-run loses at most the
  samples in flight: the run's lease runs out, the sweep hands it to a worker again, and that worker
  resets the dead worker's items to pending and skips the samples and scores already stored;
- a provider outage (every retry and fallback failed, for the target or a judge) puts the item back;
  after `OUTAGE_LIMIT` such failures in a row the run pauses with the reason shown, and the sweep resumes
  it after `PAUSE_SECONDS` (or someone resumes it by hand);
- when no item is left the run is reported: per evaluator, mean, median, std, pass@k, majority@k,
  bootstrap intervals, and the same per subgroup (the items' `metadata.tags`) with the worst group;
- a run every item of which errored is failed, its error naming the most common item error, and so is a
  run whose items were answered but every score of which errored (each evaluator failed on each answer),
  its error naming the first score error: it measured nothing, so it is neither a point on a chart, nor a
  regression baseline, nor a candidate that passed. A run only some of whose scores errored completes; its
  report counts them per evaluator (`errored` items, `errored_samples`).
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import orjson
from django.db import IntegrityError, connection, transaction
from django.db.models import Avg, Count, F, Min, Q, QuerySet
from django.db.models.functions import Coalesce, Collate
from django.utils import timezone

from agent_registry import services as registry_services
from agent_registry.models import ApiKey, PromptVersion, Scope, User, Workspace
from config import dispatch
from config.errors import KeelError
from evals import dataset_items, evaluators, exceptions, metrics, selectors, verifiers
from evals.models import (
    Evaluator,
    Run,
    RunItem,
    RunItemStatus,
    RunSample,
    RunScore,
    RunStatus,
    RunTrigger,
    Suite,
    SuiteTarget,
)
from routing import gateway, providers
from routing import selectors as routing_selectors
from routing.chat import ChatCompletionRequest

logger = logging.getLogger("evals.runs")

LEASE_SECONDS = 300  # a driver that has not finished an item for this long is presumed dead
QUEUED_GRACE_SECONDS = 120  # a queued run no worker picked up by then is dispatched again
PAUSE_SECONDS = 120
OUTAGE_LIMIT = 3
MAX_ITEM_ATTEMPTS = 3
RUNNER_KEY_NAME = "Keel eval runner (internal)"
REPORT_KS = (1, 4, 16)
# A worker holds a run for at most this long, then hands the rest to a fresh task (below Celery's time limit).
SLICE_SECONDS = 20 * 60


class RunNotStartable(exceptions.EvalsConflict):
    code = "run_not_startable"


class RunEvaluatorAgentMismatch(RunNotStartable):
    """A suite of one agent that holds an evaluator of another (attached before suites refused that): its
    runs are refused, on demand, on the schedule and for a moved label alike, until the suite is edited."""

    code = exceptions.EVALUATOR_AGENT_MISMATCH


# --- Making a run ---------------------------------------------------------------------------------------


def _prompt_version(suite: Suite, override: PromptVersion | None) -> PromptVersion | None:
    if override is not None:
        return override
    if suite.prompt_version is not None:
        return suite.prompt_version
    if suite.target != SuiteTarget.AGENT or suite.agent is None:
        return None
    # The version the gateway serves under the label, so that a suite on "production" scores production.
    version = routing_selectors.labelled_prompt_version(agent=suite.agent, label=suite.prompt_label or "production")
    if version is None:
        raise RunNotStartable(
            f"the agent {suite.agent.slug} has no prompt labelled {suite.prompt_label or 'production'!r}",
            errors=[{"field": "prompt_label", "message": "no prompt version has this label"}],
        )
    return version


def _startable(suite: Suite) -> None:
    problems: list[dict[str, str]] = []
    if suite.dataset is None:
        problems.append({"field": "dataset", "message": "the suite has no dataset"})
    if not suite.suite_evaluators.exists():
        problems.append({"field": "evaluators", "message": "the suite has no evaluators"})
    if suite.target == SuiteTarget.AGENT and suite.agent is None:
        problems.append({"field": "agent", "message": "an agent target needs the agent"})
    if suite.target == SuiteTarget.MODEL_TARGET and suite.model_target is None:
        problems.append({"field": "model_target", "message": "a model target suite needs the model target"})
    if problems:
        raise RunNotStartable(f"the suite {suite.name} cannot run: {problems[0]['message']}", errors=problems)


@transaction.atomic
def run_create(
    *,
    suite: Suite,
    trigger: str = RunTrigger.MANUAL,
    prompt_version: PromptVersion | None = None,
    scheduled_for: datetime | None = None,
    idempotency_key: str = "",
    name: str = "",
    created_by: User | None = None,
    created_via_key: ApiKey | None = None,
    dispatch: bool = True,
) -> Run:
    """A queued run of the suite, handed to a worker once the transaction commits.

    The same `idempotency_key` (or schedule slot) gives back the run made the first time, so a retried
    request or a second beat process does not make a second run."""
    if idempotency_key:
        existing = Run.objects.filter(workspace_id=suite.workspace_id, idempotency_key=idempotency_key).first()
        if existing is not None:
            return existing
    if scheduled_for is not None:
        existing = Run.objects.filter(suite=suite, scheduled_for=scheduled_for).first()
        if existing is not None:
            return existing
    _startable(suite)
    assert suite.dataset is not None
    version = suite.dataset_version or selectors.dataset_version_latest(dataset=suite.dataset)
    if version is None:
        raise RunNotStartable(
            f"the dataset {suite.dataset.name} has no items yet",
            errors=[{"field": "dataset", "message": "the dataset has no version"}],
        )
    chosen = [link.evaluator for link in suite.suite_evaluators.select_related("evaluator").order_by("position", "id")]
    evaluators.agent_mismatch_refuse(
        chosen, agent=suite.agent, error=RunEvaluatorAgentMismatch, about=f"the suite {suite.name} cannot run"
    )
    pinned = _prompt_version(suite, prompt_version)
    snapshots = [evaluators.Snapshot.of(evaluator).as_json() for evaluator in chosen]
    samples = 1 if suite.target == SuiteTarget.RECORDED else suite.samples
    label = f" v{pinned.version}" if pinned is not None else ""
    run = Run(
        workspace_id=suite.workspace_id,
        suite=suite,
        agent=suite.agent,
        name=name or f"{suite.name}{label} · {timezone.now():%Y-%m-%d %H:%M}",
        trigger=trigger,
        scheduled_for=scheduled_for,
        idempotency_key=idempotency_key,
        dataset_version=version,
        target=suite.target,
        prompt_version=pinned,
        tier=suite.tier,
        model_target=suite.model_target,
        samples=samples,
        concurrency=suite.concurrency,
        variables=dict(suite.variables or {}),
        evaluators=snapshots,
        item_count=version.item_count,
        created_by=created_by,
        created_via_key=created_via_key,
    )
    try:
        with transaction.atomic():
            run.save()
    except IntegrityError:  # a concurrent create with the same key or slot won
        winner = (
            Run.objects.filter(
                Q(workspace_id=suite.workspace_id, idempotency_key=idempotency_key)
                if idempotency_key
                else Q(pk__in=[]),
            ).first()
            or Run.objects.filter(suite=suite, scheduled_for=scheduled_for).first()
        )
        if winner is None:
            raise
        return winner
    RunItem.objects.bulk_create(
        [
            RunItem(
                run=run,
                position=item.position,
                key=item.key,
                dataset_item=item,
                task=item.task,
                input_messages=item.input_messages,
                reference_output=item.reference_output,
                expected_tool_calls=item.expected_tool_calls,
                expected_state=item.expected_state,
                metadata=item.metadata,
                source_trace_id=item.source_trace_id,
            )
            for item in version.items.order_by("position")
        ]
    )
    if dispatch:
        run_dispatch(run)
    return run


def run_dispatch(run: Run) -> None:
    from evals import tasks

    run_id = run.pk
    dispatch.task_send_on_commit(tasks.run_execute, run_id)


def run_cancel(*, run: Run) -> Run:
    Run.objects.filter(pk=run.pk, status__in=[RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.PAUSED]).update(
        status=RunStatus.CANCELLED, finished_at=timezone.now()
    )
    run.refresh_from_db()
    return run


def run_resume(*, run: Run) -> Run:
    """A paused run goes on now rather than after its pause."""
    if run.status != RunStatus.PAUSED:
        raise RunNotStartable(f"the run is {run.status}, not paused")
    Run.objects.filter(pk=run.pk, status=RunStatus.PAUSED).update(resume_after=timezone.now())
    run.refresh_from_db()
    run_dispatch(run)
    return run


def runner_key(workspace: Workspace) -> ApiKey:
    """The workspace's internal gateway key that eval runs call through; its plaintext is never kept."""
    key = ApiKey.objects.filter(workspace=workspace, name=RUNNER_KEY_NAME, revoked_at__isnull=True).first()
    if key is None:
        key, _ = registry_services.apikey_create(workspace=workspace, name=RUNNER_KEY_NAME, scopes=[Scope.GATEWAY])
    return key


# --- Executing ------------------------------------------------------------------------------------------


class _Outage(Exception):
    """The model provider could not be reached; the item goes back and counts towards a pause."""


@dataclass
class _Driver:
    """One worker's hold on a run while it executes it."""

    run: Run
    built: list[evaluators.Built]
    api_key: ApiKey | None
    lock: threading.Lock = field(default_factory=threading.Lock)
    outages: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    last_outage: str = ""
    started: float = field(default_factory=time.monotonic)

    def outage(self, reason: str) -> None:
        with self.lock:
            self.outages += 1
            self.last_outage = reason
            if self.outages >= OUTAGE_LIMIT:
                self.stop.set()

    def recovered(self) -> None:
        with self.lock:
            self.outages = 0


def _claim(run_id: int) -> Run | None:
    now = timezone.now()
    lease = now - timedelta(seconds=LEASE_SECONDS)
    claimed = Run.objects.filter(
        Q(status=RunStatus.QUEUED)
        | Q(status=RunStatus.RUNNING, claimed_at__lt=lease)
        | Q(status=RunStatus.RUNNING, claimed_at__isnull=True)
        | Q(status=RunStatus.PAUSED, resume_after__lte=now),
        pk=run_id,
    ).update(status=RunStatus.RUNNING, claimed_at=now, started_at=Coalesce(F("started_at"), now), pause_reason="")
    if not claimed:
        return None
    return Run.objects.select_related("agent", "prompt_version", "model_target", "workspace").get(pk=run_id)


def _item_claim(run: Run) -> RunItem | None:
    with transaction.atomic():
        item = (
            RunItem.objects.select_for_update(skip_locked=True)
            .filter(run=run, status=RunItemStatus.PENDING)
            .order_by("position")
            .first()
        )
        if item is None:
            return None
        item.status = RunItemStatus.RUNNING
        item.claimed_at = timezone.now()
        item.attempts += 1
        item.save(update_fields=["status", "claimed_at", "attempts"])
    return item


def _eval_item(item: RunItem) -> verifiers.EvalItem:
    expected = item.expected_tool_calls
    return verifiers.EvalItem(
        input=item.input_messages or item.task,
        reference_output=item.reference_output or None,
        expected_tool_calls=None
        if expected is None
        else tuple(
            verifiers.ToolCall(str(call.get("name")), dict(call.get("arguments") or {}))
            for call in expected
            if isinstance(call, dict)
        ),
        expected_final_state=item.expected_state,
        metadata=item.metadata,
    )


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        try:
            parsed = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return {"_raw": raw}
        return parsed if isinstance(parsed, dict) else {"_value": parsed}
    return {}


def output_of_answer(answer: gateway.GatewayAnswer) -> dict[str, Any]:
    """What a run keeps of a gateway answer: the message, the tool calls, the facts trajectory metrics read."""
    message = answer.body["choices"][0]["message"]
    keel = answer.body.get("keel") or {}
    final_calls = {call.get("id") for call in message.get("tool_calls") or ()}
    actions = []
    for call in answer.tool_calls:
        status = "client" if call.get("id") in final_calls else "executed"
        if keel.get("approval") and call.get("id") in final_calls:
            status = "pending_approval"
        actions.append(
            {"name": call.get("name") or "", "arguments": _arguments(call.get("arguments")), "status": status}
        )
    return {
        "message": message,
        "tool_calls": [{"name": a["name"], "arguments": a["arguments"]} for a in actions],
        "facts": {
            "trace_id": answer.trace_id,
            "status": "ok" if answer.status == "ok" else "error",
            "steps": answer.steps,
            "cost_usd": answer.cost_usd,
            "latency_ms": answer.latency_ms,
            "tier": answer.tier,
            "escalated": answer.escalated or answer.tier == "human",
            "actions": actions,
            "guardrail_actions": [str(v.get("action")) for v in keel.get("guardrails") or () if isinstance(v, dict)],
        },
    }


def eval_output(stored: Mapping[str, Any], text: str) -> verifiers.EvalOutput:
    """The evaluators' view of a stored sample output (see `output_of_answer`)."""
    facts = stored.get("facts")
    trajectory = None
    if isinstance(facts, Mapping):
        trajectory = verifiers.TrajectoryFacts(
            trace_id=str(facts.get("trace_id") or ""),
            status=str(facts.get("status") or "ok"),
            steps=int(facts.get("steps") or 0),
            model_calls=int(facts.get("model_calls") or 0),
            cost_usd=facts.get("cost_usd"),
            latency_ms=facts.get("latency_ms"),
            input_tokens=int(facts.get("input_tokens") or 0),
            output_tokens=int(facts.get("output_tokens") or 0),
            tier=facts.get("tier"),
            escalated=bool(facts.get("escalated")),
            actions=tuple(
                verifiers.ActionRecord(
                    name=str(action.get("name") or ""),
                    arguments=dict(action.get("arguments") or {}),
                    status=str(action.get("status") or "executed"),
                    approved=action.get("approved"),
                    error=action.get("error"),
                )
                for action in facts.get("actions") or ()
            ),
            guardrail_actions=tuple(str(action) for action in facts.get("guardrail_actions") or ()),
            signals=tuple(str(signal) for signal in facts.get("signals") or ()),
        )
    return verifiers.EvalOutput(
        text=text,
        tool_calls=tuple(
            verifiers.ToolCall(str(call.get("name") or ""), dict(call.get("arguments") or {}))
            for call in stored.get("tool_calls") or ()
        ),
        final_state=stored.get("final_state"),
        trajectory=trajectory,
    )


def _request(run: Run, item: RunItem) -> ChatCompletionRequest:
    messages = item.input_messages or [{"role": "user", "content": item.task}]
    variables = dict(run.variables or {})
    own = item.metadata.get("variables") if isinstance(item.metadata, dict) else None
    if isinstance(own, dict):
        variables.update(own)
    model = f"{gateway.AGENT_PREFIX}{run.agent.slug}" if run.target == SuiteTarget.AGENT and run.agent else ""
    if run.target == SuiteTarget.MODEL_TARGET and run.model_target is not None:
        model = run.model_target.alias
    return ChatCompletionRequest.model_validate(
        {"model": model, "messages": messages, **({"variables": variables} if variables else {})}
    )


def _sample_from_gateway(driver: _Driver, item: RunItem, sample: int) -> RunSample:
    run = driver.run
    assert driver.api_key is not None
    pin = gateway.Pin(
        prompt_version=run.prompt_version,
        tier=run.tier or None,
        tags=("eval", f"eval-run:{run.pk}"),
        metadata={"eval_run": run.pk, "eval_item": item.position, "eval_sample": sample},
    )
    try:
        answer = gateway.chat_completion(
            api_key=driver.api_key,
            request=_request(run, item),
            conversation_id=f"eval-{run.pk}-{item.position}-{sample}",
            pin=pin,
        )
    except providers.ProviderFailed as error:
        raise _Outage(error.detail) from None
    except KeelError as error:  # blocked, over budget, misconfigured: this sample is errored, not scored
        return RunSample(item=item, sample=sample, error=f"{error.code}: {error.detail}"[:4000])
    stored = output_of_answer(answer)
    return RunSample(
        item=item,
        sample=sample,
        output_text=dataset_items.content_text(stored["message"].get("content")) or "",
        output=stored,
        trace_id=answer.trace_id,
        latency_ms=answer.latency_ms,
        cost_usd=answer.cost_usd,
    )


def _sample_from_recording(run: Run, item: RunItem, sample: int) -> RunSample:
    from evals import trajectory_facts
    from tracing import selectors as tracing_selectors

    if not item.source_trace_id:
        return RunSample(item=item, sample=sample, error="the item has no recorded trajectory (source_trace_id)")
    try:
        trajectory = tracing_selectors.trajectory_get(workspace=run.workspace, trace_id=item.source_trace_id)
    except KeelError:
        return RunSample(item=item, sample=sample, error=f"trajectory {item.source_trace_id} is no longer stored")
    output = trajectory_facts.eval_output_from_trajectory(trajectory=trajectory)
    facts = output.trajectory
    stored: dict[str, Any] = {
        "message": {"role": "assistant", "content": output.text},
        "tool_calls": [{"name": call.name, "arguments": dict(call.arguments)} for call in output.tool_calls],
    }
    if facts is not None:
        stored["facts"] = dataclasses.asdict(facts)  # what `eval_output` reads back
    return RunSample(
        item=item,
        sample=sample,
        output_text=output.text,
        output=orjson.loads(orjson.dumps(stored, default=str)),
        trace_id=item.source_trace_id,
        latency_ms=facts.latency_ms if facts else None,
        cost_usd=facts.cost_usd if facts else None,
    )


def _samples(driver: _Driver, item: RunItem) -> list[RunSample]:
    """The item's k samples: the stored ones, and the missing ones made and stored one by one."""
    run = driver.run
    stored = {sample.sample: sample for sample in RunSample.objects.filter(item=item)}
    for index in range(run.samples):
        if index in stored:
            continue
        if run.target == SuiteTarget.RECORDED:
            made = _sample_from_recording(run, item, index)
        else:
            made = _sample_from_gateway(driver, item, index)
            driver.recovered()
        made.save()
        stored[index] = made
        _heartbeat(run)
    return [stored[index] for index in range(run.samples)]


def _scores(driver: _Driver, item: RunItem, samples: Sequence[RunSample]) -> None:
    """Every evaluator's scores of the item's answered samples; scores stored before are kept."""
    answered = [sample for sample in samples if not sample.error]
    if not answered:
        return
    have = set(RunScore.objects.filter(sample__in=answered).values_list("sample_id", "evaluator_name").distinct())
    eval_item = _eval_item(item)
    for built in driver.built:
        name = built.snapshot.name
        missing = [sample for sample in answered if (sample.pk, name) not in have]
        if not missing:
            continue
        # A group evaluator compares the samples with each other, so it always sees all of them.
        judged = answered if built.group is not None else missing
        try:
            results = built.scores(eval_item, [eval_output(sample.output, sample.output_text) for sample in judged])
        except evaluators.ModelUnavailable as error:
            raise _Outage(str(error)) from None
        RunScore.objects.bulk_create(
            [
                RunScore(
                    sample=sample,
                    evaluator_name=name,
                    evaluator_version=built.snapshot.version,
                    score=result.score,
                    passed=result.passed,
                    reason=result.reason[:8000],
                    error=(result.error or "")[:4000],
                )
                for sample, result in zip(judged, results, strict=True)
                if (sample.pk, name) not in have
            ],
            ignore_conflicts=True,
        )


def _heartbeat(run: Run) -> None:
    Run.objects.filter(pk=run.pk, status=RunStatus.RUNNING).update(claimed_at=timezone.now())


def _item_finish(run: Run, item: RunItem, samples: Sequence[RunSample]) -> None:
    first = run.evaluators[0]["name"] if run.evaluators else None
    values: list[float] = [
        score
        for score in RunScore.objects.filter(sample__item=item, evaluator_name=first).values_list("score", flat=True)
        if score is not None
    ]
    errored = all(sample.error for sample in samples)
    status = RunItemStatus.ERRORED if errored else RunItemStatus.DONE
    error = samples[0].error if errored and samples else ""
    with transaction.atomic():
        updated = RunItem.objects.filter(pk=item.pk, status=RunItemStatus.RUNNING).update(
            status=status, score=sum(values) / len(values) if values else None, error=error, claimed_at=None
        )
        if updated:
            # `items_done` counts the items answered and scored, `items_errored` the others: finished is
            # their sum (an errored item counted in both showed "26 of 13 items finished").
            Run.objects.filter(pk=run.pk).update(
                items_done=F("items_done") + (0 if errored else 1),
                items_errored=F("items_errored") + (1 if errored else 0),
                claimed_at=timezone.now(),
            )


def _item_execute(driver: _Driver, item: RunItem) -> None:
    run = driver.run
    try:
        samples = _samples(driver, item)
        _scores(driver, item, samples)
    except _Outage as error:
        RunItem.objects.filter(pk=item.pk).update(
            status=RunItemStatus.PENDING, claimed_at=None, attempts=F("attempts") - 1
        )
        driver.outage(str(error))
        return
    except Exception as error:
        logger.exception("eval run %s item %s failed", run.pk, item.position)
        if item.attempts >= MAX_ITEM_ATTEMPTS:
            RunItem.objects.filter(pk=item.pk).update(
                status=RunItemStatus.ERRORED, error=f"{type(error).__name__}: {error}"[:4000], claimed_at=None
            )
            Run.objects.filter(pk=run.pk).update(items_errored=F("items_errored") + 1)
        else:
            RunItem.objects.filter(pk=item.pk).update(status=RunItemStatus.PENDING, claimed_at=None)
        return
    _item_finish(run, item, samples)


def _still_running(run: Run) -> bool:
    return Run.objects.filter(pk=run.pk, status=RunStatus.RUNNING).exists()


def _work(driver: _Driver) -> None:
    try:
        while not driver.stop.is_set():
            if time.monotonic() - driver.started > SLICE_SECONDS:
                return
            if not _still_running(driver.run):  # cancelled, or paused by another thread
                driver.stop.set()
                return
            item = _item_claim(driver.run)
            if item is None:
                return
            _item_execute(driver, item)
    finally:
        if threading.current_thread() is not threading.main_thread():
            connection.close()


def _build(run: Run) -> list[evaluators.Built]:
    return [
        evaluators.build(evaluators.Snapshot.from_json(data), workspace_id=run.workspace_id, agent_id=run.agent_id)
        for data in run.evaluators
    ]


def run_execute(*, run_id: int, inline: bool = False) -> Run | None:
    """Execute a run to its end (or its pause); a run another live worker holds, or a finished one, is
    left alone, so a redelivered task is harmless. Returns the run, or None when it was not claimed.

    `inline` works through the items in the calling thread alone, for callers inside a transaction that
    the run's worker threads could not see (the demo seed)."""
    run = _claim(run_id)
    if run is None:
        return None
    # Items the previous holder had in hand: it is gone (its lease ran out) or it paused.
    RunItem.objects.filter(run=run, status=RunItemStatus.RUNNING).update(status=RunItemStatus.PENDING, claimed_at=None)
    try:
        built = _build(run)
    except evaluators.EvaluatorConfigError as error:
        Run.objects.filter(pk=run.pk).update(
            status=RunStatus.FAILED, error=f"evaluator settings: {error}", finished_at=timezone.now()
        )
        run.refresh_from_db()
        return run
    driver = _Driver(
        run=run, built=built, api_key=None if run.target == SuiteTarget.RECORDED else runner_key(run.workspace)
    )
    workers = 1 if inline else max(1, min(run.concurrency, run.item_count or 1))
    if workers == 1:
        _work(driver)
    else:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"eval-run-{run.pk}") as pool:
            for future in [pool.submit(_work, driver) for _ in range(workers)]:
                future.result()
    if driver.outages >= OUTAGE_LIMIT:
        Run.objects.filter(pk=run.pk, status=RunStatus.RUNNING).update(
            status=RunStatus.PAUSED,
            pause_reason=f"the model provider is unreachable ({driver.outages} failures in a row): "
            f"{driver.last_outage}"[:4000],
            resume_after=timezone.now() + timedelta(seconds=PAUSE_SECONDS),
            claimed_at=None,
        )
    else:
        _finish_maybe(run)
    run.refresh_from_db()
    return run


def _finish_maybe(run: Run) -> None:
    if RunItem.objects.filter(run=run, status__in=[RunItemStatus.PENDING, RunItemStatus.RUNNING]).exists():
        # The slice ended, or items came back after an outage below the limit: a fresh task goes on.
        requeued = Run.objects.filter(pk=run.pk, status=RunStatus.RUNNING).update(
            status=RunStatus.QUEUED, claimed_at=None
        )
        if requeued:
            run_dispatch(run)
        return
    report = run_report(run=run)
    errors = item_errors(run=run)
    errored = sum(error.items for error in errors)
    # A run none of whose items could be answered, or whose answers no evaluator could score, measured
    # nothing: it failed, and says why, rather than completing with an empty report that a chart, a
    # comparison or a regression check would read as a result.
    if run.item_count > 0 and errored >= run.item_count:
        error = run_failure(item_count=run.item_count, errors=errors)
    else:
        error = score_failure(run=run)
    finished = Run.objects.filter(pk=run.pk, status=RunStatus.RUNNING).update(
        status=RunStatus.FAILED if error else RunStatus.COMPLETED,
        error=error,
        report=report,
        finished_at=timezone.now(),
        claimed_at=None,
    )
    if finished:
        from evals import regressions

        regressions.run_completed(run_id=run.pk)


@dataclass(frozen=True)
class ItemError:
    """The errored items of a run that failed the same way: the error's kind (its code, or its text when
    it has none), how many items, and the first such item's full error."""

    kind: str
    items: int
    example: str
    first_position: int


_ERROR_KIND = re.compile(r"^([A-Za-z_][\w.]{0,63}): ")


def _error_kind(text: str) -> str:
    # "missing_variables: the prompt needs name" and "...needs name, city" are one kind of failure.
    found = _ERROR_KIND.match(text)
    return found.group(1) if found else (text or "unknown error")


def item_errors(*, run: Run) -> list[ItemError]:
    """The run's errored items grouped by kind, the most common first (ties: the kind met first in the
    run). One query, grouped in the database by the exact text."""
    grouped: dict[str, list[tuple[int, int, str]]] = {}
    for text, count, first in (
        RunItem.objects.filter(run=run, status=RunItemStatus.ERRORED)
        .values("error")
        .annotate(n=Count("pk"), first=Min("position"))
        .order_by()
        .values_list("error", "n", "first")
    ):
        grouped.setdefault(_error_kind(text), []).append((first, count, text))
    errors = [
        ItemError(kind, sum(count for _, count, _ in rows), min(rows)[2], min(rows)[0])
        for kind, rows in grouped.items()
    ]
    return sorted(errors, key=lambda error: (-error.items, error.first_position))


def run_failure(*, item_count: int, errors: Sequence[ItemError]) -> str:
    """A failed run's error: that every item errored, and the most common error with its count."""
    errored = sum(error.items for error in errors)
    text = f"every item errored ({errored} of {item_count})"
    if errors:
        common = errors[0]
        text += f"; the most common error ({common.items} item{'s' if common.items != 1 else ''}): {common.example}"
    return text[:4000]


def score_failure(*, run: Run) -> str:
    """A finished run's error when it has scores and every one of them errored (its items were answered,
    but no evaluator could judge any answer): how many, and the first error (by item, sample, then the
    order the scores were stored in). Empty when some score was given. Counted in the database."""
    scores = RunScore.objects.filter(sample__item__run=run, sample__error="")
    counts = scores.aggregate(scores=Count("pk"), scored=Count("score"))
    if not counts["scores"] or counts["scored"]:
        return ""
    first = (
        scores.order_by("sample__item__position", "sample__sample", "pk")
        .values_list("evaluator_name", "sample__item__position", "error")
        .first()
    )
    assert first is not None  # there are scores
    evaluator, position, text = first
    return (
        f"every score errored ({counts['scores']} of {counts['scores']}); "
        f"the first error ({evaluator} on item {position}): {text or 'no score given'}"
    )[:4000]


def runs_sweep() -> list[int]:
    """Runs a worker should take up: queued ones nobody picked up, ones whose worker died, paused ones
    whose pause is over."""
    now = timezone.now()
    return list(
        Run.objects.filter(
            Q(status=RunStatus.QUEUED, created_at__lt=now - timedelta(seconds=QUEUED_GRACE_SECONDS))
            | Q(status=RunStatus.QUEUED, claimed_at__isnull=True, started_at__isnull=False)
            | Q(status=RunStatus.RUNNING, claimed_at__lt=now - timedelta(seconds=LEASE_SECONDS))
            | Q(status=RunStatus.PAUSED, resume_after__lte=now)
        ).values_list("pk", flat=True)[:100]
    )


# --- Reporting ------------------------------------------------------------------------------------------


def _tags(metadata: Any) -> dict[str, str]:
    tags = metadata.get("tags") if isinstance(metadata, dict) else None
    if not isinstance(tags, dict):
        return {}
    return {str(key): str(value) for key, value in tags.items()}


def item_results(
    *, run: Run, evaluator: str, by_key: bool = False, keys: Collection[str] | None = None
) -> list[metrics.ItemResult]:
    """The run's items as `metrics` reads them, for one evaluator: each sample's score (None when the
    sample or its score errored) and whether it passed; the answer text for majority@k. Each item's id is
    its position, or with `by_key` its key (its identity across dataset versions). Only the items `keys`
    names, when given."""
    score_rows = RunScore.objects.filter(sample__item__run=run, evaluator_name=evaluator)
    sample_rows = RunSample.objects.filter(item__run=run)
    item_rows = RunItem.objects.filter(run=run)
    if keys is not None:
        score_rows = score_rows.filter(sample__item__key__in=list(keys))
        sample_rows = sample_rows.filter(item__key__in=list(keys))
        item_rows = item_rows.filter(key__in=list(keys))
    scores = {
        sample_id: (score, passed)
        for sample_id, score, passed in score_rows.values_list("sample_id", "score", "passed")
    }
    samples_of: dict[int, list[metrics.Sample]] = {}
    for sample_id, item_id, text, error in sample_rows.order_by("item_id", "sample").values_list(
        "pk", "item_id", "output_text", "error"
    ):
        score, passed = scores.get(sample_id, (None, False))
        if error:
            score, passed = None, False
        answer = verifiers.normalise_text(text) if text and score is not None else None
        samples_of.setdefault(item_id, []).append(metrics.Sample(score, bool(passed), answer))
    return [
        metrics.ItemResult(key if by_key else str(position), tuple(samples_of.get(item_id, ())), _tags(metadata))
        for item_id, position, key, metadata in item_rows.values_list("pk", "position", "key", "metadata")
    ]


def run_report(*, run: Run) -> dict[str, Any]:
    """Evaluator name -> the run's report for it (`metrics.RunReport.as_json()`)."""
    report: dict[str, Any] = {}
    for data in run.evaluators:
        name = data["name"]
        items = item_results(run=run, evaluator=name)
        full = metrics.run_report(items, REPORT_KS).as_json()
        full.pop("items")  # per item, the run's items hold it
        report[name] = full | {"evaluator_version": data["version"]}
    return report


def run_progress(*, run: Run) -> dict[str, Any]:
    """Where the run stands. Pending and running counts come from `selectors.run_list`/`run_get`'s
    annotations when the run was read there (no query per run in a list), else from one query."""
    counts: dict[str, int]
    if hasattr(run, "pending_items"):
        counts = {RunItemStatus.PENDING: run.pending_items, RunItemStatus.RUNNING: getattr(run, "running_items", 0)}
    else:
        counts = dict(
            RunItem.objects.filter(run=run).values_list("status").annotate(n=Count("pk")).values_list("status", "n")
        )
    return {
        "status": run.status,
        "items": run.item_count,
        "done": run.items_done,
        "errored": run.items_errored,
        "pending": counts.get(RunItemStatus.PENDING, 0),
        "running": counts.get(RunItemStatus.RUNNING, 0),
        "pause_reason": run.pause_reason,
        "resume_after": run.resume_after.isoformat() if run.resume_after else None,
    }


def item_scores(*, run: Run, evaluator: str, keys: Collection[str] | None = None) -> dict[str, float | None]:
    """Item key -> the item's score for one evaluator (None when errored); only the items `keys` names, when given."""
    return metrics.item_scores(item_results(run=run, evaluator=evaluator, by_key=True, keys=keys))


def item_input_text(*, task: str, input_messages: Any) -> str:
    """What an item asks: its task, else its last user message."""
    if task:
        return task
    for message in reversed(input_messages if isinstance(input_messages, list) else []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else str(content)
    return ""


def _compare_page_keys(baseline: Run, candidate: Run, offset: int, limit: int | None) -> list[str]:
    """The keys of one page of the compared items: the candidate's items in its order, then the items only
    the baseline has, in its order. Paged in the database, so a page of 50 reads 50 keys of each side."""
    end = None if limit is None else offset + limit
    candidate_items = RunItem.objects.filter(run=candidate).order_by("position").values_list("key", flat=True)
    keys = list(candidate_items[offset:end])
    if end is not None and len(keys) >= end - offset:
        return keys
    # The page runs past the candidate's items: it goes on with the baseline's that the candidate lacks.
    skip = max(0, offset - RunItem.objects.filter(run=candidate).count())
    rest = (
        RunItem.objects.filter(run=baseline)
        .exclude(key__in=RunItem.objects.filter(run=candidate).values("key"))
        .order_by("position")
        .values_list("key", flat=True)
    )
    return keys + list(rest[skip : None if end is None else skip + (end - offset) - len(keys)])


def runs_compare_items(
    *, baseline: Run, candidate: Run, evaluators_named: Iterable[str], offset: int = 0, limit: int | None = None
) -> list[dict[str, Any]]:
    """The items of either run, matched on their key, in the candidate's order and then the items only the
    baseline has, in its order (`offset`/`limit` take one page of them; the totals are `runs_compare`'s):
    each side's position, what the item asks, and per evaluator each side's score and the delta. A side's
    position and scores are None where that run lacks the item. The queries do not grow with the page:
    the page's keys, their items, and three per run and evaluator."""
    names = list(evaluators_named)
    keys = _compare_page_keys(baseline, candidate, offset, limit)
    positions: dict[int, dict[str, int]] = {baseline.pk: {}, candidate.pk: {}}
    inputs: dict[str, str] = {}
    for run_id, key, position, task, input_messages in (
        RunItem.objects.filter(run__in=[baseline.pk, candidate.pk], key__in=keys)
        .order_by("run_id")
        .values_list("run_id", "key", "position", "task", "input_messages")
    ):
        positions[run_id][key] = position
        # The candidate's wording wins: the baseline may hold an older version of an edited item.
        if run_id == candidate.pk or key not in inputs:
            inputs[key] = item_input_text(task=task, input_messages=input_messages)
    a_positions, b_positions = positions[baseline.pk], positions[candidate.pk]
    a_scores = {name: item_scores(run=baseline, evaluator=name, keys=keys) for name in names}
    b_scores = {name: item_scores(run=candidate, evaluator=name, keys=keys) for name in names}
    rows = []
    for key in keys:
        in_a, in_b = key in a_positions, key in b_positions
        scores = {}
        for name in names:
            a, b = a_scores[name].get(key), b_scores[name].get(key)
            scores[name] = {"baseline": a, "candidate": b, "delta": None if a is None or b is None else b - a}
        rows.append(
            {
                "key": key,
                "presence": "both" if in_a and in_b else ("baseline_only" if in_a else "candidate_only"),
                "baseline_position": a_positions.get(key),
                "candidate_position": b_positions.get(key),
                "input_text": inputs.get(key, ""),
                "scores": scores,
            }
        )
    return rows


PAIRWISE_LIMIT = 100  # items a pairwise comparison judges (two judge calls each, in the request)


def _first_answers(run: Run, keys: Iterable[str] | None = None) -> dict[str, tuple[RunItem, RunSample]]:
    """Item key -> the item and its first answered sample; only the items `keys` names, when given."""
    found: dict[str, tuple[RunItem, RunSample]] = {}
    samples = RunSample.objects.filter(item__run=run, error="").select_related("item")
    if keys is not None:
        samples = samples.filter(item__key__in=list(keys))
    for sample in samples.order_by("item__position", "sample"):
        found.setdefault(sample.item.key, (sample.item, sample))
    return found


def runs_compare_pairwise(
    *, baseline: Run, candidate: Run, evaluator: Evaluator, limit: int = PAIRWISE_LIMIT
) -> dict[str, Any]:
    """The candidate's answers against the baseline's, item by item (the first answered sample of each),
    by a pairwise judge asked in both orders: a win only when both orders agree. Raises ModelUnavailable
    when the judge's model cannot be reached."""
    for run in (baseline, candidate):
        evaluators.agent_mismatch_refuse(
            [evaluator],
            agent=run.agent,
            error=exceptions.EvaluatorAgentMismatch,
            about=f"the judge cannot compare run {run.pk}",
            field="judge",
        )
    judge = evaluators.build_pairwise(
        evaluators.Snapshot.of(evaluator), workspace_id=candidate.workspace_id, agent_id=candidate.agent_id
    )
    # Items pair on their key, so two runs over different dataset versions judge the same item's answers.
    b_answers = _first_answers(candidate)
    a_answers = _first_answers(baseline, b_answers.keys())
    shared = sorted(a_answers.keys() & b_answers.keys(), key=lambda key: b_answers[key][0].position)[:limit]
    tally = {"candidate_wins": 0, "baseline_wins": 0, "ties": 0, "inconsistent": 0, "position_bias": 0, "errored": 0}
    details = []
    for key in shared:
        a_item, a = a_answers[key]
        item, b = b_answers[key]
        verdict = judge.compare(
            _eval_item(item), eval_output(a.output, a.output_text), eval_output(b.output, b.output_text)
        )
        if verdict.error:
            tally["errored"] += 1
        elif verdict.winner == "b":
            tally["candidate_wins"] += 1
        elif verdict.winner == "a":
            tally["baseline_wins"] += 1
        else:
            tally["ties"] += 1
        tally["inconsistent"] += 0 if verdict.consistent or verdict.error else 1
        tally["position_bias"] += 1 if verdict.position_bias else 0
        details.append(
            {
                "key": key,
                "position": item.position,
                "baseline_position": a_item.position,
                "winner": {"a": "baseline", "b": "candidate", "tie": "tie"}[verdict.winner],
                "consistent": verdict.consistent,
                "position_bias": verdict.position_bias,
                "reasoning": list(verdict.reasoning),
                "error": verdict.error,
            }
        )
    decided = tally["candidate_wins"] + tally["baseline_wins"]
    return {
        "evaluator": evaluator.name,
        "version": evaluator.version,
        "items": len(details),
        **tally,
        "candidate_win_rate": tally["candidate_wins"] / decided if decided else None,
        "details": details,
    }


def _items_by_key(baseline: Run, candidate: Run) -> QuerySet[Any, Mapping[str, Any]]:
    """Both runs' items grouped on their key, one row per key, with `in_baseline`/`in_candidate`: 0 where
    that run lacks the item."""
    return (
        RunItem.objects.filter(run__in=[baseline.pk, candidate.pk])
        .values("key")
        .annotate(
            in_baseline=Count("pk", filter=Q(run=baseline.pk)), in_candidate=Count("pk", filter=Q(run=candidate.pk))
        )
        .order_by()
    )


def _scores_by_key(baseline: Run, candidate: Run, evaluator: str) -> QuerySet[Any, Mapping[str, Any]]:
    """`_items_by_key` with each side's item score for the evaluator, as `item_scores` gives it: the mean
    score of the item's answered samples, None when none was scored. Grouped in the database."""
    scored = Q(samples__error="", samples__scores__evaluator_name=evaluator)
    rows: QuerySet[Any, Mapping[str, Any]] = _items_by_key(baseline, candidate).annotate(
        baseline_score=Avg("samples__scores__score", filter=scored & Q(run=baseline.pk)),
        candidate_score=Avg("samples__scores__score", filter=scored & Q(run=candidate.pk)),
    )
    return rows


def _paired_comparison(baseline: Run, candidate: Run, evaluator: str) -> metrics.PairedComparison:
    """`metrics.paired_comparison` of the two runs' item scores for one evaluator, counted and averaged in
    the database: two queries whatever the runs' sizes, and only the paired items' deltas come back, for
    the bootstrap interval and the sign-flip test (in the order of their keys, as the metrics module
    pairs them, so that the seeded draws give the same figures)."""
    paired = Q(baseline_score__isnull=False, candidate_score__isnull=False)
    delta = F("candidate_score") - F("baseline_score")
    totals = _scores_by_key(baseline, candidate, evaluator).aggregate(
        items=Count("key", filter=paired),
        only_in_a=Count("key", filter=Q(in_candidate=0)),
        only_in_b=Count("key", filter=Q(in_baseline=0)),
        both=Count("key", filter=Q(in_baseline__gt=0, in_candidate__gt=0)),
        mean_a=Avg("baseline_score", filter=paired),
        mean_b=Avg("candidate_score", filter=paired),
        mean_delta=Avg(delta, filter=paired),
        improved=Count("key", filter=paired & Q(candidate_score__gt=F("baseline_score"))),
        worsened=Count("key", filter=paired & Q(candidate_score__lt=F("baseline_score"))),
    )
    deltas: list[float] = list(
        _scores_by_key(baseline, candidate, evaluator)
        .filter(baseline_score__isnull=False, candidate_score__isnull=False)
        .annotate(delta=delta)
        # The metrics module sorts item ids as Python does: by code point, which is the "C" collation's order.
        .order_by(Collate("key", "C"))
        .values_list("delta", flat=True)
    )
    confidence = metrics.DEFAULT_CONFIDENCE
    return metrics.PairedComparison(
        items=totals["items"],
        only_in_a=totals["only_in_a"],
        only_in_b=totals["only_in_b"],
        errored=totals["both"] - totals["items"],
        mean_a=totals["mean_a"],
        mean_b=totals["mean_b"],
        mean_delta=totals["mean_delta"],
        ci=metrics.bootstrap_ci(deltas, confidence=confidence) if deltas else None,
        p_value=metrics.sign_flip_test(deltas) if deltas else None,
        improved=totals["improved"],
        worsened=totals["worsened"],
        unchanged=totals["items"] - totals["improved"] - totals["worsened"],
        confidence=confidence,
    )


def runs_compare(*, baseline: Run, candidate: Run, evaluators_named: Iterable[str] | None = None) -> dict[str, Any]:
    """Candidate against baseline on the items both ran, matched on the item's key (its identity across
    dataset versions, not its position): per evaluator, the paired comparison (delta, bootstrap interval,
    sign-flip p-value); `items_only_in_baseline`/`items_only_in_candidate` count the items one run lacks.
    Counted and averaged in the database: the queries do not grow with the runs (one, and two per evaluator)."""
    names = list(evaluators_named or [])
    if not names:
        baseline_names = [data["name"] for data in baseline.evaluators]
        names = [data["name"] for data in candidate.evaluators if data["name"] in baseline_names]
    comparisons = {name: _paired_comparison(baseline, candidate, name).as_json() for name in names}
    presence = _items_by_key(baseline, candidate).aggregate(
        both=Count("key", filter=Q(in_baseline__gt=0, in_candidate__gt=0)),
        only_in_baseline=Count("key", filter=Q(in_candidate=0)),
        only_in_candidate=Count("key", filter=Q(in_baseline=0)),
    )
    return {
        "baseline": baseline.pk,
        "candidate": candidate.pk,
        # A failed run (every item or every score errored) has no scores: its side of every delta is missing,
        # not zero.
        "baseline_status": baseline.status,
        "candidate_status": candidate.status,
        "baseline_items_errored": baseline.items_errored,
        "candidate_items_errored": candidate.items_errored,
        "same_dataset_version": baseline.dataset_version_id == candidate.dataset_version_id,
        "items_in_both": presence["both"],
        "items_only_in_baseline": presence["only_in_baseline"],
        "items_only_in_candidate": presence["only_in_candidate"],
        "metrics": comparisons,
    }
