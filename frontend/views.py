"""The dashboard's pages. Each view parses its input, calls a selector or a service, and renders;
`frontend.access.workspace_view` has already checked the membership and the role."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import NON_FIELD_ERRORS
from django.core.exceptions import ValidationError as DjangoValidationError
from django.forms import Form
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views import defaults
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from agent_registry import exceptions, prompts, ratelimit, requirements, selectors, services
from agent_registry.middleware import client_ip
from agent_registry.models import (
    Agent,
    AgentStatus,
    Membership,
    Prompt,
    PromptType,
    PromptVersion,
    Role,
    User,
)
from config.errors import KeelError
from evals import selectors as evals_selectors
from frontend import forms
from frontend import trajectories as display
from frontend.access import HtmxHttpRequest, membership_can_edit, workspace_view
from frontend.evals_forms import DatasetAddForm
from frontend.templatetags import keel as keel_tags
from tracing import replay
from tracing import selectors as tracing_selectors
from tracing import services as tracing_services
from tracing.exceptions import ReplayConflict, ReplayInvalid, ScoreInvalid, TrajectoryListInvalid
from tracing.models import ReplayStatus, ScoreSource, Trajectory
from tracing.replay_diff import replay_diff

# A worker runs the heartbeat every 30 s; three missed beats means it is gone.
HEARTBEAT_STALE_SECONDS = 90


def _render(
    request: HttpRequest,
    membership: Membership,
    template: str,
    context: Mapping[str, Any],
    status: int = 200,
) -> HttpResponse:
    return render(
        request,
        template,
        {"workspace": membership.workspace, "membership": membership, **context},
        status=status,
    )


def _keel_errors_to_form(form: Form, error: KeelError, fields: Mapping[str, str]) -> None:
    """Put a service's `errors` on the form's fields (`fields` renames the service's to the form's)."""
    items = error.extra.get("errors") or [{"field": "", "message": error.detail}]
    for item in items:
        name = fields.get(str(item.get("field", "")), str(item.get("field", "")))
        message = str(item.get("message", error.detail))
        # Some services give each field a one-word message and the sentence in `detail`: show the sentence.
        if message in ("required", "invalid", "empty", "reserved", "read-only"):
            message = error.detail
        form.add_error(name if name in form.fields else None, message)


# --- Error pages (config/views.py sends API paths to JSON instead) -----------------------------------


def page_not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return defaults.page_not_found(request, exception or Exception("not found"))


def server_error(request: HttpRequest) -> HttpResponse:
    # Django's handler renders 500.html without context processors, which read the database
    # that may be what failed.
    return defaults.server_error(request)


# --- Sign-in and the landing page --------------------------------------------------------------------


class LoginView(auth_views.LoginView):
    """Django's sign-in, with failed attempts limited per client address and username
    (KEEL_RATE_LIMIT_LOGIN_*): past the limit the form says so and answers 429, without checking the
    password. Successful sign-ins do not count."""

    template_name = "frontend/login.html"
    redirect_authenticated_user = True

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        username = str(request.POST.get("username", ""))
        decision = ratelimit.login_check(ip=client_ip(request), username=username)
        if decision.allowed:
            return super().post(request, *args, **kwargs)
        # An unbound form: validating the posted one would check the password.
        form = self.get_form_class()(request, initial={"username": username})
        refusal = (
            f"Too many failed sign-ins for {username or 'this username'} from your address. "
            f"Try again in {decision.retry_after} seconds."
        )
        response = self.render_to_response(self.get_context_data(form=form, refusal=refusal), status=429)
        response["Retry-After"] = str(decision.retry_after)
        return response

    def form_invalid(self, form: AuthenticationForm) -> HttpResponse:
        if form.has_error(NON_FIELD_ERRORS, "invalid_login") or form.has_error(NON_FIELD_ERRORS, "inactive"):
            ratelimit.login_failure_record(ip=client_ip(self.request), username=str(form.data.get("username", "")))
        return super().form_invalid(form)


class LogoutView(auth_views.LogoutView):
    pass


@require_GET
def home_view(request: HttpRequest) -> HttpResponse:
    """`/`: the user's first workspace, or a page that says there is none."""
    if not isinstance(request.user, User):
        return redirect("frontend:login")
    membership = selectors.membership_list_for_user(user=request.user).first()
    if membership is None:
        return render(request, "frontend/no_workspace.html")
    return redirect("frontend:workspace_home", workspace_slug=membership.workspace.slug)


# --- Workspace home ----------------------------------------------------------------------------------


@workspace_view()
@require_GET
def workspace_home_view(request: HtmxHttpRequest, membership: Membership) -> HttpResponse:
    workspace = membership.workspace
    agent_findings = selectors.agent_feasibility_list(workspace=workspace)
    deployments = selectors.prompt_label_move_list_for_workspace(workspace=workspace, limit=8)
    heartbeat = selectors.worker_heartbeat_latest()
    recent = tracing_selectors.trajectory_stats(workspace=workspace, since=timezone.now() - timedelta(hours=24))

    statuses = Counter(agent.status for agent, _ in agent_findings)
    severities = Counter(finding.severity for _, findings in agent_findings for finding in findings)
    heartbeat_age = int((timezone.now() - heartbeat).total_seconds()) if heartbeat is not None else None
    return _render(
        request,
        membership,
        "frontend/home.html",
        {
            "agent_findings": agent_findings,
            "agents_with_findings": [(agent, findings) for agent, findings in agent_findings if findings],
            "status_summary": [(label, statuses[value]) for value, label in AgentStatus.choices if statuses[value]],
            "active_count": statuses[AgentStatus.ACTIVE],
            "error_count": severities.get(requirements.Severity.ERROR, 0),
            "warning_count": severities.get(requirements.Severity.WARNING, 0),
            "deployments": deployments,
            "heartbeat": heartbeat,
            "heartbeat_age": heartbeat_age,
            "heartbeat_healthy": heartbeat_age is not None and heartbeat_age <= HEARTBEAT_STALE_SECONDS,
            "recent": recent,
        },
    )


