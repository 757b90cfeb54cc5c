"""The review queue: draw samples, read each sampled trajectory in the step-through view, mark it
informative or not with one key, and see, per sampling strategy, how often reviewers found the
trajectories informative (the Signals paper's measurement on the team's own data)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods

from agent_registry import selectors
from agent_registry.models import Membership
from evals import selectors as evals_selectors
from frontend.access import HtmxHttpRequest, membership_can_edit, workspace_view
from frontend.evals_forms import DatasetAddForm
from frontend.triage_forms import ReviewDecisionForm, ReviewSampleForm
from frontend.views import _render, step_through_context
from tracing import exceptions, sampling, triage
from tracing.models import ReviewItem, ReviewItemStatus, ReviewSample

# Shown on the queue, disabled: what this button will do arrives with the trainer issue.
CURATION_TOOLTIP = "Adding to a training curation arrives with the trainer bridge (curations are not in Keel yet)."


@dataclass(frozen=True)
class FailureModeOption:
    value: str
    label: str
    key: int | None  # the digit that picks it, 1-9
    fired: bool


def _informativeness_context(membership: Membership) -> dict[str, Any]:
    report = triage.review_informativeness(workspace=membership.workspace)
    rows = report.overall
    widest = max((row.share or 0 for row in rows), default=0) or 1
    return {"report": report, "comparison": report.comparison, "bar_scale": 100 / widest}


@workspace_view()
@require_http_methods(["GET", "POST"])
def review_list_view(request: HtmxHttpRequest, membership: Membership) -> HttpResponse:
    """The queues (samples) of the workspace, drawing a new one, and informativeness per strategy."""
    agents = list(selectors.agent_list(workspace=membership.workspace))
    form = ReviewSampleForm(request.POST if request.method == "POST" else None, agents=agents)
    if form.is_bound and form.is_valid():
        try:
            sample = triage.review_sample_create(
                workspace=membership.workspace, created_by=membership.user, **form.sample_arguments(timezone.now())
            )
        except exceptions.ReviewSampleInvalid as error:
            for problem in error.extra.get("errors", []):
                field = str(problem.get("field"))
                form.add_error(field if field in form.fields else None, str(problem.get("message")))
        else:
            count = sample.items.count()
            messages.success(
                request,
                f"Drew {count} trajector{'y' if count == 1 else 'ies'} by {sample.get_strategy_display().lower()}.",
            )
            return redirect("frontend:review_sample", workspace_slug=membership.workspace.slug, sample_id=sample.pk)
    return _render(
        request,
        membership,
        "frontend/review/list.html",
        {
            "samples": triage.review_sample_list(workspace=membership.workspace),
            "form": form,
            **_informativeness_context(membership),
        },
        status=422 if form.errors else 200,
    )


def sample_page(
    request: HtmxHttpRequest,
    membership: Membership,
    sample: ReviewSample,
    *,
    dataset_form: DatasetAddForm | None = None,
    dataset_position: int | None = None,
    status: int = 200,
) -> HttpResponse:
    """A queue's rows, each with an "Add to dataset" control; `dataset_form` is the one a row posted
    (`dataset_position`), shown there with its errors."""
    items = list(triage.review_item_list(sample=sample))
    upcoming = triage.review_item_next(sample=sample)
    datasets = list(evals_selectors.dataset_list(workspace=membership.workspace))
    return _render(
        request,
        membership,
        "frontend/review/sample.html",
        {
            "sample": sample,
            "items": items,
            "upcoming": upcoming,
            "done": _decided(sample),
            "can_add_to_dataset": membership_can_edit(membership),
            "blank_dataset_form": DatasetAddForm(datasets=datasets),
            "dataset_form": dataset_form,
            "dataset_position": dataset_position,
        },
        status=status,
    )


@workspace_view()
@require_GET
def review_sample_view(request: HtmxHttpRequest, membership: Membership, sample_id: int) -> HttpResponse:
    sample = triage.review_sample_get(workspace=membership.workspace, sample_id=sample_id)
    return sample_page(request, membership, sample)


def _decided(sample: ReviewSample) -> int:
    """Items with a decision (from the counts tracing.triage.review_sample_get annotates)."""
    return int(getattr(sample, "reviewed_count", 0)) + int(getattr(sample, "skipped_count", 0))


def _failure_modes(item: ReviewItem) -> list[FailureModeOption]:
    fired = set(triage.fired_signals(item.trajectory)) | set(item.signal_names)
    order = sampling.failure_mode_order(fired)
    return [
        FailureModeOption(value, sampling.FAILURE_MODES[value], index + 1 if index < 9 else None, value in fired)
        for index, value in enumerate(order)
    ]


def _decision_initial(item: ReviewItem) -> dict[str, Any]:
    if item.status == ReviewItemStatus.SKIPPED:
        return {"decision": "skip", "note": item.note}
    if item.status == ReviewItemStatus.REVIEWED:
        return {
            "decision": "informative" if item.informative else "not_informative",
            "failure_mode": item.failure_mode,
            "note": item.note,
        }
    return {}


def _item_page(
    request: HtmxHttpRequest,
    membership: Membership,
    sample: ReviewSample,
    item: ReviewItem,
    form: ReviewDecisionForm,
    status: int = 200,
) -> HttpResponse:
    positions = list(sample.items.order_by("position").values_list("position", flat=True))
    index = positions.index(item.position)
    return _render(
        request,
        membership,
        "frontend/review/item.html",
        {
            **step_through_context(request, item.trajectory),
            "sample": sample,
            "item": item,
            "form": form,
            "failure_modes": _failure_modes(item),
            "chosen_failure_mode": form["failure_mode"].value() or "",
            "chosen_decision": form["decision"].value() or "",
            "number": index + 1,
            "total": len(positions),
            "done": _decided(sample),
            "previous": positions[index - 1] if index > 0 else None,
            "next": positions[index + 1] if index + 1 < len(positions) else None,
            "can_review": membership_can_edit(membership),
            "can_add_to_dataset": membership_can_edit(membership),
            "dataset_form": DatasetAddForm(datasets=list(evals_selectors.dataset_list(workspace=membership.workspace))),
            "curation_tooltip": CURATION_TOOLTIP,
        },
        status=status,
    )


@workspace_view()
@require_http_methods(["GET", "POST"])
def review_item_view(request: HtmxHttpRequest, membership: Membership, sample_id: int, position: int) -> HttpResponse:
    """One item of a queue: the trajectory step by step, and the decision form; saving moves on to the
    next pending item."""
    sample = triage.review_sample_get(workspace=membership.workspace, sample_id=sample_id)
    item = triage.review_item_get(sample=sample, position=position)
    if request.method == "GET":
        return _item_page(request, membership, sample, item, ReviewDecisionForm(initial=_decision_initial(item)))
    form = ReviewDecisionForm(request.POST)
    if form.is_valid():
        try:
            triage.review_item_decide(item=item, reviewer=membership.user, **form.decision_arguments())
        except exceptions.ReviewDecisionInvalid as error:
            for problem in error.extra.get("errors", []):
                field = str(problem.get("field"))
                form.add_error(field if field in form.fields else None, str(problem.get("message")))
        else:
            upcoming = triage.review_item_next(sample=sample, after=item.position)
            slug = membership.workspace.slug
            if upcoming is None:
                messages.success(request, "That was the last one: every trajectory of this queue has a decision.")
                return redirect("frontend:review_sample", workspace_slug=slug, sample_id=sample.pk)
            return redirect(reverse("frontend:review_item", args=[slug, sample.pk, upcoming.position]) + "#review-form")
    sample = triage.review_sample_get(workspace=membership.workspace, sample_id=sample_id)
    return _item_page(request, membership, sample, item, form, status=422)


@workspace_view()
@require_GET
def review_informativeness_view(request: HtmxHttpRequest, membership: Membership) -> HttpResponse:
    """Per strategy, the share of reviewed trajectories found informative, overall and per agent."""
    return _render(request, membership, "frontend/review/informativeness.html", _informativeness_context(membership))
