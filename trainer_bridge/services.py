"""Writes of the trainer bridge: curations, their previews, and exports written by a Celery task.

An export is refused before any file exists when the curation selects no groups or the format cannot
represent them (the preview pass runs the format's `check`). Accepted, it is a row the task claims with a
lease; the task writes `<id>.partial` under MEDIA_ROOT/exports and renames it only when the file is
complete, so a worker killed mid-write leaves no file anyone can download, and the next claim (the sweep
hands a stale one out again) starts the file over. Cancelling stops the writer at its next group.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import orjson
from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from agent_registry import audit
from agent_registry.models import ApiKey, AuditAction, User, Workspace
from config.dispatch import task_send_on_commit
from config.errors import Conflict, NotFound, ValidationFailed
from trainer_bridge import curation as curation_query
from trainer_bridge import formats, groups
from trainer_bridge.formats import manifest as manifests
from trainer_bridge.models import ACTIVE, Curation, Export, ExportFormat, GroupJudgement, JobStatus

logger = logging.getLogger("trainer_bridge.services")

EXPORT_LEASE_SECONDS = 600
# Which of the curation's splits an export holds: both (each row or group says which it is in), or one, for a
# consumer that takes its training and validation sets as separate files (OpenAI fine-tuning).
EXPORT_SPLIT_ALL = "all"
EXPORT_SPLITS = (EXPORT_SPLIT_ALL, *groups.SPLITS)
PROGRESS_STEPS = 100  # progress writes (and cancellation checks) over an export, at most


class CurationInvalid(ValidationFailed):
    code = "curation_invalid"


class CurationExists(Conflict):
    code = "curation_exists"


class CurationNotFound(NotFound):
    code = "curation_not_found"


class ExportRefused(ValidationFailed):
    """The curation selects nothing, or the format cannot represent what it selects; no file was written."""

    code = "export_refused"


class ExportNotFound(NotFound):
    code = "export_not_found"


class ExportNotReady(Conflict):
    code = "export_not_ready"


# --- Curations ------------------------------------------------------------------------------------------


def _filters(data: Mapping[str, Any]) -> groups.Filters:
    try:
        return groups.Filters.from_dict(dict(data))
    except groups.FilterError as error:
        raise CurationInvalid(
            f"filters.{error.field}: {error.message}",
            errors=[{"field": f"filters.{error.field}", "message": error.message}],
        ) from None
    except TypeError as error:
        raise CurationInvalid(str(error), errors=[{"field": "filters", "message": str(error)}]) from None


def curation_validate(*, query: Any, grouping: Any, reward: Any, filters: Any) -> None:
    """Raise `CurationInvalid` naming each bad field of a curation's settings."""
    _curation_check(query=query, grouping=grouping, reward=reward, filters=filters)


def _curation_check(*, query: Any, grouping: Any, reward: Any, filters: Any) -> None:
    problems = curation_query.curation_problems(query=query, grouping=grouping, reward=reward)
    if not isinstance(filters, Mapping):
        problems.append({"field": "filters", "message": "must be an object"})
    if problems:
        raise CurationInvalid(f"invalid curation: {problems[0]['field']}: {problems[0]['message']}", errors=problems)
    _filters(filters)


@transaction.atomic
def curation_create(
    *,
    workspace: Workspace,
    name: str,
    query: Mapping[str, Any],
    reward: Mapping[str, Any],
    grouping: str = "auto",
    filters: Mapping[str, Any] | None = None,
    description: str = "",
    created_by: User | None = None,
) -> Curation:
    filters = dict(filters or {})
    _curation_check(query=query, grouping=grouping, reward=reward, filters=filters)
    found = Curation(
        workspace=workspace,
        name=name,
        description=description,
        query=dict(query),
        grouping=grouping,
        reward=dict(reward),
        filters=filters,
        created_by=created_by,
    )
    try:
        found.full_clean(exclude=["workspace", "created_by"], validate_constraints=False)
    except DjangoValidationError as error:
        raise CurationInvalid(
            "invalid curation",
            errors=[{"field": key, "message": "; ".join(value)} for key, value in error.message_dict.items()],
        ) from None
    try:
        with transaction.atomic():
            found.save()
    except IntegrityError:
        raise CurationExists(f"a curation named {name!r} exists") from None
    return found


def curation_update(*, curation: Curation, **fields: Any) -> Curation:
    allowed = {"description", "query", "grouping", "reward", "filters"}
    unknown = sorted(set(fields) - allowed)
    if unknown:
        raise CurationInvalid(
            f"cannot change {', '.join(unknown)}",
            errors=[{"field": key, "message": "cannot be changed"} for key in unknown],
        )
    merged = {key: fields.get(key, getattr(curation, key)) for key in allowed}
    _curation_check(
        query=merged["query"], grouping=merged["grouping"], reward=merged["reward"], filters=merged["filters"]
    )
    for key, value in fields.items():
        setattr(curation, key, value)
    try:
        curation.full_clean(exclude=["workspace", "created_by"], validate_constraints=False)
    except DjangoValidationError as error:
        curation.refresh_from_db()
        raise CurationInvalid(
            "invalid curation",
            errors=[{"field": key, "message": "; ".join(value)} for key, value in error.message_dict.items()],
        ) from None
    curation.save()
    return curation


