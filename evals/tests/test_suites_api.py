"""The eval suites API: evaluators with versions, suites, runs (202, idempotent, progress, report, items),
comparison, NeMo Gym rollouts out and in, online rules, regressions; bad input that changes nothing, and
another workspace's key on every path."""

from __future__ import annotations

import json
from typing import Any
from unittest import mock

import pytest
from django.test import Client

from evals import runs
from evals.models import Evaluator, OnlineRule, Run, RunItem, Suite
from evals.tests.test_runs import _dataset, _script
from routing.tests import conftest as routing_fixtures
from routing.tests.conftest import Gateway
from routing.tests.fakes import FakeGatewayLLM

fake = routing_fixtures.fake
gateway = routing_fixtures.gateway

pytestmark = pytest.mark.django_db


def post(client: Client, path: str, body: Any) -> Any:
    return client.post(path, data=json.dumps(body), content_type="application/json")


def patch(client: Client, path: str, body: Any) -> Any:
    return client.patch(path, data=json.dumps(body), content_type="application/json")


def state() -> dict[str, object]:
    return {
        "evaluators": list(Evaluator.objects.values_list("pk", "version").order_by("pk")),
        "suites": list(Suite.objects.values_list("pk", "name", "samples", "schedule_cron").order_by("pk")),
        "runs": list(Run.objects.values_list("pk", "status").order_by("pk")),
        "rules": list(OnlineRule.objects.values_list("pk", "sample_rate").order_by("pk")),
    }


@pytest.fixture
def client(api_client_for: Any, gateway: Gateway) -> Client:
    made: Client = api_client_for(gateway.workspace, scopes=("read", "write"))
    return made


@pytest.fixture
def suite(client: Client, gateway: Gateway) -> dict[str, Any]:
    _dataset(gateway)
    assert (
        post(
            client, "/api/v1/evaluators", {"name": "says_ok", "config": {"type": "regex", "pattern": "ok"}}
        ).status_code
        == 201
    )
    response = post(
        client,
        "/api/v1/suites",
        {
            "name": "answers",
            "agent": "ride-support",
            "dataset": "regressions",
            "evaluators": ["says_ok"],
            "samples": 4,
            "tier": "single_call",
            # One worker: threads would not see this test's uncommitted rows (test_runs covers concurrency).
            "concurrency": 1,
        },
    )
    assert response.status_code == 201, response.content
    created: dict[str, Any] = response.json()
    return created


@pytest.fixture
def no_dispatch() -> Any:
    with mock.patch("evals.runs.run_dispatch") as dispatch:
        yield dispatch


def test_evaluators_are_versioned_and_a_bad_config_names_the_field(client: Client, gateway: Gateway) -> None:
    first = post(client, "/api/v1/evaluators", {"name": "exact", "config": {"type": "exact_match"}})
    second = post(client, "/api/v1/evaluators/exact/versions", {"config": {"type": "exact_match", "strip": False}})
    assert (first.status_code, first.json()["version"]) == (201, 1)
    assert (second.status_code, second.json()["version"]) == (201, 2)
    assert [e["version"] for e in client.get("/api/v1/evaluators/exact/versions").json()] == [2, 1]
    assert [(e["name"], e["version"]) for e in client.get("/api/v1/evaluators").json()] == [("exact", 2)]

    before = state()
    unknown_type = post(client, "/api/v1/evaluators", {"name": "bad", "config": {"type": "vibes"}})
    unknown_key = post(client, "/api/v1/evaluators", {"name": "bad", "config": {"type": "regex", "patern": "x"}})
    assert (unknown_type.status_code, unknown_type.json()["code"]) == (422, "evaluator_invalid")
    assert unknown_type.json()["errors"][0]["field"] == "config.type"
    assert unknown_key.json()["errors"][0]["field"] == "config.patern"
    assert state() == before


