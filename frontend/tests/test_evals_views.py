"""The evals pages of the dashboard: suites (list, proposal, create and edit, run now), a suite's metrics
over time, runs with their progress and report (subgroups with the worst group, items down to each
sample's trajectory), cancel and resume, two runs compared, online rules and their backfill, regression
alerts, and adding a trajectory to a dataset from the step-through view and from a review queue. The runs
are real: made by evals.runs and executed through the gateway on the fake provider."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from agent_registry.models import Role, Workspace
from agent_registry.tests.factories import AgentFactory, MembershipFactory, UserFactory
from evals import dataset_items, online, runs, services
from evals.models import (
    Dataset,
    DatasetItem,
    DatasetVersion,
    OnlineRule,
    RegressionAlert,
    Run,
    RunStatus,
    Suite,
    SuiteTarget,
)
from frontend.tests import traces
from routing.tests import conftest as routing_fixtures
from routing.tests.conftest import Gateway
from routing.tests.fakes import FakeGatewayLLM, say
from tracing import triage
from tracing.models import ReviewSample, Trajectory

fake = routing_fixtures.fake
gateway = routing_fixtures.gateway

pytestmark = pytest.mark.django_db

QUESTIONS = (
    ("Where is my receipt?", "en", "receipts"),
    ("¿Dónde está mi recibo?", "es", "receipts"),
    ("Refund my double charge", "en", "refunds"),
    ("Devuélvanme el cobro doble", "es", "refunds"),
)
# Item by item, sample by sample (k = 4, one worker): en receipts passes 1 of 4, es receipts 0 of 4, refunds
# all. The worst intent is receipts; the worst language es.
FIRST_ANSWERS = ["ok", "no", "no", "no"] + ["no"] * 4 + ["ok"] * 4 + ["ok"] * 4


def _dataset(workspace: Workspace, agent: Any, name: str = "regressions") -> Dataset:
    dataset = services.dataset_create(workspace=workspace, name=name, agent=agent)
    items = [
        dataset_items.ItemData(
            input_messages=({"role": "user", "content": text},),
            reference_output="ok",
            metadata={"tags": {"language": language, "intent": intent}, "variables": {"company": "Acme"}},
        )
        for text, language, intent in QUESTIONS
    ]
    services.dataset_version_create_from_items(dataset=dataset, items=items)
    return dataset


def _suite(gw: Gateway, **fields: Any) -> Suite:
    evaluator = services.evaluator_create(
        workspace=gw.workspace, name="says_ok", config={"type": "regex", "pattern": r"\bok\b", "flags": ["IGNORECASE"]}
    )
    return services.suite_create(
        workspace=gw.workspace,
        name="answers",
        agent=gw.agent,
        dataset=_dataset(gw.workspace, gw.agent),
        samples=4,
        concurrency=1,
        tier="single_call",
        evaluators_used=[evaluator],
        **fields,
    )


def _execute(suite: Suite, fake: FakeGatewayLLM, answers: list[str]) -> Run:
    fake.script("fast", *[say(answer) for answer in answers])
    run = runs.run_execute(run_id=runs.run_create(suite=suite, dispatch=False).pk)
    assert run is not None
    assert run.status == RunStatus.COMPLETED
    return run


@pytest.fixture
def suite(gateway: Gateway) -> Suite:
    return _suite(gateway)


@pytest.fixture
def completed(suite: Suite, fake: FakeGatewayLLM) -> Run:
    return _execute(suite, fake, FIRST_ANSWERS)


def _client(workspace: Workspace, role: Role, username: str) -> Client:
    user = UserFactory.create(username=username)
    MembershipFactory.create(workspace=workspace, user=user, role=role)
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def member(gateway: Gateway) -> Client:
    return _client(gateway.workspace, Role.MEMBER, "mia")


@pytest.fixture
def viewer(gateway: Gateway) -> Client:
    return _client(gateway.workspace, Role.VIEWER, "vic")


@pytest.fixture
def elsewhere(other_workspace: Workspace) -> dict[str, Any]:
    """Another workspace's suite, queued run, online rule, dataset and trajectory."""
    agent = AgentFactory.create(workspace=other_workspace, slug="globex-bot")
    evaluator = services.evaluator_create(
        workspace=other_workspace, name="says_yes", config={"type": "regex", "pattern": "yes"}
    )
    dataset = _dataset(other_workspace, agent, name="globex-set")
    suite = services.suite_create(
        workspace=other_workspace,
        name="globex-suite",
        agent=agent,
        dataset=dataset,
        target=SuiteTarget.RECORDED,
        evaluators_used=[evaluator],
    )
    run = runs.run_create(suite=suite, dispatch=False)
    rule = online.online_rule_create(agent=agent, name="globex-rule", evaluators_used=[evaluator])
    trajectory = traces.conversation(other_workspace, "globex/refund")
    return {"suite": suite, "run": run, "rule": rule, "dataset": dataset, "trajectory": trajectory}


