from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.http import HttpRequest

from agent_registry import selectors
from agent_registry.models import Membership, User
from frontend.access import membership_can_edit, membership_can_manage_keys
from guardrails import selectors as guardrail_selectors
from routing import reports
from tracing import alerts

# The sidebar entry that a page belongs to, by the prefix of its URL name.
_SECTIONS = (
    ("workspace_home", "home"),
    ("agent", "agents"),
    ("requirements", "agents"),
    ("configuration", "agents"),
    ("prompt", "prompts"),
    ("apikey", "keys"),
    ("integration", "integrations"),
    ("langfuse", "integrations"),
    ("model_price", "integrations"),
    ("audit_event", "audit_log"),
    ("trajectory", "trajectories"),
    ("replay", "trajectories"),
    ("session", "sessions"),
    ("review", "review"),
    ("alert", "alerts"),
    ("model_target", "model_targets"),
    ("routing_decision", "routing_decisions"),
    ("handoff", "handoffs"),
    ("cache", "cache_review"),
    ("guardrail_violation", "guardrail_violations"),
    ("guardrail_approval", "guardrail_approvals"),
    ("guardrail_budget", "guardrail_budgets"),
    ("eval_run", "eval_runs"),
    ("eval_online_rule", "eval_online_rules"),
    ("eval", "eval_suites"),
    ("training_curation", "training_curations"),
    ("training_export", "training_exports"),
    ("training_job", "training_jobs"),
)


def navigation(request: HttpRequest) -> dict[str, Any]:
    """The workspace switcher, the current workspace and what the user may do in it.

    Read from the URL rather than from the view, so that error pages (403, 404) raised inside a
    workspace still show its navigation, and a workspace the user is not in shows none.
    """
    context: dict[str, Any] = {"keel_version": settings.KEEL_VERSION}
    # The 500 page renders without a request, and so without a user.
    user = getattr(request, "user", None)
    if not isinstance(user, User):
        return context
    memberships = list(selectors.membership_list_for_user(user=user))
    match = request.resolver_match
    slug = match.kwargs.get("workspace_slug") if match is not None else None
    current = next((m for m in memberships if m.workspace.slug == slug), None)
    url_name = match.url_name if match is not None and match.url_name else ""
    section = next((name for prefix, name in _SECTIONS if url_name.startswith(prefix)), "")
    context.update(
        nav_memberships=memberships,
        nav_membership=current,
        nav_workspace=current.workspace if current is not None else None,
        nav_section=section,
        can_edit=membership_can_edit(current),
        can_manage_keys=membership_can_manage_keys(current),
        # The sidebar's badges, counted only when a page draws the sidebar (htmx fragments do not; a template
        # calls a callable, and the cache keeps it to one query however often the page reads it): alerts
        # nobody acknowledged yet, hand-offs nobody has taken yet, and tool calls waiting for approval.
        nav_open_alerts=_count_once(alerts.alert_unacknowledged_count, current),
        nav_open_handoffs=_count_once(reports.handoff_open_count, current),
        nav_pending_approvals=_count_once(guardrail_selectors.approval_pending_count, current),
    )
    return context


def _count_once(count: Callable[..., int], membership: Membership | None) -> Callable[[], int]:
    if membership is None:
        return lambda: 0
    return functools.cache(functools.partial(count, workspace=membership.workspace))
