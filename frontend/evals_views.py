"""Evals pages: suites (with their schedule, last run and the proposal from each agent's evaluation
commitment), a suite's metrics over time per prompt version, runs with live progress and their report
(pass@k, majority@k, subgroup tables with the worst group, items down to each sample's trajectory), two
runs side by side, online rules with their scores and backfills, and regression alerts. Also the
"Add to dataset" action of the step-through view and of the review queue. Viewers read; members create,
edit, run, cancel, resume, propose, backfill and add to datasets."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from django.contrib import messages
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import transaction
from django.http import HttpResponse, JsonResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from agent_registry import selectors as registry_selectors
from agent_registry.models import Agent, Membership, PromptVersion, Workspace
from config.errors import KeelError
from evals import exceptions, online, runs, schedules, selectors, services, tasks
from evals.models import RUN_ACTIVE, DatasetVersion, RegressionAlert, Run, RunItem, RunStatus, RunTrigger, Suite
from frontend import review
from frontend.access import HtmxHttpRequest, workspace_view
from frontend.evals_forms import (
    BackfillForm,
    CompareForm,
    DatasetAddForm,
    OnlineRuleForm,
    ProposeForm,
    SuiteForm,
)
from frontend.views import _keel_errors_to_form, _render, _trajectory_page
from routing import reports as routing_reports
from tracing import selectors as tracing_selectors
from tracing import triage
from tracing.models import Trajectory

RECENT_RUNS: Final = 10
RUNS_SHOWN: Final = 100
ITEMS_PER_PAGE: Final = 20
COMPARE_ITEMS_PER_PAGE: Final = 50
ITEM_ERROR_KINDS_SHOWN: Final = 3
PASS_KS: Final = ("1", "4", "16")


# --- Reading reports ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Headline:
    evaluator: str
    mean: float | None
    pass_at_1: float | None


def _headline(run: Run | None) -> Headline | None:
    """The first evaluator's mean and pass@1: what a list shows of a finished run."""
    if run is None or not run.evaluators:
        return None
    name = str(run.evaluators[0]["name"])
    overall = ((run.report or {}).get(name) or {}).get("overall") or {}
    return Headline(name, overall.get("mean"), (overall.get("pass_at_k") or {}).get("1"))


@dataclass(frozen=True)
class GroupRow:
    name: str
    data: dict[str, Any]
    worst: bool


@dataclass(frozen=True)
class SubgroupView:
    tag_key: str
    worst: dict[str, Any] | None
    untagged: int
    min_group_size: int
    groups: list[GroupRow]


@dataclass(frozen=True)
class EvaluatorReport:
    name: str
    version: Any
    type: str
    overall: dict[str, Any]
    pass_at_k: list[tuple[str, Any, Any, Any]]  # (k, value, items, interval)
    majority_at_k: list[tuple[str, Any, Any]]  # (k, value, items)
    worst_metric: str
    subgroups: list[SubgroupView]


def _evaluator_reports(run: Run) -> list[EvaluatorReport]:
    reports = []
    for snapshot in run.evaluators:
        name = str(snapshot["name"])
        report = (run.report or {}).get(name)
        if not report:
            continue
        overall = report.get("overall") or {}
        worst_groups = report.get("worst_groups") or {}
        tables = []
        for key, table in sorted((report.get("subgroups") or {}).items()):
            worst = worst_groups.get(key)
            tables.append(
                SubgroupView(
                    tag_key=key,
                    worst=worst,
                    untagged=int(table.get("untagged") or 0),
                    min_group_size=int(table.get("min_group_size") or 0),
                    groups=[
                        GroupRow(str(group["name"]), group, worst is not None and worst.get("name") == group["name"])
                        for group in table.get("groups") or []
                    ],
                )
            )
        reports.append(
            EvaluatorReport(
                name=name,
                version=report.get("evaluator_version", snapshot.get("version")),
                type=str(snapshot.get("type", "")),
                overall=overall,
                pass_at_k=[
                    (k, overall["pass_at_k"][k], (overall.get("pass_at_k_items") or {}).get(k), ci)
                    for k in PASS_KS
                    if k in (overall.get("pass_at_k") or {})
                    for ci in [(overall.get("pass_at_k_ci") or {}).get(k)]
                ],
                majority_at_k=[
                    (k, value, (overall.get("majority_at_k_items") or {}).get(k))
                    for k, value in sorted((overall.get("majority_at_k") or {}).items(), key=lambda pair: int(pair[0]))
                ],
                worst_metric=str(report.get("worst_metric") or "mean"),
                subgroups=tables,
            )
        )
    return reports


