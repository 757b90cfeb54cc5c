"""CSRF: every route of the URL configuration that a browser session can reach refuses a state-changing
request without the CSRF token, and the only routes exempt from the check are the API's, which a session
does not authenticate (only `Authorization: Bearer <key>` does, and a browser never sends that on its own).

(That each page's forms carry the token is checked with the rendered pages, in test_xss.py.)
"""

from __future__ import annotations

import pytest
from django.db import transaction
from django.test import Client

from agent_registry.models import Role
from agent_registry.tests.factories import MembershipFactory, UserFactory, WorkspaceFactory
from tests.security.routes import Route, all_routes, example_url

pytestmark = pytest.mark.django_db

UNSAFE_METHODS = ("POST", "PUT", "PATCH", "DELETE")
# The API's Django views outside ninja (OTLP ingest and the OpenAI-compatible gateway), with the method each
# answers; ninja's operations are the rest of the API, each exempt by ninja itself.
PLAIN_API = {
    "otlp-traces": "POST",
    "langfuse-otlp-traces": "POST",
    "gateway-chat-completions": "POST",
    "gateway-models": "GET",
    "gateway-model": "GET",
}
ROUTES = all_routes()


def _is_api(route: Route) -> bool:
    return route.is_ninja or route.name in PLAIN_API


@pytest.fixture
def signed_in() -> tuple[Client, str]:
    """The owner of a workspace, signed in, with a browser's CSRF checks in force."""
    workspace = WorkspaceFactory.create(slug="csrf-acme")
    owner = UserFactory.create(username="csrf-owner")
    MembershipFactory.create(workspace=workspace, user=owner, role=Role.OWNER)
    client = Client(enforce_csrf_checks=True, raise_request_exception=False)
    client.force_login(owner)
    return client, workspace.slug


def test_the_only_routes_exempt_from_csrf_are_the_apis():
    exempt = sorted(route.name for route in ROUTES if route.csrf_exempt)
    api = sorted(route.name for route in ROUTES if route.is_ninja or route.name in PLAIN_API)

    assert exempt == api
    assert len(api) > 100  # the walk found ninja's operations


def test_no_exempt_route_takes_a_session(signed_in):
    """Exempt from CSRF is safe only where a cookie proves nothing: a signed-in browser gets 401."""
    client, _ = signed_in
    problems = []
    for route in ROUTES:
        if not route.csrf_exempt:
            continue
        method = PLAIN_API.get(route.name) or sorted(route.methods or ())[0]
        response = client.generic(method, example_url(route, "csrf-acme"), data="{}", content_type="application/json")
        if response.status_code != 401:
            problems.append(f"{route.name} {method}: {response.status_code}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("method", UNSAFE_METHODS)
def test_every_other_route_refuses_a_write_without_the_token(signed_in, method):
    """POST to every route a session reaches; PUT, PATCH and DELETE to the dashboard's (the admin and
    sign-in answer GET and POST only, and the middleware treats every unsafe method alike)."""
    client, slug = signed_in
    checked, problems = 0, []
    for route in ROUTES:
        if _is_api(route) or (method != "POST" and route.namespace != "frontend"):
            continue
        url = example_url(route, slug)
        with transaction.atomic():
            response = client.generic(method, url, data="name=x", content_type="application/x-www-form-urlencoded")
            transaction.set_rollback(True)
        checked += 1
        if response.status_code != 403 or b"CSRF verification failed" not in response.content:
            problems.append(f"{route.name} {url}: {response.status_code}")
    assert not problems, "\n".join(problems)
    assert checked > (250 if method == "POST" else 100)  # the dashboard, sign-in and the admin


def test_the_token_lets_the_same_write_through(signed_in):
    """The refusals above are the CSRF check's: with the token a form post and an htmx post go through."""
    client, slug = signed_in
    page = client.get(f"/w/{slug}/agents/")
    token = page.cookies["csrftoken"].value

    form = client.post(f"/w/{slug}/agents/", {"slug": "new-agent", "name": "New", "csrfmiddlewaretoken": token})
    htmx = client.post(
        f"/w/{slug}/agents/",
        {"slug": "other-agent", "name": "Other"},
        headers={"X-CSRFToken": token, "HX-Request": "true"},
    )

    assert form.status_code == 302
    assert htmx.status_code in (200, 302)
