"""Settings pages: an agent's settings (name, description, status, trace retention) and its deletion, and
the workspace's integrations: the Langfuse mirror (owners configure it; everyone reads its delivery
status) and model price overrides (members set them)."""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib import messages
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from agent_registry import exceptions as registry_exceptions
from agent_registry import selectors, services
from agent_registry.models import Membership, Role
from frontend.access import HtmxHttpRequest, role_allows, workspace_view
from frontend.settings_forms import AgentSettingsForm, LangfuseMirrorForm, ModelPriceForm, decimal_plain
from frontend.views import _keel_errors_to_form, _render
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
            services.agent_update(agent=agent, fields=form.agent_fields())
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
        services.agent_delete(agent=agent)
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
                workspace=membership.workspace, **form.configure_arguments()
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
    langfuse_bridge.langfuse_mirror_delete(workspace=membership.workspace)
    if mirror_status is not None:
        messages.success(request, f"Stopped mirroring to {mirror_status.mirror.host}.")
    else:
        messages.info(request, "This workspace was not mirroring to Langfuse: nothing to stop.")
    return redirect("frontend:integration_list", workspace_slug=membership.workspace.slug)


@workspace_view()
@require_POST
def model_price_set_view(request: HtmxHttpRequest, membership: Membership) -> HttpResponse:
    form = ModelPriceForm(request.POST)
    if form.is_valid():
        try:
            price = tracing_services.model_price_set(workspace=membership.workspace, **form.price_arguments())
        except exceptions.ModelPriceInvalid as error:
            _keel_errors_to_form(form, error, {})
        else:
            messages.success(request, f"Saved the price of {price.model}: it applies to generation spans from now on.")
            return redirect("frontend:integration_list", workspace_slug=membership.workspace.slug)
    return _integrations_page(request, membership, price_form=form, status=422)
