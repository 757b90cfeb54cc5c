"""The evals REST API for evaluators, suites, runs, comparisons, online rules and regression alerts.

Reads need `read`, writes `write`. A key limited to some agents sees and changes only those agents'
rows. Starting a run answers 202 at once; the run executes in a worker, and `GET /runs/{id}` shows its
progress and, once done, its report. `Idempotency-Key` on a run start returns the run made the first time.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from ninja import Field, Query, Router, Schema, Status

from agent_registry import selectors as registry_selectors
from agent_registry.auth import key_auth, request_agent_ids, request_api_key, request_workspace
from agent_registry.models import Agent, PromptVersion, Scope
from agent_registry.schemas import error_responses
from config.errors import NotFound, PermissionDenied, Unavailable, ValidationFailed
from config.schemas import PatchSchema
from evals import evaluators, gym, interchange, online, runs, selectors, services
from evals.models import (
    DATASET_NAME_PATTERN,
    EVALUATOR_NAME_PATTERN,
    Evaluator,
    OnlineRule,
    RegressionAlert,
    Run,
    RunItem,
    RunStatus,
    RunTrigger,
    Suite,
)
from routing.models import ModelTarget

router = Router(tags=["eval suites"])

READ = key_auth(Scope.READ)
WRITE = key_auth(Scope.WRITE)
ERRORS = error_responses(409, 503)


# --- Schemas --------------------------------------------------------------------------------------------


class EvaluatorIn(Schema):
    name: str = Field(pattern=EVALUATOR_NAME_PATTERN, max_length=64)
    config: dict[str, Any]
    description: str = ""
    agent: str | None = None


class EvaluatorVersionIn(Schema):
    config: dict[str, Any]
    description: str = ""


class EvaluatorOut(Schema):
    name: str
    version: int
    type: str
    config: dict[str, Any]
    description: str
    agent: str | None
    created_at: datetime


class SuiteIn(Schema):
    name: str = Field(pattern=DATASET_NAME_PATTERN, max_length=200)
    agent: str | None = None
    description: str = ""
    dataset: str | None = None
    dataset_version: int | None = None
    target: Literal["agent", "model_target", "recorded"] = "agent"
    prompt_label: str = "production"
    prompt_version: int | None = None
    tier: str = ""
    model_target: str | None = None
    variables: dict[str, Any] = Field(default_factory=dict)
    evaluators: list[str] = Field(default_factory=list, max_length=50)
    samples: int = Field(default=1, ge=1, le=64)
    concurrency: int = Field(default=4, ge=1, le=64)
    schedule_cron: str = ""
    schedule_enabled: bool = False


class SuitePatch(PatchSchema):
    description: str | None = None
    dataset: str | None = None
    dataset_version: int | None = None
    target: Literal["agent", "model_target", "recorded"] | None = None
    prompt_label: str | None = None
    prompt_version: int | None = None
    tier: str | None = None
    model_target: str | None = None
    variables: dict[str, Any] | None = None
    evaluators: list[str] | None = Field(default=None, max_length=50)
    samples: int | None = Field(default=None, ge=1, le=64)
    concurrency: int | None = Field(default=None, ge=1, le=64)
    schedule_cron: str | None = None
    schedule_enabled: bool | None = None


class SuiteOut(Schema):
    name: str
    agent: str | None
    description: str
    dataset: str | None
    dataset_version: int | None
    target: str
    prompt_label: str
    prompt_version: int | None
    tier: str
    model_target: str | None
    variables: dict[str, Any]
    evaluators: list[dict[str, Any]]
    samples: int
    concurrency: int
    schedule_cron: str
    schedule_enabled: bool
    next_run_at: datetime | None
    proposed: bool
    created_at: datetime


class ProposeIn(Schema):
    agent: str


class ProposeOut(Schema):
    suites: list[SuiteOut]
    online_rules: list[dict[str, Any]]


class RunIn(Schema):
    prompt_version: int | None = None
    name: str = ""
    idempotency_key: str = Field(default="", max_length=200)


class RunOut(Schema):
    id: int
    name: str
    suite: str | None
    agent: str | None
    status: str
    trigger: str
    target: str
    prompt_version: int | None
    tier: str
    dataset: str | None
    dataset_version: int | None
    samples: int
    concurrency: int
    evaluators: list[dict[str, Any]]
    progress: dict[str, Any]
    report: dict[str, Any]
    baseline: int | None
    error: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class RunListQuery(Schema):
    suite: str | None = None
    status: str | None = None
    limit: int = Field(default=50, ge=1, le=500)


class ItemsQuery(Schema):
    offset: int = Field(default=0, ge=0)
    limit: int = Field(default=100, ge=1, le=500)
    status: Literal["pending", "running", "done", "errored"] | None = None


class CompareQuery(Schema):
    baseline: int
    candidate: int
    judge: str | None = Field(default=None, description="a pairwise judge evaluator to also compare the answers")
    items: bool = Field(
        default=False,
        description="also list a page of the items, matched on their key, with each run's score and the delta",
    )
    offset: int = Field(default=0, ge=0, description="with items=true: the first item of the page")
    limit: int = Field(default=100, ge=1, le=1000, description="with items=true: the items in the page")


class ImportQuery(Schema):
    name: str = Field(default="", max_length=300)
    suite: str | None = None
    threshold: float = Field(default=1.0, ge=0, le=1)


class OnlineRuleIn(Schema):
    name: str = Field(pattern=DATASET_NAME_PATTERN, max_length=200)
    agent: str
    evaluators: list[str] = Field(min_length=1, max_length=50)
    filter: dict[str, Any] = Field(default_factory=dict)
    sample_rate: float = 1.0
    delay_seconds: int = 60
    enabled: bool = True


class OnlineRulePatch(PatchSchema):
    evaluators: list[str] | None = Field(default=None, min_length=1, max_length=50)
    filter: dict[str, Any] | None = None
    sample_rate: float | None = None
    delay_seconds: int | None = None
    enabled: bool | None = None


class OnlineRuleOut(Schema):
    name: str
    agent: str
    evaluators: list[dict[str, Any]]
    filter: dict[str, Any]
    sample_rate: float
    delay_seconds: int
    enabled: bool
    checked_until: datetime | None
    proposed: bool
    summary: dict[str, Any]


class BackfillIn(Schema):
    start: datetime
    end: datetime


class BackfillOut(Schema):
    rule: str
    start: datetime
    end: datetime
    queued: bool


class RegressionOut(Schema):
    id: int
    suite: str
    agent: str | None
    metric: str
    message: str
    baseline_run: int
    candidate_run: int
    comparison: dict[str, Any]
    created_at: datetime


# --- Converters -----------------------------------------------------------------------------------------


def _evaluator_out(evaluator: Evaluator) -> dict[str, Any]:
    return {
        "name": evaluator.name,
        "version": evaluator.version,
        "type": evaluator.type,
        "config": evaluator.config,
        "description": evaluator.description,
        "agent": evaluator.agent.slug if evaluator.agent else None,
        "created_at": evaluator.created_at,
    }


def _suite_out(suite: Suite) -> dict[str, Any]:
    from evals import schedules

    next_run = None
    if suite.schedule_enabled and suite.schedule_cron and not schedules.cron_error(suite.schedule_cron):
        next_run = schedules.slot_next(suite.schedule_cron, suite.schedule_last_slot or suite.updated_at)
    return {
        "name": suite.name,
        "agent": suite.agent.slug if suite.agent else None,
        "description": suite.description,
        "dataset": suite.dataset.name if suite.dataset else None,
        "dataset_version": suite.dataset_version.version if suite.dataset_version else None,
        "target": suite.target,
        "prompt_label": suite.prompt_label,
        "prompt_version": suite.prompt_version.version if suite.prompt_version else None,
        "tier": suite.tier,
        "model_target": suite.model_target.alias if suite.model_target else None,
        "variables": suite.variables,
        "evaluators": [
            {"name": evaluator.name, "version": evaluator.version, "type": evaluator.type}
            for evaluator in selectors.suite_evaluators(suite=suite)
        ],
        "samples": suite.samples,
        "concurrency": suite.concurrency,
        "schedule_cron": suite.schedule_cron,
        "schedule_enabled": suite.schedule_enabled,
        "next_run_at": next_run,
        "proposed": suite.proposed,
        "created_at": suite.created_at,
    }


def run_out(run: Run) -> dict[str, Any]:
    return {
        "id": run.pk,
        "name": run.name,
        "suite": run.suite.name if run.suite else None,
        "agent": run.agent.slug if run.agent else None,
        "status": run.status,
        "trigger": run.trigger,
        "target": run.target,
        "prompt_version": run.prompt_version.version if run.prompt_version else None,
        "tier": run.tier,
        "dataset": run.dataset_version.dataset.name if run.dataset_version else None,
        "dataset_version": run.dataset_version.version if run.dataset_version else None,
        "samples": run.samples,
        "concurrency": run.concurrency,
        "evaluators": [{"name": e["name"], "version": e["version"], "type": e["type"]} for e in run.evaluators],
        "progress": runs.run_progress(run=run),
        "report": run.report,
        "baseline": run.baseline_id,
        "error": run.error,
        "created_at": run.created_at,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
    }


def _item_out(item: RunItem) -> dict[str, Any]:
    return {
        "position": item.position,
        "key": item.key,
        "status": item.status,
        "task": item.task,
        "input_messages": item.input_messages,
        "reference_output": item.reference_output,
        "metadata": item.metadata,
        "source_trace_id": item.source_trace_id,
        "score": item.score,
        "error": item.error,
        "samples": [
            {
                "sample": sample.sample,
                "output_text": sample.output_text,
                "tool_calls": (sample.output or {}).get("tool_calls", []),
                "trace_id": sample.trace_id,
                "latency_ms": sample.latency_ms,
                "cost_usd": sample.cost_usd,
                "error": sample.error,
                "scores": [
                    {
                        "evaluator": score.evaluator_name,
                        "version": score.evaluator_version,
                        "score": score.score,
                        "passed": score.passed,
                        "reason": score.reason,
                        "error": score.error,
                    }
                    for score in sample.scores.all()
                ],
            }
            for sample in item.samples.all()
        ],
    }


def _rule_out(rule: OnlineRule) -> dict[str, Any]:
    return {
        "name": rule.name,
        "agent": rule.agent.slug,
        "evaluators": [{"name": e.name, "version": e.version, "type": e.type} for e in rule.evaluators.all()],
        "filter": rule.filter,
        "sample_rate": rule.sample_rate,
        "delay_seconds": rule.delay_seconds,
        "enabled": rule.enabled,
        "checked_until": rule.checked_until,
        "proposed": rule.proposed,
        "summary": online.rule_summary(rule=rule),
    }


def _regression_out(alert: RegressionAlert) -> dict[str, Any]:
    return {
        "id": alert.pk,
        "suite": alert.suite.name,
        "agent": alert.agent.slug if alert.agent else None,
        "metric": alert.metric,
        "message": alert.message,
        "baseline_run": alert.baseline_run_id,
        "candidate_run": alert.candidate_run_id,
        "comparison": alert.comparison,
        "created_at": alert.created_at,
    }


# --- Lookups --------------------------------------------------------------------------------------------


def _agent(request: HttpRequest, slug: str) -> Agent:
    return registry_selectors.agent_get(
        workspace=request_workspace(request), slug=slug, agent_ids=request_agent_ids(request)
    )


def _workspace_wide_allowed(request: HttpRequest, agent: str | None, what: str) -> None:
    if agent is None and request_agent_ids(request) is not None:
        raise PermissionDenied(f"a key limited to some agents cannot create a workspace-wide {what}; name an agent")


def _evaluators(request: HttpRequest, names: list[str]) -> list[Evaluator]:
    return selectors.evaluators_named(
        workspace=request_workspace(request), names=names, agent_ids=request_agent_ids(request)
    )


def _suite(request: HttpRequest, name: str) -> Suite:
    return selectors.suite_get(workspace=request_workspace(request), name=name, agent_ids=request_agent_ids(request))


def _run(request: HttpRequest, run_id: int) -> Run:
    return selectors.run_get(workspace=request_workspace(request), run_id=run_id, agent_ids=request_agent_ids(request))


def _prompt_version(agent: Agent | None, number: int | None) -> PromptVersion | None:
    if number is None:
        return None
    if agent is None:
        raise ValidationFailed(
            "a prompt version needs the suite's agent", errors=[{"field": "prompt_version", "message": "no agent"}]
        )
    version = (
        PromptVersion.objects.filter(prompt__agent=agent, version=number)
        .select_related("prompt")
        .order_by("prompt__name")
        .first()
    )
    if version is None:
        raise NotFound(
            f"the agent {agent.slug} has no prompt version {number}",
            errors=[{"field": "prompt_version", "message": "not found"}],
        )
    return version


def _suite_fields(
    request: HttpRequest, payload: Schema, agent: Agent | None, current: Suite | None = None
) -> dict[str, Any]:
    """The payload's fields as the service takes them, names looked up in the workspace. A dataset
    version given alone is a version of the suite's current dataset."""
    workspace = request_workspace(request)
    given = payload.model_dump(exclude_unset=True)
    fields: dict[str, Any] = {}
    for key in (
        "description",
        "target",
        "prompt_label",
        "tier",
        "variables",
        "samples",
        "concurrency",
        "schedule_cron",
        "schedule_enabled",
    ):
        if key in given and given[key] is not None:
            fields[key] = given[key]
    if "dataset" in given:
        fields["dataset"] = (
            selectors.dataset_get(workspace=workspace, name=given["dataset"], agent_ids=request_agent_ids(request))
            if given["dataset"]
            else None
        )
        if "dataset_version" not in given:
            fields["dataset_version"] = None
    if "dataset_version" in given:
        dataset = fields.get("dataset", current.dataset if current else None)
        if given["dataset_version"] is None:
            fields["dataset_version"] = None
        elif dataset is None:
            raise ValidationFailed(
                "a dataset version needs the dataset", errors=[{"field": "dataset_version", "message": "no dataset"}]
            )
        else:
            fields["dataset_version"] = selectors.dataset_version_get(dataset=dataset, version=given["dataset_version"])
    if "prompt_version" in given:
        fields["prompt_version"] = _prompt_version(agent, given["prompt_version"])
    if "model_target" in given:
        alias = given["model_target"]
        target = ModelTarget.objects.filter(workspace=workspace, alias=alias).first() if alias else None
        if alias and target is None:
            raise NotFound(f"no model target {alias!r}", errors=[{"field": "model_target", "message": "not found"}])
        fields["model_target"] = target
    return fields