# --- Agents --------------------------------------------------------------------------------------------


@workspace_view()
@require_http_methods(["GET", "POST"])
def agent_list_view(request: HtmxHttpRequest, membership: Membership) -> HttpResponse:
    form = forms.AgentCreateForm(request.POST if request.method == "POST" else None)
    if form.is_bound and form.is_valid():
        try:
            agent = services.agent_create(
                workspace=membership.workspace,
                slug=form.cleaned_data["slug"],
                name=form.cleaned_data["name"],
                description=form.cleaned_data["description"],
                owner=membership.user,
                created_by=membership.user,
            )
        except exceptions.AgentSlugTaken as error:
            form.add_error("slug", error.detail)
        except DjangoValidationError as error:
            for field, field_messages in error.message_dict.items():
                form.add_error(field if field in form.fields else None, field_messages)
        else:
            messages.success(request, f"Created agent {agent.name}.")
            return redirect("frontend:agent_detail", workspace_slug=membership.workspace.slug, agent_slug=agent.slug)
    agents = selectors.agent_list(workspace=membership.workspace)
    return _render(
        request,
        membership,
        "frontend/agents/list.html",
        {"agents": agents, "form": form},
        status=422 if form.errors else 200,
    )


@dataclass(frozen=True)
class FindingView:
    finding: requirements.Finding
    targets: list[forms.FindingTarget]


def _finding_views(findings: Iterable[requirements.Finding], values: Mapping[str, Sequence[str]]) -> list[FindingView]:
    return [FindingView(finding, forms.finding_targets(finding.fields, values)) for finding in findings]


@workspace_view()
@require_GET
def agent_detail_view(request: HtmxHttpRequest, membership: Membership, agent_slug: str) -> HttpResponse:
    agent = selectors.agent_get(workspace=membership.workspace, slug=agent_slug)
    current = selectors.requirements_current(agent=agent)
    values = forms.requirements_form_values(current.to_json()) if current is not None else {}
    findings = requirements.feasibility_check(current) if current is not None else []
    return _render(
        request,
        membership,
        "frontend/agents/detail.html",
        {"agent": agent, "tab": "overview", "current": current, "findings": _finding_views(findings, values)},
    )


# --- Requirements --------------------------------------------------------------------------------------


def _posted_lists(request: HttpRequest) -> dict[str, list[str]]:
    return {key: values for key, values in request.POST.lists() if key != "csrfmiddlewaretoken"}


@dataclass(frozen=True)
class Validation:
    """What the editor shows about a set of answers: field errors, or else feasibility findings."""

    errors: dict[str, list[str]]
    findings: list[FindingView]
    values: Mapping[str, Sequence[str]]

    @property
    def flagged(self) -> list[str]:
        return sorted({target.name for item in self.findings for target in item.targets})

    @property
    def error_list(self) -> list[tuple[str, str, str]]:
        """(anchor, label, message) for the error summary."""
        sections = {section.key for section in forms.REQUIREMENTS_SECTIONS}
        return [
            (f"q-{name}" if name in sections else forms.anchor_id(name), requirements.field_label(name), message)
            for name, messages_ in self.errors.items()
            for message in messages_
        ]

    @property
    def client_data(self) -> dict[str, Any]:
        return {"errors": self.errors, "flagged": self.flagged}


def _validate(values: Mapping[str, Sequence[str]]) -> Validation:
    try:
        parsed = services.requirements_parse(forms.requirements_answers_from_post(values))
    except exceptions.RequirementsInvalid as error:
        return Validation(forms.requirements_field_errors(error.extra.get("errors", [])), [], values)
    return Validation({}, _finding_views(requirements.feasibility_check(parsed), values), values)


def _requirements_editor(
    request: HttpRequest,
    membership: Membership,
    agent: Agent,
    values: Mapping[str, Sequence[str]],
    validation: Validation,
    message: str = "",
    status: int = 200,
) -> HttpResponse:
    sections = forms.requirements_form_bind(values, validation.errors, validation.flagged)
    return _render(
        request,
        membership,
        "frontend/requirements/edit.html",
        {
            "agent": agent,
            "tab": "requirements",
            "sections": sections,
            "validation": validation,
            "message": message,
        },
        status=status,
    )


@workspace_view()
@require_http_methods(["GET", "POST"])
def requirements_edit_view(request: HtmxHttpRequest, membership: Membership, agent_slug: str) -> HttpResponse:
    agent = selectors.agent_get(workspace=membership.workspace, slug=agent_slug)
    if request.method == "GET":
        current = agent.current_requirements
        values = forms.requirements_form_values(
            current.answers if current is not None else forms.REQUIREMENTS_STARTING_ANSWERS
        )
        return _requirements_editor(request, membership, agent, values, _validate(values))

    values = _posted_lists(request)
    message = request.POST.get("message", "").strip()
    try:
        version = services.requirements_version_create(
            agent=agent,
            answers=forms.requirements_answers_from_post(values),
            message=message,
            created_by=membership.user,
        )
    except exceptions.RequirementsInvalid as error:
        validation = Validation(forms.requirements_field_errors(error.extra.get("errors", [])), [], values)
        messages.error(request, "Nothing was saved: fix the fields marked below.")
        return _requirements_editor(request, membership, agent, values, validation, message, status=422)
    findings = requirements.feasibility_check(requirements.Requirements.model_validate(version.answers))
    severities = Counter(finding.severity for finding in findings)
    messages.success(request, f"Saved requirements v{version.version}; it is now current.")
    for finding in findings:
        if finding.severity is requirements.Severity.ERROR:
            messages.error(request, f"Feasibility error: {finding.message}")
        elif finding.severity is requirements.Severity.WARNING:
            messages.warning(request, f"Feasibility warning: {finding.message}")
    if not severities:
        messages.info(request, "The feasibility check found no contradictions.")
    return redirect("frontend:agent_detail", workspace_slug=membership.workspace.slug, agent_slug=agent.slug)