def _evals_state() -> dict[str, list[Any]]:
    """Everything an evals POST could change, to assert that a refused one changed nothing."""
    return {
        "suites": list(
            Suite.objects.order_by("pk").values_list(
                "pk", "name", "samples", "schedule_cron", "schedule_enabled", "dataset_id", "proposed"
            )
        ),
        "runs": list(Run.objects.order_by("pk").values_list("pk", "status", "resume_after")),
        "rules": list(OnlineRule.objects.order_by("pk").values_list("pk", "name", "sample_rate", "enabled")),
        "datasets": list(Dataset.objects.order_by("pk").values_list("pk", "name")),
        "versions": list(DatasetVersion.objects.order_by("pk").values_list("pk", "version")),
    }


def _messages(response: Any) -> list[str]:
    return [str(message) for message in response.context["messages"]]


# --- Suites -------------------------------------------------------------------------------------------


def test_the_overview_lists_each_suite_with_its_evaluators_schedule_and_last_run(gateway, member, completed):
    services.suite_update(suite=completed.suite, schedule_cron="0 2 * * *", schedule_enabled=True)

    response = member.get(f"/w/{gateway.workspace.slug}/evals/")

    assert response.status_code == 200
    (row,) = response.context["rows"]
    assert row.suite.name == "answers"
    assert row.last_run.pk == completed.pk
    assert row.headline.evaluator == "says_ok"
    assert row.headline.mean == pytest.approx((0.25 + 0 + 1 + 1) / 4)
    assert row.headline.pass_at_1 == pytest.approx((0.25 + 0 + 1 + 1) / 4)
    assert row.next_run is not None
    assert (row.next_run.hour, row.next_run.minute) == (2, 0)
    content = response.content.decode()
    assert "<code>says_ok</code> v1" in content
    assert '<span class="badge badge-run-completed" data-run-status="completed">Completed</span>' in content
    assert ">0.563<" in content
    assert "Run now</button>" in content
    assert "Propose from commitment</button>" in content
    assert '<a href="/w/acme/evals/" aria-current="page">' in content.replace("\n", "").replace("            ", "")


def test_a_viewer_reads_the_overview_without_the_buttons_that_change_things(gateway, viewer, completed):
    response = viewer.get(f"/w/{gateway.workspace.slug}/evals/")

    assert response.status_code == 200
    content = response.content.decode()
    assert "answers" in content
    assert "Run now</button>" not in content
    assert "Propose from commitment</button>" not in content


