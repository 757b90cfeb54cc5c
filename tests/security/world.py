"""The two workspaces the access tests call into, and a caller for every role.

Ours is the dashboard tests' tenant (frontend/tests/conftest.py: an agent with requirements, prompts, a
trajectory, a replay, a review sample, alert rules, routing, guardrails, evals, a curation with exports,
a training job) plus what the worker side of the trainer bridge needs (a job our `train` key holds and
one waiting to be claimed) and a model target on the fake provider for the gateway. Theirs is empty but
for its owner and a key with every scope: whatever of ours it reaches by name or id, it must not find.

Built once per test module inside a transaction that is rolled back when the module ends; each test
runs in a savepoint inside it (pytest-django's `db`), so what one test changes no other test sees.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.test import Client
from django.utils import timezone

from agent_registry import services as registry_services
from agent_registry.models import Agent, ApiKey, Role, Scope, User, Workspace
from agent_registry.tests.factories import MembershipFactory, UserFactory, WorkspaceFactory
from frontend.tests.conftest import Tenant, _tenant
from guardrails import services as guardrail_services
from routing.models import ModelTarget
from routing.tests.fakes import FAKE_PROVIDER
from tracing import services as tracing_services
from trainer_bridge import jobs

# Strings only our workspace's rows contain: none may appear in anything another workspace is shown.
OURS_NAME = "Acme Matrix Holdings"
OURS_MARKER = "ours-only-8f3c1e"

SESSION_ROLES = ("viewer", "member", "owner")
KEY_ROLES = tuple(f"key:{scope}" for scope in Scope.values)
# anonymous: no credentials; other_owner: signed in as the owner of the other workspace; other_key: the
# other workspace's key with every scope; expired_key / revoked_key: ours, with every scope, but dead.
ROLES = ("anonymous", *SESSION_ROLES, "other_owner", *KEY_ROLES, "other_key", "expired_key", "revoked_key")
SIGNED_IN = frozenset({*SESSION_ROLES, "other_owner"})
KEYS = frozenset({*KEY_ROLES, "other_key", "expired_key", "revoked_key"})


@dataclass(frozen=True)
class Caller:
    role: str
    session_key: str = ""
    raw_key: str = ""

    def client(self, *, enforce_csrf_checks: bool = False) -> Client:
        headers = {"Authorization": f"Bearer {self.raw_key}"} if self.raw_key else {}
        # A view's exception is a 500 to record, not a test error that stops the sweep.
        client = Client(enforce_csrf_checks=enforce_csrf_checks, raise_request_exception=False, headers=headers)
        if self.session_key:
            client.cookies[settings.SESSION_COOKIE_NAME] = self.session_key
        return client


@dataclass
class World:
    ours: Tenant
    theirs: Workspace
    callers: dict[str, Caller]
    # {placeholder: value} for the request tables: ids and names of our rows.
    values: dict[str, Any] = field(default_factory=dict)

    @property
    def markers(self) -> tuple[str, ...]:
        return (OURS_NAME, OURS_MARKER, self.ours.trajectory.trace_id)


def _session_key(user: User) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies[settings.SESSION_COOKIE_NAME].value


def _key(workspace: Workspace, role: str, scopes: list[str]) -> tuple[Any, str]:
    return registry_services.apikey_create(workspace=workspace, name=f"matrix {role}", scopes=scopes)


def world_build(media: Path) -> World:
    ours = WorkspaceFactory.create(slug="acme-matrix", name=OURS_NAME)
    theirs = WorkspaceFactory.create(slug="globex-matrix", name="Globex Matrix")
    author = UserFactory.create(username="matrix-author")
    MembershipFactory.create(workspace=ours, user=author, role=Role.OWNER)
    tenant = _tenant(ours, author, media)
    Agent.objects.filter(pk=tenant.agent.pk).update(description=f"Refunds ({OURS_MARKER})")

    callers = {"anonymous": Caller("anonymous")}
    for role in SESSION_ROLES:
        user = UserFactory.create(username=f"matrix-{role}")
        MembershipFactory.create(workspace=ours, user=user, role=role)
        callers[role] = Caller(role, session_key=_session_key(user))
    stranger = UserFactory.create(username="matrix-other-owner")
    MembershipFactory.create(workspace=theirs, user=stranger, role=Role.OWNER)
    callers["other_owner"] = Caller("other_owner", session_key=_session_key(stranger))
    for role, scope in zip(KEY_ROLES, Scope.values, strict=True):
        callers[role] = Caller(role, raw_key=_key(ours, role, [scope])[1])
    callers["other_key"] = Caller("other_key", raw_key=_key(theirs, "other", list(Scope.values))[1])
    expired, raw_expired = _key(ours, "expired", list(Scope.values))
    type(expired).objects.filter(pk=expired.pk).update(expires_at=timezone.now() - timedelta(minutes=1))
    callers["expired_key"] = Caller("expired_key", raw_key=raw_expired)
    revoked, raw_revoked = _key(ours, "revoked", list(Scope.values))
    registry_services.apikey_revoke(api_key=revoked)
    callers["revoked_key"] = Caller("revoked_key", raw_key=raw_revoked)

    # The key the matrix revokes: one a `write` key may revoke (a key revokes only keys whose scopes it holds).
    revocable, _ = _key(ours, "revocable", [Scope.WRITE])

    ApiKey.objects.filter(workspace__in=(ours, theirs)).update(last_used_at=timezone.now())

    # The worker side of the trainer bridge: our train key holds the tenant's job (it is the oldest
    # waiting), and another job waits for a worker to claim it.
    train_key = registry_services.apikey_authenticate(raw_key=callers[f"key:{Scope.TRAIN}"].raw_key)
    assert train_key is not None
    held = jobs.job_claim(api_key=train_key, worker="matrix-gpu")
    assert held is not None
    assert held.pk == tenant.training_job.pk
    jobs.job_create(
        export=tenant.export, method="grpo", base_model="tiny-model", config={"steps": 2}, created_by=author
    )
    gateway_target = ModelTarget.objects.create(
        workspace=ours, alias="matrix-fake", model=f"{FAKE_PROVIDER}/matrix", tier="single_call", max_retries=0
    )

    price = tracing_services.model_price_set(
        workspace=ours, model="matrix/priced-model", input_usd_per_million=Decimal(1), output_usd_per_million=Decimal(2)
    )

    item = tenant.sample.items.order_by("position").first()
    assert item is not None
    values: dict[str, Any] = {
        "agent": tenant.agent.slug,
        "prompt": tenant.prompt.name,
        "draft_prompt": tenant.draft_prompt.name,
        "trace": tenant.trajectory.trace_id,
        "session": tenant.trajectory.session_id,
        "replay": tenant.replay.pk,
        "sample": tenant.sample.pk,
        "item": item.pk,
        "rule": tenant.rule.pk,
        "alert": tenant.alert.pk,
        "target": tenant.target.alias,
        "gateway_target": gateway_target.alias,
        "tool": tenant.tool.name,
        "decision": tenant.decision.pk,
        "handoff": tenant.handoff.pk,
        "approval": tenant.approval.pk,
        "budget": tenant.budget.pk,
        "dataset": tenant.suite.dataset.name if tenant.suite.dataset else "",
        "evaluator": "says_ok",
        "suite": tenant.suite.name,
        "run": tenant.eval_run.pk,
        "online_rule": tenant.online_rule.name,
        "curation": tenant.curation.name,
        "export": tenant.export.pk,
        "queued_export": tenant.queued_export.pk,
        "job": tenant.training_job.pk,
        "key": revocable.pk,
        "price": price.model,
        # The agent's guardrail policy as it stands, for a save that changes nothing but is a save.
        "policy": guardrail_services.guardrail_policy_get(agent=tenant.agent).document.model_dump(mode="json"),
    }
    return World(ours=tenant, theirs=theirs, callers=callers, values=values)


@contextmanager
def no_network() -> Iterator[None]:
    """Refuse every connection but the database's unix socket: a request that would reach a model
    provider or a webhook fails here instead of leaving the machine."""
    connect = socket.socket.connect

    def guarded(self: socket.socket, address: Any) -> None:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            raise ConnectionRefusedError(f"tests.security: no network ({address!r})")
        connect(self, address)

    socket.socket.connect = guarded  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        socket.socket.connect = connect  # type: ignore[method-assign]


@contextmanager
def rolled_back(method: str = "POST") -> Iterator[None]:
    """Run a request that may write in a savepoint that is undone after it, so each caller meets the
    same rows. A GET is left alone (the test's own savepoint undoes whatever it wrote)."""
    if method in ("GET", "HEAD"):
        yield
        return
    with transaction.atomic():
        yield
        transaction.set_rollback(True)