# --- Evaluators -----------------------------------------------------------------------------------------


@router.get("/evaluators", auth=READ, response={200: list[EvaluatorOut], **ERRORS})
def evaluator_list_api(request: HttpRequest) -> Any:
    """The latest version of each evaluator."""
    evaluators = selectors.evaluator_list(workspace=request_workspace(request), agent_ids=request_agent_ids(request))
    return [_evaluator_out(evaluator) for evaluator in evaluators]


@router.post("/evaluators", auth=WRITE, response={201: EvaluatorOut, **ERRORS})
def evaluator_create_api(request: HttpRequest, payload: EvaluatorIn) -> Any:
    """A new evaluator, or the next version of an existing name (suites and rules move to it)."""
    _workspace_wide_allowed(request, payload.agent, "evaluator")
    agent = _agent(request, payload.agent) if payload.agent else None
    existing = Evaluator.objects.filter(workspace=request_workspace(request), name=payload.name).first()
    agent_ids = request_agent_ids(request)
    if existing is not None and agent_ids is not None and existing.agent_id not in agent_ids:
        raise PermissionDenied("this evaluator belongs to an agent the key may not change")
    evaluator = services.evaluator_create(
        workspace=request_workspace(request),
        name=payload.name,
        config=payload.config,
        description=payload.description,
        agent=agent,
    )
    return Status(201, _evaluator_out(evaluator))