@workspace_view()
@require_POST
def requirements_validate_view(request: HtmxHttpRequest, membership: Membership, agent_slug: str) -> HttpResponse:
    """The editor's live check: the posted form's field errors, or its feasibility findings."""
    agent = selectors.agent_get(workspace=membership.workspace, slug=agent_slug)
    return _render(
        request,
        membership,
        "frontend/requirements/_validation.html",
        {"agent": agent, "validation": _validate(_posted_lists(request))},
    )


def _display(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list) and all(isinstance(item, str | int | float) for item in value):
        return ", ".join(str(item) for item in value) or "(none)"
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


@dataclass(frozen=True)
class ChangeView:
    path: str
    label: str
    kind: str
    before: str
    after: str
    section: str


def _version_number(text: str | None) -> int | None:
    # isdigit() alone takes digits int() refuses, such as '²'.
    return int(text) if text and text.isascii() and text.isdigit() else None


@workspace_view()
@require_GET
def requirements_history_view(request: HtmxHttpRequest, membership: Membership, agent_slug: str) -> HttpResponse:
    agent = selectors.agent_get(workspace=membership.workspace, slug=agent_slug)
    versions = list(selectors.requirements_version_list(agent=agent))
    by_number = {version.version: version for version in versions}
    before_number = _version_number(request.GET.get("a"))
    after_number = _version_number(request.GET.get("b"))
    if before_number is None and after_number is None and len(versions) >= 2:
        # By default, what the latest version changed.
        before_number, after_number = versions[1].version, versions[0].version
    changes: list[ChangeView] | None = None
    before = by_number.get(before_number) if before_number is not None else None
    after = by_number.get(after_number) if after_number is not None else None
    if before is not None and after is not None:
        changes = [
            ChangeView(
                path=change.path,
                label=requirements.field_label(change.path),
                kind=change.kind,
                before=_display(change.before),
                after=_display(change.after),
                section=change.path.split(".", 1)[0],
            )
            for change in requirements.requirements_diff(before.answers, after.answers)
        ]
    return _render(
        request,
        membership,
        "frontend/requirements/history.html",
        {
            "agent": agent,
            "tab": "history",
            "versions": versions,
            "before": before,
            "after": after,
            "changes": changes,
        },
    )


@workspace_view()
@require_POST
def requirements_activate_view(
    request: HtmxHttpRequest, membership: Membership, agent_slug: str, version: int
) -> HttpResponse:
    agent = selectors.agent_get(workspace=membership.workspace, slug=agent_slug)
    found = selectors.requirements_version_get(agent=agent, version=version)
    try:
        services.requirements_version_activate(agent=agent, version=found, user=membership.user)
    except exceptions.RequirementsInvalid as error:
        messages.error(request, f"Requirements v{found.version} was not made current: {error.detail}")
    else:
        messages.success(request, f"Requirements v{found.version} is current again.")
    return redirect("frontend:requirements_history", workspace_slug=membership.workspace.slug, agent_slug=agent.slug)


# --- Derived configuration -------------------------------------------------------------------------------

CONFIGURATION_TITLES = {
    "allowed_tiers": "Allowed tiers",
    "tier_budgets": "Tier budgets",
    "budgets": "Budgets",
    "approval_rules": "Approval rules",
    "tool_allow_list": "Tool allow list",
    "mandatory_guardrails": "Mandatory guardrails",
    "eval_suites": "Eval suites",
    "router": "Router",
    "trajectory_sampling_rate": "Trajectory sampling",
}


@dataclass(frozen=True)
class ConfigurationCard:
    key: str
    title: str
    derived: requirements.Derived
    sources: list[forms.FindingTarget]

    @property
    def templates(self) -> list[str]:
        return [f"frontend/configuration/_{self.key}.html", "frontend/configuration/_value.html"]


@workspace_view()
@require_GET
def configuration_view(request: HtmxHttpRequest, membership: Membership, agent_slug: str) -> HttpResponse:
    agent = selectors.agent_get(workspace=membership.workspace, slug=agent_slug)
    current = selectors.requirements_current(agent=agent)
    cards: list[ConfigurationCard] = []
    errors: list[FindingView] = []
    if current is not None:
        values = forms.requirements_form_values(current.to_json())
        derived = requirements.derived_configuration(current)
        for key in type(derived).model_fields:
            item = getattr(derived, key)
            cards.append(
                ConfigurationCard(
                    key=key,
                    title=CONFIGURATION_TITLES.get(key, key.replace("_", " ").capitalize()),
                    derived=item,
                    sources=forms.finding_targets(item.sources, values),
                )
            )
        errors = _finding_views(
            (f for f in requirements.feasibility_check(current) if f.severity is requirements.Severity.ERROR),
            values,
        )
    return _render(
        request,
        membership,
        "frontend/configuration/detail.html",
        {"agent": agent, "tab": "configuration", "cards": cards, "errors": errors, "current": current},
    )


# --- Prompts --------------------------------------------------------------------------------------------

_PROMPT_FIELDS = {"label": "labels", "labels": "labels", "": ""}


@workspace_view()
@require_GET
def prompt_list_view(request: HtmxHttpRequest, membership: Membership) -> HttpResponse:
    prompt_rows = selectors.prompt_list(workspace=membership.workspace)
    return _render(request, membership, "frontend/prompts/list.html", {"prompts": prompt_rows})


