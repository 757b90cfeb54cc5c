"""Reads of the evals, each scoped to a workspace (and, for keys limited to some agents, to those
agents' datasets): datasets, their versions and items, and a version written out as JSONL or CSV."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, TypeVar

from django.db.models import Count, Model, OuterRef, Prefetch, Q, QuerySet, Subquery

from agent_registry.models import Workspace
from evals import dataset_items, exceptions, judges
from evals.models import (
    Dataset,
    DatasetItem,
    DatasetVersion,
    Evaluator,
    OnlineRule,
    RegressionAlert,
    Run,
    RunItem,
    RunSample,
    RunScore,
    RunStatus,
    Suite,
)
from tracing.models import Score, ScoreSource

AgentIds = Collection[int] | None
M = TypeVar("M", bound=Model)
FORMATS = ("jsonl", "csv")


def dataset_list(*, workspace: Workspace, agent_ids: AgentIds = None) -> QuerySet[Dataset]:
    datasets = Dataset.objects.filter(workspace=workspace).select_related("agent")
    if agent_ids is not None:
        # A key limited to some agents sees their datasets only, not the workspace-wide ones.
        datasets = datasets.filter(agent_id__in=agent_ids)
    return datasets.order_by("name")


def dataset_get(*, workspace: Workspace, name: str, agent_ids: AgentIds = None) -> Dataset:
    dataset = dataset_list(workspace=workspace, agent_ids=agent_ids).filter(name=name).first()
    if dataset is None:
        raise exceptions.DatasetNotFound(f"no dataset named {name!r}")
    return dataset


def dataset_version_list(*, dataset: Dataset) -> QuerySet[DatasetVersion]:
    return dataset.versions.order_by("-version")


def dataset_version_latest(*, dataset: Dataset) -> DatasetVersion | None:
    return dataset.versions.order_by("-version").first()


def dataset_version_get(*, dataset: Dataset, version: int) -> DatasetVersion:
    found = dataset.versions.filter(version=version).first()
    if found is None:
        raise exceptions.DatasetVersionNotFound(f"dataset {dataset.name!r} has no version {version}")
    return found


def dataset_item_list(*, version: DatasetVersion) -> QuerySet[DatasetItem]:
    return version.items.order_by("position")


@dataclass(frozen=True)
class DatasetItemPage:
    items: list[DatasetItem]
    next_cursor: str | None


def _item_cursor_encode(position: int) -> str:
    return base64.urlsafe_b64encode(f"after:{position}".encode()).decode().rstrip("=")


def _item_cursor_decode(cursor: str) -> int:
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        prefix, _, position = text.partition(":")
        if prefix != "after" or not position.isascii() or not position.isdigit() or len(position) > 9:
            raise ValueError(text)
        return int(position)
    except (ValueError, UnicodeDecodeError, binascii.Error):
        raise exceptions.DatasetItemPageInvalid(
            "the cursor is not one this API gave out", errors=[{"field": "cursor", "message": "unknown cursor"}]
        ) from None


def dataset_item_page(*, version: DatasetVersion, limit: int, cursor: str | None = None) -> DatasetItemPage:
    """A page of the version's items in their order; `next_cursor` continues it (None on the last page).
    Keyed on the position, so a page costs one query wherever it is in the version.
    Raises DatasetItemPageInvalid for a cursor this never gave out."""
    items = dataset_item_list(version=version)
    if cursor:
        items = items.filter(position__gt=_item_cursor_decode(cursor))
    page = list(items[: limit + 1])
    more = len(page) > limit
    page = page[:limit]
    return DatasetItemPage(page, _item_cursor_encode(page[-1].position) if more else None)


def dataset_item_data(item: DatasetItem) -> dataset_items.ItemData:
    return dataset_items.ItemData(
        key=item.key,
        task=item.task,
        input_messages=tuple(item.input_messages or ()),
        reference_output=item.reference_output or None,
        expected_tool_calls=None if item.expected_tool_calls is None else tuple(item.expected_tool_calls),
        expected_state=item.expected_state,
        metadata=item.metadata or {},
        source_trace_id=item.source_trace_id,
    )


def dataset_version_items(*, version: DatasetVersion) -> list[dataset_items.ItemData]:
    return [dataset_item_data(item) for item in dataset_item_list(version=version)]


def dataset_version_export(*, version: DatasetVersion, file_format: str) -> str:
    """The version's items as a JSONL or CSV file, in the shape an upload accepts."""
    items = dataset_version_items(version=version)
    if file_format == "jsonl":
        return dataset_items.items_to_jsonl(items)
    if file_format == "csv":
        return dataset_items.items_to_csv(items)
    raise exceptions.DatasetInvalid(
        f"format must be one of {', '.join(FORMATS)}", errors=[{"field": "format", "message": "must be jsonl or csv"}]
    )


