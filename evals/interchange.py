"""Runs in and out as NeMo Gym rollouts JSONL (the file format itself is evals/gym.py).

Export: one rollout per sample, its reward the run's first evaluator's score (none when the sample or
its score errored), every evaluator's score and the item's tags kept under Keel's own key. Streamed
from the database in chunks, so a large run does not sit in memory.

Import: a file of rollouts becomes a completed run: each task an item, each rollout a sample, its
reward the score of an evaluator named `reward`; the run then reports pass@k, majority@k and the
subgroups like any run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from django.db import transaction
from django.db.models import Prefetch
from django.utils import timezone

from agent_registry.models import ApiKey, User, Workspace
from evals import dataset_items, exceptions, gym, runs
from evals.models import Run, RunItem, RunItemStatus, RunSample, RunScore, RunStatus, RunTrigger, Suite, SuiteTarget

IMPORTED_EVALUATOR = "reward"
MAX_IMPORT_BYTES = 100 * 1024 * 1024


def run_rollouts(*, run: Run) -> Iterator[gym.Rollout]:
    """The run's samples as rollouts, item by item, in chunks."""
    first = run.evaluators[0]["name"] if run.evaluators else None
    items = (
        RunItem.objects.filter(run=run)
        .order_by("position")
        .prefetch_related(Prefetch("samples", queryset=RunSample.objects.order_by("sample").prefetch_related("scores")))
    )
    for item in items.iterator(chunk_size=200):
        tags = item.metadata.get("tags") if isinstance(item.metadata, dict) else None
        for sample in item.samples.all():
            scores = {score.evaluator_name: score for score in sample.scores.all()}
            primary = scores.get(first) if first else None
            reward = None if sample.error or primary is None or primary.error else primary.score
            tool_calls = (sample.output or {}).get("tool_calls", [])
            yield gym.Rollout(
                task_index=item.position,
                sample=sample.sample,
                input=item.input_messages or item.task,
                output_text=sample.output_text,
                output_items=gym.output_items_build(sample.output_text, tool_calls),
                reward=reward,
                passed=None if reward is None else bool(primary and primary.passed),
                metadata={
                    "item_key": item.key,
                    "tags": tags or {},
                    "trace_id": sample.trace_id,
                    "reference_output": item.reference_output,
                    "scores": {
                        name: {"score": score.score, "passed": score.passed, "version": score.evaluator_version}
                        for name, score in scores.items()
                    },
                    **({"error": sample.error} if sample.error else {}),
                },
            )


def _rollouts(content: bytes, threshold: float) -> list[gym.Rollout]:
    if len(content) > MAX_IMPORT_BYTES:
        raise exceptions.RolloutsInvalid(
            f"the file is over {MAX_IMPORT_BYTES} bytes", errors=[{"line": None, "field": "", "message": "too large"}]
        )
    try:
        return gym.rollouts_read(content, threshold=threshold)
    except gym.RolloutsInvalid as error:
        raise exceptions.RolloutsInvalid(
            f"invalid rollouts: {error}", errors=[problem.as_dict() for problem in error.problems]
        ) from None


@transaction.atomic
def run_import(
    *,
    workspace: Workspace,
    content: bytes,
    name: str = "",
    suite: Suite | None = None,
    threshold: float = 1.0,
    created_by: User | None = None,
    created_via_key: ApiKey | None = None,
) -> Run:
    """A completed run from a rollouts file. A malformed file raises `RolloutsInvalid` naming each line
    and field, and nothing is stored."""
    rollouts = _rollouts(content, threshold)  # a file without rollouts is refused there
    tasks: dict[int, list[gym.Rollout]] = {}
    for rollout in rollouts:
        tasks.setdefault(rollout.task_index, []).append(rollout)
    now = timezone.now()
    run = Run.objects.create(
        workspace=workspace,
        suite=suite,
        agent=suite.agent if suite else None,
        name=name or f"imported rollouts · {now:%Y-%m-%d %H:%M}",
        status=RunStatus.RUNNING,
        trigger=RunTrigger.IMPORT,
        target=SuiteTarget.RECORDED,
        samples=max(len(group) for group in tasks.values()),
        concurrency=1,
        evaluators=[
            {
                "id": None,
                "name": IMPORTED_EVALUATOR,
                "version": 1,
                "type": "imported",
                "config": {"threshold": threshold},
            }
        ],
        item_count=len(tasks),
        items_done=len(tasks),
        created_by=created_by,
        created_via_key=created_via_key,
        started_at=now,
    )
    ordered = sorted(tasks.items())
    keys = _item_keys([group for _, group in ordered])
    items = RunItem.objects.bulk_create(
        [
            RunItem(
                run=run,
                position=task_index,
                key=key,
                task=group[0].input if isinstance(group[0].input, str) else "",
                input_messages=group[0].input if isinstance(group[0].input, list) else [],
                metadata=_item_metadata(group[0].metadata),
                status=RunItemStatus.DONE,
            )
            for (task_index, group), key in zip(ordered, keys, strict=True)
        ]
    )
    by_position = {item.position: item for item in items}
    samples = RunSample.objects.bulk_create(
        [
            RunSample(
                item=by_position[rollout.task_index],
                sample=rollout.sample,
                output_text=rollout.output_text,
                output={"tool_calls": rollout.tool_calls},
                trace_id=str(rollout.metadata.get("trace_id") or "")[:32] if rollout.metadata else "",
                error="" if rollout.reward is not None else "the rollout has no reward",
            )
            for rollout in rollouts
        ]
    )
    RunScore.objects.bulk_create(
        [
            RunScore(
                sample=sample,
                evaluator_name=IMPORTED_EVALUATOR,
                evaluator_version=1,
                score=rollout.reward,
                passed=bool(rollout.passed),
            )
            for sample, rollout in zip(samples, rollouts, strict=True)
            if rollout.reward is not None
        ]
    )
    for item in items:
        values = [r.reward for r in tasks[item.position] if r.reward is not None]
        item.score = sum(values) / len(values) if values else None
    RunItem.objects.bulk_update(items, ["score"])
    run.report = runs.run_report(run=run)
    run.status = RunStatus.COMPLETED
    run.finished_at = timezone.now()
    run.save(update_fields=["report", "status", "finished_at"])
    return run


def _item_keys(groups: list[list[gym.Rollout]]) -> list[str]:
    """Each task's item key: the one Keel's export wrote (so an imported run compares item by item with
    the run it came from), else its input's hash. A key that several tasks claim is not an identity; they
    fall back to their input's hash."""
    given = []
    for group in groups:
        metadata = group[0].metadata
        key = metadata.get("item_key") if isinstance(metadata, dict) else None
        given.append(key if isinstance(key, str) and key.strip() and len(key) <= dataset_items.KEY_MAX_CHARS else "")
    claimed = Counter(key for key in given if key)
    items = [
        dataset_items.ItemData(
            key=key if claimed[key] == 1 else "",
            task=group[0].input if isinstance(group[0].input, str) else "",
            input_messages=tuple(group[0].input) if isinstance(group[0].input, list) else (),
        )
        for key, group in zip(given, groups, strict=True)
    ]
    return [item.key for item in dataset_items.items_keyed(items)]


def _item_metadata(metadata: Any) -> dict[str, Any]:
    if not isinstance(metadata, dict):
        return {}
    tags = metadata.get("tags")
    return {"tags": tags} if isinstance(tags, dict) else {}