def test_run_now_makes_a_manual_run_by_the_member_and_hands_it_to_a_worker(
    gateway, member, suite, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = member.post(f"/w/{gateway.workspace.slug}/evals/suites/answers/run/")

    run = Run.objects.get(suite=suite)
    assert response.status_code == 302
    assert response["Location"] == f"/w/{gateway.workspace.slug}/evals/runs/{run.pk}/"
    assert (run.status, run.trigger, str(run.created_by), run.item_count) == ("queued", "manual", "mia", 4)
    assert len(callbacks) == 1


def test_run_now_on_a_suite_that_cannot_run_says_why_and_makes_nothing(gateway, member):
    services.suite_create(workspace=gateway.workspace, name="empty", agent=gateway.agent)

    response = member.post(f"/w/{gateway.workspace.slug}/evals/suites/empty/run/", follow=True)

    assert not Run.objects.exists()
    assert _messages(response) == ["The suite empty cannot run: the suite has no dataset; the suite has no evaluators."]


def test_propose_from_the_commitment_makes_the_agents_suite_and_rule(gateway, member):
    response = member.post(f"/w/{gateway.workspace.slug}/evals/propose/", {"agent": gateway.agent.slug}, follow=True)

    proposed = Suite.objects.get(workspace=gateway.workspace, proposed=True)
    assert proposed.name == "ride-support-output-quality"
    (message,) = _messages(response)
    assert message.startswith("Proposed from Ride support's evaluation commitment: ride-support-output-quality")

    again = member.post(f"/w/{gateway.workspace.slug}/evals/propose/", {"agent": gateway.agent.slug}, follow=True)
    assert _messages(again) == ["Ride support's commitment proposes nothing new: its suites and rules exist."]
    assert Suite.objects.filter(workspace=gateway.workspace).count() == 1


def _suite_post(**changes: Any) -> dict[str, Any]:
    return {
        "name": "nightly",
        "agent": "ride-support",
        "description": "Receipts and refunds",
        "dataset": "regressions",
        "target": "agent",
        "prompt_label": "production",
        "prompt_version": "",
        "tier": "single_call",
        "model_target": "",
        "evaluators": ["says_ok"],
        "samples": "4",
        "concurrency": "2",
        "schedule_cron": "0 3 * * *",
        "schedule_enabled": "on",
        **changes,
    }


def test_a_member_creates_a_suite_with_evaluators_and_a_schedule(gateway, member, suite):
    response = member.post(f"/w/{gateway.workspace.slug}/evals/suites/new/", _suite_post())

    assert response.status_code == 302
    created = Suite.objects.get(workspace=gateway.workspace, name="nightly")
    assert response["Location"] == f"/w/{gateway.workspace.slug}/evals/suites/nightly/"
    assert (created.samples, created.concurrency, created.schedule_cron, created.schedule_enabled) == (
        4,
        2,
        "0 3 * * *",
        True,
    )
    assert created.dataset is not None
    assert created.dataset.name == "regressions"
    assert [link.evaluator.name for link in created.suite_evaluators.all()] == ["says_ok"]
    assert created.schedule_last_slot is not None  # the schedule counts from now


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"schedule_cron": "every night"}, "schedule_cron", "use five fields"),
        ({"schedule_cron": "", "schedule_enabled": "on"}, "schedule_cron", "a schedule needs a cron expression"),
        ({"samples": "65"}, "samples", "less than or equal to 64"),
        ({"name": "no spaces please"}, "name", "Use letters, digits"),
        ({"name": "answers"}, "name", "a suite with this name exists"),
        ({"dataset": "not-ours"}, "dataset", "Select a valid choice"),
        # Valid fields, but no date ever matches: croniter found no slot, which was a 500.
        ({"schedule_cron": "0 0 31 2 *", "schedule_enabled": "on"}, "schedule_cron", "never matches a date"),
        # Three more 500s: PostgreSQL refused the NUL and the NaN mid-write, and deep nesting overflowed the stack.
        ({"variables": '{"company": "Acme\\u0000"}'}, "variables", "it holds a NUL character"),
        ({"variables": '{"discount": NaN}'}, "variables", "Not JSON Keel can store: it is not valid JSON"),
        ({"variables": "[" * 100_000}, "variables", "Not JSON Keel can store: nested too deeply."),
    ],
)
def test_a_bad_suite_is_shown_beside_its_field_and_changes_nothing(gateway, member, suite, changes, field, message):
    before = _evals_state()

    response = member.post(f"/w/{gateway.workspace.slug}/evals/suites/new/", _suite_post(**changes))

    assert response.status_code == 422
    errors = response.context["form"].errors
    assert message in " ".join(errors[field])
    assert f'id="id_{field}_error"' in response.content.decode()
    assert _evals_state() == before


def test_editing_a_suite_changes_k_and_the_schedule(gateway, member, suite):
    page = member.get(f"/w/{gateway.workspace.slug}/evals/suites/answers/edit/")
    assert page.status_code == 200
    assert page.context["form"].initial["samples"] == 4

    data = _suite_post(samples="8", schedule_cron="hourly")
    del data["name"], data["agent"]
    response = member.post(f"/w/{gateway.workspace.slug}/evals/suites/answers/edit/", data)

    assert response.status_code == 302
    suite.refresh_from_db()
    assert (suite.samples, suite.schedule_cron, suite.schedule_enabled) == (8, "hourly", True)


def test_a_suites_prompt_variables_are_edited_as_json(gateway, member, suite):
    data = _suite_post(variables='{"company": "Acme Rides"}')
    del data["name"], data["agent"]
    assert member.post(f"/w/{gateway.workspace.slug}/evals/suites/answers/edit/", data).status_code == 302
    suite.refresh_from_db()
    assert suite.variables == {"company": "Acme Rides"}

    before = _evals_state()
    for bad, message in (('{"company": ', "Not JSON"), ('["Acme"]', "An object of variable name")):
        data = _suite_post(variables=bad)
        del data["name"], data["agent"]
        response = member.post(f"/w/{gateway.workspace.slug}/evals/suites/answers/edit/", data)
        assert response.status_code == 422
        assert message in " ".join(response.context["form"].errors["variables"])
    assert _evals_state() == before
    suite.refresh_from_db()
    assert suite.variables == {"company": "Acme Rides"}


def test_a_bad_edit_changes_nothing(gateway, member, suite):
    before = _evals_state()
    data = _suite_post(schedule_cron="61 * * * *")
    del data["name"], data["agent"]

    response = member.post(f"/w/{gateway.workspace.slug}/evals/suites/answers/edit/", data)

    assert response.status_code == 422
    assert "not a valid cron expression" in " ".join(response.context["form"].errors["schedule_cron"])
    assert _evals_state() == before


# --- A suite's metrics over time ----------------------------------------------------------------------


