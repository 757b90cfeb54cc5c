"""The triage pages of the dashboard: signals on the trajectory list and in the step-through view, the
review queue driven by decisions, informativeness, alerts and their rules, triage settings and the
signal-rate charts. Who may do what is in test_access.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from frontend.tests.conftest import db_state
from tracing import triage
from tracing.models import AlertRule, ReviewItem, Trajectory, TriageSettings
from tracing.tests.factories import AlertFactory, TrajectoryFactory, signal_instance

pytestmark = pytest.mark.django_db


@pytest.fixture
def flagged(tenant):
    """Two trajectories of the tenant's agent with signals, one bad enough to top the triage order."""
    now = timezone.now()
    loop = TrajectoryFactory.create(
        workspace=tenant.workspace,
        agent=tenant.agent,
        input_preview="Search again and again",
        signals=[signal_instance("loop", level="error", severity=0.9), signal_instance("loop", level="warning")],
        triage_score=0.9,
        started_at=now - timedelta(minutes=20),
    )
    drift = TrajectoryFactory.create(
        workspace=tenant.workspace,
        agent=tenant.agent,
        input_preview="Answered something else",
        signals=[signal_instance("goal_drift", level="info", severity=0.3)],
        triage_score=0.3,
        started_at=now - timedelta(minutes=30),
    )
    return loop, drift


def _queue(tenant, count=3):
    sample = triage.review_sample_create(
        workspace=tenant.workspace,
        strategy="length",
        window_start=timezone.now() - timedelta(days=1),
        window_end=timezone.now(),
        budget=count,
    )
    return sample


def test_the_list_shows_signal_badges_by_level_and_the_triage_score(tenant, member_client, flagged):
    response = member_client.get(f"/w/{tenant.workspace.slug}/trajectories/")

    content = response.content.decode()
    assert 'class="badge badge-signal level-error"' in content
    assert "loop ×2" in content
    assert 'class="badge badge-signal level-info"' in content
    assert ">0.90<" in content


def test_the_list_filters_by_signal_and_orders_by_triage_score(tenant, member_client, flagged):
    loop, drift = flagged
    url = f"/w/{tenant.workspace.slug}/trajectories/"

    filtered = member_client.get(url, {"signal": "goal_drift"})
    ordered = member_client.get(url, {"order": "-triage_score"})

    assert [t.pk for t in filtered.context["page"].items] == [drift.pk]
    assert [t.pk for t in ordered.context["page"].items][:2] == [loop.pk, drift.pk]
    assert "Most worth reviewing" in ordered.content.decode()


def test_the_step_through_view_shows_each_signal_with_its_evidence(tenant, member_client):
    trajectory = tenant.trajectory
    Trajectory.objects.filter(pk=trajectory.pk).update(
        signals=[signal_instance("misalignment", level="warning", steps=(1, 999))], signal_names=["misalignment"]
    )

    response = member_client.get(f"/w/{tenant.workspace.slug}/trajectories/{trajectory.trace_id}/")

    content = response.content.decode()
    assert 'id="signals"' in content
    assert "Why misalignment fired." in content
    assert "evidence of misalignment" in content
    assert 'data-step-link="1"' in content
    assert [view.steps for view in response.context["signal_views"]] == [(1,)]


def test_a_decision_moves_to_the_next_pending_item_and_the_last_back_to_the_queue(tenant, member_client, flagged):
    sample = _queue(tenant)
    base = f"/w/{tenant.workspace.slug}/review/{sample.pk}"

    first = member_client.post(f"{base}/items/1/", {"decision": "informative", "failure_mode": "loop"})
    member_client.post(f"{base}/items/3/", {"decision": "skip"})
    last = member_client.post(f"{base}/items/2/", {"decision": "not_informative", "note": "fine"})

    assert first.status_code == 302
    assert first["Location"] == f"{base}/items/2/#review-form"
    assert last["Location"] == f"{base}/"
    items = {item.position: item for item in sample.items.all()}
    assert (items[1].status, items[1].informative, items[1].failure_mode) == ("reviewed", True, "loop")
    assert (items[2].status, items[2].informative, items[2].note) == ("reviewed", False, "fine")
    assert items[3].status == "skipped"
    assert items[1].reviewer is not None
    assert items[1].reviewer.username == "mia"


def test_an_incomplete_decision_is_refused_and_changes_nothing(tenant, member_client):
    sample = _queue(tenant, 1)
    before = db_state()

    response = member_client.post(f"/w/{tenant.workspace.slug}/review/{sample.pk}/items/1/", {"failure_mode": "x"})

    assert response.status_code == 422
    assert db_state() == before