def test_a_suite_is_created_read_and_edited(client: Client, suite: dict[str, Any]) -> None:
    assert suite["evaluators"] == [{"name": "says_ok", "version": 1, "type": "regex"}]
    assert suite["samples"] == 4
    assert suite["dataset"] == "regressions"
    assert suite["next_run_at"] is None

    edited = patch(client, "/api/v1/suites/answers", {"schedule_cron": "0 2 * * *", "schedule_enabled": True})
    assert edited.status_code == 200, edited.content
    assert edited.json()["schedule_enabled"] is True
    assert edited.json()["next_run_at"] is not None

    before = state()
    bad = patch(client, "/api/v1/suites/answers", {"schedule_cron": "at two"})
    assert (bad.status_code, bad.json()["errors"][0]["field"]) == (422, "schedule_cron")
    too_many = patch(client, "/api/v1/suites/answers", {"samples": 1000})
    assert too_many.status_code == 422
    unknown_dataset = patch(client, "/api/v1/suites/answers", {"dataset": "nope"})
    assert unknown_dataset.status_code == 404
    assert state() == before


def test_a_run_starts_with_202_is_idempotent_and_reports_when_done(
    client: Client, suite: dict[str, Any], gateway: Gateway, fake: FakeGatewayLLM, no_dispatch: Any
) -> None:
    started = client.post(
        "/api/v1/suites/answers/runs", data="{}", content_type="application/json", headers={"Idempotency-Key": "k1"}
    )
    again = client.post(
        "/api/v1/suites/answers/runs", data="{}", content_type="application/json", headers={"Idempotency-Key": "k1"}
    )
    assert started.status_code == 202, started.content
    run = started.json()
    assert again.json()["id"] == run["id"]
    assert Run.objects.count() == 1
    assert run["status"] == "queued"
    assert run["progress"]["pending"] == 4
    assert run["samples"] == 4

    _script(fake, ["ok"] * 16)
    runs.run_execute(run_id=run["id"])
    done = client.get(f"/api/v1/runs/{run['id']}").json()
    assert done["status"] == "completed"
    assert done["progress"]["done"] == 4
    assert done["report"]["says_ok"]["overall"]["pass_at_k"]["4"] == 1.0

    items = client.get(f"/api/v1/runs/{run['id']}/items?limit=2").json()
    assert [item["position"] for item in items] == [0, 1]
    assert len(items[0]["samples"]) == 4
    assert items[0]["samples"][0]["scores"][0] | {"reason": None} == {
        "evaluator": "says_ok",
        "version": 1,
        "score": 1.0,
        "passed": True,
        "reason": None,
        "error": "",
    }
    assert items[0]["samples"][0]["trace_id"]
    history = client.get("/api/v1/suites/answers/history").json()
    assert [point["run"] for point in history["says_ok"]] == [run["id"]]


def test_two_runs_are_compared_and_rollouts_round_trip_with_the_same_pass_at_k(
    client: Client, suite: dict[str, Any], fake: FakeGatewayLLM, no_dispatch: Any
) -> None:
    _script(fake, ["ok", "no", "no", "no"] * 4)
    a = post(client, "/api/v1/suites/answers/runs", {}).json()["id"]
    runs.run_execute(run_id=a)
    _script(fake, ["ok"] * 16)
    b = post(client, "/api/v1/suites/answers/runs", {}).json()["id"]
    runs.run_execute(run_id=b)

    comparison = client.get(f"/api/v1/runs/compare?baseline={a}&candidate={b}").json()
    assert comparison["metrics"]["says_ok"]["mean_delta"] == pytest.approx(0.75)
    assert comparison["same_dataset_version"] is True

    exported = client.get(f"/api/v1/runs/{a}/rollouts")
    assert exported.status_code == 200
    body = b"".join(exported.streaming_content)  # type: ignore[attr-defined]
    lines = body.decode().splitlines()
    assert len(lines) == 16
    assert {json.loads(line)["reward"] for line in lines} == {0.0, 1.0}

    imported = client.post("/api/v1/runs/import?name=from-gym", data=body, content_type="application/x-ndjson")
    assert imported.status_code == 201, imported.content
    original = client.get(f"/api/v1/runs/{a}").json()["report"]["says_ok"]["overall"]
    again = imported.json()["report"]["reward"]["overall"]
    assert again["pass_at_k"] == original["pass_at_k"]
    assert again["mean"] == pytest.approx(original["mean"])