def _run_alerts(workspace: Workspace, run: Run) -> list[RegressionAlert]:
    return selectors.regression_list(workspace=workspace, run=run)


def _previous_completed(workspace: Workspace, run: Run) -> Run | None:
    """The run to compare with: its baseline, else the suite's last completed run before it."""
    if run.baseline_id is not None:
        return run.baseline
    if run.suite is None:
        return None
    earlier = [
        candidate
        for candidate in selectors.run_list(workspace=workspace, suite=run.suite, status=RunStatus.COMPLETED)
        if candidate.pk < run.pk
    ]
    return earlier[0] if earlier else None


def _progress(run: Run) -> dict[str, Any]:
    progress = runs.run_progress(run=run)
    finished = int(progress["done"]) + int(progress["errored"])
    total = int(progress["items"]) or 0
    return {
        **progress,
        "finished": finished,
        "percent": round(100 * finished / total, 1) if total else (100.0 if not run.is_active else 0.0),
        "active": run.is_active,
        # A paused run waits for its pause or a person: the page polls only a run a worker moves on.
        "polling": run.status in (RunStatus.QUEUED, RunStatus.RUNNING),
        "status_label": RunStatus(run.status).label,
    }


# --- The overview: suites, proposals, regressions -----------------------------------------------------


@dataclass(frozen=True)
class SuiteRow:
    suite: Suite
    evaluators: list[Any]
    next_run: datetime | None
    last_run: Run | None
    last_completed: Run | None
    headline: Headline | None


def _next_run(suite: Suite) -> datetime | None:
    if not suite.schedule_enabled or not suite.schedule_cron or schedules.cron_error(suite.schedule_cron):
        return None
    return schedules.slot_next(suite.schedule_cron, timezone.now())


def _suite_rows(workspace: Workspace) -> list[SuiteRow]:
    rows = []
    for suite in selectors.suite_list(workspace=workspace):
        recent = selectors.run_list(workspace=workspace, suite=suite, limit=1)
        completed = selectors.run_list(workspace=workspace, suite=suite, status=RunStatus.COMPLETED, limit=1)
        last_completed = completed[0] if completed else None
        rows.append(
            SuiteRow(
                suite=suite,
                evaluators=[link.evaluator for link in suite.suite_evaluators.all()],
                next_run=_next_run(suite),
                last_run=recent[0] if recent else None,
                last_completed=last_completed,
                headline=_headline(last_completed),
            )
        )
    return rows


@workspace_view()
@require_GET
def eval_overview_view(request: HtmxHttpRequest, membership: Membership) -> HttpResponse:
    workspace = membership.workspace
    agents = list(registry_selectors.agent_list(workspace=workspace))
    return _render(
        request,
        membership,
        "frontend/evals/overview.html",
        {
            "rows": _suite_rows(workspace),
            "regressions": selectors.regression_list(workspace=workspace, limit=20),
            "recent_runs": selectors.run_list(workspace=workspace, limit=RECENT_RUNS),
            "agents": agents,
            "datasets": list(selectors.dataset_list(workspace=workspace)),
        },
    )