@router.get("/evaluators/{name}/versions", auth=READ, response={200: list[EvaluatorOut], **ERRORS})
def evaluator_versions_api(request: HttpRequest, name: str) -> Any:
    versions = selectors.evaluator_versions(
        workspace=request_workspace(request), name=name, agent_ids=request_agent_ids(request)
    )
    return [_evaluator_out(evaluator) for evaluator in versions]


class CalibrationOut(Schema):
    name: str
    n: int
    agreement: float | None
    cohen_kappa: float | None
    pearson: float | None
    spearman: float | None
    mean_absolute_error: float | None
    skipped: int


@router.get("/evaluators/{name}/calibration", auth=READ, response={200: CalibrationOut, **ERRORS})
def evaluator_calibration_api(request: HttpRequest, name: str) -> Any:
    """The evaluator against people: on trajectories both scored (human scores named like the evaluator,
    in 0..1), pass/fail agreement, Cohen's kappa, Pearson and Spearman correlation, mean absolute error."""
    selectors.evaluator_versions(workspace=request_workspace(request), name=name, agent_ids=request_agent_ids(request))
    found = selectors.evaluator_calibration(workspace=request_workspace(request), name=name)
    figures = found.calibration
    return {
        "name": name,
        "n": figures.n,
        "agreement": figures.agreement,
        "cohen_kappa": figures.cohen_kappa,
        "pearson": figures.pearson,
        "spearman": figures.spearman,
        "mean_absolute_error": figures.mean_absolute_error,
        "skipped": found.skipped,
    }