def test_the_suite_page_charts_each_run_by_prompt_version_with_the_worst_group(gateway, member, completed, fake):
    second = _execute(completed.suite, fake, ["ok"] * 16)

    response = member.get(f"/w/{gateway.workspace.slug}/evals/suites/answers/")

    assert response.status_code == 200
    (chart,) = response.context["charts"]
    assert chart.evaluator == "says_ok"
    assert [point["run"] for point in chart.points] == [completed.pk, second.pk]
    assert chart.data["series"] == [{"label": "prompt v1", "values": [pytest.approx(0.5625), pytest.approx(1.0)]}]
    assert chart.data["worst"][0] == pytest.approx(0.125)  # receipts: (0.25 + 0) / 2
    assert chart.data["worst_names"][0] == "intent=receipts"
    content = response.content.decode()
    assert 'id="eval-chart-data"' in content
    assert 'data-eval-chart="0"' in content
    assert "intent = <strong>receipts</strong>: 0.125" in content
    assert f'data-run="{second.pk}"' in content


# --- Runs ---------------------------------------------------------------------------------------------


def test_the_run_page_reports_pass_at_k_and_highlights_the_worst_group_of_each_tag(gateway, member, completed):
    response = member.get(f"/w/{gateway.workspace.slug}/evals/runs/{completed.pk}/")

    assert response.status_code == 200
    (report,) = response.context["reports"]
    assert [k for k, *_ in report.pass_at_k] == ["1", "4"]  # k = 16 needs 16 samples
    assert report.pass_at_k[1][1] == pytest.approx(3 / 4)
    by_tag = {table.tag_key: table for table in report.subgroups}
    assert [group.name for group in by_tag["intent"].groups if group.worst] == ["receipts"]
    assert [group.name for group in by_tag["language"].groups if group.worst] == ["es"]
    content = response.content.decode()
    assert '<tr data-group="receipts" class="is-worst" data-worst="true">' in content
    assert '<tr data-group="refunds">' in content
    assert "small group</span>" in content  # two items a group, below the threshold
    assert "data-progress-url" not in content  # a finished run is not polled
    # The pause box was rendered `hidden` for every run, and .alert's display:flex showed it anyway.
    assert "data-pause" not in content
    assert "Paused:" not in content


def test_each_sample_links_to_the_trajectory_that_produced_it(gateway, member, completed):
    response = member.get(f"/w/{gateway.workspace.slug}/evals/runs/{completed.pk}/")

    content = response.content.decode()
    first = response.context["items"][0].item
    assert first.position == 0
    samples = list(first.samples.all())
    assert len(samples) == 4
    for sample in samples:
        assert f'href="/w/{gateway.workspace.slug}/trajectories/{sample.trace_id}/" data-trace="{sample.trace_id}"' in (
            content
        )
    assert "<code>says_ok</code> v1: <strong>1.000</strong>" in content
    assert "Where is my receipt?" in content


def test_the_items_are_paginated_and_one_item_can_be_opened_alone(gateway, member, completed, monkeypatch):
    from frontend import evals_views

    monkeypatch.setattr(evals_views, "ITEMS_PER_PAGE", 3)
    second_page = member.get(f"/w/{gateway.workspace.slug}/evals/runs/{completed.pk}/?page=2")
    assert [view.item.position for view in second_page.context["items"]] == [3]
    assert second_page.context["pages"] == 2

    alone = member.get(f"/w/{gateway.workspace.slug}/evals/runs/{completed.pk}/?item=2")
    assert [view.item.position for view in alone.context["items"]] == [2]

    missing = member.get(f"/w/{gateway.workspace.slug}/evals/runs/{completed.pk}/?item=9")
    assert missing.status_code == 404


def test_the_progress_endpoint_reports_the_runs_counts(gateway, member, suite, fake):
    queued = runs.run_create(suite=suite, dispatch=False)

    before = member.get(f"/w/{gateway.workspace.slug}/evals/runs/{queued.pk}/progress/").json()
    page = member.get(f"/w/{gateway.workspace.slug}/evals/runs/{queued.pk}/").content.decode()
    fake.script("fast", *[say("ok")] * 16)
    runs.run_execute(run_id=queued.pk)
    after = member.get(f"/w/{gateway.workspace.slug}/evals/runs/{queued.pk}/progress/").json()

    assert (before["status"], before["finished"], before["items"], before["percent"], before["polling"]) == (
        "queued",
        0,
        4,
        0.0,
        True,
    )
    assert f'data-progress-url="/w/{gateway.workspace.slug}/evals/runs/{queued.pk}/progress/"' in page
    assert (after["status"], after["done"], after["percent"], after["polling"]) == ("completed", 4, 100.0, False)