@workspace_view()
@require_POST
def eval_suites_propose_view(request: HtmxHttpRequest, membership: Membership) -> HttpResponse:
    workspace = membership.workspace
    form = ProposeForm(request.POST, agents=list(registry_selectors.agent_list(workspace=workspace)))
    if not form.is_valid():
        messages.error(request, "Nothing was proposed: choose one of the workspace's agents.")
        return redirect("frontend:eval_overview", workspace_slug=workspace.slug)
    agent = form.agent_chosen()
    try:
        proposal = services.suites_propose(agent=agent, created_by=membership.user)
    except exceptions.SuiteInvalid as error:
        messages.error(request, f"Nothing was proposed for {agent.name}: {error.detail}.")
    else:
        made = [suite.name for suite in proposal.suites] + [rule.name for rule in proposal.rules]
        if made:
            messages.success(
                request, f"Proposed from {agent.name}'s evaluation commitment: {', '.join(made)}. Review and edit them."
            )
        else:
            messages.info(request, f"{agent.name}'s commitment proposes nothing new: its suites and rules exist.")
    return redirect("frontend:eval_overview", workspace_slug=workspace.slug)


# --- Creating and editing a suite ---------------------------------------------------------------------


def _prompt_versions(workspace: Workspace) -> list[PromptVersion]:
    versions: list[PromptVersion] = []
    for prompt in registry_selectors.prompt_list(workspace=workspace):
        for version in registry_selectors.prompt_version_list(prompt=prompt):
            version.prompt = prompt
            versions.append(version)
    return versions


def _suite_form(membership: Membership, data: Any = None, suite: Suite | None = None) -> SuiteForm:
    workspace = membership.workspace
    return SuiteForm(
        data,
        agents=list(registry_selectors.agent_list(workspace=workspace)),
        datasets=list(selectors.dataset_list(workspace=workspace)),
        prompt_versions=_prompt_versions(workspace),
        model_targets=list(routing_reports.model_target_list(workspace=workspace)),
        evaluators=selectors.evaluator_list(workspace=workspace),
        suite=suite,
    )


def _suite_form_page(
    request: HtmxHttpRequest, membership: Membership, form: SuiteForm, suite: Suite | None, status: int = 200
) -> HttpResponse:
    return _render(request, membership, "frontend/evals/suite_form.html", {"form": form, "suite": suite}, status=status)


@workspace_view()
@require_http_methods(["GET", "POST"])
def eval_suite_create_view(request: HtmxHttpRequest, membership: Membership) -> HttpResponse:
    if request.method == "GET":
        initial = {"agent": request.GET.get("agent", "")}
        form = _suite_form(membership)
        form.initial.update(initial)
        return _suite_form_page(request, membership, form, None)
    form = _suite_form(membership, request.POST)
    if form.is_valid():
        try:
            suite = services.suite_create(
                workspace=membership.workspace,
                name=form.cleaned_data["name"],
                agent=form.agent_chosen(),
                evaluators_used=form.chosen_evaluators(),
                created_by=membership.user,
                **form.suite_fields(),
            )
        except (exceptions.SuiteInvalid, exceptions.SuiteExists) as error:
            _keel_errors_to_form(form, error, {})
        else:
            messages.success(request, f"Created the suite {suite.name}.")
            return redirect("frontend:eval_suite_detail", workspace_slug=membership.workspace.slug, name=suite.name)
    return _suite_form_page(request, membership, form, None, status=422)


@workspace_view()
@require_http_methods(["GET", "POST"])
def eval_suite_edit_view(request: HtmxHttpRequest, membership: Membership, name: str) -> HttpResponse:
    suite = selectors.suite_get(workspace=membership.workspace, name=name)
    if request.method == "GET":
        return _suite_form_page(request, membership, _suite_form(membership, suite=suite), suite)
    form = _suite_form(membership, request.POST, suite=suite)
    if form.is_valid():
        try:
            services.suite_update(suite=suite, evaluators_used=form.chosen_evaluators(), **form.suite_fields())
        except exceptions.SuiteInvalid as error:
            _keel_errors_to_form(form, error, {})
        else:
            messages.success(request, f"Saved the suite {suite.name}.")
            return redirect("frontend:eval_suite_detail", workspace_slug=membership.workspace.slug, name=suite.name)
    return _suite_form_page(request, membership, form, suite, status=422)