@router.post("/evaluators/{name}/versions", auth=WRITE, response={201: EvaluatorOut, **ERRORS})
def evaluator_version_create_api(request: HttpRequest, name: str, payload: EvaluatorVersionIn) -> Any:
    latest = selectors.evaluator_versions(
        workspace=request_workspace(request), name=name, agent_ids=request_agent_ids(request)
    )[0]
    evaluator = services.evaluator_create(
        workspace=request_workspace(request),
        name=name,
        config=payload.config,
        description=payload.description,
        agent=latest.agent,
    )
    return Status(201, _evaluator_out(evaluator))


# --- Suites ---------------------------------------------------------------------------------------------


@router.get("/suites", auth=READ, response={200: list[SuiteOut], **ERRORS})
def suite_list_api(request: HttpRequest) -> Any:
    suites = selectors.suite_list(workspace=request_workspace(request), agent_ids=request_agent_ids(request))
    return [_suite_out(suite) for suite in suites]


@router.post("/suites", auth=WRITE, response={201: SuiteOut, **ERRORS})
def suite_create_api(request: HttpRequest, payload: SuiteIn) -> Any:
    _workspace_wide_allowed(request, payload.agent, "suite")
    agent = _agent(request, payload.agent) if payload.agent else None
    fields = _suite_fields(request, payload, agent)
    suite = services.suite_create(
        workspace=request_workspace(request),
        name=payload.name,
        agent=agent,
        evaluators_used=_evaluators(request, payload.evaluators),
        **fields,
    )
    return Status(201, _suite_out(selectors.suite_get(workspace=suite.workspace, name=suite.name)))