def curation_snapshot(curation: Curation) -> dict[str, Any]:
    return {
        "id": curation.pk,
        "name": curation.name,
        "query": curation.query,
        "grouping": curation.grouping,
        "reward": curation.reward,
        "filters": curation.filters,
    }


# --- From trajectories to groups ------------------------------------------------------------------------


def _rollout(item: curation_query.Curated, grouping: str) -> groups.Rollout | None:
    keys = item.task_keys
    if grouping != "auto" and grouping not in keys:
        return None  # the trajectory lacks what this curation groups by
    return groups.Rollout(
        trace_id=item.trace_id,
        messages=item.messages,
        tools=item.tools,
        reward=item.reward,
        metadata=item.metadata,
        correction=item.correction,
        tokens=item.tokens,
        metrics=item.metrics,
        dataset_item_id=keys.get("dataset_item") if grouping in ("auto", "dataset_item") else None,
        task_id=keys.get("task_id") if grouping in ("auto", "task_id") else None,
    )


def _judge_key(group: groups.Group, outputs: list[Any]) -> str:
    judged = [
        group.task_text,
        *(
            [rollout.trace_id, output.text, output.tool_calls]
            for rollout, output in zip(group.rollouts, outputs, strict=True)
        ),
    ]
    return hashlib.sha256(orjson.dumps(judged, default=repr)).hexdigest()


def _judged(group: groups.Group, judge: _GroupJudge) -> groups.Group:
    """The group with each rollout's reward from the group judge (RULER): one call per group, kept, so the
    next preview or the export reads the same rewards; unchanged when the judge errs (nothing kept then)."""
    from evals import verifiers

    outputs = [
        verifiers.EvalOutput(
            text=groups.final_answer(rollout.messages),
            tool_calls=tuple(
                verifiers.ToolCall(name, {"arguments": arguments})
                for name, arguments in groups.tool_call_sequence(rollout.messages)
            ),
        )
        for rollout in group.rollouts
    ]
    key = _judge_key(group, outputs)
    kept = GroupJudgement.objects.filter(evaluator_id=judge.evaluator_id, group_key=key).first()
    if kept is not None:
        rewards = [kept.rewards.get(rollout.trace_id) for rollout in group.rollouts]
    else:
        scores = judge.built.scores(verifiers.EvalItem(input=group.task_text), outputs)
        rewards = [score.score for score in scores]
        if all(reward is not None for reward in rewards):
            GroupJudgement.objects.bulk_create(
                [
                    GroupJudgement(
                        evaluator_id=judge.evaluator_id,
                        group_key=key,
                        rewards={
                            rollout.trace_id: reward for rollout, reward in zip(group.rollouts, rewards, strict=True)
                        },
                    )
                ],
                ignore_conflicts=True,  # another preview judged it at the same moment
            )
    rollouts = tuple(
        groups.Rollout(**{**_fields(rollout), "reward": reward})
        for rollout, reward in zip(group.rollouts, rewards, strict=True)
    )
    return replace(group, rollouts=rollouts)


def _fields(rollout: groups.Rollout) -> dict[str, Any]:
    return {name: getattr(rollout, name) for name in rollout.__dataclass_fields__}


@dataclass(frozen=True)
class _GroupJudge:
    evaluator_id: int
    built: Any  # evals.evaluators.Built with a group judge


def _group_judge(workspace: Workspace, reward: Mapping[str, Any]) -> _GroupJudge | None:
    if reward.get("source") != "group_judge":
        return None
    from evals import evaluators
    from evals.models import Evaluator

    found = Evaluator.objects.filter(workspace=workspace, name=reward["evaluator"]).order_by("-version").first()
    if found is None:
        raise CurationInvalid(
            f"no evaluator named {reward['evaluator']!r}",
            errors=[{"field": "reward.evaluator", "message": "no such evaluator"}],
        )
    built = evaluators.build(evaluators.Snapshot.of(found), workspace_id=workspace.pk, agent_id=found.agent_id)
    if built.group is None:
        raise CurationInvalid(
            f"{found.name} is not a group judge", errors=[{"field": "reward.evaluator", "message": "not a group judge"}]
        )
    return _GroupJudge(evaluator_id=found.pk, built=built)


@dataclass
class _Tally:
    trajectories: int = 0
    ungrouped: int = 0


