"""schemathesis against Keel's OpenAPI schemas (/api/v1/openapi.json and the Langfuse-compatible
/api/public/openapi.json), in process through the WSGI application: every operation, with valid and
invalid generated requests, from a key with every scope, must answer no 5xx, with a status code the
schema declares and a body that matches its schema.

The gateway (/v1/chat/completions, /v1/models) and OTLP ingest (/v1/traces) are plain Django views
outside these schemas; test_gateway_bodies.py and test_otlp.py cover them.

Path parameters name seeded rows (frontend/tests/conftest.py's tenant: an agent, prompts, a trajectory,
evals, routing, guardrails, a curation with exports and a training job) in half the examples, so that
operations get past their 404. Each request runs in a savepoint that is rolled back, so every example
meets the same rows. KEEL_FUZZ_EXAMPLES raises the examples per operation and mode from CI's two.
"""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import schemathesis
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections, transaction
from django.test import Client, override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pytest_django import DjangoDbBlocker
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance

from agent_registry import services as registry_services
from agent_registry.models import Role, Scope
from agent_registry.tests.factories import MembershipFactory, UserFactory, WorkspaceFactory
from frontend.tests.conftest import Tenant, _tenant
from routing.tests.fakes import fake_gateway_provider

EXAMPLES = int(os.environ.get("KEEL_FUZZ_EXAMPLES", "0")) or 2
CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance]
SCHEMAS = {"/api/v1/openapi.json": "keel", "/api/public/openapi.json": "langfuse"}

# Uploads declare their body as a string of JSON lines (rollouts) or CSV; it goes on the wire as text.
schemathesis.serializer.alias("application/x-ndjson", "text/plain")


@contextmanager
def no_network() -> Iterator[None]:
    """Refuse every TCP connection: an operation that would reach a model provider or a webhook fails
    here (and shows as a 5xx) instead of leaving the machine."""
    connect = socket.socket.connect

    def refused(self: socket.socket, address: Any) -> Any:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            raise ConnectionRefusedError(f"tests.badinput: no network ({address!r})")
        return connect(self, address)

    socket.socket.connect = refused  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        socket.socket.connect = connect  # type: ignore[method-assign]


