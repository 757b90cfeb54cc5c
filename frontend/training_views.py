"""Training pages: curations (a builder whose preview follows the form as it changes, and a curation's page
with one-click exports), exports with live progress, their manifest and the file, and training jobs with
their metric charts polled while they run, the reward-hacking flag, the adapter, the model target they
became and the eval run comparing it with the incumbent. Viewers read; members build, save, export,
cancel and start jobs.

trainer_bridge has no selectors module: the reads here filter by the membership's workspace, as its API
does, so another workspace's id is a 404."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, cast

from django.contrib import messages
from django.db.models import QuerySet
from django.http import FileResponse, Http404, HttpResponse, JsonResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from agent_registry import audit
from agent_registry import selectors as registry_selectors
from agent_registry.models import AuditAction, Membership, PromptVersion, Workspace
from config.errors import KeelError
from evals import selectors as eval_selectors
from frontend.access import HtmxHttpRequest, workspace_view
from frontend.training_forms import CurationForm, TrainingJobForm, field_of
from frontend.views import _render
from trainer_bridge import jobs, services
from trainer_bridge.models import ACTIVE, Curation, Export, ExportFormat, JobStatus, TrainingJob, TrainingMetric

SHOWN: Final = 100
RUN_CHOICES: Final = 50
# The charts of a job's page: (title, metric keys drawn on it, what it tells).
CHARTS: Final = (
    ("Loss", ("loss",), "The training loss at each step."),
    (
        "Reward",
        ("reward_mean", "policy_reward", "train_policy_reward"),
        "The recorded rewards' mean; the policy-weighted reward of each step's batch, and of a fixed sample of "
        "training groups at each validation.",
    ),
    ("Validation score", ("validation_score",), "The held-out score, where the worker measured it."),
    ("KL", ("kl",), "How far the policy moved from the base model."),
)


# --- Reads, each scoped to the workspace ---------------------------------------------------------------


def _curation_get(workspace: Workspace, name: str) -> Curation:
    found = Curation.objects.filter(workspace=workspace, name=name).first()
    if found is None:
        raise services.CurationNotFound(f"no curation named {name!r}")
    return found


def _exports(workspace: Workspace) -> QuerySet[Export]:
    return Export.objects.filter(workspace=workspace).select_related("curation", "created_by")


def _export_get(workspace: Workspace, export_id: int) -> Export:
    found = _exports(workspace).filter(pk=export_id).first()
    if found is None:
        raise services.ExportNotFound(f"no export {export_id}")
    return found


def _jobs(workspace: Workspace) -> QuerySet[TrainingJob]:
    return TrainingJob.objects.filter(workspace=workspace).select_related(
        "export__curation", "model_target", "comparison_run__baseline", "created_by"
    )


def _job_get(workspace: Workspace, job_id: int) -> TrainingJob:
    found = _jobs(workspace).filter(pk=job_id).first()
    if found is None:
        raise jobs.JobNotFound(f"no training job {job_id}")
    return found


# --- Curations -----------------------------------------------------------------------------------------


def _prompt_versions(workspace: Workspace) -> list[PromptVersion]:
    versions: list[PromptVersion] = []
    for prompt in registry_selectors.prompt_list(workspace=workspace):
        for version in registry_selectors.prompt_version_list(prompt=prompt):
            version.prompt = prompt
            versions.append(version)
    return versions


def _curation_form(membership: Membership, data: Any = None, curation: Curation | None = None) -> CurationForm:
    workspace = membership.workspace
    return CurationForm(
        data,
        agents=list(registry_selectors.agent_list(workspace=workspace)),
        datasets=list(eval_selectors.dataset_list(workspace=workspace)),
        runs=eval_selectors.run_list(workspace=workspace, limit=RUN_CHOICES),
        prompt_versions=_prompt_versions(workspace),
        curation=curation,
    )


def _service_errors(
    form: CurationForm | TrainingJobForm, error: KeelError, fields: Mapping[str, str] | None = None
) -> None:
    """Put a service's `errors` beside the fields they name (the curation's through `field_of`, a job's
    through `fields`, else by the first part of the name: "config.kl_coef" beside "config"); the rest above
    the form."""
    for problem in error.extra.get("errors") or [{"field": "", "message": error.detail}]:
        name = str(problem.get("field", ""))
        target = fields.get(name) if fields is not None else field_of(name, form)
        if target is None and fields is not None:
            target = name.split(".")[0]
        message = str(problem.get("message", error.detail))
        form.add_error(target if target in form.fields else None, f"{name}: {message}" if name else message)


@workspace_view()
@require_GET
def training_curation_list_view(request: HtmxHttpRequest, membership: Membership) -> HttpResponse:
    workspace = membership.workspace
    curations = list(Curation.objects.filter(workspace=workspace).order_by("name"))
    latest: dict[int, Export] = {}
    for export in _exports(workspace).filter(curation__in=curations).order_by("-created_at", "-pk"):
        latest.setdefault(export.curation_id or 0, export)
    return _render(
        request,
        membership,
        "frontend/training/curations.html",
        {"rows": [(curation, latest.get(curation.pk)) for curation in curations]},
    )


def _builder_page(
    request: HtmxHttpRequest, membership: Membership, form: CurationForm, curation: Curation | None, status: int = 200
) -> HttpResponse:
    return _render(
        request, membership, "frontend/training/curation_form.html", {"form": form, "curation": curation}, status=status
    )


@workspace_view()
@require_http_methods(["GET", "POST"])
def training_curation_create_view(request: HtmxHttpRequest, membership: Membership) -> HttpResponse:
    if request.method == "GET":
        return _builder_page(request, membership, _curation_form(membership), None)
    form = _curation_form(membership, request.POST)
    if form.is_valid():
        try:
            curation = services.curation_create(
                workspace=membership.workspace,
                name=form.cleaned_data["name"],
                created_by=membership.user,
                **form.curation_fields(),
            )
        except services.CurationInvalid as error:
            _service_errors(form, error)
        except services.CurationExists as error:
            form.add_error("name", f"{error.detail}; choose another name.")
        else:
            messages.success(request, f"Saved the curation {curation.name}.")
            return redirect(
                "frontend:training_curation_detail", workspace_slug=membership.workspace.slug, name=curation.name
            )
    return _builder_page(request, membership, form, None, status=422)


@workspace_view()
@require_http_methods(["GET", "POST"])
def training_curation_edit_view(request: HtmxHttpRequest, membership: Membership, name: str) -> HttpResponse:
    curation = _curation_get(membership.workspace, name)
    if request.method == "GET":
        return _builder_page(request, membership, _curation_form(membership, curation=curation), curation)
    form = _curation_form(membership, request.POST, curation=curation)
    if form.is_valid():
        try:
            services.curation_update(curation=curation, **form.curation_fields())
        except services.CurationInvalid as error:
            _service_errors(form, error)
        else:
            messages.success(request, f"Saved the curation {curation.name}; its earlier exports keep what they said.")
            return redirect("frontend:training_curation_detail", workspace_slug=membership.workspace.slug, name=name)
    curation.refresh_from_db()
    return _builder_page(request, membership, form, curation, status=422)


@dataclass(frozen=True)
class Bar:
    label: str
    count: int
    percent: float


def _bars(counts: dict[str, int]) -> list[Bar]:
    top = max(counts.values(), default=0)
    return [Bar(label, count, round(100 * count / top, 1) if top else 0.0) for label, count in counts.items()]


def _preview_context(preview: dict[str, Any]) -> dict[str, Any]:
    signals = dict(sorted(preview.get("signals", {}).items(), key=lambda pair: (-pair[1], pair[0])))
    return {
        "preview": preview,
        "size_bars": _bars(dict(preview.get("group_sizes") or {})),
        "signal_bars": _bars(signals),
        "quantiles": list((preview.get("rewards", {}).get("quantiles") or {}).items()),
    }


def _preview_partial(request: HtmxHttpRequest, membership: Membership, context: dict[str, Any]) -> HttpResponse:
    return _render(request, membership, "frontend/training/_preview.html", context)


@workspace_view()
@require_POST
def training_curation_preview_view(request: HtmxHttpRequest, membership: Membership) -> HttpResponse:
    """The builder's form, previewed without saving: the partial the builder swaps in (errors included, with
    a 200 so that htmx shows them)."""
    existing = request.POST.get("curation")
    curation = _curation_get(membership.workspace, existing) if existing else None
    form = _curation_form(membership, request.POST, curation=curation)
    # The preview does not need a name yet: only the settings count.
    if "name" in form.fields:
        form.fields["name"].required = False
    problems: list[str] = []
    if form.is_valid():
        fields = form.curation_fields()
        snapshot = {key: fields[key] for key in ("query", "grouping", "reward", "filters")}
        try:
            services.curation_validate(**snapshot)
            preview = services.curation_preview(workspace=membership.workspace, snapshot=snapshot).as_dict()
        except services.CurationInvalid as error:
            problems = [
                f"{problem['field']}: {problem['message']}"
                for problem in error.extra.get("errors") or [{"field": "curation", "message": error.detail}]
            ]
        else:
            return _preview_partial(request, membership, _preview_context(preview))
    else:
        problems = [
            f"{form.fields[name].label or name if name in form.fields else name}: {'; '.join(map(str, errors))}"
            for name, errors in form.errors.items()
        ]
    return _preview_partial(request, membership, {"problems": problems})


@workspace_view()
@require_GET
def training_curation_detail_view(request: HtmxHttpRequest, membership: Membership, name: str) -> HttpResponse:
    workspace = membership.workspace
    curation = _curation_get(workspace, name)
    if request.GET.get("partial") == "preview":
        # Asked for by the page once it has loaded: a preview reads every selected trajectory (and a group
        # judge's calls), which should not hold up the page.
        try:
            preview = services.curation_preview(workspace=workspace, snapshot=services.curation_snapshot(curation))
        except services.CurationInvalid as error:
            return _preview_partial(request, membership, {"problems": [error.detail]})
        return _preview_partial(request, membership, _preview_context(preview.as_dict()))
    return _render(
        request,
        membership,
        "frontend/training/curation_detail.html",
        {
            "curation": curation,
            "formats": ExportFormat.choices,
            "exports": list(_exports(workspace).filter(curation=curation).order_by("-created_at", "-pk")[:SHOWN]),
        },
    )


@workspace_view()
@require_POST
def training_curation_export_view(request: HtmxHttpRequest, membership: Membership, name: str) -> HttpResponse:
    curation = _curation_get(membership.workspace, name)
    chosen = request.POST.get("format", "")
    split = request.POST.get("split") or services.EXPORT_SPLIT_ALL
    label = dict(ExportFormat.choices).get(chosen, chosen)
    if split != services.EXPORT_SPLIT_ALL:
        label = f"{label} ({split} split)"
    try:
        export = services.export_create(curation=curation, format=chosen, split=split, created_by=membership.user)
    except services.ExportRefused as error:
        messages.error(request, f"Not exported as {label}: {error.detail}.")
        return redirect("frontend:training_curation_detail", workspace_slug=membership.workspace.slug, name=name)
    messages.success(request, f"Exporting {curation.name} as {label}: {export.groups_total} groups.")
    return redirect("frontend:training_export_detail", workspace_slug=membership.workspace.slug, export_id=export.pk)


def _streamed(response: FileResponse) -> HttpResponse:
    # A file streams rather than loading into memory; Django serves any response class, though
    # `workspace_view` types its views as returning an HttpResponse.
    return cast(HttpResponse, response)


# --- Exports -------------------------------------------------------------------------------------------


def _export_progress(export: Export) -> dict[str, Any]:
    total = export.groups_total
    done = min(export.groups_done, total) if total else export.groups_done
    finished = export.status not in ACTIVE
    return {
        "status": export.status,
        "status_label": JobStatus(export.status).label,
        "groups_done": done,
        "groups_total": total,
        "percent": 100.0 if export.status == JobStatus.SUCCEEDED else (round(100 * done / total, 1) if total else 0.0),
        "polling": not finished,
        "bytes": export.bytes,
        "error": export.error,
    }


@workspace_view()
@require_GET
def training_export_list_view(request: HtmxHttpRequest, membership: Membership) -> HttpResponse:
    return _render(
        request,
        membership,
        "frontend/training/exports.html",
        {
            "exports": list(_exports(membership.workspace).order_by("-created_at", "-pk")[:SHOWN]),
            "shown_limit": SHOWN,
        },
    )


@workspace_view()
@require_GET
def training_export_detail_view(request: HtmxHttpRequest, membership: Membership, export_id: int) -> HttpResponse:
    export = _export_get(membership.workspace, export_id)
    return _render(
        request,
        membership,
        "frontend/training/export_detail.html",
        {
            "export": export,
            "progress": _export_progress(export),
            "manifest": export.manifest or {},
            "jobs": list(_jobs(membership.workspace).filter(export=export).order_by("-created_at", "-pk")),
            "trainable": export.status == JobStatus.SUCCEEDED and export.format in ("art", "trl_sft", "trl_dpo"),
        },
    )


@workspace_view()
@require_GET
def training_export_progress_view(request: HtmxHttpRequest, membership: Membership, export_id: int) -> HttpResponse:
    """The export's progress as JSON, which its page polls while it is queued or running."""
    return JsonResponse(_export_progress(_export_get(membership.workspace, export_id)))


