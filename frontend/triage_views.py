"""An agent's triage pages: its triage settings (phrases, weights, thresholds, the daily review draw),
and its signal rates over time, one series per prompt version."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Final

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import redirect
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods

from agent_registry import selectors
from agent_registry.models import Membership
from frontend.access import HtmxHttpRequest, workspace_view
from frontend.triage_forms import TriageSettingsForm
from frontend.views import _render
from tracing import exceptions, signals, triage

# ?period= → (label, span, bucket)
CHART_PERIODS: Final[dict[str, tuple[str, timedelta, str]]] = {
    "24h": ("Last 24 hours, hourly", timedelta(hours=24), "hour"),
    "7d": ("Last 7 days, daily", timedelta(days=7), "day"),
    "7d-hourly": ("Last 7 days, hourly", timedelta(days=7), "hour"),
    "30d": ("Last 30 days, daily", timedelta(days=30), "day"),
}


@workspace_view()
@require_http_methods(["GET", "POST"])
def agent_triage_view(request: HtmxHttpRequest, membership: Membership, agent_slug: str) -> HttpResponse:
    agent = selectors.agent_get(workspace=membership.workspace, slug=agent_slug)
    settings_row = triage.triage_settings_get(agent=agent)
    form = TriageSettingsForm(request.POST if request.method == "POST" else None, settings_row=settings_row)
    if form.is_bound and form.is_valid():
        try:
            saved = triage.triage_settings_update(agent=agent, updated_by=membership.user, **form.settings_arguments())
        except exceptions.TriageSettingsInvalid as error:
            form.add_service_errors(error.extra.get("errors", []))
        else:
            note = (
                f" The signals of {saved.recomputing} trajector{'y' if saved.recomputing == 1 else 'ies'} are being "
                "recomputed."
                if saved.recomputing
                else ""
            )
            messages.success(request, f"Saved the triage settings of {agent.name}.{note}")
            return redirect("frontend:agent_triage", workspace_slug=membership.workspace.slug, agent_slug=agent.slug)
    return _render(
        request,
        membership,
        "frontend/triage/settings.html",
        {"agent": agent, "tab": "triage", "form": form, "settings_row": settings_row},
        status=422 if form.errors else 200,
    )


def _chart_data(rates: triage.SignalRates) -> dict[str, Any]:
    return {
        "x": [int(moment.timestamp()) for moment in rates.buckets],
        "bucket": rates.bucket,
        "charts": [
            {
                "signal": name,
                "label": name.replace("_", " ").capitalize(),
                "series": [
                    {"label": series.label, "rates": series.rates(name), "totals": series.totals}
                    for series in rates.series
                ],
            }
            for name in rates.signals
        ],
    }


@workspace_view()
@require_GET
def agent_signals_view(request: HtmxHttpRequest, membership: Membership, agent_slug: str) -> HttpResponse:
    """Each signal's rate over time, a series per prompt version: a prompt change that raises a signal shows."""
    agent = selectors.agent_get(workspace=membership.workspace, slug=agent_slug)
    period = request.GET.get("period") or "7d"
    if period not in CHART_PERIODS:
        period = "7d"
    label, span, bucket = CHART_PERIODS[period]
    now = timezone.now()
    rates = triage.signal_rate_series(agent=agent, since=now - span, until=now, bucket=bucket)
    tables = [
        {
            "signal": name,
            "rows": [
                {
                    "label": series.label,
                    "trajectories": sum(series.totals),
                    "matching": sum(series.counts.get(name, [])),
                }
                for series in rates.series
            ],
        }
        for name in rates.signals
    ]
    return _render(
        request,
        membership,
        "frontend/triage/signals.html",
        {
            "agent": agent,
            "tab": "signals",
            "period": period,
            "periods": [(key, value[0]) for key, value in CHART_PERIODS.items()],
            "period_label": label,
            "rates": rates,
            "chart_data": _chart_data(rates),
            "tables": tables,
            "total": sum(sum(series.totals) for series in rates.series),
            "weights": signals.DEFAULT_WEIGHTS,
        },
    )