@workspace_view()
@require_POST
def eval_suite_run_view(request: HtmxHttpRequest, membership: Membership, name: str) -> HttpResponse:
    suite = selectors.suite_get(workspace=membership.workspace, name=name)
    try:
        run = runs.run_create(suite=suite, trigger=RunTrigger.MANUAL, created_by=membership.user)
    except runs.RunNotStartable as error:
        problems = error.extra.get("errors") or []
        detail = "; ".join(str(problem.get("message")) for problem in problems) or error.detail
        messages.error(request, f"The suite {suite.name} cannot run: {detail}.")
        return redirect("frontend:eval_suite_detail", workspace_slug=membership.workspace.slug, name=suite.name)
    messages.success(request, f"Started run #{run.pk} of {suite.name} ({run.item_count} items, k = {run.samples}).")
    return redirect("frontend:eval_run_detail", workspace_slug=membership.workspace.slug, run_id=run.pk)


# --- A suite: metrics over time -----------------------------------------------------------------------


@dataclass
class MetricChart:
    evaluator: str
    version: int
    points: list[dict[str, Any]]
    data: dict[str, Any] = field(default_factory=dict)


def _chart_data(points: list[dict[str, Any]]) -> dict[str, Any]:
    """uPlot columns: one series per prompt version (its runs' means, gaps elsewhere) and the worst group."""
    versions = sorted({point["prompt_version"] for point in points}, key=lambda v: (v is None, v or 0))
    return {
        "x": [int(point["finished_at"].timestamp()) if point["finished_at"] else 0 for point in points],
        "runs": [point["run"] for point in points],
        "series": [
            {
                "label": f"prompt v{version}" if version is not None else "no prompt version",
                "values": [point["mean"] if point["prompt_version"] == version else None for point in points],
            }
            for version in versions
        ],
        "worst": [(point["worst_group"] or {}).get("value") for point in points],
        "worst_names": [
            f"{worst['tag_key']}={worst['name']}" if (worst := point["worst_group"]) else None for point in points
        ],
    }


@workspace_view()
@require_GET
def eval_suite_detail_view(request: HtmxHttpRequest, membership: Membership, name: str) -> HttpResponse:
    workspace = membership.workspace
    suite = selectors.suite_get(workspace=workspace, name=name)
    charts = []
    for evaluator in selectors.suite_evaluators(suite=suite):
        points = selectors.metric_history(suite=suite, evaluator=evaluator.name)
        charts.append(MetricChart(evaluator.name, evaluator.version, points, _chart_data(points)))
    return _render(
        request,
        membership,
        "frontend/evals/suite_detail.html",
        {
            "suite": suite,
            "evaluators": [link.evaluator for link in suite.suite_evaluators.all()],
            "next_run": _next_run(suite),
            "charts": charts,
            "chart_data": {"charts": [chart.data for chart in charts]},
            "runs": selectors.run_list(workspace=workspace, suite=suite, limit=RUNS_SHOWN),
            "regressions": selectors.regression_list(workspace=workspace, suite=suite),
        },
    )


# --- Runs ---------------------------------------------------------------------------------------------


@workspace_view()
@require_GET
def eval_run_list_view(request: HtmxHttpRequest, membership: Membership) -> HttpResponse:
    status = request.GET.get("status") if request.GET.get("status") in RunStatus.values else None
    return _render(
        request,
        membership,
        "frontend/evals/runs.html",
        {
            "runs": selectors.run_list(workspace=membership.workspace, status=status, limit=RUNS_SHOWN),
            "status": status or "",
            "status_choices": RunStatus.choices,
            "shown_limit": RUNS_SHOWN,
        },
    )


def _int(raw: str | None, default: int) -> int:
    try:
        return int(raw or "")
    except ValueError:
        return default