@workspace_view()
@require_http_methods(["GET", "POST"])
def agent_prompt_list_view(request: HtmxHttpRequest, membership: Membership, agent_slug: str) -> HttpResponse:
    agent = selectors.agent_get(workspace=membership.workspace, slug=agent_slug)
    form = forms.PromptCreateForm(request.POST if request.method == "POST" else None)
    if form.is_bound and form.is_valid():
        data = form.cleaned_data
        try:
            version = services.prompt_create(
                agent=agent,
                name=data["name"],
                type=data["type"],
                template=data["template"],
                config=data["config"],
                commit_message=data["commit_message"],
                labels=data["labels"],
                created_by=membership.user,
            )
        except (exceptions.PromptNameTaken, exceptions.PromptInvalid, exceptions.PromptLabelInvalid) as error:
            _keel_errors_to_form(form, error, {**_PROMPT_FIELDS, "": "name"})
        else:
            messages.success(request, f"Created prompt {version.prompt.name} with v1.")
            return redirect(
                "frontend:prompt_detail", workspace_slug=membership.workspace.slug, prompt_id=version.prompt_id
            )
    prompt_rows = selectors.prompt_list(workspace=membership.workspace, agent=agent)
    return _render(
        request,
        membership,
        "frontend/prompts/agent_list.html",
        {"agent": agent, "tab": "prompts", "prompts": prompt_rows, "form": form},
        status=422 if form.errors else 200,
    )


@dataclass(frozen=True)
class VersionView:
    version: PromptVersion
    template_text: str
    config_text: str
    variables: list[str]
    placeholders: list[str]
    labels: list[str]
    is_latest: bool

    @property
    def messages(self) -> list[dict[str, Any]]:
        """A chat template's messages, for showing one block per message; empty for text."""
        template = self.version.template
        return [item for item in template if isinstance(item, dict)] if isinstance(template, list) else []


@dataclass(frozen=True)
class TryIt:
    version: VersionView
    variables: list[tuple[str, str]]
    placeholders: list[tuple[str, str]]
    errors: dict[str, str]


def _version_views(versions: Sequence[PromptVersion]) -> list[VersionView]:
    latest = max((version.version for version in versions), default=None)
    return [
        VersionView(
            version=version,
            template_text=forms.template_format(version.template),
            config_text=forms.config_format(version.config),
            variables=prompts.template_variables(version.template),
            placeholders=prompts.template_placeholders(version.template),
            labels=sorted(label.name for label in version.labels.all()),
            is_latest=version.version == latest,
        )
        for version in versions
    ]


def _try_it(views: Sequence[VersionView], query: Mapping[str, str], render_input: forms.RenderInput) -> TryIt | None:
    if not views:
        return None
    chosen = next((view for view in views if view.version.version == render_input.version), None)
    if chosen is None:
        chosen = next((view for view in views if "production" in view.labels), views[0])
    return TryIt(
        version=chosen,
        variables=[(name, query.get(f"var.{name}", "")) for name in chosen.variables],
        placeholders=[(name, query.get(f"placeholder.{name}", "")) for name in chosen.placeholders],
        errors=render_input.errors,
    )


def _prompt_page(
    request: HttpRequest,
    membership: Membership,
    prompt: Prompt,
    version_form: forms.PromptVersionForm | None = None,
    label_form: forms.PromptLabelMoveForm | None = None,
    details_form: forms.PromptDetailsForm | None = None,
    status: int = 200,
) -> HttpResponse:
    views = _version_views(list(selectors.prompt_version_list(prompt=prompt)))
    moves = selectors.prompt_label_move_list(prompt=prompt, limit=20)
    by_number = {view.version.version: view for view in views}
    latest = views[0] if views else None
    if version_form is None:
        version_form = forms.PromptVersionForm(
            prompt_type=latest.version.type if latest else PromptType.TEXT,
            initial={
                "template": latest.template_text if latest else "",
                "config": latest.config_text if latest else "{}",
            },
        )
    labels = sorted((label, view) for view in views for label in view.labels)
    diff_from = _version_number(request.GET.get("from"))
    diff_to = _version_number(request.GET.get("to"))
    if diff_from is None and diff_to is None and len(views) >= 2:
        diff_from, diff_to = views[1].version.version, views[0].version.version
    diff = None
    before = by_number.get(diff_from) if diff_from is not None else None
    after = by_number.get(diff_to) if diff_to is not None else None
    if before is not None and after is not None:
        diff = prompts.prompt_diff(
            before.version.template,
            before.version.config,
            after.version.template,
            after.version.config,
            before_name=f"v{before.version.version}",
            after_name=f"v{after.version.version}",
        )
    query = request.GET.dict()
    return _render(
        request,
        membership,
        "frontend/prompts/detail.html",
        {
            "agent": prompt.agent,
            "prompt": prompt,
            "versions": views,
            "latest": latest,
            "labels": labels,
            "moves": moves,
            "version_form": version_form,
            "label_form": label_form or forms.PromptLabelMoveForm(),
            "details_form": details_form or forms.PromptDetailsForm.for_prompt(prompt),
            "diff": diff,
            "diff_from": before,
            "diff_to": after,
            "try_it": _try_it(views, query, forms.render_input_parse(query)),
        },
        status=status,
    )


@workspace_view()
@require_GET
def prompt_detail_view(request: HtmxHttpRequest, membership: Membership, prompt_id: int) -> HttpResponse:
    prompt = selectors.prompt_get_by_id(workspace=membership.workspace, prompt_id=prompt_id)
    return _prompt_page(request, membership, prompt)