def test_a_member_cancels_an_active_run(gateway, member, suite):
    queued = runs.run_create(suite=suite, dispatch=False)

    response = member.post(f"/w/{gateway.workspace.slug}/evals/runs/{queued.pk}/cancel/", follow=True)

    queued.refresh_from_db()
    assert queued.status == RunStatus.CANCELLED
    assert _messages(response) == [f"Cancelled run #{queued.pk}; the items it finished keep their scores."]
    again = member.post(f"/w/{gateway.workspace.slug}/evals/runs/{queued.pk}/cancel/", follow=True)
    assert _messages(again) == [f"Run #{queued.pk} is cancelled: there is nothing to cancel."]


def test_a_paused_run_shows_its_reason_and_a_member_resumes_it(
    gateway, member, suite, django_capture_on_commit_callbacks
):
    queued = runs.run_create(suite=suite, dispatch=False)
    later = timezone.now() + timedelta(minutes=2)
    # A provider outage pauses a run (evals.runs); here its state is set directly.
    Run.objects.filter(pk=queued.pk).update(
        status=RunStatus.PAUSED, pause_reason="fast: connection refused", resume_after=later
    )

    page = member.get(f"/w/{gateway.workspace.slug}/evals/runs/{queued.pk}/")
    content = page.content.decode()
    assert "fast: connection refused" in content
    assert "<strong>Paused:</strong>" in content
    assert "Resume</button>" in content
    assert "data-progress-url" not in content  # a paused run waits: no polling
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = member.post(f"/w/{gateway.workspace.slug}/evals/runs/{queued.pk}/resume/")

    assert response.status_code == 302
    queued.refresh_from_db()
    assert queued.resume_after is not None
    assert queued.resume_after < later
    assert len(callbacks) == 1


def test_resuming_a_run_that_is_not_paused_says_so(gateway, member, completed):
    response = member.post(f"/w/{gateway.workspace.slug}/evals/runs/{completed.pk}/resume/", follow=True)

    assert _messages(response) == ["Not resumed: the run is completed, not paused."]


def test_the_run_list_filters_by_status(gateway, member, completed, suite):
    queued = runs.run_create(suite=suite, dispatch=False)

    response = member.get(f"/w/{gateway.workspace.slug}/evals/runs/?status=queued")

    assert [run.pk for run in response.context["runs"]] == [queued.pk]
    assert [run.pk for run in member.get(f"/w/{gateway.workspace.slug}/evals/runs/").context["runs"]] == [
        queued.pk,
        completed.pk,
    ]


# --- Comparing runs and regressions -------------------------------------------------------------------


def test_compare_defaults_to_the_previous_completed_run_and_pairs_the_items(gateway, member, completed, fake):
    second = _execute(completed.suite, fake, ["ok"] * 16)

    response = member.get(f"/w/{gateway.workspace.slug}/evals/compare/?b={second.pk}")

    assert response.status_code == 200
    assert (response.context["run_a"].pk, response.context["run_b"].pk) == (completed.pk, second.pk)
    (metric,) = response.context["metrics"]
    comparison = metric.comparison
    assert comparison["mean_a"] == pytest.approx(0.5625)
    assert comparison["mean_b"] == pytest.approx(1.0)
    assert comparison["mean_delta"] == pytest.approx(0.4375)
    assert (comparison["improved"], comparison["worsened"], comparison["unchanged"]) == (2, 0, 2)
    assert [(row.position_b, row.delta) for row in metric.items] == [
        (0, pytest.approx(0.75)),
        (1, pytest.approx(1.0)),
        (2, 0.0),
        (3, 0.0),
    ]
    content = response.content.decode()
    assert '<td class="num delta-up" data-delta>+0.438</td>' in content
    # The run page links here with the same pair.
    run_page = member.get(f"/w/{gateway.workspace.slug}/evals/runs/{second.pk}/").content.decode()
    assert f"compare/?a={completed.pk}&amp;b={second.pk}" in run_page


def test_comparing_a_run_with_itself_is_refused_beside_the_field(gateway, member, completed):
    response = member.get(f"/w/{gateway.workspace.slug}/evals/compare/?a={completed.pk}&b={completed.pk}")

    assert response.status_code == 200
    assert response.context["result"] is None
    assert response.context["form"].errors["b"] == ["Pick another run than A."]


def test_regression_alerts_show_on_the_overview_and_on_both_runs(gateway, member, completed, fake):
    candidate = _execute(completed.suite, fake, ["no"] * 16)
    RegressionAlert.objects.create(
        workspace=gateway.workspace,
        agent=gateway.agent,
        suite=completed.suite,
        baseline_run=completed,
        candidate_run=candidate,
        metric="says_ok",
        comparison={"mean_delta": -0.5625},
        message="says_ok fell from 0.56 to 0.00 with prompt v1",
    )

    for url in (
        f"/w/{gateway.workspace.slug}/evals/",
        f"/w/{gateway.workspace.slug}/evals/runs/{candidate.pk}/",
        f"/w/{gateway.workspace.slug}/evals/runs/{completed.pk}/",
        f"/w/{gateway.workspace.slug}/evals/suites/answers/",
    ):
        content = member.get(url).content.decode()
        assert "says_ok fell from 0.56 to 0.00 with prompt v1" in content, url
        assert '<td class="num delta-down">-0.563</td>' in content, url