@workspace_view()
@require_POST
def training_export_cancel_view(request: HtmxHttpRequest, membership: Membership, export_id: int) -> HttpResponse:
    export = _export_get(membership.workspace, export_id)
    if export.status not in ACTIVE:
        messages.error(request, f"Export #{export.pk} is {export.get_status_display().lower()}: nothing to cancel.")
    else:
        services.export_cancel(export=export)
        messages.success(request, f"Cancelled export #{export.pk}; its partial file is discarded.")
    return redirect("frontend:training_export_detail", workspace_slug=membership.workspace.slug, export_id=export.pk)


@workspace_view()
@require_GET
def training_export_download_view(request: HtmxHttpRequest, membership: Membership, export_id: int) -> HttpResponse:
    export = _export_get(membership.workspace, export_id)
    try:
        path = services.export_file(export=export)
    except services.ExportNotReady as error:
        raise Http404(error.detail) from None
    audit.record(
        workspace=membership.workspace, action=AuditAction.EXPORT_DOWNLOADED, user=membership.user, target=export
    )
    response = FileResponse(
        path.open("rb"), content_type="application/x-ndjson", as_attachment=True, filename=path.name
    )
    response["ETag"] = f'"{export.sha256}"'
    return _streamed(response)


# --- Training jobs -------------------------------------------------------------------------------------