def _item_input(item: RunItem) -> str:
    """What the item asks: its task, else its last user message."""
    return runs.item_input_text(task=item.task, input_messages=item.input_messages)


@dataclass(frozen=True)
class ItemView:
    item: RunItem
    input_text: str
    tags: dict[str, Any]


@workspace_view()
@require_GET
def eval_run_detail_view(request: HtmxHttpRequest, membership: Membership, run_id: int) -> HttpResponse:
    workspace = membership.workspace
    run = selectors.run_get(workspace=workspace, run_id=run_id)
    pages = max(1, math.ceil(run.item_count / ITEMS_PER_PAGE))
    position = request.GET.get("item")
    if position is not None:
        items = [selectors.run_item_get(run=run, position=_int(position, -1))]
        page = 1
    else:
        page = min(max(1, _int(request.GET.get("page"), 1)), pages)
        items = selectors.run_items(run=run, offset=(page - 1) * ITEMS_PER_PAGE, limit=ITEMS_PER_PAGE)
    tags_of = {item.pk: (item.metadata or {}).get("tags") or {} for item in items}
    return _render(
        request,
        membership,
        "frontend/evals/run_detail.html",
        {
            "run": run,
            "progress": _progress(run),
            "reports": _evaluator_reports(run),
            "items": [ItemView(item, _item_input(item), tags_of[item.pk]) for item in items],
            "item_filter": position is not None,
            "page": page,
            "pages": pages,
            "page_numbers": range(1, pages + 1),
            "alerts": _run_alerts(workspace, run),
            # The kinds of item error, most common first (one query, only when some item errored).
            "item_errors": runs.item_errors(run=run)[:ITEM_ERROR_KINDS_SHOWN] if run.items_errored else [],
            "compare_with": _previous_completed(workspace, run),
            "can_cancel": run.status in RUN_ACTIVE,
        },
    )


@workspace_view()
@require_GET
def eval_run_progress_view(request: HtmxHttpRequest, membership: Membership, run_id: int) -> HttpResponse:
    """The run's progress as JSON, which the run page polls while the run is active."""
    run = selectors.run_get(workspace=membership.workspace, run_id=run_id)
    return JsonResponse(_progress(run))


@workspace_view()
@require_POST
def eval_run_cancel_view(request: HtmxHttpRequest, membership: Membership, run_id: int) -> HttpResponse:
    run = selectors.run_get(workspace=membership.workspace, run_id=run_id)
    if not run.is_active:
        messages.error(request, f"Run #{run.pk} is {run.get_status_display().lower()}: there is nothing to cancel.")
    else:
        runs.run_cancel(run=run)
        messages.success(request, f"Cancelled run #{run.pk}; the items it finished keep their scores.")
    return redirect("frontend:eval_run_detail", workspace_slug=membership.workspace.slug, run_id=run.pk)


@workspace_view()
@require_POST
def eval_run_resume_view(request: HtmxHttpRequest, membership: Membership, run_id: int) -> HttpResponse:
    run = selectors.run_get(workspace=membership.workspace, run_id=run_id)
    try:
        runs.run_resume(run=run)
    except runs.RunNotStartable as error:
        messages.error(request, f"Not resumed: {error.detail}.")
    else:
        messages.success(request, f"Resumed run #{run.pk}.")
    return redirect("frontend:eval_run_detail", workspace_slug=membership.workspace.slug, run_id=run.pk)


# --- Two runs side by side ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ItemDelta:
    """One item of either run, matched on its key; a side's position is None where that run lacks it."""

    key: str
    presence: str  # "both", "baseline_only", "candidate_only"
    position_a: int | None
    position_b: int | None
    input_text: str
    a: float | None
    b: float | None

    @property
    def delta(self) -> float | None:
        return None if self.a is None or self.b is None else self.b - self.a


@dataclass(frozen=True)
class MetricComparison:
    name: str
    comparison: dict[str, Any]
    items: list[ItemDelta]