# --- Online rules -------------------------------------------------------------------------------------


def _rule_post(**changes: Any) -> dict[str, Any]:
    return {
        "name": "audit",
        "agent": "ride-support",
        "evaluators": ["says_ok"],
        "filter": '{"status": "error"}',
        "sample_rate": "0.5",
        "delay_seconds": "120",
        "enabled": "on",
        **changes,
    }


def test_a_member_adds_an_online_rule_and_the_list_shows_its_summary(gateway, member, suite):
    response = member.post(f"/w/{gateway.workspace.slug}/evals/online-rules/", _rule_post())

    assert response.status_code == 302
    rule = OnlineRule.objects.get(workspace=gateway.workspace, name="audit")
    assert (rule.filter, rule.sample_rate, rule.delay_seconds, rule.enabled) == ({"status": "error"}, 0.5, 120, True)
    listing = member.get(f"/w/{gateway.workspace.slug}/evals/online-rules/")
    ((shown, summary),) = listing.context["rows"]
    assert shown.pk == rule.pk
    assert summary == {"trajectories": 0, "evaluators": {}}
    assert '<td class="num" data-scored>0</td>' in listing.content.decode()


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"filter": "{not json"}, "filter", "Not JSON"),
        ({"filter": '{"colour": "red"}'}, "filter", "filter.colour: unknown"),
        ({"sample_rate": "1.5"}, "sample_rate", "less than or equal to 1"),
        ({"evaluators": []}, "evaluators", "This field is required."),
        ({"evaluators": ["which"]}, "evaluators", "a pairwise judge compares two runs; it cannot score a trajectory"),
        ({"filter": '{"tags": ["refund\\u0000"]}'}, "filter", "it holds a NUL character"),
    ],
)
def test_a_bad_online_rule_is_shown_beside_its_field_and_changes_nothing(
    gateway, member, suite, changes, field, message
):
    services.evaluator_create(
        workspace=gateway.workspace, name="which", config={"type": "pairwise_judge", "rubric": "Which is better?"}
    )
    before = _evals_state()

    response = member.post(f"/w/{gateway.workspace.slug}/evals/online-rules/", _rule_post(**changes))

    assert response.status_code == 422
    assert message in " ".join(response.context["form"].errors[field])
    assert _evals_state() == before


def test_a_member_edits_a_rule_and_queues_a_backfill(gateway, member, suite, django_capture_on_commit_callbacks):
    created = member.post(f"/w/{gateway.workspace.slug}/evals/online-rules/", _rule_post(), follow=True)
    assert _messages(created) == ["Created the online rule audit."]
    url = f"/w/{gateway.workspace.slug}/evals/online-rules/audit/"
    assert member.get(url).status_code == 200

    data = _rule_post(sample_rate="0.25", enabled="")
    del data["name"], data["agent"]
    edited = member.post(url, data, follow=True)
    assert _messages(edited) == ["Saved the online rule audit."]
    rule = OnlineRule.objects.get(name="audit")
    assert (rule.sample_rate, rule.enabled) == (0.25, False)

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = member.post(f"{url}backfill/", {"start": "2026-01-01T00:00", "end": "2026-01-02T00:00"}, follow=True)
    assert len(callbacks) == 1
    assert _messages(response) == [
        "Backfilling audit from 2026-01-01 00:00 to 2026-01-02 00:00 UTC; trajectories already scored are skipped."
    ]

    with django_capture_on_commit_callbacks(execute=False) as refused:
        bad = member.post(f"{url}backfill/", {"start": "2026-01-02T00:00", "end": "2026-01-01T00:00"})
    assert bad.status_code == 422
    assert bad.context["backfill_form"].errors["end"] == ["Must be after the start."]
    assert refused == []


# --- Adding a trajectory to a dataset -----------------------------------------------------------------


@pytest.fixture
def trajectory(gateway: Gateway) -> Trajectory:
    return traces.conversation(gateway.workspace, "acme/refund", question="I was charged twice for trip T-9")


def test_the_step_through_view_offers_add_to_dataset_to_members_only(gateway, member, viewer, trajectory):
    url = f"/w/{gateway.workspace.slug}/trajectories/{trajectory.trace_id}/"

    assert 'id="dataset-title">Add to dataset</h2>' in member.get(url).content.decode()
    assert 'id="dataset-title"' not in viewer.get(url).content.decode()