@router.post("/suites/propose", auth=WRITE, response={201: ProposeOut, **ERRORS})
def suite_propose_api(request: HttpRequest, payload: ProposeIn) -> Any:
    """Suites and online rules from the agent's evaluation commitment; what exists is left alone."""
    proposal = services.suites_propose(agent=_agent(request, payload.agent))
    return Status(
        201,
        {
            "suites": [_suite_out(suite) for suite in proposal.suites],
            "online_rules": [_rule_out(r) for r in proposal.rules],
        },
    )


@router.get("/suites/{name}", auth=READ, response={200: SuiteOut, **ERRORS})
def suite_get_api(request: HttpRequest, name: str) -> Any:
    return _suite_out(_suite(request, name))


@router.patch("/suites/{name}", auth=WRITE, response={200: SuiteOut, **ERRORS})
def suite_update_api(request: HttpRequest, name: str, payload: SuitePatch) -> Any:
    suite = _suite(request, name)
    fields = _suite_fields(request, payload, suite.agent, suite)
    chosen = _evaluators(request, payload.evaluators) if payload.evaluators is not None else None
    services.suite_update(suite=suite, evaluators_used=chosen, **fields)
    return _suite_out(_suite(request, name))


@router.delete("/suites/{name}", auth=WRITE, response={204: None, **ERRORS})
def suite_delete_api(request: HttpRequest, name: str) -> Any:
    services.suite_delete(suite=_suite(request, name))
    return Status(204, None)


