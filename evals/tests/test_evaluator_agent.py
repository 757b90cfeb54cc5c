"""An agent's suites, runs and online rules use its own evaluators and the workspace-wide ones, never another
agent's: refused by the services (code `evaluator_agent_mismatch`, nothing written), so the API answers 4xx
and the dashboard's forms show the refusal beside the field, as they show the services' other refusals."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from agent_registry import services as registry_services
from agent_registry.models import Agent, PromptVersion, Role
from agent_registry.tests.factories import AgentFactory, MembershipFactory, UserFactory
from evals import exceptions, online, regressions, runs, schedules, services
from evals.models import Dataset, Evaluator, OnlineRule, Run, Suite, SuiteEvaluator, SuiteTarget
from evals.tests.test_runs import _dataset
from routing.tests import conftest as routing_fixtures
from routing.tests.conftest import Gateway

fake = routing_fixtures.fake
gateway = routing_fixtures.gateway

pytestmark = pytest.mark.django_db

MISMATCH = "evaluator_agent_mismatch"
SHOP_TONE = "the evaluator shop_tone belongs to the agent shopping, not to ride-support"


@pytest.fixture
def shopping(gateway: Gateway) -> Agent:
    agent: Agent = AgentFactory.create(workspace=gateway.workspace, slug="shopping", name="Shopping")
    return agent


@pytest.fixture
def evaluators(gateway: Gateway, shopping: Agent) -> dict[str, Evaluator]:
    """Ride support's own evaluator, the shopping agent's, and a workspace-wide one."""
    regex = {"type": "regex", "pattern": "ok"}
    return {
        "own": services.evaluator_create(
            workspace=gateway.workspace, agent=gateway.agent, name="ride_tone", config=regex
        ),
        "other": services.evaluator_create(workspace=gateway.workspace, agent=shopping, name="shop_tone", config=regex),
        "shared": services.evaluator_create(workspace=gateway.workspace, name="says_ok", config=regex),
    }


def _state() -> dict[str, list[Any]]:
    """Everything a refused write could have changed."""
    return {
        "evaluators": list(Evaluator.objects.order_by("pk").values_list("pk", "name", "version", "agent_id")),
        "suites": list(Suite.objects.order_by("pk").values_list("pk", "name", "samples")),
        "suite_evaluators": list(SuiteEvaluator.objects.order_by("pk").values_list("suite_id", "evaluator_id")),
        "runs": list(Run.objects.order_by("pk").values_list("pk", "status")),
        "rules": list(OnlineRule.objects.order_by("pk").values_list("pk", "name", "sample_rate")),
        "rule_evaluators": list(
            OnlineRule.evaluators.through.objects.order_by("pk").values_list("onlinerule_id", "evaluator_id")
        ),
    }


def _suite(gw: Gateway, chosen: list[Evaluator], **fields: Any) -> Suite:
    return services.suite_create(
        workspace=gw.workspace,
        name=fields.pop("name", "answers"),
        agent=fields.pop("agent", gw.agent),
        dataset=Dataset.objects.filter(workspace=gw.workspace, name="regressions").first() or _dataset(gw),
        target=fields.pop("target", SuiteTarget.RECORDED),
        evaluators_used=chosen,
        **fields,
    )


def _legacy_suite(gw: Gateway, evaluators: dict[str, Evaluator]) -> Suite:
    """A suite of ride support that holds the shopping agent's evaluator, as one made before the services
    refused that."""
    suite = _suite(gw, [evaluators["own"]], tier="single_call", target=SuiteTarget.AGENT)
    SuiteEvaluator.objects.create(suite=suite, evaluator=evaluators["other"], position=1)
    return suite


# --- Services -------------------------------------------------------------------------------------------


def test_a_suite_takes_its_agents_own_and_the_workspace_wide_evaluators(gateway: Gateway, evaluators: Any) -> None:
    suite = _suite(gateway, [evaluators["own"], evaluators["shared"]])

    assert [link.evaluator.name for link in suite.suite_evaluators.all()] == ["ride_tone", "says_ok"]
    # A workspace-wide suite (no agent) may take any of the workspace's evaluators.
    anyone = _suite(gateway, [evaluators["other"]], name="anyone", agent=None)
    assert [link.evaluator.name for link in anyone.suite_evaluators.all()] == ["shop_tone"]


def test_a_suite_refuses_another_agents_evaluator_and_writes_nothing(gateway: Gateway, evaluators: Any) -> None:
    existing = _suite(gateway, [evaluators["own"]])
    before = _state()

    with pytest.raises(exceptions.SuiteEvaluatorAgentMismatch) as created:
        _suite(gateway, [evaluators["shared"], evaluators["other"]], name="mixed")
    with pytest.raises(exceptions.SuiteEvaluatorAgentMismatch) as updated:
        services.suite_update(suite=existing, samples=8, evaluators_used=[evaluators["own"], evaluators["other"]])

    for caught in (created, updated):
        assert caught.value.status == 422
        assert caught.value.body() == {
            "detail": f"invalid suite: {SHOP_TONE}",
            "code": MISMATCH,
            "errors": [{"field": "evaluators", "message": SHOP_TONE}],
        }
    assert _state() == before


def test_an_online_rule_refuses_another_agents_evaluator_on_create_and_update(
    gateway: Gateway, evaluators: Any, other_workspace: Any
) -> None:
    rule = online.online_rule_create(agent=gateway.agent, name="live", evaluators_used=[evaluators["own"]])
    foreign = services.evaluator_create(workspace=other_workspace, name="says_yes", config={"type": "exact_match"})
    before = _state()

    with pytest.raises(exceptions.OnlineRuleEvaluatorAgentMismatch) as created:
        online.online_rule_create(agent=gateway.agent, name="audit", evaluators_used=[evaluators["other"]])
    with pytest.raises(exceptions.OnlineRuleEvaluatorAgentMismatch) as updated:
        online.online_rule_update(
            rule=rule, sample_rate=0.5, evaluators_used=[evaluators["shared"], evaluators["other"]]
        )
    # Another workspace's evaluator was refused on create only.
    with pytest.raises(exceptions.OnlineRuleInvalid) as elsewhere:
        online.online_rule_update(rule=rule, evaluators_used=[foreign])

    for caught in (created, updated):
        assert (caught.value.status, caught.value.code, caught.value.detail) == (
            422,
            MISMATCH,
            f"invalid online rule: {SHOP_TONE}",
        )
        assert caught.value.extra["errors"] == [{"field": "evaluators", "message": SHOP_TONE}]
    assert elsewhere.value.extra["errors"] == [{"field": "evaluators", "message": "an evaluator of another workspace"}]
    assert _state() == before
    # Its own and the workspace-wide evaluators it takes.
    online.online_rule_update(rule=rule, evaluators_used=[evaluators["own"], evaluators["shared"]])
    assert sorted(rule.evaluators.values_list("name", flat=True)) == ["ride_tone", "says_ok"]


def test_a_suite_holding_another_agents_evaluator_makes_no_run_on_demand_on_schedule_or_for_a_label_move(
    gateway: Gateway, evaluators: Any
) -> None:
    suite = _legacy_suite(gateway, evaluators)
    services.suite_update(suite=suite, schedule_cron="0 2 * * *", schedule_enabled=True)
    start = datetime(2026, 11, 24, 1, 30, tzinfo=UTC)
    Suite.objects.filter(pk=suite.pk).update(schedule_last_slot=schedules.slot_latest("0 2 * * *", start))

    with pytest.raises(runs.RunEvaluatorAgentMismatch) as caught:
        runs.run_create(suite=suite, dispatch=False)
    assert (caught.value.status, caught.value.code, caught.value.detail) == (
        409,
        MISMATCH,
        f"the suite answers cannot run: {SHOP_TONE}",
    )
    # The schedule skips the slot (and says why in the log) rather than retrying it every minute.
    assert schedules.schedules_tick(now=start + timedelta(minutes=31)) == []
    suite.refresh_from_db()
    assert suite.schedule_last_slot == datetime(2026, 11, 24, 2, 0, tzinfo=UTC)
    # A moved label makes neither a candidate nor a baseline run.
    prompt = gateway.agent.prompts.get()
    registry_services.prompt_version_create(prompt=prompt, template=[{"role": "system", "content": "v2"}])
    registry_services.prompt_label_move(
        prompt=prompt, label="production", version=PromptVersion.objects.get(prompt=prompt, version=2)
    )
    assert regressions.label_moves_check() == []
    assert not Run.objects.exists()

    # Once the suite is edited to its own evaluators, it runs.
    services.suite_update(suite=suite, evaluators_used=[evaluators["own"], evaluators["shared"]])
    made = runs.run_create(suite=suite, dispatch=False)
    assert [snapshot["name"] for snapshot in made.evaluators] == ["ride_tone", "says_ok"]


def test_a_rule_holding_another_agents_evaluator_scores_nothing_until_it_is_edited(
    gateway: Gateway, evaluators: Any
) -> None:
    rule = online.online_rule_create(
        agent=gateway.agent, name="live", evaluators_used=[evaluators["own"]], delay_seconds=0
    )
    rule.evaluators.add(evaluators["other"])  # as a rule made before the services refused that holds it
    now = timezone.now() + timedelta(seconds=1)

    assert online.rules_tick(now=now) == {}  # logged, as a rule whose evaluator cannot be built
    rule.refresh_from_db()
    assert rule.checked_until is None  # the watermark waits for the edit

    online.online_rule_update(rule=rule, evaluators_used=[evaluators["own"], evaluators["shared"]])
    assert online.rules_tick(now=now) == {rule.pk: 0}
    rule.refresh_from_db()
    assert rule.checked_until == now


def test_a_new_version_that_would_judge_another_agents_suite_or_rule_is_refused(
    gateway: Gateway, evaluators: Any, shopping: Agent
) -> None:
    suite = _suite(gateway, [evaluators["shared"]])
    online.online_rule_create(agent=gateway.agent, name="live", evaluators_used=[evaluators["shared"]])
    before = _state()

    # The workspace-wide says_ok given to the shopping agent would take over ride support's suite and rule.
    with pytest.raises(exceptions.EvaluatorAgentMismatch) as caught:
        services.evaluator_create(
            workspace=gateway.workspace, agent=shopping, name="says_ok", config={"type": "regex", "pattern": "yes"}
        )

    message = "this version would judge the suite answers, the online rule live, of another agent than shopping"
    assert caught.value.body() == {
        "detail": f"invalid evaluator: agent: {message}",
        "code": MISMATCH,
        "errors": [{"field": "agent", "message": message}],
    }
    assert _state() == before
    # Given to ride support itself, or kept workspace-wide, the new version takes over both.
    kept = services.evaluator_create(workspace=gateway.workspace, name="says_ok", config={"type": "exact_match"})
    mine = services.evaluator_create(
        workspace=gateway.workspace, agent=gateway.agent, name="says_ok", config={"type": "regex", "pattern": "k"}
    )
    assert (kept.version, kept.agent_id, mine.version, mine.agent_id) == (2, None, 3, gateway.agent.pk)
    assert [link.evaluator_id for link in suite.suite_evaluators.all()] == [mine.pk]
    assert list(OnlineRule.objects.get(name="live").evaluators.values_list("pk", flat=True)) == [mine.pk]


def test_a_proposal_does_not_take_another_agents_evaluator_of_the_same_metric(
    gateway: Gateway, shopping: Agent
) -> None:
    # The shopping agent has an evaluator named like ride support's committed trajectory metric.
    services.evaluator_create(
        workspace=gateway.workspace, agent=shopping, name="policy_compliance_rate", config={"type": "exact_match"}
    )
    before = _state()

    with pytest.raises(exceptions.SuiteEvaluatorAgentMismatch) as caught:
        services.suites_propose(agent=gateway.agent)

    assert caught.value.detail == (
        "the metric policy_compliance_rate cannot be proposed: the evaluator policy_compliance_rate belongs to the "
        "agent shopping, not to ride-support (evaluator names are unique in a workspace)"
    )
    # The suite proposed before the rule, and its new evaluator, are gone with it.
    assert _state() == before
    # A workspace-wide evaluator of the metric is taken, as before.
    Evaluator.objects.filter(name="policy_compliance_rate").update(agent=None)
    proposal = services.suites_propose(agent=gateway.agent)
    assert [e.name for e in proposal.rules[0].evaluators.all()] == ["policy_compliance_rate"]


# --- API ------------------------------------------------------------------------------------------------


def _post(client: Client, path: str, body: Any) -> Any:
    return client.post(path, data=json.dumps(body), content_type="application/json")


def _patch(client: Client, path: str, body: Any) -> Any:
    return client.patch(path, data=json.dumps(body), content_type="application/json")


def test_the_api_refuses_another_agents_evaluator_with_422_and_changes_nothing(
    gateway: Gateway, evaluators: Any, api_client_for: Any
) -> None:
    client = api_client_for(gateway.workspace, scopes=("read", "write"))
    _suite(gateway, [evaluators["own"]])
    online.online_rule_create(agent=gateway.agent, name="live", evaluators_used=[evaluators["own"]])
    before = _state()

    refused = [
        _post(client, "/api/v1/suites", {"name": "mixed", "agent": "ride-support", "evaluators": ["shop_tone"]}),
        _patch(client, "/api/v1/suites/answers", {"samples": 8, "evaluators": ["ride_tone", "shop_tone"]}),
        _post(client, "/api/v1/online-rules", {"name": "audit", "agent": "ride-support", "evaluators": ["shop_tone"]}),
        _patch(client, "/api/v1/online-rules/live", {"sample_rate": 0.5, "evaluators": ["shop_tone"]}),
        _post(
            client, "/api/v1/evaluators", {"name": "ride_tone", "agent": "shopping", "config": {"type": "exact_match"}}
        ),
    ]

    assert [(response.status_code, response.json()["code"]) for response in refused] == [(422, MISMATCH)] * 5
    assert refused[0].json()["errors"] == [{"field": "evaluators", "message": SHOP_TONE}]
    assert refused[0].json()["detail"] == f"invalid suite: {SHOP_TONE}"
    assert refused[2].json()["detail"] == f"invalid online rule: {SHOP_TONE}"
    assert _state() == before


def test_the_api_refuses_a_run_of_a_suite_holding_another_agents_evaluator_and_another_agents_judge(
    gateway: Gateway, evaluators: Any, api_client_for: Any
) -> None:
    client = api_client_for(gateway.workspace, scopes=("read", "write"))
    suite = _suite(gateway, [evaluators["own"]])
    baseline = runs.run_create(suite=suite, dispatch=False)
    candidate = runs.run_create(suite=suite, dispatch=False)
    SuiteEvaluator.objects.create(suite=suite, evaluator=evaluators["other"], position=1)
    services.evaluator_create(
        workspace=gateway.workspace,
        agent=evaluators["other"].agent,
        name="shop_prefers",
        config={"type": "pairwise_judge", "model": "fast"},
    )
    before = _state()

    run = _post(client, "/api/v1/suites/answers/runs", {})
    judged = client.get(f"/api/v1/runs/compare?baseline={baseline.pk}&candidate={candidate.pk}&judge=shop_prefers")

    assert (run.status_code, run.json()["code"], run.json()["detail"]) == (
        409,
        MISMATCH,
        f"the suite answers cannot run: {SHOP_TONE}",
    )
    message = "the evaluator shop_prefers belongs to the agent shopping, not to ride-support"
    assert judged.status_code == 422
    assert judged.json() == {
        "detail": f"the judge cannot compare run {baseline.pk}: {message}",
        "code": MISMATCH,
        "errors": [{"field": "judge", "message": message}],
    }
    assert _state() == before


# --- The dashboard's forms ------------------------------------------------------------------------------


@pytest.fixture
def member(gateway: Gateway) -> Client:
    user = UserFactory.create(username="mia")
    MembershipFactory.create(workspace=gateway.workspace, user=user, role=Role.MEMBER)
    client = Client()
    client.force_login(user)
    return client


def _messages(response: Any) -> list[str]:
    return [str(message) for message in response.context["messages"]]


def test_the_dashboards_forms_show_the_refusal_beside_the_evaluators_and_change_nothing(
    gateway: Gateway, evaluators: Any, member: Client
) -> None:
    ws = gateway.workspace.slug
    _suite(gateway, [evaluators["own"]])
    online.online_rule_create(agent=gateway.agent, name="live", evaluators_used=[evaluators["own"]])
    before = _state()
    suite_data = {
        "name": "nightly",
        "agent": "ride-support",
        "dataset": "regressions",
        "target": "recorded",
        "prompt_label": "production",
        "evaluators": ["ride_tone", "shop_tone"],
        "samples": "1",
        "concurrency": "1",
    }
    rule_data = {
        "name": "audit",
        "agent": "ride-support",
        "evaluators": ["shop_tone"],
        "sample_rate": "1",
        "delay_seconds": "60",
        "enabled": "on",
    }
    edited_rule = {key: value for key, value in rule_data.items() if key not in ("name", "agent")}
    edited_suite = {key: value for key, value in suite_data.items() if key not in ("name", "agent")}

    pages = {
        "suite_create": member.post(f"/w/{ws}/evals/suites/new/", suite_data),
        "suite_edit": member.post(f"/w/{ws}/evals/suites/answers/edit/", edited_suite),
        "rule_create": member.post(f"/w/{ws}/evals/online-rules/", rule_data),
        "rule_edit": member.post(f"/w/{ws}/evals/online-rules/live/", edited_rule),
    }

    for name, response in pages.items():
        assert response.status_code == 422, name
        assert response.context["form"].errors["evaluators"] == [
            SHOP_TONE if name.startswith("suite") else f"evaluators: {SHOP_TONE}"
        ], name
        assert 'id="id_evaluators_error"' in response.content.decode(), name
    assert _state() == before


def test_run_now_and_propose_say_why_on_the_dashboard(
    gateway: Gateway, evaluators: Any, member: Client, shopping: Agent
) -> None:
    ws = gateway.workspace.slug
    _legacy_suite(gateway, evaluators)
    services.evaluator_create(
        workspace=gateway.workspace, agent=shopping, name="policy_compliance_rate", config={"type": "exact_match"}
    )
    before = _state()

    ran = member.post(f"/w/{ws}/evals/suites/answers/run/", follow=True)
    proposed = member.post(f"/w/{ws}/evals/propose/", {"agent": "ride-support"}, follow=True)

    assert _messages(ran) == [f"The suite answers cannot run: {SHOP_TONE}."]
    assert _messages(proposed) == [
        "Nothing was proposed for Ride support: the metric policy_compliance_rate cannot be proposed: the evaluator "
        "policy_compliance_rate belongs to the agent shopping, not to ride-support (evaluator names are unique in a "
        "workspace)."
    ]
    assert _state() == before