@workspace_view()
@require_POST
def prompt_version_create_view(request: HtmxHttpRequest, membership: Membership, prompt_id: int) -> HttpResponse:
    prompt = selectors.prompt_get_by_id(workspace=membership.workspace, prompt_id=prompt_id)
    prompt_type = selectors.prompt_version_latest(prompt=prompt).type
    form = forms.PromptVersionForm(request.POST, prompt_type=prompt_type)
    if form.is_valid():
        data = form.cleaned_data
        try:
            version = services.prompt_version_create(
                prompt=prompt,
                template=data["template"],
                config=data["config"],
                commit_message=data["commit_message"],
                labels=data["labels"],
                created_by=membership.user,
            )
        except (exceptions.PromptInvalid, exceptions.PromptLabelInvalid) as error:
            _keel_errors_to_form(form, error, {**_PROMPT_FIELDS, "": "template"})
        else:
            moved = f" with {', '.join(data['labels'])}" if data["labels"] else ""
            messages.success(request, f"Published {prompt.name} v{version.version}{moved}.")
            return redirect(
                reverse("frontend:prompt_detail", args=[membership.workspace.slug, prompt.pk]) + "#versions"
            )
    return _prompt_page(request, membership, prompt, version_form=form, status=422)


@workspace_view()
@require_POST
def prompt_label_move_view(request: HtmxHttpRequest, membership: Membership, prompt_id: int) -> HttpResponse:
    """Point a label at a version: deploying a new version or rolling back to an old one."""
    prompt = selectors.prompt_get_by_id(workspace=membership.workspace, prompt_id=prompt_id)
    form = forms.PromptLabelMoveForm(request.POST)
    if form.is_valid():
        version = selectors.prompt_version_get(prompt=prompt, version=form.cleaned_data["version"])
        try:
            services.prompt_label_move(
                prompt=prompt, label=form.cleaned_data["label"], version=version, moved_by=membership.user
            )
        except exceptions.PromptLabelInvalid as error:
            _keel_errors_to_form(form, error, {"": "label"})
        else:
            messages.success(request, f"{form.cleaned_data['label']} now points at v{version.version}.")
            return redirect(reverse("frontend:prompt_detail", args=[membership.workspace.slug, prompt.pk]) + "#labels")
    return _prompt_page(request, membership, prompt, label_form=form, status=422)


@workspace_view()
@require_POST
def prompt_update_view(request: HtmxHttpRequest, membership: Membership, prompt_id: int) -> HttpResponse:
    """Change the prompt's description and tags."""
    prompt = selectors.prompt_get_by_id(workspace=membership.workspace, prompt_id=prompt_id)
    form = forms.PromptDetailsForm(request.POST)
    if form.is_valid():
        try:
            services.prompt_update(
                prompt=prompt, description=form.cleaned_data["description"], tags=form.cleaned_data["tags"]
            )
        except exceptions.PromptInvalid as error:
            _keel_errors_to_form(form, error, {})
        else:
            messages.success(request, f"Saved the description and tags of {prompt.name}.")
            return redirect(reverse("frontend:prompt_detail", args=[membership.workspace.slug, prompt.pk]) + "#details")
    return _prompt_page(request, membership, prompt, details_form=form, status=422)


@workspace_view(view_role=Role.MEMBER)
@require_http_methods(["GET", "POST"])
def prompt_delete_view(request: HtmxHttpRequest, membership: Membership, prompt_id: int) -> HttpResponse:
    """Delete the prompt, after a confirmation that says what goes with it, or why it cannot go yet."""
    prompt = selectors.prompt_get_by_id(workspace=membership.workspace, prompt_id=prompt_id)
    status = 200
    if request.method == "POST":
        try:
            services.prompt_delete(prompt=prompt, deleted_by=membership.user)
        except exceptions.PromptInUse:
            # Refused: the page below names the reasons, read by the same selector the service used.
            status = 409
        else:
            messages.success(request, f"Deleted the prompt {prompt.name} with its versions and labels.")
            return redirect(
                "frontend:agent_prompt_list", workspace_slug=membership.workspace.slug, agent_slug=prompt.agent.slug
            )
    versions = list(selectors.prompt_version_list(prompt=prompt))
    return _render(
        request,
        membership,
        "frontend/prompts/delete.html",
        {
            "agent": prompt.agent,
            "prompt": prompt,
            "versions": len(versions),
            "labels": sorted(label.name for version in versions for label in version.labels.all()),
            "reasons": selectors.prompt_in_use_reasons(prompt=prompt),
        },
        status=status,
    )


@workspace_view(view_role=Role.MEMBER)
@require_http_methods(["GET", "POST"])
def prompt_label_delete_view(
    request: HtmxHttpRequest, membership: Membership, prompt_id: int, label: str
) -> HttpResponse:
    """Remove a label after a confirmation; the API allows every label, production included, and so does this."""
    prompt = selectors.prompt_get_by_id(workspace=membership.workspace, prompt_id=prompt_id)
    found = selectors.prompt_label_get(prompt=prompt, label=label)
    if request.method == "GET":
        return _render(
            request,
            membership,
            "frontend/prompts/label_delete.html",
            {"agent": prompt.agent, "prompt": prompt, "label": found},
        )
    services.prompt_label_delete(prompt=prompt, label=found.name, moved_by=membership.user)
    messages.success(request, f"Removed the label {found.name} (it pointed at v{found.version.version}).")
    return redirect(reverse("frontend:prompt_detail", args=[membership.workspace.slug, prompt.pk]) + "#labels")


@workspace_view()
@require_GET
def prompt_render_view(request: HtmxHttpRequest, membership: Membership, prompt_id: int) -> HttpResponse:
    """The try-it box: `panel=1` redraws the inputs for another version; otherwise render the template."""
    prompt = selectors.prompt_get_by_id(workspace=membership.workspace, prompt_id=prompt_id)
    query = request.GET.dict()
    render_input = forms.render_input_parse(query)
    views = _version_views(list(selectors.prompt_version_list(prompt=prompt)))
    try_it = _try_it(views, query, render_input)
    context: dict[str, Any] = {"prompt": prompt, "agent": prompt.agent, "versions": views, "try_it": try_it}
    if request.htmx and query.get("panel"):
        return _render(request, membership, "frontend/prompts/_try_it.html", context)
    if try_it is not None and not render_input.errors:
        try:
            output = services.prompt_version_render(
                version=try_it.version.version,
                variables=render_input.variables,
                placeholders=render_input.placeholders,
            )
        except exceptions.PromptVariablesMissing as error:
            context["render_error"] = error.detail
            context["missing"] = [str(item["field"]).removeprefix("variables.") for item in error.extra["errors"]]
        else:
            context["output"] = output if isinstance(output, str) else json.dumps(output, indent=2, ensure_ascii=False)
    template = "frontend/prompts/_render_result.html" if request.htmx else "frontend/prompts/render.html"
    return _render(request, membership, template, context)