def test_adding_a_trajectory_to_a_new_dataset_keeps_its_trace_id(gateway, member, trajectory):
    response = member.post(
        f"/w/{gateway.workspace.slug}/trajectories/{trajectory.trace_id}/dataset/",
        {"dataset": "", "new_name": "hard-cases"},
        follow=True,
    )

    dataset = Dataset.objects.get(workspace=gateway.workspace, name="hard-cases")
    (item,) = DatasetItem.objects.filter(version__dataset=dataset)
    assert item.source_trace_id == trajectory.trace_id
    assert item.version.version == 1
    assert dataset.agent == gateway.agent
    assert _messages(response) == ["Added the trajectory to the dataset hard-cases: version 1 has 1 item."]
    assert response.redirect_chain[-1][0] == f"/w/{gateway.workspace.slug}/trajectories/{trajectory.trace_id}/#dataset"


def test_adding_to_an_existing_dataset_makes_its_next_version(gateway, member, suite, trajectory):
    response = member.post(
        f"/w/{gateway.workspace.slug}/trajectories/{trajectory.trace_id}/dataset/",
        {"dataset": "regressions", "new_name": ""},
        follow=True,
    )

    latest = DatasetVersion.objects.filter(dataset__name="regressions").order_by("-version").first()
    assert latest is not None
    assert (latest.version, latest.item_count) == (2, 5)
    assert latest.items.order_by("-position")[0].source_trace_id == trajectory.trace_id
    assert _messages(response) == ["Added the trajectory to the dataset regressions: version 2 has 5 items."]


def test_adding_a_trajectory_the_dataset_holds_already_says_so(gateway, member, suite, trajectory):
    path = f"/w/{gateway.workspace.slug}/trajectories/{trajectory.trace_id}/dataset/"
    member.post(path, {"dataset": "regressions", "new_name": ""})
    before = _evals_state()

    response = member.post(path, {"dataset": "regressions", "new_name": ""})

    assert response.status_code == 422
    assert "holds every trajectory named already" in " ".join(response.context["dataset_form"].errors["dataset"])
    assert _evals_state() == before


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        ({"dataset": "", "new_name": ""}, "dataset", "Choose a dataset, or name a new one."),
        ({"dataset": "regressions", "new_name": "also-this"}, "new_name", "not both"),
        ({"dataset": "", "new_name": "regressions"}, "new_name", "a dataset named 'regressions' exists"),
        ({"dataset": "", "new_name": "two words"}, "new_name", "Use letters, digits"),
        ({"dataset": "globex-set", "new_name": ""}, "dataset", "Select a valid choice"),
    ],
)
def test_a_bad_dataset_choice_is_shown_beside_the_field_and_changes_nothing(
    gateway, member, suite, trajectory, elsewhere, data, field, message
):
    before = _evals_state()

    response = member.post(f"/w/{gateway.workspace.slug}/trajectories/{trajectory.trace_id}/dataset/", data)

    assert response.status_code == 422
    assert message in " ".join(response.context["dataset_form"].errors[field])
    assert 'id="dataset-title">Add to dataset</h2>' in response.content.decode()
    assert _evals_state() == before


@pytest.fixture
def queue(gateway: Gateway, trajectory: Trajectory) -> ReviewSample:
    return triage.review_sample_create(
        workspace=gateway.workspace,
        strategy="random",
        window_start=trajectory.started_at - timedelta(hours=1),
        window_end=trajectory.started_at + timedelta(hours=1),
        budget=5,
    )


def test_each_review_queue_row_adds_its_trajectory_to_a_dataset(gateway, member, viewer, suite, queue, trajectory):
    url = f"/w/{gateway.workspace.slug}/review/{queue.pk}/"
    page = member.get(url).content.decode()
    assert f'action="/w/{gateway.workspace.slug}/review/{queue.pk}/items/1/dataset/"' in page
    assert 'id="dataset-1-dataset"' in page
    assert "/dataset/" not in viewer.get(url).content.decode()

    response = member.post(f"{url}items/1/dataset/", {"dataset": "regressions"}, follow=True)

    assert response.redirect_chain[-1][0] == f"{url}#item-1"
    latest = DatasetVersion.objects.filter(dataset__name="regressions").order_by("-version").first()
    assert latest is not None
    assert latest.version == 2
    assert latest.items.order_by("-position")[0].source_trace_id == trajectory.trace_id
    assert _messages(response) == ["Added the trajectory to the dataset regressions: version 2 has 5 items."]


def test_the_review_item_page_adds_to_a_dataset_and_comes_back(gateway, member, queue, trajectory):
    url = f"/w/{gateway.workspace.slug}/review/{queue.pk}/items/1/"
    assert 'name="back" value="item"' in member.get(url).content.decode()

    response = member.post(f"{url}dataset/", {"new_name": "from-review", "back": "item"})

    assert response.status_code == 302
    assert response["Location"] == url
    assert DatasetItem.objects.get(version__dataset__name="from-review").source_trace_id == trajectory.trace_id