@contextmanager
def connection_kept() -> Iterator[None]:
    """Django's WSGI handler closes the database connection when a request ends, which would end the
    test's transaction; the test client disconnects the same handler, and so does this."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


@dataclass(frozen=True)
class Seeded:
    tenant: Tenant
    raw_key: str
    # {(the path segment before the parameter, its name): a value that names a seeded row}
    values: dict[tuple[str, str], Any]


def _values(tenant: Tenant) -> dict[tuple[str, str], Any]:
    item = tenant.sample.items.order_by("position").first()
    assert item is not None
    assert tenant.suite.dataset is not None
    return {
        ("agents", "slug"): tenant.agent.slug,
        ("requirements", "version"): 1,
        ("prompts", "name"): tenant.prompt.name,
        ("versions", "version"): 1,
        ("labels", "label"): "production",
        ("keys", "key_id"): tenant.api_key.pk,
        ("trajectories", "trace_id"): tenant.trajectory.trace_id,
        ("sessions", "session_id"): tenant.trajectory.session_id,
        ("replays", "replay_id"): tenant.replay.pk,
        ("samples", "sample_id"): tenant.sample.pk,
        ("items", "item_id"): item.pk,
        ("alert-rules", "rule_id"): tenant.rule.pk,
        ("alerts", "alert_id"): tenant.alert.pk,
        ("model-targets", "alias"): tenant.target.alias,
        ("tools", "name"): tenant.tool.name,
        ("routing-decisions", "decision_id"): tenant.decision.pk,
        ("handoffs", "handoff_id"): tenant.handoff.pk,
        ("approvals", "approval_id"): tenant.approval.pk,
        ("budgets", "budget_id"): tenant.budget.pk,
        ("datasets", "name"): tenant.suite.dataset.name,
        ("evaluators", "name"): "says_ok",
        ("suites", "name"): tenant.suite.name,
        ("runs", "run_id"): tenant.eval_run.pk,
        ("online-rules", "name"): tenant.online_rule.name,
        ("curations", "name"): tenant.curation.name,
        ("exports", "export_id"): tenant.export.pk,
        ("training-jobs", "job_id"): tenant.training_job.pk,
        ("data", "split"): "train",
        # Langfuse's prompt path.
        ("prompts", "prompt_name"): tenant.prompt.name,
    }


def seeded_path_parameters(path: str, values: dict[tuple[str, str], Any]) -> dict[str, Any]:
    """For each {parameter} of `path`, the seeded value its preceding segment and name call for."""
    found: dict[str, Any] = {}
    for match in re.finditer(r"([^/{}]+)/\{([^}]+)\}", path):
        key = (match.group(1), match.group(2))
        if key in values:
            found[match.group(2)] = values[key]
    return found


@pytest.fixture(scope="module")
def seeded(
    django_db_setup: None, django_db_blocker: DjangoDbBlocker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Seeded]:
    media = tmp_path_factory.mktemp("schemathesis")
    with (
        override_settings(MEDIA_ROOT=media / "media"),
        django_db_blocker.unblock(),
        fake_gateway_provider(),
        no_network(),
        transaction.atomic(),
    ):
        workspace = WorkspaceFactory.create(slug="acme-fuzz", name="Acme Fuzz")
        author = UserFactory.create(username="fuzz-author")
        MembershipFactory.create(workspace=workspace, user=author, role=Role.OWNER)
        tenant = _tenant(workspace, author, media)
        _, raw_key = registry_services.apikey_create(
            workspace=workspace, name="every scope", scopes=[scope.value for scope in Scope]
        )
        yield Seeded(tenant=tenant, raw_key=raw_key, values=_values(tenant))
        transaction.set_rollback(True)


def _document(location: str) -> dict[str, Any]:
    response = Client().get(location)
    assert response.status_code == 200, (location, response.status_code)
    document: dict[str, Any] = json.loads(response.content)
    return document


def _load(location: str) -> Any:
    schema = schemathesis.openapi.from_dict(_document(location))
    schema.app = get_wsgi_application()
    return schema


@pytest.mark.django_db
@pytest.mark.parametrize("location", SCHEMAS, ids=SCHEMAS.values())
def test_every_operation_declares_the_errors_any_request_can_get(location: str) -> None:
    """401 and 403 (every operation takes a key), 422 for a parameter or body that does not validate, and
    for a body 400 (not JSON Keel can store) and 413 (over the size limit, refused before it is read):
    the sweep below cannot send a 16 MB body, so this is checked on the schema itself."""
    missing = {}
    for path, item in _document(location)["paths"].items():
        for method, operation in item.items():
            needed = {"401", "403"}
            if operation.get("parameters") or operation.get("requestBody"):
                needed.add("422")
            if operation.get("requestBody"):
                needed |= {"400", "413"}
            lacking = needed - set(operation["responses"])
            if lacking:
                missing[f"{method.upper()} {path}"] = sorted(lacking)

    assert missing == {}


@dataclass
class Finding:
    operation: str
    mode: str
    error: str

    def __str__(self) -> str:
        return f"{self.operation} ({self.mode}):\n{self.error}"


def _property(
    operation: Any, mode: GenerationMode, headers: dict[str, str], seeded: Seeded, examples: int, statuses: set[int]
) -> Any:
    """A hypothesis test of one operation in one generation mode."""
    path_values = seeded_path_parameters(operation.path, seeded.values)

    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    # The first (simplest) example names seeded rows: with CI's two examples per mode, every operation
    # is reached past its 404 once; further examples name generated ones half the time.
    @given(case=operation.as_strategy(generation_mode=mode), generated_path=st.booleans())
    def call(case: Any, generated_path: bool) -> None:
        if not generated_path and case.path_parameters:
            case.path_parameters = {**case.path_parameters, **path_values}
        with transaction.atomic():
            response = case.call(headers=headers)
            transaction.set_rollback(True)
        statuses.add(response.status_code)
        case.validate_response(response, checks=CHECKS, headers=headers)

    return call


def _sweep(schema: Any, seeded: Seeded, examples: int, statuses: dict[str, set[int]]) -> list[Finding]:
    headers = {"Authorization": f"Bearer {seeded.raw_key}"}
    findings: list[Finding] = []
    for result in schema.get_all_operations():
        operation = result.ok()
        answered = statuses.setdefault(f"{operation.method.upper()} {operation.path}", set())
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                _property(operation, mode, headers, seeded, examples, answered)()
            # Every operation is swept; each failure is reported at the end. schemathesis raises a
            # FailureGroup (a BaseExceptionGroup) for several distinct failures of one case.
            except (Exception, BaseExceptionGroup) as error:
                findings.append(Finding(f"{operation.method.upper()} {operation.path}", mode.value, str(error)[:3000]))
    return findings


@pytest.mark.django_db
# schemathesis's in-process client does not close a streamed file response (a download of the seeded
# exports or adapter, under this module's temporary directory).
@pytest.mark.filterwarnings(
    r"ignore:Exception ignored in.*FileIO name='[^']*/schemathesis\d+/:pytest.PytestUnraisableExceptionWarning"
)
@pytest.mark.parametrize("location", SCHEMAS, ids=SCHEMAS.values())
def test_every_operation_answers_without_a_server_error_as_its_schema_says(seeded: Seeded, location: str) -> None:
    schema = _load(location)
    assert list(schema.get_all_operations()), location

    statuses: dict[str, set[int]] = {}
    with fake_gateway_provider(), no_network(), connection_kept():
        findings = _sweep(schema, seeded, EXAMPLES, statuses)
    # The seeded path parameters work: nearly every operation answered something other than 404.
    lost = sorted(operation for operation, seen in statuses.items() if seen <= {404})
    assert len(lost) <= len(statuses) // 20, lost

    report = "\n\n".join(map(str, findings))
    print(report)  # pytest shows captured output in full; an assertion message it may cut
    assert not findings, f"{len(findings)} operations failed:\n\n{report}"