@dataclass(frozen=True)
class ItemsPage:
    """Which page of the compared items the page shows; the counts are over every item."""

    number: int
    pages: int
    total: int
    first: int  # 1-based, for "items 51-100 of 13,000"
    last: int

    @property
    def previous(self) -> int | None:
        return self.number - 1 if self.number > 1 else None

    @property
    def next(self) -> int | None:
        return self.number + 1 if self.number < self.pages else None


def _comparisons(
    baseline: Run, candidate: Run, page_asked: int
) -> tuple[dict[str, Any], list[MetricComparison], ItemsPage]:
    """The comparison over every item, and one page of the items (`COMPARE_ITEMS_PER_PAGE`): a run of
    100,000 items reads and renders 50 rows, whichever page."""
    result = runs.runs_compare(baseline=baseline, candidate=candidate)
    total = result["items_in_both"] + result["items_only_in_baseline"] + result["items_only_in_candidate"]
    pages = max(1, math.ceil(total / COMPARE_ITEMS_PER_PAGE))
    number = min(max(1, page_asked), pages)
    offset = (number - 1) * COMPARE_ITEMS_PER_PAGE
    rows = runs.runs_compare_items(
        baseline=baseline,
        candidate=candidate,
        evaluators_named=list(result["metrics"]),
        offset=offset,
        limit=COMPARE_ITEMS_PER_PAGE,
    )
    metrics = [
        MetricComparison(
            name,
            comparison,
            [
                ItemDelta(
                    row["key"],
                    row["presence"],
                    row["baseline_position"],
                    row["candidate_position"],
                    row["input_text"],
                    row["scores"][name]["baseline"],
                    row["scores"][name]["candidate"],
                )
                for row in rows
            ],
        )
        for name, comparison in result["metrics"].items()
    ]
    page = ItemsPage(number, pages, total, offset + 1 if rows else 0, offset + len(rows))
    return result, metrics, page


@workspace_view()
@require_GET
def eval_run_compare_view(request: HtmxHttpRequest, membership: Membership) -> HttpResponse:
    workspace = membership.workspace
    finished = selectors.run_list(workspace=workspace, status=RunStatus.COMPLETED, limit=RUNS_SHOWN)
    chosen: dict[str, Run] = {}
    for key in ("a", "b"):
        raw = request.GET.get(key)
        if raw:
            # A run named in the URL is looked up in the workspace: another workspace's is a 404.
            chosen[key] = selectors.run_get(workspace=workspace, run_id=_int(raw, 0))
    if "b" not in chosen and finished:
        chosen["b"] = finished[0]
    if "a" not in chosen and "b" in chosen:
        previous = _previous_completed(workspace, chosen["b"])
        if previous is not None:
            chosen["a"] = previous
    choices = {run.pk: run for run in [*chosen.values(), *finished]}
    form = CompareForm(
        {key: str(run.pk) for key, run in chosen.items()}, runs=sorted(choices.values(), key=lambda r: -r.pk)
    )
    result: dict[str, Any] | None = None
    metrics: list[MetricComparison] = []
    items_page: ItemsPage | None = None
    if len(chosen) == 2 and form.is_valid():
        result, metrics, items_page = _comparisons(chosen["a"], chosen["b"], _int(request.GET.get("page"), 1))
    return _render(
        request,
        membership,
        "frontend/evals/compare.html",
        {
            "form": form,
            "run_a": chosen.get("a"),
            "run_b": chosen.get("b"),
            "result": result,
            "metrics": metrics,
            "items_page": items_page,
            "failed": [
                run for run in (chosen.get("a"), chosen.get("b")) if run is not None and run.status == RunStatus.FAILED
            ],
        },
    )


# --- Online rules -------------------------------------------------------------------------------------


def _rule_errors(form: OnlineRuleForm | BackfillForm, error: KeelError) -> None:
    for problem in error.extra.get("errors") or [{"field": "", "message": error.detail}]:
        # The service names a filter's key as "filter.<key>": the form has one filter field.
        name = str(problem.get("field", "")).split(".")[0]
        form.add_error(name if name in form.fields else None, f"{problem.get('field')}: {problem.get('message')}")