# --- Evaluators, suites, runs, online rules -------------------------------------------------------------


def _scoped(queryset: QuerySet[M], agent_ids: AgentIds, *, field: str = "agent_id") -> QuerySet[M]:
    """A key limited to some agents sees their rows only, not the workspace-wide ones."""
    if agent_ids is None:
        return queryset
    return queryset.filter(**{f"{field}__in": agent_ids})


def evaluator_list(*, workspace: Workspace, agent_ids: AgentIds = None) -> list[Evaluator]:
    """The latest version of each evaluator, by name."""
    latest = Evaluator.objects.filter(workspace=workspace, name=OuterRef("name")).order_by("-version").values("pk")[:1]
    rows = _scoped(Evaluator.objects.filter(workspace=workspace), agent_ids).filter(pk=Subquery(latest))
    return list(rows.select_related("agent").order_by("name"))


def evaluator_versions(*, workspace: Workspace, name: str, agent_ids: AgentIds = None) -> list[Evaluator]:
    versions = list(
        _scoped(Evaluator.objects.filter(workspace=workspace, name=name), agent_ids)
        .select_related("agent")
        .order_by("-version")
    )
    if not versions:
        raise exceptions.EvaluatorNotFound(f"no evaluator named {name!r}")
    return versions


def evaluators_named(*, workspace: Workspace, names: Collection[str], agent_ids: AgentIds = None) -> list[Evaluator]:
    """The latest version of each named evaluator, in the order named; raises for an unknown name."""
    latest = {evaluator.name: evaluator for evaluator in evaluator_list(workspace=workspace, agent_ids=agent_ids)}
    missing = [name for name in names if name not in latest]
    if missing:
        raise exceptions.EvaluatorNotFound(
            f"no evaluator named {missing[0]!r}",
            errors=[{"field": "evaluators", "message": f"unknown: {', '.join(missing)}"}],
        )
    return [latest[name] for name in names]


def suite_list(*, workspace: Workspace, agent_ids: AgentIds = None) -> QuerySet[Suite]:
    return (
        _scoped(Suite.objects.filter(workspace=workspace), agent_ids)
        .select_related("agent", "dataset", "dataset_version", "prompt_version", "model_target")
        .prefetch_related("suite_evaluators__evaluator")
        .order_by("name")
    )


def suite_get(*, workspace: Workspace, name: str, agent_ids: AgentIds = None) -> Suite:
    suite = suite_list(workspace=workspace, agent_ids=agent_ids).filter(name=name).first()
    if suite is None:
        raise exceptions.SuiteNotFound(f"no suite named {name!r}")
    return suite


def suite_evaluators(*, suite: Suite) -> list[Evaluator]:
    """In order; from what `suite_list` prefetched when the suite came from it."""
    return [link.evaluator for link in suite.suite_evaluators.all()]


def _with_progress(runs: QuerySet[Run]) -> QuerySet[Run]:
    """Runs with their pending and running item counts (what `runs.run_progress` shows), in the same query."""
    return runs.annotate(
        pending_items=Count("items", filter=Q(items__status="pending")),
        running_items=Count("items", filter=Q(items__status="running")),
    )


def run_list(
    *,
    workspace: Workspace,
    agent_ids: AgentIds = None,
    suite: Suite | None = None,
    status: str | None = None,
    limit: int = 50,
    offset: int = 0,
) -> list[Run]:
    runs = _scoped(Run.objects.filter(workspace=workspace), agent_ids)
    if suite is not None:
        runs = runs.filter(suite=suite)
    if status:
        runs = runs.filter(status=status)
    return list(
        _with_progress(runs)
        .select_related("suite", "agent", "prompt_version__prompt", "dataset_version__dataset")
        .order_by("-created_at", "-pk")[offset : offset + limit]
    )


def run_get(*, workspace: Workspace, run_id: int, agent_ids: AgentIds = None) -> Run:
    run = (
        _with_progress(_scoped(Run.objects.filter(workspace=workspace, pk=run_id), agent_ids))
        .select_related("suite", "agent", "prompt_version__prompt", "dataset_version__dataset", "baseline")
        .first()
    )
    if run is None:
        raise exceptions.RunNotFound(f"no run {run_id}")
    return run


def run_items(*, run: Run, offset: int = 0, limit: int = 100, status: str | None = None) -> list[RunItem]:
    """A page of the run's items with their samples and scores (three queries)."""
    items = RunItem.objects.filter(run=run)
    if status:
        items = items.filter(status=status)
    return list(
        items.order_by("position").prefetch_related(
            Prefetch("samples", queryset=RunSample.objects.order_by("sample").prefetch_related("scores"))
        )[offset : offset + limit]
    )