def selected_groups(
    workspace: Workspace, snapshot: Mapping[str, Any], tally: _Tally | None = None
) -> Iterator[groups.Group]:
    """The curation's groups after its filters (deterministic: the same data gives the same groups).

    With `snapshot["separate_prompts"]` (set for a group-relative export format) each task's rollouts are first
    separated into one group per prompt (`groups.separate_prompts`), before the group judge and the filters: RULER
    ranks a group's rollouts against each other, and the size and reward filters must see the groups the file
    will hold."""
    tally = tally if tally is not None else _Tally()
    judge = _group_judge(workspace, snapshot["reward"])

    def rollouts() -> Iterator[groups.Rollout]:
        for item in curation_query.curated(workspace=workspace, query=snapshot["query"], reward=snapshot["reward"]):
            tally.trajectories += 1
            made = _rollout(item, snapshot["grouping"])
            if made is None:
                tally.ungrouped += 1
                continue
            yield made

    grouped: Iterator[groups.Group] = groups.group_rollouts(rollouts())
    if snapshot.get("separate_prompts", False):
        grouped = groups.separate_prompts(grouped)
    if judge is not None:
        grouped = (_judged(group, judge) for group in grouped)
    curated = groups.curate(grouped, _filters(snapshot["filters"]))
    split = snapshot.get("split", EXPORT_SPLIT_ALL)
    if split == EXPORT_SPLIT_ALL:
        return curated
    return (group for group in curated if group.split == split)


@dataclass(frozen=True)
class CurationPreview:
    preview: groups.Preview
    trajectories: int
    ungrouped: int

    def as_dict(self) -> dict[str, Any]:
        return {**self.preview.as_dict(), "trajectories": self.trajectories, "ungrouped": self.ungrouped}


def curation_preview(*, workspace: Workspace, snapshot: Mapping[str, Any]) -> CurationPreview:
    tally = _Tally()
    summary = groups.preview(selected_groups(workspace, snapshot, tally))
    return CurationPreview(preview=summary, trajectories=tally.trajectories, ungrouped=tally.ungrouped)


# --- Exports --------------------------------------------------------------------------------------------


def export_dir() -> Path:
    folder = Path(settings.MEDIA_ROOT) / "exports"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@transaction.atomic
def export_create(
    *,
    curation: Curation,
    format: str,
    threshold: float = formats.DEFAULT_REWARD_THRESHOLD,
    split: str = EXPORT_SPLIT_ALL,
    created_by: User | None = None,
    created_via_key: ApiKey | None = None,
    dispatch: bool = True,
) -> Export:
    """A queued export of the curation (of one of its splits, or `split="all"`: both), or `ExportRefused`
    (nothing written) when there is nothing to export or the format cannot represent it."""
    if format not in ExportFormat.values:
        raise ExportRefused(
            f"format must be one of {', '.join(ExportFormat.values)}",
            errors=[{"field": "format", "message": "unknown format"}],
        )
    if split not in EXPORT_SPLITS:
        raise ExportRefused(
            f"split must be one of {', '.join(EXPORT_SPLITS)}", errors=[{"field": "split", "message": "unknown split"}]
        )
    snapshot = {
        **curation_snapshot(curation),
        "threshold": threshold,
        "split": split,
        "separate_prompts": formats.format_get(format).group_relative,
    }
    found = curation_preview(workspace=curation.workspace, snapshot=snapshot)
    if found.preview.groups == 0:
        of_split = "" if split == EXPORT_SPLIT_ALL else f" in its {split} split"
        by_prompt = ", one group per prompt of each task," if snapshot["separate_prompts"] else ""
        raise ExportRefused(
            f"the curation selects no groups{of_split} ({found.trajectories} trajectories; after grouping"
            f"{by_prompt} and filters none is left)",
            errors=[{"field": "curation", "message": "selects no groups"}],
            preview=found.as_dict(),
        )
    try:
        formats.format_get(format).check(found.preview, threshold=threshold)
    except formats.FormatCannotRepresent as error:
        raise ExportRefused(str(error), errors=[{"field": "format", "message": str(error)}]) from None
    export = Export.objects.create(
        workspace=curation.workspace,
        curation=curation,
        format=format,
        curation_snapshot={**snapshot, "preview": found.as_dict()},
        groups_total=found.preview.groups,
        created_by=created_by,
        created_via_key=created_via_key,
    )
    audit.record(
        workspace=export.workspace_id,
        action=AuditAction.EXPORT_CREATED,
        user=created_by,
        api_key=created_via_key,
        target=export,
        details={"curation": curation.name, "format": format, "split": split, "groups": export.groups_total},
    )
    if dispatch:
        from trainer_bridge import tasks

        # A broker that cannot be reached costs a delay: `exports_sweep` sends a queued export nobody took.
        task_send_on_commit(tasks.export_execute, export.pk)
    return export