def test_the_item_page_offers_the_fired_signals_first_add_to_dataset_and_curation_disabled(
    tenant, member_client, flagged
):
    sample = _queue(tenant, 3)
    loop_item = ReviewItem.objects.get(sample=sample, trajectory=flagged[0])

    response = member_client.get(f"/w/{tenant.workspace.slug}/review/{sample.pk}/items/{loop_item.position}/")

    options = response.context["failure_modes"]
    assert (options[0].value, options[0].key, options[0].fired) == ("loop", 1, True)
    assert [option.key for option in options[:9]] == list(range(1, 10))
    assert options[9].key is None
    content = response.content.decode()
    assert 'data-key="1"' in content
    assert 'id="dataset-title">Add to eval dataset</h3>' in content
    assert content.count("disabled aria-disabled") == 1
    assert "Add to training curation</button>" in content
    assert "<kbd>y</kbd>" in content
    assert response.context["number"] == loop_item.position
    assert 'id="steps"' in content


def test_informativeness_shows_signal_against_random(tenant, member_client):
    signal = _queue(tenant, 1)
    for item in signal.items.all():
        triage.review_item_decide(item=item, status="reviewed", informative=True)

    response = member_client.get(f"/w/{tenant.workspace.slug}/review/informativeness/")

    rows = {row.strategy: (row.reviewed, row.informative) for row in response.context["report"].overall}
    assert rows == {"length": (1, 1)}
    assert response.context["comparison"].verdict == "needs_reviews"
    assert "not measured yet" in response.content.decode()


def test_drawing_a_sample_in_the_dashboard(tenant, member_client, flagged):
    response = member_client.post(
        f"/w/{tenant.workspace.slug}/review/", {"strategy": "signal", "period": "24h", "budget": "5"}
    )

    assert response.status_code == 302
    sample = triage.review_sample_list(workspace=tenant.workspace)[0]
    assert sample.strategy == "signal"
    assert {item.trajectory_id for item in sample.items.all()} == {t.pk for t in flagged}
    assert response["Location"] == f"/w/{tenant.workspace.slug}/review/{sample.pk}/"


def test_the_alert_list_links_to_the_trajectories_behind_each_alert(tenant, member_client):
    response = member_client.get(f"/w/{tenant.workspace.slug}/alerts/")

    (view,) = response.context["alerts"]
    assert view.alert == tenant.alert
    assert view.trajectories_url.startswith(f"/w/{tenant.workspace.slug}/agents/{tenant.agent.slug}/trajectories/?")
    assert "signal=loop" in view.trajectories_url
    assert "period=custom" in view.trajectories_url
    content = response.content.decode()
    assert "Acknowledge</button>" in content
    assert 'class="nav-badge"' in content


def test_acknowledging_clears_the_sidebar_badge(tenant, member_client):
    member_client.post(f"/w/{tenant.workspace.slug}/alerts/{tenant.alert.pk}/acknowledge/")

    response = member_client.get(f"/w/{tenant.workspace.slug}/alerts/?show=open")

    assert response.context["alerts"] == []
    assert "not acknowledged</span>" not in response.content.decode()


def test_a_viewer_sees_no_review_or_alert_controls(tenant, viewer_client):
    AlertFactory.create(rule=tenant.rule)
    ws = tenant.workspace.slug

    item = viewer_client.get(f"/w/{ws}/review/{tenant.sample.pk}/items/1/").content.decode()
    alerts = viewer_client.get(f"/w/{ws}/alerts/").content.decode()
    rules = viewer_client.get(f"/w/{ws}/agents/{tenant.agent.slug}/alert-rules/").content.decode()
    settings = viewer_client.get(f"/w/{ws}/agents/{tenant.agent.slug}/triage/").content.decode()
    review = viewer_client.get(f"/w/{ws}/review/").content.decode()

    assert "data-review-form" not in item
    assert "Acknowledge</button>" not in alerts
    assert "Add rule" not in rules
    assert "Save triage settings" not in settings
    assert "Draw</button>" not in review


def test_saving_triage_settings_in_the_dashboard(tenant, member_client):
    url = f"/w/{tenant.workspace.slug}/agents/{tenant.agent.slug}/triage/"

    response = member_client.post(
        url,
        {
            "language": "en",
            "weight_loop": "0.9",
            "threshold_loop_repeats": "4",
            "limit_token_budget": "30000",
            "mode_quit": "extend",
            "phrases_quit": "i'm out\n\nnever mind",
            "handoff_tools": "page_human",
            "review_budget_per_day": "6",
            "review_strategies": ["signal", "random"],
        },
    )

    assert response.status_code == 302
    stored = TriageSettings.objects.get(agent=tenant.agent)
    assert stored.weights == {"loop": 0.9}
    assert stored.thresholds == {"loop_repeats": 4}
    assert stored.limits == {"token_budget": 30000}
    assert stored.phrases == {"en": {"quit": {"mode": "extend", "phrases": ["i'm out", "never mind"]}}}
    assert (stored.handoff_tools, stored.review_budget_per_day) == (["page_human"], 6)
    page = member_client.get(url)
    assert page.context["form"]["phrases_quit"].value() == "i'm out\nnever mind"
    assert page.context["form"]["weight_loop"].value() == 0.9