# --- API keys -------------------------------------------------------------------------------------------


@workspace_view(post_role=Role.OWNER)
@require_http_methods(["GET", "POST"])
def apikey_list_view(request: HtmxHttpRequest, membership: Membership) -> HttpResponse:
    agents = list(selectors.agent_list(workspace=membership.workspace))
    form = forms.ApiKeyCreateForm(request.POST if request.method == "POST" else None, agents=agents)
    if form.is_bound and form.is_valid():
        try:
            api_key, raw_key = services.apikey_create(
                workspace=membership.workspace,
                name=form.cleaned_data["name"],
                scopes=form.cleaned_data["scopes"],
                agents=form.cleaned_data["agents"],
                created_by=membership.user,
                expires_at=form.expires_at(),
            )
        except (exceptions.ApiKeyInvalid, exceptions.AgentNotFound) as error:
            _keel_errors_to_form(form, error, {"": "agents"})
        else:
            # The key exists in this one response only: not in a redirect URL, not in the session.
            response = _render(
                request, membership, "frontend/keys/created.html", {"api_key": api_key, "raw_key": raw_key}
            )
            response["Cache-Control"] = "no-store"
            return response
    keys = selectors.apikey_list(workspace=membership.workspace)
    return _render(
        request,
        membership,
        "frontend/keys/list.html",
        {"keys": keys, "form": form, "now": timezone.now()},
        status=422 if form.errors else 200,
    )


@workspace_view(post_role=Role.OWNER, view_role=Role.OWNER)
@require_http_methods(["GET", "POST"])
def apikey_revoke_view(request: HtmxHttpRequest, membership: Membership, key_id: int) -> HttpResponse:
    api_key = selectors.apikey_get(workspace=membership.workspace, key_id=key_id)
    if request.method == "GET":
        return _render(request, membership, "frontend/keys/revoke.html", {"api_key": api_key})
    services.apikey_revoke(api_key=api_key, revoked_by=membership.user)
    messages.success(request, f"Revoked {api_key.name} ({api_key.prefix}…). Clients using it now get 401.")
    return redirect("frontend:apikey_list", workspace_slug=membership.workspace.slug)


# --- Trajectories ---------------------------------------------------------------------------------------

TRAJECTORY_PAGE_SIZE = 50
SESSION_PAGE_SIZE = 200
# The htmx targets of the list: the whole result (a filter changed) or the rows after the last one.
RESULTS_TARGET = "trajectory-results"
MORE_TARGET = "trajectory-more"


def _query_string(query: QueryDict, **changes: str | None) -> str:
    """The query with `changes` applied and empty values dropped, so that shared links stay short."""
    values = {key: [value for value in query.getlist(key) if value] for key in query}
    for key, value in changes.items():
        values[key] = [value] if value else []
    encoded = QueryDict(mutable=True)
    for key, items in values.items():
        if items:
            encoded.setlist(key, items)
    return encoded.urlencode()


def _trajectory_list(request: HtmxHttpRequest, membership: Membership, agent: Agent | None) -> HttpResponse:
    workspace = membership.workspace
    agents = [agent] if agent is not None else list(selectors.agent_list(workspace=workspace))
    form = forms.TrajectoryFilterForm(
        request.GET,
        agents=agents,
        prompt_names=[prompt.name for prompt in selectors.prompt_list(workspace=workspace, agent=agent)],
        score_names=tracing_selectors.score_name_list(workspace=workspace),
    )
    form.is_valid()
    query = form.query(timezone.now())
    filters = dataclasses.replace(query.filters, agent_id=agent.pk) if agent is not None else query.filters
    cursor = request.GET.get("cursor") or None
    cursor_error = ""
    try:
        page = tracing_selectors.trajectory_list(
            workspace=workspace, filters=filters, order=query.order, limit=TRAJECTORY_PAGE_SIZE, cursor=cursor
        )
    except TrajectoryListInvalid as error:
        cursor_error, cursor = error.detail, None
        page = tracing_selectors.trajectory_list(
            workspace=workspace, filters=filters, order=query.order, limit=TRAJECTORY_PAGE_SIZE
        )
    list_url = (
        reverse("frontend:agent_trajectory_list", args=[workspace.slug, agent.slug])
        if agent is not None
        else reverse("frontend:trajectory_list", args=[workspace.slug])
    )
    context = {
        "agent": agent,
        "tab": "trajectories",
        "form": form,
        "page": page,
        "list_url": list_url,
        "cursor": cursor,
        "cursor_error": cursor_error,
        "first_page_query": _query_string(request.GET, cursor=None),
        "more_query": _query_string(request.GET, cursor=page.next_cursor) if page.next_cursor else "",
        "results_target": RESULTS_TARGET,
        "more_target": MORE_TARGET,
    }
    if request.htmx and request.htmx.target == MORE_TARGET:
        return _render(request, membership, "frontend/trajectories/_rows.html", context)
    if request.htmx and request.htmx.target == RESULTS_TARGET:
        return _render(request, membership, "frontend/trajectories/_results.html", context)
    template = "frontend/trajectories/agent_list.html" if agent is not None else "frontend/trajectories/list.html"
    return _render(request, membership, template, context)