def _claim(export_id: int) -> Export | None:
    now = timezone.now()
    lease = now - timedelta(seconds=EXPORT_LEASE_SECONDS)
    claimed = Export.objects.filter(
        Q(status=JobStatus.QUEUED) | Q(status=JobStatus.RUNNING, claimed_at__lt=lease), pk=export_id
    ).update(status=JobStatus.RUNNING, claimed_at=now, started_at=now, groups_done=0)
    return Export.objects.select_related("workspace").get(pk=export_id) if claimed else None


class _Cancelled(Exception):
    pass


def _counted(export: Export, grouped: Iterator[groups.Group]) -> Iterator[groups.Group]:
    every = max(1, export.groups_total // PROGRESS_STEPS)
    done = 0
    for group in grouped:
        yield group
        done += 1
        if done % every == 0:
            if not Export.objects.filter(pk=export.pk, status=JobStatus.RUNNING).exists():
                raise _Cancelled
            Export.objects.filter(pk=export.pk).update(groups_done=done, claimed_at=timezone.now())
    Export.objects.filter(pk=export.pk).update(groups_done=done)


def export_execute(*, export_id: int) -> Export | None:
    """Write the export's file (from the start), then its manifest; a finished export, or one another live
    worker holds, is left alone."""
    export = _claim(export_id)
    if export is None:
        return None
    # An export queued before snapshots recorded `separate_prompts` takes its format's: its file must not mix
    # prompts in a group even if its preview did.
    snapshot = {
        "separate_prompts": formats.format_get(export.format).group_relative,
        **export.curation_snapshot,
    }
    final = export_dir() / f"export-{export.pk}-{export.format}.jsonl"
    partial = final.with_suffix(".partial")
    try:
        with partial.open("wb") as out:
            manifest = manifests.export_write(
                _counted(export, selected_groups(export.workspace, snapshot)),
                out,
                format_name=export.format,
                curation={
                    **{key: snapshot[key] for key in ("id", "name", "query", "grouping", "reward", "filters")},
                    "split": snapshot.get("split", EXPORT_SPLIT_ALL),
                    "separate_prompts": snapshot["separate_prompts"],
                },
                created_at=timezone.now(),
                threshold=float(snapshot.get("threshold", formats.DEFAULT_REWARD_THRESHOLD)),
            )
            out.flush()
            os.fsync(out.fileno())
    except _Cancelled:
        partial.unlink(missing_ok=True)
        export.refresh_from_db()
        return export
    except Exception as error:
        partial.unlink(missing_ok=True)
        logger.exception("export %s failed", export.pk)
        Export.objects.filter(pk=export.pk).update(
            status=JobStatus.FAILED, error=f"{type(error).__name__}: {error}"[:4000], finished_at=timezone.now()
        )
        export.refresh_from_db()
        return export
    if manifest.counts.lines == 0:
        partial.unlink(missing_ok=True)
        Export.objects.filter(pk=export.pk).update(
            status=JobStatus.FAILED,
            error=f"the {export.format} format made no lines of these groups",
            finished_at=timezone.now(),
        )
        export.refresh_from_db()
        return export
    os.replace(partial, final)
    updated = Export.objects.filter(pk=export.pk, status=JobStatus.RUNNING).update(
        status=JobStatus.SUCCEEDED,
        path=str(final),
        bytes=manifest.size,
        sha256=manifest.sha256,
        manifest=manifest.as_dict(),
        finished_at=timezone.now(),
        groups_done=F("groups_total") if manifest.counts.groups >= export.groups_total else manifest.counts.groups,
    )
    if not updated:  # cancelled while the last groups were written
        final.unlink(missing_ok=True)
    export.refresh_from_db()
    return export


def export_cancel(*, export: Export) -> Export:
    Export.objects.filter(pk=export.pk, status__in=ACTIVE).update(
        status=JobStatus.CANCELLED, finished_at=timezone.now()
    )
    export.refresh_from_db()
    return export


def exports_sweep() -> list[int]:
    """Exports a worker should take up: queued ones nobody took, running ones whose worker died."""
    now = timezone.now()
    return list(
        Export.objects.filter(
            Q(status=JobStatus.QUEUED, created_at__lt=now - timedelta(seconds=120))
            | Q(status=JobStatus.RUNNING, claimed_at__lt=now - timedelta(seconds=EXPORT_LEASE_SECONDS))
        ).values_list("pk", flat=True)[:100]
    )


def export_file(*, export: Export) -> Path:
    if export.status != JobStatus.SUCCEEDED or not export.path:
        raise ExportNotReady(f"export {export.pk} is {export.status}; its file is ready once it has succeeded")
    path = Path(export.path)
    if not path.exists():
        raise ExportNotFound(f"the file of export {export.pk} is gone")
    return path