def _job_form(membership: Membership, data: Any = None, **kwargs: Any) -> TrainingJobForm:
    workspace = membership.workspace
    return TrainingJobForm(
        data,
        exports=list(
            _exports(workspace)
            .filter(status=JobStatus.SUCCEEDED, format__in=("art", "trl_sft", "trl_dpo"))
            .order_by("-created_at", "-pk")[:SHOWN]
        ),
        suites=list(eval_selectors.suite_list(workspace=workspace)),
        **kwargs,
    )


@workspace_view()
@require_GET
def training_job_list_view(request: HtmxHttpRequest, membership: Membership) -> HttpResponse:
    return _render(
        request,
        membership,
        "frontend/training/jobs.html",
        {"jobs": list(_jobs(membership.workspace).order_by("-created_at", "-pk")[:SHOWN]), "shown_limit": SHOWN},
    )


JOB_FIELDS: Final = {
    "export": "export",
    "method": "method",
    "base_model": "base_model",
    "serve.model": "serve_model",
    "serve.api_base": "serve_api_base",
    "config.steps": "steps",
    "config.learning_rate": "learning_rate",
    "config.lora_r": "lora_r",
}


@workspace_view()
@require_http_methods(["GET", "POST"])
def training_job_create_view(request: HtmxHttpRequest, membership: Membership) -> HttpResponse:
    if request.method == "GET":
        form = _job_form(membership, initial={"export": request.GET.get("export", "")})
        return _render(request, membership, "frontend/training/job_form.html", {"form": form})
    form = _job_form(membership, request.POST)
    if form.is_valid():
        try:
            job = jobs.job_create(export=form.export_chosen(), created_by=membership.user, **form.job_fields())
        except jobs.JobInvalid as error:
            _service_errors(form, error, JOB_FIELDS)
        else:
            messages.success(request, f"Queued training job #{job.pk}; a GPU worker takes it at its next claim.")
            return redirect("frontend:training_job_detail", workspace_slug=membership.workspace.slug, job_id=job.pk)
    return _render(request, membership, "frontend/training/job_form.html", {"form": form}, status=422)