def test_a_pairwise_judge_compares_two_runs_answers_in_both_orders(
    client: Client, suite: dict[str, Any], fake: FakeGatewayLLM, no_dispatch: Any
) -> None:
    from routing.tests.fakes import say

    _script(fake, ["ok"] * 16)
    a = post(client, "/api/v1/suites/answers/runs", {}).json()["id"]
    runs.run_execute(run_id=a)
    b = post(client, "/api/v1/suites/answers/runs", {}).json()["id"]
    runs.run_execute(run_id=b)
    created = post(
        client, "/api/v1/evaluators", {"name": "prefer", "config": {"type": "pairwise_judge", "model": "fast"}}
    )
    assert created.status_code == 201, created.content
    # Per item, the judge is asked (baseline, candidate) and then (candidate, baseline).
    orders = [("2", "1"), ("1", "1"), ("tie", "tie"), ("2", "1")]
    fake.script("fast", *[say(json.dumps({"reasoning": "r", "winner": w})) for pair in orders for w in pair])

    response = client.get(f"/api/v1/runs/compare?baseline={a}&candidate={b}&judge=prefer")

    assert response.status_code == 200, response.content
    pairwise = response.json()["pairwise"]
    assert pairwise["items"] == 4
    assert (pairwise["candidate_wins"], pairwise["baseline_wins"], pairwise["ties"]) == (2, 0, 2)
    assert (pairwise["inconsistent"], pairwise["position_bias"]) == (1, 1)
    assert pairwise["candidate_win_rate"] == 1.0
    # A pairwise judge cannot be a suite's evaluator.
    refused = patch(client, "/api/v1/suites/answers", {"evaluators": ["says_ok", "prefer"]})
    assert (refused.status_code, refused.json()["errors"][0]["field"]) == (422, "evaluators")


def test_a_malformed_rollouts_file_names_the_line_and_imports_nothing(client: Client, gateway: Gateway) -> None:
    before = (Run.objects.count(), RunItem.objects.count())
    body = b'{"responses_create_params": {"input": "hi"}, "reward": 1}\n{"responses_create_params": {"input": "x"}}\n'
    response = client.post("/api/v1/runs/import", data=body, content_type="application/x-ndjson")
    assert (response.status_code, response.json()["code"]) == (422, "rollouts_invalid")
    assert any(error["line"] == 2 for error in response.json()["errors"])
    assert (Run.objects.count(), RunItem.objects.count()) == before


def test_a_run_of_a_suite_without_a_dataset_is_refused(client: Client, gateway: Gateway, no_dispatch: Any) -> None:
    post(client, "/api/v1/evaluators", {"name": "says_ok", "config": {"type": "regex", "pattern": "ok"}})
    post(client, "/api/v1/suites", {"name": "empty", "agent": "ride-support", "evaluators": ["says_ok"]})
    response = post(client, "/api/v1/suites/empty/runs", {})
    assert (response.status_code, response.json()["code"]) == (409, "run_not_startable")
    assert Run.objects.count() == 0