@router.get("/suites/{name}/history", auth=READ, response={200: dict[str, list[dict[str, Any]]], **ERRORS})
def suite_history_api(request: HttpRequest, name: str) -> Any:
    """Per evaluator, the suite's completed runs over time: mean, interval, pass@k, worst group, prompt version."""
    suite = _suite(request, name)
    return {
        evaluator.name: selectors.metric_history(suite=suite, evaluator=evaluator.name)
        for evaluator in selectors.suite_evaluators(suite=suite)
    }


# --- Runs -----------------------------------------------------------------------------------------------


@router.post("/suites/{name}/runs", auth=WRITE, response={202: RunOut, **ERRORS})
def run_create_api(request: HttpRequest, name: str, payload: RunIn) -> Any:
    """Start a run (202); it executes in a worker. The same idempotency key (body or `Idempotency-Key`
    header) returns the run it made the first time."""
    suite = _suite(request, name)
    key = payload.idempotency_key or request.headers.get("Idempotency-Key", "")[:200]
    run = runs.run_create(
        suite=suite,
        trigger=RunTrigger.API,
        prompt_version=_prompt_version(suite.agent, payload.prompt_version),
        idempotency_key=key,
        name=payload.name,
        created_via_key=request_api_key(request),
    )
    return Status(202, run_out(_run(request, run.pk)))


@router.get("/runs", auth=READ, response={200: list[RunOut], **ERRORS})
def run_list_api(request: HttpRequest, query: Query[RunListQuery]) -> Any:
    if query.status is not None and query.status not in RunStatus.values:
        raise ValidationFailed(
            f"status must be one of {', '.join(RunStatus.values)}", errors=[{"field": "status", "message": "unknown"}]
        )
    suite = _suite(request, query.suite) if query.suite else None
    found = selectors.run_list(
        workspace=request_workspace(request),
        agent_ids=request_agent_ids(request),
        suite=suite,
        status=query.status,
        limit=query.limit,
    )
    return [run_out(run) for run in found]


