"""Settings pages: an agent's settings (name, description, status, trace retention) and its deletion, the
workspace's integrations: the Langfuse mirror (owners configure it; everyone reads its delivery status)
and model price overrides (members set them), and the audit log (owners read it)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

from django.apps import apps
from django.contrib import messages
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from agent_registry import exceptions as registry_exceptions
from agent_registry import selectors, services
from agent_registry.models import AuditAction, AuditEvent, Membership, Role
from frontend.access import HtmxHttpRequest, role_allows, workspace_view
from frontend.settings_forms import AgentSettingsForm, LangfuseMirrorForm, ModelPriceForm, decimal_plain
from frontend.views import _keel_errors_to_form, _query_string, _render
from tracing import exceptions, langfuse_bridge
from tracing import selectors as tracing_selectors
from tracing import services as tracing_services
from tracing.models import LangfuseMirror, ModelPriceOverride

# --- Agent settings -------------------------------------------------------------------------------------


@workspace_view()
@require_http_methods(["GET", "POST"])
def agent_settings_view(request: HtmxHttpRequest, membership: Membership, agent_slug: str) -> HttpResponse:
    agent = selectors.agent_get(workspace=membership.workspace, slug=agent_slug)
    form = AgentSettingsForm.for_agent(agent, request.POST if request.method == "POST" else None)
    if form.is_bound and form.is_valid():
        try:
            services.agent_update(agent=agent, fields=form.agent_fields(), updated_by=membership.user)
        except DjangoValidationError as error:
            for field, field_messages in error.message_dict.items():
                form.add_error(field if field in form.fields else None, field_messages)
        except registry_exceptions.AgentInvalid as error:
            _keel_errors_to_form(form, error, {})
        else:
            messages.success(request, f"Saved the settings of {agent.name}.")
            return redirect("frontend:agent_settings", workspace_slug=membership.workspace.slug, agent_slug=agent.slug)
        # The service set the rejected values on the instance before it checked them: show the saved agent.
        agent = selectors.agent_get(workspace=membership.workspace, slug=agent_slug)
    return _render(
        request,
        membership,
        "frontend/agents/settings.html",
        {"agent": agent, "tab": "settings", "form": form},
        status=422 if form.errors else 200,
    )


@workspace_view(view_role=Role.MEMBER)
@require_http_methods(["GET", "POST"])
def agent_delete_view(request: HtmxHttpRequest, membership: Membership, agent_slug: str) -> HttpResponse:
    """Delete the agent after a confirmation. Members may, as any key with the write scope may through the API."""
    agent = selectors.agent_get(workspace=membership.workspace, slug=agent_slug)
    if request.method == "POST":
        services.agent_delete(agent=agent, deleted_by=membership.user)
        messages.success(request, f"Deleted the agent {agent.name} with its requirements and prompts.")
        return redirect("frontend:agent_list", workspace_slug=membership.workspace.slug)
    return _render(
        request,
        membership,
        "frontend/agents/delete.html",
        {
            "agent": agent,
            "requirements_versions": selectors.requirements_version_list(agent=agent).count(),
            "prompts": list(selectors.prompt_list(workspace=membership.workspace, agent=agent)),
            # The keys limited to this agent alone, which agent_delete revokes rather than widen.
            "keys": [
                api_key
                for api_key in selectors.apikey_list(workspace=membership.workspace, agent_ids=[agent.pk])
                if not api_key.is_revoked
            ],
        },
    )


# --- Integrations ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MirrorStatusView:
    mirror: LangfuseMirror
    pending: int
    failed: int

    @property
    def error_is_current(self) -> bool:
        """Whether the last delivery failed: its error is newer than its last success."""
        mirror = self.mirror
        if not mirror.last_error or mirror.last_error_at is None:
            return False
        return mirror.last_success_at is None or mirror.last_error_at > mirror.last_success_at


@dataclass(frozen=True)
class PriceRow:
    price: ModelPriceOverride
    input: str
    output: str
    cache_read: str


def _mirror_status(membership: Membership) -> MirrorStatusView | None:
    try:
        status = tracing_selectors.langfuse_mirror_status(workspace=membership.workspace)
    except exceptions.LangfuseMirrorNotFound:
        return None
    return MirrorStatusView(mirror=status.mirror, pending=status.pending, failed=status.failed)


def _integrations_page(
    request: HtmxHttpRequest,
    membership: Membership,
    mirror_form: LangfuseMirrorForm | None = None,
    price_form: ModelPriceForm | None = None,
    status: int = 200,
) -> HttpResponse:
    mirror_status = _mirror_status(membership)
    mirror = mirror_status.mirror if mirror_status is not None else None
    prices = list(tracing_selectors.model_price_list(workspace=membership.workspace))
    if price_form is None:
        # "Change" on a row fills the form with that row (found among the workspace's own prices).
        wanted = request.GET.get("price")
        price_form = ModelPriceForm.for_price(next((price for price in prices if price.model == wanted), None))
    return _render(
        request,
        membership,
        "frontend/integrations/list.html",
        {
            "mirror_status": mirror_status,
            "mirror_form": mirror_form or LangfuseMirrorForm(mirror=mirror),
            "can_manage_mirror": role_allows(membership.role, Role.OWNER),
            "max_attempts": langfuse_bridge.MAX_ATTEMPTS,
            "prices": [
                PriceRow(
                    price=price,
                    input=decimal_plain(price.input_usd_per_million),
                    output=decimal_plain(price.output_usd_per_million),
                    cache_read=decimal_plain(price.cache_read_usd_per_million),
                )
                for price in prices
            ],
            "price_form": price_form,
        },
        status=status,
    )


@workspace_view()
@require_GET
def integration_list_view(request: HtmxHttpRequest, membership: Membership) -> HttpResponse:
    return _integrations_page(request, membership)


@workspace_view(post_role=Role.OWNER)
@require_POST
def langfuse_mirror_configure_view(request: HtmxHttpRequest, membership: Membership) -> HttpResponse:
    mirror_status = _mirror_status(membership)
    form = LangfuseMirrorForm(request.POST, mirror=mirror_status.mirror if mirror_status is not None else None)
    if form.is_valid():
        try:
            mirror = langfuse_bridge.langfuse_mirror_configure(
                workspace=membership.workspace, configured_by=membership.user, **form.configure_arguments()
            )
        except exceptions.LangfuseMirrorInvalid as error:
            _keel_errors_to_form(form, error, {})
        else:
            state = "mirrors new spans and scores to" if mirror.enabled else "is paused; it would mirror to"
            messages.success(request, f"Saved the Langfuse mirror: this workspace {state} {mirror.host}.")
            return redirect("frontend:integration_list", workspace_slug=membership.workspace.slug)
    return _integrations_page(request, membership, mirror_form=form, status=422)


@workspace_view(post_role=Role.OWNER)
@require_POST
def langfuse_export_retry_view(request: HtmxHttpRequest, membership: Membership) -> HttpResponse:
    retried = langfuse_bridge.langfuse_export_retry_failed(workspace=membership.workspace)
    if retried:
        messages.success(request, f"Sending {retried} failed deliver{'y' if retried == 1 else 'ies'} again.")
    else:
        messages.info(request, "No failed deliveries to send again.")
    return redirect("frontend:integration_list", workspace_slug=membership.workspace.slug)


@workspace_view(post_role=Role.OWNER, view_role=Role.OWNER)
@require_http_methods(["GET", "POST"])
def langfuse_mirror_delete_view(request: HtmxHttpRequest, membership: Membership) -> HttpResponse:
    """Stop mirroring, after a confirmation: the settings go, and the deliveries not yet sent with them."""
    mirror_status = _mirror_status(membership)
    if request.method == "GET":
        return _render(
            request, membership, "frontend/integrations/langfuse_delete.html", {"mirror_status": mirror_status}
        )
    langfuse_bridge.langfuse_mirror_delete(workspace=membership.workspace, deleted_by=membership.user)
    if mirror_status is not None:
        messages.success(request, f"Stopped mirroring to {mirror_status.mirror.host}.")
    else:
        messages.info(request, "This workspace was not mirroring to Langfuse: nothing to stop.")
    return redirect("frontend:integration_list", workspace_slug=membership.workspace.slug)


@workspace_view()
@require_POST
def model_price_delete_view(request: HtmxHttpRequest, membership: Membership) -> HttpResponse:
    model = request.POST.get("model", "")
    try:
        tracing_services.model_price_delete(workspace=membership.workspace, model=model, deleted_by=membership.user)
    except exceptions.ModelPriceNotFound:
        messages.info(request, f"{model} had no price of this workspace's own: nothing to remove.")
    else:
        messages.success(request, f"Removed the price of {model}: new spans of it are priced from litellm's map.")
    return redirect("frontend:integration_list", workspace_slug=membership.workspace.slug)


@workspace_view()
@require_POST
def model_price_set_view(request: HtmxHttpRequest, membership: Membership) -> HttpResponse:
    form = ModelPriceForm(request.POST)
    if form.is_valid():
        try:
            price = tracing_services.model_price_set(
                workspace=membership.workspace, set_by=membership.user, **form.price_arguments()
            )
        except exceptions.ModelPriceInvalid as error:
            _keel_errors_to_form(form, error, {})
        else:
            messages.success(request, f"Saved the price of {price.model}: it applies to generation spans from now on.")
            return redirect("frontend:integration_list", workspace_slug=membership.workspace.slug)
    return _integrations_page(request, membership, price_form=form, status=422)


# --- Audit log ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AuditRow:
    event: AuditEvent
    target_kind: str
    details: list[tuple[str, str]]


def _audit_row(event: AuditEvent) -> AuditRow:
    try:
        kind = str(apps.get_model(event.target_type)._meta.verbose_name) if event.target_type else ""
    except (LookupError, ValueError):
        kind = event.target_type
    details = [
        (key, value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))
        for key, value in event.details.items()
    ]
    return AuditRow(event=event, target_kind=kind, details=details)


def _day(text: str | None) -> date | None:
    try:
        return date.fromisoformat(text) if text else None
    except ValueError:
        return None


@workspace_view(view_role=Role.OWNER)
@require_GET
def audit_event_list_view(request: HtmxHttpRequest, membership: Membership) -> HttpResponse:
    """Who did what to the workspace's keys, policies, targets, labels, approvals, exports and settings."""
    workspace = membership.workspace
    action = request.GET.get("action") or ""
    groups = sorted({value.split(".")[0] for value in AuditAction.values})
    if action not in AuditAction.values and action.removesuffix(".") not in groups:
        action = ""
    actors = selectors.audit_actor_list(workspace=workspace)
    actor = request.GET.get("actor") or ""
    if actor not in actors and actor != "keel":
        actor = ""
    # Whole UTC days, both ends included.
    since_day, until_day = _day(request.GET.get("since")), _day(request.GET.get("until"))
    since = datetime.combine(since_day, time.min, tzinfo=UTC) if since_day else None
    until = datetime.combine(until_day + timedelta(days=1), time.min, tzinfo=UTC) if until_day else None

    def listed(cursor: str | None = None) -> selectors.AuditEventPage:
        return selectors.audit_event_list(
            workspace=workspace, action=action or None, actor=actor or None, since=since, until=until, cursor=cursor
        )

    try:
        page = listed(request.GET.get("cursor") or None)
    except registry_exceptions.AuditEventListInvalid:
        messages.info(request, "That page of the audit log is gone: showing the newest events.")
        page = listed()
    return _render(
        request,
        membership,
        "frontend/audit/list.html",
        {
            "page": page,
            "rows": [_audit_row(event) for event in page.events],
            "action": action,
            "action_choices": AuditAction.choices,
            "action_groups": [f"{group}." for group in groups],
            "actor": actor,
            "actors": actors,
            "since": since_day.isoformat() if since_day else "",
            "until": until_day.isoformat() if until_day else "",
            "filtered": bool(action or actor or since_day or until_day),
            "next_query": _query_string(request.GET, cursor=page.next_cursor) if page.next_cursor else None,
            "first_query": _query_string(request.GET, cursor=None) if request.GET.get("cursor") else None,
        },
    )