def test_online_rules_through_the_api(client: Client, gateway: Gateway) -> None:
    post(client, "/api/v1/evaluators", {"name": "says_ok", "config": {"type": "regex", "pattern": "ok"}})
    created = post(
        client,
        "/api/v1/online-rules",
        {"name": "live", "agent": "ride-support", "evaluators": ["says_ok"], "sample_rate": 0.25, "delay_seconds": 30},
    )
    assert created.status_code == 201, created.content
    assert created.json()["summary"] == {"trajectories": 0, "evaluators": {}}
    before = state()
    bad = patch(client, "/api/v1/online-rules/live", {"sample_rate": 2})
    assert (bad.status_code, bad.json()["errors"][0]["field"]) == (422, "sample_rate")
    assert state() == before
    assert patch(client, "/api/v1/online-rules/live", {"enabled": False}).json()["enabled"] is False
    with mock.patch("evals.tasks.online_rule_backfill.delay"):
        queued = post(
            client,
            "/api/v1/online-rules/live/backfill",
            {"start": "2026-11-01T00:00:00Z", "end": "2026-11-02T00:00:00Z"},
        )
    assert queued.status_code == 202


def test_a_backfill_range_without_an_offset_is_utc(
    client: Client, gateway: Gateway, django_capture_on_commit_callbacks: Any
) -> None:
    post(client, "/api/v1/evaluators", {"name": "says_ok", "config": {"type": "regex", "pattern": "ok"}})
    post(client, "/api/v1/online-rules", {"name": "live", "agent": "ride-support", "evaluators": ["says_ok"]})
    with (
        mock.patch("evals.tasks.online_rule_backfill.delay") as delay,
        django_capture_on_commit_callbacks(execute=True),
    ):
        # One end with an offset and one without could not be compared: a 500.
        queued = post(
            client,
            "/api/v1/online-rules/live/backfill",
            {"start": "2026-11-01T00:00:00", "end": "2026-11-02T00:00:00Z"},
        )
        backwards = post(
            client,
            "/api/v1/online-rules/live/backfill",
            {"start": "2026-11-02T00:00:00Z", "end": "2026-11-01T00:00:00"},
        )
    assert queued.status_code == 202, queued.content
    assert (queued.json()["start"], queued.json()["end"]) == ("2026-11-01T00:00:00Z", "2026-11-02T00:00:00Z")
    assert (backwards.status_code, backwards.json()["errors"]) == (
        422,
        [{"field": "end", "message": "not after start"}],
    )
    rule_id = OnlineRule.objects.get(name="live").pk
    assert delay.call_args_list == [mock.call(rule_id, "2026-11-01T00:00:00+00:00", "2026-11-02T00:00:00+00:00")]


def test_an_online_rule_refuses_a_pairwise_judge(client: Client, gateway: Gateway) -> None:
    post(client, "/api/v1/evaluators", {"name": "says_ok", "config": {"type": "regex", "pattern": "ok"}})
    post(client, "/api/v1/evaluators", {"name": "which", "config": {"type": "pairwise_judge", "rubric": "Better?"}})
    post(client, "/api/v1/online-rules", {"name": "live", "agent": "ride-support", "evaluators": ["says_ok"]})
    before = state()
    created = post(client, "/api/v1/online-rules", {"name": "pairs", "agent": "ride-support", "evaluators": ["which"]})
    changed = patch(client, "/api/v1/online-rules/live", {"evaluators": ["says_ok", "which"]})
    for response in (created, changed):
        assert (response.status_code, response.json()["code"], response.json()["errors"]) == (
            422,
            "online_rule_invalid",
            [{"field": "evaluators", "message": "a pairwise judge compares two runs; it cannot score a trajectory"}],
        )
    assert state() == before
    assert list(OnlineRule.objects.get(name="live").evaluators.values_list("name", flat=True)) == ["says_ok"]


def test_a_proposal_makes_suites_from_the_commitment(client: Client, gateway: Gateway) -> None:
    response = post(client, "/api/v1/suites/propose", {"agent": "ride-support"})
    assert response.status_code == 201, response.content
    again = post(client, "/api/v1/suites/propose", {"agent": "ride-support"})
    assert again.json() == {"suites": [], "online_rules": []}


# --- Tenancy: another workspace's key, with every scope, on every path -----------------------------------