@workspace_view()
@require_GET
def trajectory_list_view(request: HtmxHttpRequest, membership: Membership) -> HttpResponse:
    return _trajectory_list(request, membership, None)


@workspace_view()
@require_GET
def agent_trajectory_list_view(request: HtmxHttpRequest, membership: Membership, agent_slug: str) -> HttpResponse:
    agent = selectors.agent_get(workspace=membership.workspace, slug=agent_slug)
    return _trajectory_list(request, membership, agent)


def _selected_step(raw: str | None, steps: Sequence[display.StepView]) -> display.StepView | None:
    """The step the page opens on: the one in `?step=`, else the first error, else the first step."""
    if raw is not None and raw.isascii() and raw.isdigit() and int(raw) < len(steps):
        return steps[int(raw)]
    return next((item for item in steps if item.is_error), steps[0] if steps else None)


@dataclass(frozen=True)
class ScoreTarget:
    """The step option of the score form: the selected step, or the span a rejected form named."""

    span_id: str
    label: str
    chosen: bool


def step_through_context(request: HttpRequest, trajectory: Trajectory) -> dict[str, Any]:
    """What the step-through view shows of a trajectory (its steps, waterfall, the selected step and the
    triage signals with their evidence): shared by the trajectory page and the review queue."""
    view = tracing_selectors.trajectory_view(trajectory=trajectory)
    steps = display.step_views(view)
    total_ms = max(view.end_time_ns - view.start_time_ns, 0) / 1e6
    return {
        "trajectory": trajectory,
        "view": view,
        "steps": steps,
        "bars": display.waterfall(view, steps),
        "selected": _selected_step(request.GET.get("step"), steps),
        "step_count": len(steps),
        "first_error": next((item.index for item in steps if item.is_error), None),
        "scale": [total_ms * fraction for fraction in (0, 0.25, 0.5, 0.75, 1)],
        "signal_views": display.signal_views(trajectory.signals, len(steps)),
    }


def _trajectory_page(
    request: HttpRequest,
    membership: Membership,
    trajectory: Trajectory,
    score_form: forms.ScoreForm | None = None,
    replay_form: forms.ReplayForm | None = None,
    status: int = 200,
    dataset_form: DatasetAddForm | None = None,
) -> HttpResponse:
    context = step_through_context(request, trajectory)
    steps: list[display.StepView] = context["steps"]
    selected: display.StepView | None = context["selected"]
    can_edit = membership_can_edit(membership)
    if replay_form is None and can_edit:
        replay_form = _replay_form(membership, trajectory)
    if dataset_form is None and can_edit:
        dataset_form = DatasetAddForm(datasets=list(evals_selectors.dataset_list(workspace=membership.workspace)))
    scores = list(tracing_selectors.trajectory_score_list(trajectory=trajectory))
    step_of_span = display.first_step_of_span(steps)
    score_form = score_form or forms.ScoreForm()
    posted_span = str(score_form.data.get("span_id") or "").strip().lower() if score_form.is_bound else ""
    target = next((item for item in steps if item.step.span_id == posted_span), None) if posted_span else selected
    score_target = ScoreTarget(
        span_id=posted_span or (target.step.span_id if target is not None else ""),
        label=f"Step {target.index} · {target.title}" if target is not None else f"Span {posted_span}",
        chosen=bool(posted_span),
    )
    return _render(
        request,
        membership,
        "frontend/trajectories/detail.html",
        {
            **context,
            "scores": [(score, step_of_span.get(score.span_id)) for score in scores],
            "score_form": score_form,
            "prompt_versions": list(tracing_selectors.trajectory_prompt_version_list(trajectory=trajectory)),
            "score_target": score_target,
            "replay_form": replay_form,
            "dataset_form": dataset_form,
            "replays": list(tracing_selectors.replay_list(trajectory=trajectory)),
            "made_by": tracing_selectors.replay_of_trajectory(trajectory=trajectory)
            if trajectory.replay_of_id
            else None,
        },
        status=status,
    )


@workspace_view()
@require_GET
def trajectory_detail_view(request: HtmxHttpRequest, membership: Membership, trace_id: str) -> HttpResponse:
    trajectory = tracing_selectors.trajectory_get(workspace=membership.workspace, trace_id=trace_id)
    return _trajectory_page(request, membership, trajectory)


_SCORE_FIELDS = {"value": "value", "string_value": "category", "data_type": "data_type", "": "name"}


@workspace_view()
@require_POST
def trajectory_score_create_view(request: HtmxHttpRequest, membership: Membership, trace_id: str) -> HttpResponse:
    trajectory = tracing_selectors.trajectory_get(workspace=membership.workspace, trace_id=trace_id)
    form = forms.ScoreForm(request.POST)
    if form.is_valid():
        arguments = form.score_arguments()
        try:
            score = tracing_services.score_create(
                trajectory=trajectory, **arguments, source=ScoreSource.HUMAN, created_by=membership.user
            )
        except ScoreInvalid as error:
            fields = {
                **_SCORE_FIELDS,
                "string_value": "correction" if arguments["data_type"] == "correction" else "category",
            }
            _keel_errors_to_form(form, error, fields)
        else:
            target = "this trajectory" if not score.span_id else f"span {score.span_id}"
            messages.success(request, f"Added the score {score.name} = {keel_tags.score_value(score)} to {target}.")
            return redirect(
                reverse("frontend:trajectory_detail", args=[membership.workspace.slug, trace_id]) + "#scores"
            )
    return _trajectory_page(request, membership, trajectory, score_form=form, status=422)


# --- Sessions -------------------------------------------------------------------------------------------


