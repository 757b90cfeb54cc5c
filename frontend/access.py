"""Who may open which dashboard page.

Every workspace page goes through `workspace_view`: the user must be signed in and hold a
membership in the workspace named by the URL (anyone else gets the same 404 whether or not the
workspace exists), and a POST needs the view's `post_role`. Viewers read; members edit agents,
requirements and prompts; owners also manage API keys. Domain "not found" errors raised inside a
view become the 404 page, so a view never has to remember to scope its error handling.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django_htmx.middleware import HtmxDetails

from agent_registry import selectors
from agent_registry.models import Membership, Role, User
from config.errors import NotFound
from config.errors import PermissionDenied as KeelPermissionDenied


class HtmxHttpRequest(HttpRequest):
    """A request after django-htmx's middleware, as its documentation suggests for type checking."""

    htmx: HtmxDetails


ROLE_RANK: dict[str, int] = {Role.VIEWER: 0, Role.MEMBER: 1, Role.OWNER: 2}

WorkspaceView = Callable[..., HttpResponse]


def role_allows(role: str, required: Role) -> bool:
    return ROLE_RANK.get(role, -1) >= ROLE_RANK[required]


def workspace_view(
    *, post_role: Role = Role.MEMBER, view_role: Role = Role.VIEWER
) -> Callable[[WorkspaceView], WorkspaceView]:
    """Resolve `workspace_slug` to the user's membership and pass it to the view after the request."""

    def decorator(view: WorkspaceView) -> WorkspaceView:
        @functools.wraps(view)
        def wrapper(request: HtmxHttpRequest, workspace_slug: str, **kwargs: Any) -> HttpResponse:
            if not isinstance(request.user, User):
                return redirect_to_login(request.get_full_path())
            try:
                membership = selectors.membership_get(user=request.user, workspace_slug=workspace_slug)
            except NotFound as error:
                raise Http404(error.detail) from None
            # The membership's user is the signed-in user: reuse it instead of loading it again.
            membership.user = request.user
            required = post_role if request.method == "POST" else view_role
            if not role_allows(membership.role, required):
                raise PermissionDenied(f"this needs the {required.label.lower()} role in {membership.workspace}")
            try:
                return view(request, membership, **kwargs)
            except NotFound as error:
                raise Http404(error.detail) from None
            except KeelPermissionDenied as error:
                raise PermissionDenied(error.detail) from None

        return wrapper

    return decorator


def membership_can_edit(membership: Membership | None) -> bool:
    return membership is not None and role_allows(membership.role, Role.MEMBER)


def membership_can_manage_keys(membership: Membership | None) -> bool:
    return membership is not None and role_allows(membership.role, Role.OWNER)