NAMED = [
    ("GET", "/api/v1/evaluators/{name}/versions", None),
    ("GET", "/api/v1/evaluators/{name}/calibration", None),
    ("POST", "/api/v1/evaluators/{name}/versions", {"config": {"type": "exact_match"}}),
    ("GET", "/api/v1/suites/{name}", None),
    ("PATCH", "/api/v1/suites/{name}", {"samples": 2}),
    ("DELETE", "/api/v1/suites/{name}", None),
    ("GET", "/api/v1/suites/{name}/history", None),
    ("POST", "/api/v1/suites/{name}/runs", {}),
    ("GET", "/api/v1/runs/{run_id}", None),
    ("GET", "/api/v1/runs/{run_id}/items", None),
    ("POST", "/api/v1/runs/{run_id}/cancel", None),
    ("POST", "/api/v1/runs/{run_id}/resume", None),
    ("GET", "/api/v1/runs/{run_id}/rollouts", None),
    ("GET", "/api/v1/runs/compare?baseline={run_id}&candidate={run_id}", None),
    ("GET", "/api/v1/online-rules/{name}", None),
    ("PATCH", "/api/v1/online-rules/{name}", {"enabled": False}),
    ("POST", "/api/v1/online-rules/{name}/backfill", {"start": "2026-11-01T00:00:00Z", "end": "2026-11-02T00:00:00Z"}),
    ("POST", "/api/v1/suites/propose", {"agent": "ride-support"}),
]
WORKSPACE_WIDE = [
    ("GET", "/api/v1/evaluators"),
    ("POST", "/api/v1/evaluators"),
    ("GET", "/api/v1/suites"),
    ("POST", "/api/v1/suites"),
    ("GET", "/api/v1/runs"),
    ("POST", "/api/v1/runs/import"),
    ("GET", "/api/v1/online-rules"),
    ("POST", "/api/v1/online-rules"),
    ("GET", "/api/v1/regressions"),
]


@pytest.fixture
def theirs(client: Client, suite: dict[str, Any], gateway: Gateway, no_dispatch: Any) -> dict[str, Any]:
    """The workspace's suite, a run of it, an online rule; names the intruder will try."""
    run_id = post(client, "/api/v1/suites/answers/runs", {}).json()["id"]
    post(client, "/api/v1/online-rules", {"name": "live", "agent": "ride-support", "evaluators": ["says_ok"]})
    return {"run_id": run_id}


@pytest.mark.parametrize(("method", "path", "body"), NAMED)
def test_another_workspaces_rows_are_404_and_unchanged(
    theirs: dict[str, Any], api_client_for: Any, other_workspace: Any, method: str, path: str, body: Any
) -> None:
    intruder = api_client_for(other_workspace, scopes=("read", "write"))
    before = state()
    name = "says_ok" if "/evaluators/" in path else "answers" if "/suites/" in path else "live"
    url = path.replace("{name}", name).replace("{run_id}", str(theirs["run_id"]))
    data = json.dumps(body) if body is not None else "{}"
    response = intruder.generic(method, url, data=data, content_type="application/json")
    assert response.status_code == 404, (url, response.content)
    assert state() == before


def test_another_workspace_lists_none_of_ours(
    theirs: dict[str, Any], api_client_for: Any, other_workspace: Any
) -> None:
    intruder = api_client_for(other_workspace, scopes=("read", "write"))
    for path in ("/api/v1/evaluators", "/api/v1/suites", "/api/v1/runs", "/api/v1/online-rules", "/api/v1/regressions"):
        assert intruder.get(path).json() == [], path


def test_the_tenancy_cases_cover_every_eval_suites_path_and_method(db: Any) -> None:
    document = Client().get("/api/v1/openapi.json").json()
    served = {
        (method.upper(), path)
        for path, operations in document["paths"].items()
        for method, operation in operations.items()
        if "eval suites" in operation.get("tags", [])
    }
    covered = {(method, path.split("?")[0]) for method, path, _ in NAMED} | set(WORKSPACE_WIDE)
    assert served == covered