@workspace_view()
@require_GET
def session_list_view(request: HtmxHttpRequest, membership: Membership) -> HttpResponse:
    cursor = request.GET.get("cursor") or None
    cursor_error = ""
    try:
        page = tracing_selectors.session_list(workspace=membership.workspace, limit=SESSION_PAGE_SIZE, cursor=cursor)
    except TrajectoryListInvalid as error:
        cursor_error, cursor = error.detail, None
        page = tracing_selectors.session_list(workspace=membership.workspace, limit=SESSION_PAGE_SIZE)
    return _render(
        request,
        membership,
        "frontend/sessions/list.html",
        {
            "sessions": page.items,
            "cursor": cursor,
            "cursor_error": cursor_error,
            "more_query": _query_string(request.GET, cursor=page.next_cursor) if page.next_cursor else "",
        },
    )


@dataclass(frozen=True)
class SessionTurnView:
    trajectory: Trajectory
    turn: display.SessionTurn


@workspace_view()
@require_GET
def session_detail_view(request: HtmxHttpRequest, membership: Membership, session_id: str) -> HttpResponse:
    trajectories = list(tracing_selectors.session_trajectories(workspace=membership.workspace, session_id=session_id))
    views = tracing_selectors.trajectory_views(trajectories=trajectories)
    turns = display.session_turns([views[trajectory.pk] for trajectory in trajectories])
    known_costs = [t.cost_usd for t in trajectories if t.cost_usd is not None]
    unpriced_calls = sum(t.unpriced_call_count for t in trajectories)
    return _render(
        request,
        membership,
        "frontend/sessions/detail.html",
        {
            "session_id": session_id,
            "turns": [SessionTurnView(t, turn) for t, turn in zip(trajectories, turns, strict=True)],
            "first": trajectories[0],
            "last": trajectories[-1],
            "total_tokens": sum(t.total_tokens for t in trajectories),
            # Unknown, not $0, when no turn's model calls were priced.
            "cost_usd": sum(known_costs, Decimal(0)) if known_costs or not unpriced_calls else None,
            "unpriced_calls": unpriced_calls,
            "unpriced_models": sorted({model for t in trajectories for model in t.unpriced_models}),
            "error_count": sum(t.error_count for t in trajectories),
            "agents": sorted({t.agent.name for t in trajectories if t.agent is not None}),
            "users": sorted({t.user_id for t in trajectories if t.user_id}),
        },
    )


# --- Replays --------------------------------------------------------------------------------------------

REPLAY_POLL_STATUSES = (ReplayStatus.PENDING, ReplayStatus.RUNNING)
_REPLAY_FIELDS = {"": "from_step", "from_step": "from_step", "prompt_version": "prompt_version", "model": "model"}


def _replay_form(membership: Membership, trajectory: Trajectory, data: QueryDict | None = None) -> forms.ReplayForm:
    """The replay form, offering the prompt versions of the trajectory's agent."""
    agent = trajectory.agent
    prompts = selectors.prompt_list(workspace=membership.workspace, agent=agent) if agent is not None else []
    return forms.ReplayForm(data, prompts=prompts)


@workspace_view()
@require_POST
def trajectory_replay_create_view(request: HtmxHttpRequest, membership: Membership, trace_id: str) -> HttpResponse:
    trajectory = tracing_selectors.trajectory_get(workspace=membership.workspace, trace_id=trace_id)
    form = _replay_form(membership, trajectory, request.POST)
    if form.is_valid():
        data = form.cleaned_data
        wanted = form.prompt_version_wanted()
        prompt_version = (
            selectors.prompt_version_resolve(workspace=membership.workspace, name=wanted[0], version=wanted[1])
            if wanted is not None
            else None
        )
        try:
            created = replay.replay_create(
                original=trajectory,
                from_step=data["from_step"],
                prompt_version=prompt_version,
                model=data["model"].strip(),
                divergence_policy=data["divergence"],
                stub_result=data["stub_result"],
                max_steps=data["max_steps"] or replay.DEFAULT_MAX_STEPS,
                created_by=membership.user,
            )
        except ReplayInvalid as error:
            _keel_errors_to_form(form, error, {**_REPLAY_FIELDS, "divergence": "divergence", "max_steps": "max_steps"})
        except ReplayConflict as error:
            form.add_error(None, error.detail)
        else:
            messages.success(request, f"Replay {created.pk} is queued: it re-runs from step {created.from_step}.")
            return redirect("frontend:replay_detail", workspace_slug=membership.workspace.slug, replay_id=created.pk)
    return _trajectory_page(request, membership, trajectory, replay_form=form, status=422)


@workspace_view()
@require_GET
def replay_detail_view(request: HtmxHttpRequest, membership: Membership, replay_id: int) -> HttpResponse:
    """A replay: progress while it runs (htmx asks again every second), then the diff against its original."""
    found = tracing_selectors.replay_get(workspace=membership.workspace, replay_id=replay_id)
    context: dict[str, Any] = {
        "replay": found,
        "original": found.original,
        "polling": found.status in REPLAY_POLL_STATUSES,
        "percent": min(100, round(100 * found.steps_done / found.steps_planned)) if found.steps_planned else 0,
    }
    if found.replay_trajectory is not None and not context["polling"]:
        views = tracing_selectors.trajectory_views(trajectories=[found.original, found.replay_trajectory])
        original_view, replay_view = views[found.original.pk], views[found.replay_trajectory.pk]
        diff = replay_diff(original_view, replay_view, from_step=found.from_step)
        rows = display.diff_rows(diff, original_view, replay_view)
        context.update(
            diff=diff,
            diff_totals=[
                ("Original", diff.totals.original),
                ("Replay", diff.totals.replay),
                ("Original, from the re-made call", diff.replayed_totals.original),
                ("Replay, from the re-made call", diff.replayed_totals.replay),
            ],
            history=[row for row in rows if not row.pair.replayed],
            replayed=[row for row in rows if row.pair.replayed],
            same_history=sum(1 for row in rows if not row.pair.replayed and row.pair.status == "same"),
        )
    template = "frontend/replays/_status.html" if request.htmx else "frontend/replays/detail.html"
    return _render(request, membership, template, context)