def _rule_form(membership: Membership, data: Any = None, rule: Any = None) -> OnlineRuleForm:
    workspace = membership.workspace
    return OnlineRuleForm(
        data,
        agents=list(registry_selectors.agent_list(workspace=workspace)),
        evaluators=selectors.evaluator_list(workspace=workspace),
        rule=rule,
    )


@workspace_view()
@require_http_methods(["GET", "POST"])
def eval_online_rule_list_view(request: HtmxHttpRequest, membership: Membership) -> HttpResponse:
    workspace = membership.workspace
    form = _rule_form(membership, request.POST if request.method == "POST" else None)
    if form.is_bound and form.is_valid():
        agent: Agent = form.agents[form.cleaned_data["agent"]]
        try:
            rule = online.online_rule_create(
                agent=agent, name=form.cleaned_data["name"], created_by=membership.user, **form.rule_fields()
            )
        except exceptions.OnlineRuleInvalid as error:
            _rule_errors(form, error)
        else:
            messages.success(request, f"Created the online rule {rule.name}.")
            return redirect("frontend:eval_online_rule_list", workspace_slug=workspace.slug)
    rules = list(selectors.online_rule_list(workspace=workspace))
    return _render(
        request,
        membership,
        "frontend/evals/online_rules.html",
        {"rows": [(rule, online.rule_summary(rule=rule)) for rule in rules], "form": form},
        status=422 if form.errors else 200,
    )


def _rule_page(
    request: HtmxHttpRequest,
    membership: Membership,
    rule: Any,
    *,
    form: OnlineRuleForm | None = None,
    backfill_form: BackfillForm | None = None,
    status: int = 200,
) -> HttpResponse:
    now = timezone.now()
    return _render(
        request,
        membership,
        "frontend/evals/online_rule.html",
        {
            "rule": rule,
            "summary": online.rule_summary(rule=rule),
            "recent": list(rule.evaluations.order_by("-trajectory_ended_at")[:20]),
            "form": form or _rule_form(membership, rule=rule),
            "backfill_form": backfill_form
            or BackfillForm(
                initial={
                    "start": (now - online.FIRST_LOOKBACK * 24).strftime("%Y-%m-%dT%H:%M"),
                    "end": now.strftime("%Y-%m-%dT%H:%M"),
                }
            ),
        },
        status=status,
    )


@workspace_view()
@require_http_methods(["GET", "POST"])
def eval_online_rule_edit_view(request: HtmxHttpRequest, membership: Membership, name: str) -> HttpResponse:
    rule = selectors.online_rule_get(workspace=membership.workspace, name=name)
    if request.method == "GET":
        return _rule_page(request, membership, rule)
    form = _rule_form(membership, request.POST, rule=rule)
    if form.is_valid():
        try:
            online.online_rule_update(rule=rule, **form.rule_fields())
        except exceptions.OnlineRuleInvalid as error:
            _rule_errors(form, error)
        else:
            messages.success(request, f"Saved the online rule {rule.name}.")
            return redirect("frontend:eval_online_rule_edit", workspace_slug=membership.workspace.slug, name=rule.name)
    rule = selectors.online_rule_get(workspace=membership.workspace, name=name)
    return _rule_page(request, membership, rule, form=form, status=422)


@workspace_view()
@require_POST
def eval_online_rule_backfill_view(request: HtmxHttpRequest, membership: Membership, name: str) -> HttpResponse:
    rule = selectors.online_rule_get(workspace=membership.workspace, name=name)
    form = BackfillForm(request.POST)
    if not form.is_valid():
        return _rule_page(request, membership, rule, backfill_form=form, status=422)
    rule_id = rule.pk
    start, end = form.cleaned_data["start"].isoformat(), form.cleaned_data["end"].isoformat()
    transaction.on_commit(lambda: tasks.online_rule_backfill.delay(rule_id, start, end))
    messages.success(
        request,
        f"Backfilling {rule.name} from {form.cleaned_data['start']:%Y-%m-%d %H:%M} to "
        f"{form.cleaned_data['end']:%Y-%m-%d %H:%M} UTC; trajectories already scored are skipped.",
    )
    return redirect("frontend:eval_online_rule_edit", workspace_slug=membership.workspace.slug, name=rule.name)