@router.get("/runs/compare", auth=READ, response={200: dict[str, Any], **ERRORS})
def run_compare_api(request: HttpRequest, response: HttpResponse, query: Query[CompareQuery]) -> Any:
    """The candidate against the baseline on the items both ran, matched on each item's key (so runs over
    two dataset versions compare the same items): per evaluator, the mean delta with its bootstrap
    interval and the paired sign-flip test's p-value, and how many items only one run has. With
    `items=true`, one page of the items (`offset`, `limit`): `items_total` counts them all, and
    `items_next_offset` (and a `Link` header, rel="next") gives the next page's offset while more follow."""
    baseline, candidate = _run(request, query.baseline), _run(request, query.candidate)
    comparison = runs.runs_compare(baseline=baseline, candidate=candidate)
    if query.items:
        total = sum(
            comparison[count] for count in ("items_in_both", "items_only_in_baseline", "items_only_in_candidate")
        )
        comparison["items"] = runs.runs_compare_items(
            baseline=baseline,
            candidate=candidate,
            evaluators_named=list(comparison["metrics"]),
            offset=query.offset,
            limit=query.limit,
        )
        following = query.offset + query.limit if query.offset + query.limit < total else None
        comparison |= {"items_total": total, "items_offset": query.offset, "items_next_offset": following}
        if following is not None:
            parameters = request.GET.copy()
            parameters["offset"] = str(following)
            response["Link"] = f'<{request.path}?{parameters.urlencode()}>; rel="next"'
    if query.judge:
        (judge,) = _evaluators(request, [query.judge])
        try:
            comparison["pairwise"] = runs.runs_compare_pairwise(baseline=baseline, candidate=candidate, evaluator=judge)
        except evaluators.EvaluatorConfigError as error:
            raise ValidationFailed(str(error), errors=[{"field": "judge", "message": error.message}]) from None
        except evaluators.ModelUnavailable as error:
            raise Unavailable(f"the judge's model cannot be reached: {error}") from None
    return comparison


@router.post(
    "/runs/import",
    auth=WRITE,
    response={201: RunOut, **ERRORS},
    openapi_extra={
        "requestBody": {"required": True, "content": {"application/x-ndjson": {"schema": {"type": "string"}}}}
    },
)
def run_import_api(request: HttpRequest, query: Query[ImportQuery]) -> Any:
    """A NeMo Gym rollouts JSONL file (the body) as a completed run with the same report as any run.
    A malformed file is 422 naming each line and field, and nothing is imported."""
    suite = _suite(request, query.suite) if query.suite else None
    run = interchange.run_import(
        workspace=request_workspace(request),
        content=request.body,
        name=query.name,
        suite=suite,
        threshold=query.threshold,
        created_via_key=request_api_key(request),
    )
    return Status(201, run_out(_run(request, run.pk)))


@router.get("/runs/{int:run_id}", auth=READ, response={200: RunOut, **ERRORS})
def run_get_api(request: HttpRequest, run_id: int) -> Any:
    return run_out(_run(request, run_id))


@router.get("/runs/{int:run_id}/items", auth=READ, response={200: list[dict[str, Any]], **ERRORS})
def run_items_api(request: HttpRequest, run_id: int, query: Query[ItemsQuery]) -> Any:
    """A page of the run's items with every sample, its trajectory's trace id and each evaluator's score."""
    items = selectors.run_items(run=_run(request, run_id), offset=query.offset, limit=query.limit, status=query.status)
    return [_item_out(item) for item in items]


@router.post("/runs/{int:run_id}/cancel", auth=WRITE, response={200: RunOut, **ERRORS})
def run_cancel_api(request: HttpRequest, run_id: int) -> Any:
    runs.run_cancel(run=_run(request, run_id))
    return run_out(_run(request, run_id))


@router.post("/runs/{int:run_id}/resume", auth=WRITE, response={200: RunOut, **ERRORS})
def run_resume_api(request: HttpRequest, run_id: int) -> Any:
    """A paused run goes on now (409 when it is not paused)."""
    runs.run_resume(run=_run(request, run_id))
    return run_out(_run(request, run_id))