def run_item_get(*, run: Run, position: int) -> RunItem:
    item = (
        RunItem.objects.filter(run=run, position=position)
        .prefetch_related(Prefetch("samples", queryset=RunSample.objects.order_by("sample").prefetch_related("scores")))
        .first()
    )
    if item is None:
        raise exceptions.RunNotFound(f"run {run.pk} has no item {position}")
    return item


def online_rule_list(*, workspace: Workspace, agent_ids: AgentIds = None) -> QuerySet[OnlineRule]:
    return (
        _scoped(OnlineRule.objects.filter(workspace=workspace), agent_ids)
        .select_related("agent")
        .prefetch_related("evaluators")
        .order_by("name")
    )


def online_rule_get(*, workspace: Workspace, name: str, agent_ids: AgentIds = None) -> OnlineRule:
    rule = online_rule_list(workspace=workspace, agent_ids=agent_ids).filter(name=name).first()
    if rule is None:
        raise exceptions.OnlineRuleNotFound(f"no online rule named {name!r}")
    return rule


def regression_list(
    *,
    workspace: Workspace,
    agent_ids: AgentIds = None,
    run: Run | None = None,
    suite: Suite | None = None,
    limit: int = 50,
) -> list[RegressionAlert]:
    """Regression alerts, newest first; of one run (as candidate or baseline) or one suite when given."""
    alerts = _scoped(RegressionAlert.objects.filter(workspace=workspace), agent_ids)
    if run is not None:
        alerts = alerts.filter(Q(candidate_run=run) | Q(baseline_run=run))
    if suite is not None:
        alerts = alerts.filter(suite=suite)
    return list(
        alerts.select_related("suite", "agent", "baseline_run", "candidate_run").order_by("-created_at")[:limit]
    )


def metric_history(*, suite: Suite, evaluator: str, limit: int = 60) -> list[dict[str, Any]]:
    """The suite's completed runs, oldest first, with the evaluator's mean, interval, pass@1 and worst
    group: the points of its chart over time, each labelled with its prompt version."""
    points = []
    runs = (
        Run.objects.filter(suite=suite, status=RunStatus.COMPLETED)
        .select_related("prompt_version")
        .order_by("-finished_at")[:limit]
    )
    for run in reversed(list(runs)):
        report = (run.report or {}).get(evaluator)
        if not report:
            continue
        overall = report.get("overall") or {}
        points.append(
            {
                "run": run.pk,
                "finished_at": run.finished_at,
                "prompt_version": run.prompt_version.version if run.prompt_version else None,
                "mean": overall.get("mean"),
                "ci": overall.get("ci"),
                "pass_at_k": overall.get("pass_at_k"),
                "worst_group": report.get("worst_group"),
            }
        )
    return points


@dataclass(frozen=True)
class EvaluatorCalibration:
    """An evaluator against people on the same trajectories (see `evaluator_calibration`)."""

    name: str
    calibration: judges.Calibration
    skipped: int  # human scores outside 0..1, which cannot be compared with an evaluator's


def evaluator_calibration(*, workspace: Workspace, name: str, threshold: float = 0.5) -> EvaluatorCalibration:
    """How the evaluator `name` agrees with people: every trajectory that has both a human score named
    `name` (numeric in 0..1, or boolean) and the evaluator's score, from an online rule (a score on the
    trajectory) or from a run (the sample's trajectory). A trajectory scored several times by either side
    counts once, with the mean of each side's scores."""
    human: dict[str, list[float]] = {}
    skipped = 0
    for trace_id, value in Score.objects.filter(
        workspace=workspace, name=name, source=ScoreSource.HUMAN, value__isnull=False
    ).values_list("trajectory__trace_id", "value"):
        if value is not None and 0.0 <= value <= 1.0:
            human.setdefault(trace_id, []).append(value)
        else:
            skipped += 1
    machine: dict[str, list[float]] = {}
    for trace_id, value in Score.objects.filter(
        workspace=workspace,
        name=name,
        source=ScoreSource.EVALUATOR,
        value__isnull=False,
        trajectory__trace_id__in=list(human),
    ).values_list("trajectory__trace_id", "value"):
        if value is not None:
            machine.setdefault(trace_id, []).append(value)
    for trace_id, value in RunScore.objects.filter(
        sample__item__run__workspace=workspace,
        evaluator_name=name,
        score__isnull=False,
        sample__trace_id__in=list(human),
    ).values_list("sample__trace_id", "score"):
        if value is not None:
            machine.setdefault(trace_id, []).append(value)
    both = sorted(set(human) & set(machine))
    return EvaluatorCalibration(
        name=name,
        calibration=judges.judge_calibration(
            [sum(machine[t]) / len(machine[t]) for t in both],
            [sum(human[t]) / len(human[t]) for t in both],
            threshold=threshold,
        ),
        skipped=skipped,
    )