def _job_metrics(job: TrainingJob) -> dict[str, Any]:
    """uPlot columns: the steps, and each metric's value per step (None where the worker did not report it)."""
    rows = list(TrainingMetric.objects.filter(job=job).order_by("step").values_list("step", "values"))
    keys = {key for _, values in rows for key in values}
    return {
        "steps": [step for step, _ in rows],
        "series": {key: [values.get(key) for _, values in rows] for key in sorted(keys)},
    }


def _job_state(job: TrainingJob) -> dict[str, Any]:
    steps = job.config.get("steps")
    return {
        "status": job.status,
        "status_label": JobStatus(job.status).label,
        "steps_done": job.steps_done,
        "steps": steps if isinstance(steps, int) else None,
        "flagged": job.flagged,
        "flag_reason": job.flag_reason,
        "polling": job.status in ACTIVE,
        "metrics": _job_metrics(job),
    }


@workspace_view()
@require_GET
def training_job_detail_view(request: HtmxHttpRequest, membership: Membership, job_id: int) -> HttpResponse:
    job = _job_get(membership.workspace, job_id)
    state = _job_state(job)
    run = job.comparison_run
    latest = {
        key: next((v for v in reversed(values) if v is not None), None)
        for key, values in state["metrics"]["series"].items()
    }
    return _render(
        request,
        membership,
        "frontend/training/job_detail.html",
        {
            "job": job,
            "state": state,
            "charts": [
                {"title": title, "keys": keys, "help": help_text, "reported": any(k in latest for k in keys)}
                for title, keys, help_text in CHARTS
            ],
            "chart_data": {"charts": [{"title": t, "keys": list(k)} for t, k, _ in CHARTS], **state["metrics"]},
            "latest": sorted(latest.items()),
            "settings": sorted((k, v) for k, v in job.config.items() if k not in ("serve", "compare_suite")),
            "serve": job.config.get("serve") or {},
            "compare_suite": job.config.get("compare_suite") or "",
            "baseline": run.baseline if run is not None else None,
            "can_cancel": job.status in ACTIVE,
        },
    )