@router.get(
    "/runs/{int:run_id}/rollouts",
    auth=READ,
    response={200: None, **ERRORS},
    openapi_extra={
        "responses": {
            200: {
                "description": "NeMo Gym rollouts",
                "content": {"application/x-ndjson": {"schema": {"type": "string"}}},
            }
        }
    },
)
def run_rollouts_api(request: HttpRequest, run_id: int) -> Any:
    """The run as NeMo Gym rollouts JSONL: input, output and reward (the first evaluator's score) per
    sample, Keel's item, sample, tags and scores under `keel`. Streamed."""
    run = _run(request, run_id)
    response = StreamingHttpResponse(
        gym.rollouts_lines(interchange.run_rollouts(run=run)), content_type="application/x-ndjson"
    )
    response["Content-Disposition"] = f'attachment; filename="keel-run-{run.pk}-rollouts.jsonl"'
    return response


# --- Online rules ---------------------------------------------------------------------------------------


@router.get("/online-rules", auth=READ, response={200: list[OnlineRuleOut], **ERRORS})
def online_rule_list_api(request: HttpRequest) -> Any:
    rules = selectors.online_rule_list(workspace=request_workspace(request), agent_ids=request_agent_ids(request))
    return [_rule_out(rule) for rule in rules]


@router.post("/online-rules", auth=WRITE, response={201: OnlineRuleOut, **ERRORS})
def online_rule_create_api(request: HttpRequest, payload: OnlineRuleIn) -> Any:
    rule = online.online_rule_create(
        agent=_agent(request, payload.agent),
        name=payload.name,
        evaluators_used=_evaluators(request, payload.evaluators),
        filter=payload.filter,
        sample_rate=payload.sample_rate,
        delay_seconds=payload.delay_seconds,
        enabled=payload.enabled,
    )
    return Status(201, _rule_out(rule))


def _rule(request: HttpRequest, name: str) -> OnlineRule:
    return selectors.online_rule_get(
        workspace=request_workspace(request), name=name, agent_ids=request_agent_ids(request)
    )


@router.get("/online-rules/{name}", auth=READ, response={200: OnlineRuleOut, **ERRORS})
def online_rule_get_api(request: HttpRequest, name: str) -> Any:
    return _rule_out(_rule(request, name))


@router.patch("/online-rules/{name}", auth=WRITE, response={200: OnlineRuleOut, **ERRORS})
def online_rule_update_api(request: HttpRequest, name: str, payload: OnlineRulePatch) -> Any:
    rule = _rule(request, name)
    fields = {key: value for key, value in payload.model_dump(exclude_unset=True).items() if value is not None}
    if "evaluators" in fields:
        fields["evaluators_used"] = _evaluators(request, fields.pop("evaluators"))
    online.online_rule_update(rule=rule, **fields)
    return _rule_out(_rule(request, name))


@router.post("/online-rules/{name}/backfill", auth=WRITE, response={202: BackfillOut, **ERRORS})
def online_rule_backfill_api(request: HttpRequest, name: str, payload: BackfillIn) -> Any:
    """Evaluate the rule's sample over a past range, in a worker; trajectories it scored are skipped."""
    from django.db import transaction

    from evals import tasks

    rule = _rule(request, name)
    # A time without an offset is UTC, as everywhere in Keel; comparing it with one that has an offset
    # would raise.
    start_at, end_at = (
        moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment for moment in (payload.start, payload.end)
    )
    if end_at <= start_at:
        raise ValidationFailed("end must be after start", errors=[{"field": "end", "message": "not after start"}])
    start, end = start_at.isoformat(), end_at.isoformat()
    transaction.on_commit(lambda: tasks.online_rule_backfill.delay(rule.pk, start, end))
    return Status(202, {"rule": rule.name, "start": start_at, "end": end_at, "queued": True})


# --- Regressions ----------------------------------------------------------------------------------------


@router.get("/regressions", auth=READ, response={200: list[RegressionOut], **ERRORS})
def regression_list_api(request: HttpRequest) -> Any:
    """Regression alerts: newly labelled prompt versions that scored worse on a committed metric."""
    alerts = selectors.regression_list(workspace=request_workspace(request), agent_ids=request_agent_ids(request))
    return [_regression_out(alert) for alert in alerts]