# --- Adding a trajectory to a dataset -----------------------------------------------------------------


def dataset_add_form(workspace: Workspace, data: Any = None) -> DatasetAddForm:
    return DatasetAddForm(data, datasets=list(selectors.dataset_list(workspace=workspace)))


def _dataset_add(membership: Membership, trajectory: Trajectory, form: DatasetAddForm) -> DatasetVersion | None:
    """Add the trajectory to the chosen dataset, or to a new one made for it; None, with the reasons on the
    form, when it cannot be (a new dataset made on the way is then not kept)."""
    try:
        with transaction.atomic():
            dataset = form.dataset_chosen() or services.dataset_create(
                workspace=membership.workspace,
                name=form.cleaned_data["new_name"],
                agent=trajectory.agent,
                created_by=membership.user,
            )
            return services.dataset_add_trajectories(
                dataset=dataset,
                trace_ids=[trajectory.trace_id],
                message=f"added trajectory {trajectory.trace_id} from the dashboard",
                created_by=membership.user,
            )
    except exceptions.DatasetExists as error:
        form.add_error("new_name", f"{error.detail}; choose it above instead.")
    except exceptions.DatasetTrajectoriesPresent as error:
        form.add_error("dataset", error.detail)
    except (exceptions.TrajectoryNotUsable, exceptions.DatasetInvalid, exceptions.DatasetItemsInvalid) as error:
        form.add_error(None, error.detail)
    except DjangoValidationError as error:
        form.add_error("new_name", "; ".join(error.messages))
    return None


def _added_message(request: HtmxHttpRequest, version: DatasetVersion) -> None:
    messages.success(
        request,
        f"Added the trajectory to the dataset {version.dataset.name}: version {version.version} "
        f"has {version.item_count} item{'s' if version.item_count != 1 else ''}.",
    )


@workspace_view()
@require_POST
def trajectory_dataset_add_view(request: HtmxHttpRequest, membership: Membership, trace_id: str) -> HttpResponse:
    trajectory = tracing_selectors.trajectory_get(workspace=membership.workspace, trace_id=trace_id)
    form = dataset_add_form(membership.workspace, request.POST)
    if form.is_valid() and (version := _dataset_add(membership, trajectory, form)) is not None:
        _added_message(request, version)
        return redirect(
            reverse("frontend:trajectory_detail", args=[membership.workspace.slug, trajectory.trace_id]) + "#dataset"
        )
    return _trajectory_page(request, membership, trajectory, dataset_form=form, status=422)


@workspace_view()
@require_POST
def review_dataset_add_view(
    request: HtmxHttpRequest, membership: Membership, sample_id: int, position: int
) -> HttpResponse:
    """From a row of a review queue (or its item page, `back=item`): the row's trajectory, never one named
    by the client."""
    sample = triage.review_sample_get(workspace=membership.workspace, sample_id=sample_id)
    item = triage.review_item_get(sample=sample, position=position)
    form = dataset_add_form(membership.workspace, request.POST)
    if form.is_valid() and (version := _dataset_add(membership, item.trajectory, form)) is not None:
        _added_message(request, version)
        slug = membership.workspace.slug
        if request.POST.get("back") == "item":
            return redirect("frontend:review_item", workspace_slug=slug, sample_id=sample.pk, position=position)
        return redirect(reverse("frontend:review_sample", args=[slug, sample.pk]) + f"#item-{position}")
    return review.sample_page(request, membership, sample, dataset_form=form, dataset_position=position, status=422)