@workspace_view()
@require_GET
def training_job_metrics_view(request: HtmxHttpRequest, membership: Membership, job_id: int) -> HttpResponse:
    """The job's status, flag and metrics as JSON, which its page polls while it is queued or running."""
    return JsonResponse(_job_state(_job_get(membership.workspace, job_id)))


@workspace_view()
@require_POST
def training_job_cancel_view(request: HtmxHttpRequest, membership: Membership, job_id: int) -> HttpResponse:
    job = _job_get(membership.workspace, job_id)
    if job.status not in ACTIVE:
        messages.error(request, f"Training job #{job.pk} is {job.get_status_display().lower()}: nothing to cancel.")
    else:
        jobs.job_cancel(job=job)
        messages.success(request, f"Cancelled training job #{job.pk}; its worker stops at its next call.")
    return redirect("frontend:training_job_detail", workspace_slug=membership.workspace.slug, job_id=job.pk)


@workspace_view()
@require_GET
def training_job_adapter_view(request: HtmxHttpRequest, membership: Membership, job_id: int) -> HttpResponse:
    """The adapter the worker uploaded (a tar.gz)."""
    job = _job_get(membership.workspace, job_id)
    if not job.adapter_path:
        raise Http404(f"training job {job_id} has no uploaded adapter")
    try:
        handle = open(job.adapter_path, "rb")  # noqa: SIM115 - FileResponse closes it
    except FileNotFoundError:
        raise Http404(f"the adapter of training job {job_id} is gone") from None
    return _streamed(
        FileResponse(
            handle, content_type="application/gzip", as_attachment=True, filename=f"job-{job.pk}-adapter.tar.gz"
        )
    )