def test_a_bad_choice_on_a_queue_row_is_shown_on_that_row(gateway, member, queue):
    before = _evals_state()

    response = member.post(f"/w/{gateway.workspace.slug}/review/{queue.pk}/items/1/dataset/", {"dataset": ""})

    assert response.status_code == 422
    assert response.context["dataset_position"] == 1
    assert 'id="dataset-1-dataset-error"' in response.content.decode()
    assert _evals_state() == before


# --- Roles and tenancy --------------------------------------------------------------------------------


def _posts(
    gateway: Gateway, completed: Run, trace_id: str, queue: ReviewSample
) -> dict[str, tuple[str, dict[str, Any]]]:
    ws = gateway.workspace.slug
    rule_data = _rule_post()
    return {
        "propose": (f"/w/{ws}/evals/propose/", {"agent": gateway.agent.slug}),
        "suite_create": (f"/w/{ws}/evals/suites/new/", _suite_post()),
        "suite_edit": (f"/w/{ws}/evals/suites/answers/edit/", _suite_post(samples="2")),
        "suite_run": (f"/w/{ws}/evals/suites/answers/run/", {}),
        "run_cancel": (f"/w/{ws}/evals/runs/{completed.pk}/cancel/", {}),
        "run_resume": (f"/w/{ws}/evals/runs/{completed.pk}/resume/", {}),
        "rule_create": (f"/w/{ws}/evals/online-rules/", rule_data),
        "rule_edit": (f"/w/{ws}/evals/online-rules/seeded/", {**rule_data, "sample_rate": "0.1"}),
        "rule_backfill": (
            f"/w/{ws}/evals/online-rules/seeded/backfill/",
            {"start": "2026-01-01T00:00", "end": "2026-01-02T00:00"},
        ),
        "trajectory_dataset_add": (f"/w/{ws}/trajectories/{trace_id}/dataset/", {"new_name": "viewer-set"}),
        "review_dataset_add": (f"/w/{ws}/review/{queue.pk}/items/1/dataset/", {"new_name": "viewer-set"}),
    }


def test_a_viewer_reads_every_evals_page_and_is_refused_every_write(
    gateway, viewer, completed, trajectory, queue, django_capture_on_commit_callbacks
):
    online.online_rule_create(
        agent=gateway.agent, name="seeded", evaluators_used=list(completed.suite.evaluators.all())
    )
    ws = gateway.workspace.slug
    for url in (
        f"/w/{ws}/evals/",
        f"/w/{ws}/evals/suites/new/",
        f"/w/{ws}/evals/suites/answers/",
        f"/w/{ws}/evals/suites/answers/edit/",
        f"/w/{ws}/evals/runs/",
        f"/w/{ws}/evals/runs/{completed.pk}/",
        f"/w/{ws}/evals/runs/{completed.pk}/progress/",
        f"/w/{ws}/evals/compare/",
        f"/w/{ws}/evals/online-rules/",
        f"/w/{ws}/evals/online-rules/seeded/",
    ):
        assert viewer.get(url).status_code == 200, url
    before = _evals_state()

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        for name, (url, data) in _posts(gateway, completed, trajectory.trace_id, queue).items():
            assert viewer.post(url, data).status_code == 403, name

    assert _evals_state() == before
    assert callbacks == []


def test_another_workspaces_suites_runs_and_rules_are_not_found(gateway, member, completed, elsewhere):
    ws = gateway.workspace.slug
    other_run = elsewhere["run"].pk
    before = _evals_state()
    for url in (
        f"/w/{ws}/evals/suites/globex-suite/",
        f"/w/{ws}/evals/suites/globex-suite/edit/",
        f"/w/{ws}/evals/runs/{other_run}/",
        f"/w/{ws}/evals/runs/{other_run}/progress/",
        f"/w/{ws}/evals/compare/?a={completed.pk}&b={other_run}",
        f"/w/{ws}/evals/online-rules/globex-rule/",
        f"/w/{ws}/trajectories/{elsewhere['trajectory'].trace_id}/",
        f"/w/{elsewhere['suite'].workspace.slug}/evals/",  # not a member there at all
    ):
        assert member.get(url).status_code == 404, url
    for url in (
        f"/w/{ws}/evals/suites/globex-suite/run/",
        f"/w/{ws}/evals/runs/{other_run}/cancel/",
        f"/w/{ws}/evals/runs/{other_run}/resume/",
        f"/w/{ws}/evals/online-rules/globex-rule/backfill/",
        f"/w/{ws}/trajectories/{elsewhere['trajectory'].trace_id}/dataset/",
    ):
        assert member.post(url, {"new_name": "stolen", "start": "2026-01-01T00:00"}).status_code == 404, url
    assert _evals_state() == before
    listing = member.get(f"/w/{ws}/evals/").content.decode()
    assert "globex" not in listing