def test_invalid_triage_settings_are_refused_and_change_nothing(tenant, member_client):
    before = db_state()

    response = member_client.post(
        f"/w/{tenant.workspace.slug}/agents/{tenant.agent.slug}/triage/",
        {"language": "en", "weight_loop": "3", "review_budget_per_day": "5"},
    )

    assert response.status_code == 422
    assert response.context["form"].errors["weight_loop"]
    assert db_state() == before


def test_adding_an_alert_rule_in_the_dashboard(tenant, member_client):
    response = member_client.post(
        f"/w/{tenant.workspace.slug}/agents/{tenant.agent.slug}/alert-rules/",
        {
            "name": "Failure rate",
            "signal": "error_status",
            "threshold_percent": "2.5",
            "window_minutes": "60",
            "min_trajectories": "10",
            "severity": "page",
            "cooldown_minutes": "30",
            "enabled": "on",
            "email_to": "a@example.com, b@example.com",
            "webhook_url": "https://hooks.example.com/k",
            "webhook_secret": "whsec",
        },
    )

    assert response.status_code == 302
    rule = AlertRule.objects.get(name="Failure rate")
    assert (rule.threshold, rule.severity, rule.email_to) == (0.025, "page", ["a@example.com", "b@example.com"])
    assert rule.webhook_secret_encrypted


def test_a_webhook_without_a_secret_is_refused(tenant, member_client):
    before = db_state()

    response = member_client.post(
        f"/w/{tenant.workspace.slug}/agents/{tenant.agent.slug}/alert-rules/",
        {
            "name": "Hook",
            "signal": "loop",
            "threshold_percent": "2",
            "window_minutes": "60",
            "min_trajectories": "10",
            "severity": "info",
            "cooldown_minutes": "30",
            "webhook_url": "https://hooks.example.com/k",
        },
    )

    assert response.status_code == 422
    assert "a webhook needs a secret" in response.content.decode()
    assert db_state() == before


def test_the_signals_page_charts_each_signal_per_prompt_version(tenant, member_client):
    version = tenant.prompt.versions.get(version=1)
    # The chart buckets by the hour: all three sit in one hour, whatever minute the test runs at.
    hour = (timezone.now() - timedelta(hours=2)).replace(minute=30, second=0, microsecond=0)
    for index in range(3):
        trajectory = TrajectoryFactory.create(
            workspace=tenant.workspace,
            agent=tenant.agent,
            signals=[signal_instance("misalignment")] if index == 0 else [],
            started_at=hour + timedelta(minutes=index),
        )
        trajectory.prompt_versions.add(version)

    response = member_client.get(f"/w/{tenant.workspace.slug}/agents/{tenant.agent.slug}/signals/?period=24h")

    data = response.context["chart_data"]
    (chart,) = [chart for chart in data["charts"] if chart["signal"] == "misalignment"]
    series = {line["label"]: line for line in chart["series"]}
    assert "support/triage v1" in series
    assert max(rate for rate in series["support/triage v1"]["rates"] if rate is not None) == pytest.approx(1 / 3)
    assert 24 <= len(data["x"]) <= 25  # the current hour, begun, is the last bucket
    content = response.content.decode()
    assert "uplot/uPlot.iife.min.js" in content
    assert 'id="signal-chart-data"' in content


RULE_FORM = {
    "name": "Satisfaction rate",
    "signal": "satisfaction",
    "direction": "below",
    "threshold_percent": "60",
    "window_minutes": "60",
    "min_trajectories": "10",
    "severity": "warning",
    "cooldown_minutes": "30",
    "enabled": "on",
}


def test_a_rule_that_fires_when_satisfaction_drops_in_the_dashboard(tenant, member_client):
    url = f"/w/{tenant.workspace.slug}/agents/{tenant.agent.slug}/alert-rules/"

    response = member_client.post(url, RULE_FORM)

    assert response.status_code == 302
    rule = AlertRule.objects.get(name="Satisfaction rate")
    assert (rule.direction, rule.threshold) == ("below", 0.6)
    page = member_client.get(url).content.decode()
    assert "Satisfaction &lt; 60.0% over 60 min" in page
    edit = member_client.get(f"{url}{rule.pk}/")
    assert edit.context["form"].initial["direction"] == "below"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"direction": "above", "threshold_percent": "100"}, "Below 100%: no rate is above 100%."),
        ({"direction": "below", "threshold_percent": "0"}, "Above 0%: no rate is below 0%."),
        (
            {"webhook_url": "http://10.0.0.5/hook", "webhook_secret": "whsec"},
            "10.0.0.5 is private: Keel sends only to public addresses",
        ),
    ],
)
def test_a_rule_that_cannot_fire_or_a_webhook_to_an_internal_address_is_refused(tenant, member_client, change, message):
    before = db_state()

    response = member_client.post(
        f"/w/{tenant.workspace.slug}/agents/{tenant.agent.slug}/alert-rules/", {**RULE_FORM, **change}
    )

    assert response.status_code == 422
    assert message in response.content.decode()
    assert db_state() == before
