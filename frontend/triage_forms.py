"""Forms of the triage pages: an agent's triage settings, drawing a review sample, a reviewer's decision,
an alert rule. They parse what a person typed into the arguments of tracing.triage and tracing.alerts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django import forms

from agent_registry.models import Agent
from tracing import alerts, sampling, signals, triage_config
from tracing.models import AlertDirection, AlertRule, AlertSeverity, ReviewStrategy, TriageSettings

# The phrase lists a person edits in the dashboard, in the order the docs list them.
PHRASE_LISTS = tuple(name for name in triage_config.PHRASE_LIST_NAMES)


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


@dataclass(frozen=True)
class WeightRow:
    signal: str
    default: float
    field: forms.BoundField


@dataclass(frozen=True)
class ThresholdRow:
    name: str
    default: float
    help: str
    field: forms.BoundField


@dataclass(frozen=True)
class PhraseRow:
    name: str
    default_count: int
    defaults: tuple[str, ...]
    mode: forms.BoundField
    phrases: forms.BoundField


class TriageSettingsForm(forms.Form):
    """Every field optional: a blank weight, threshold or limit keeps the default. The phrase lists
    edited here are those of the settings' language; other languages are kept as they are (the API
    edits them all)."""

    language = forms.CharField(
        max_length=16, initial="en", help_text="Which language's phrase lists the detectors read."
    )
    handoff_tools = forms.CharField(
        label="Hand-off tools",
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "class": "mono"}),
        help_text="Tool names that hand the conversation to a person, one per line (added to the defaults).",
    )
    review_budget_per_day = forms.IntegerField(
        label="Daily review budget",
        min_value=0,
        max_value=500,
        initial=0,
        help_text="Trajectories of the previous day drawn for review each day, split across the strategies (0: none).",
    )
    review_strategies = forms.MultipleChoiceField(
        label="Daily strategies",
        required=False,
        widget=forms.CheckboxSelectMultiple,
        choices=[(value, label) for value, label in ReviewStrategy.choices if value != ReviewStrategy.STRATIFIED_AGENT],
    )

    def __init__(self, *args: Any, settings_row: TriageSettings, **kwargs: Any) -> None:
        self.settings_row = settings_row
        language = settings_row.language or "en"
        own = settings_row.phrases.get(language, {}) if isinstance(settings_row.phrases, dict) else {}
        initial = {
            "language": language,
            "handoff_tools": "\n".join(settings_row.handoff_tools),
            "review_budget_per_day": settings_row.review_budget_per_day,
            "review_strategies": list(settings_row.review_strategies),
            **{f"weight_{name}": value for name, value in settings_row.weights.items()},
            **{f"threshold_{name}": value for name, value in settings_row.thresholds.items()},
            **{f"limit_{name}": value for name, value in settings_row.limits.items()},
        }
        for name, entry in own.items():
            initial[f"mode_{name}"] = entry.get("mode", "extend")
            initial[f"phrases_{name}"] = "\n".join(entry.get("phrases", []))
        kwargs["initial"] = {**initial, **kwargs.get("initial", {})}
        super().__init__(*args, **kwargs)
        for name, default in signals.DEFAULT_WEIGHTS.items():
            self.fields[f"weight_{name}"] = forms.FloatField(
                required=False,
                min_value=-1,
                max_value=1,
                widget=forms.NumberInput(attrs={"step": "0.05", "placeholder": f"{default:g}"}),
            )
        defaults = signals.Thresholds()
        for name, (low, high, whole) in triage_config.EXPOSED_THRESHOLDS.items():
            field: forms.Field
            placeholder = f"{getattr(defaults, name):g}"
            if whole:
                field = forms.IntegerField(
                    required=False,
                    min_value=int(low),
                    max_value=int(high),
                    widget=forms.NumberInput(attrs={"placeholder": placeholder}),
                )
            else:
                field = forms.FloatField(
                    required=False,
                    min_value=low,
                    max_value=high,
                    widget=forms.NumberInput(attrs={"step": "0.01", "placeholder": placeholder}),
                )
            self.fields[f"threshold_{name}"] = field
        for name in triage_config.LIMITS:
            self.fields[f"limit_{name}"] = forms.IntegerField(
                required=False, min_value=1, widget=forms.NumberInput(attrs={"placeholder": "none"})
            )
        for name in PHRASE_LISTS:
            self.fields[f"mode_{name}"] = forms.ChoiceField(
                required=False,
                choices=[("extend", "Add to the defaults"), ("replace", "Replace the defaults")],
                initial="extend",
            )
            self.fields[f"phrases_{name}"] = forms.CharField(
                required=False, widget=forms.Textarea(attrs={"rows": 3}), max_length=50_000
            )

    @property
    def weight_rows(self) -> list[WeightRow]:
        return [WeightRow(name, default, self[f"weight_{name}"]) for name, default in signals.DEFAULT_WEIGHTS.items()]

    @property
    def threshold_rows(self) -> list[ThresholdRow]:
        defaults = signals.Thresholds()
        return [
            ThresholdRow(name, getattr(defaults, name), triage_config.THRESHOLD_HELP[name], self[f"threshold_{name}"])
            for name in triage_config.EXPOSED_THRESHOLDS
        ]

    @property
    def limit_rows(self) -> list[tuple[str, str, forms.BoundField]]:
        return [(name, text, self[f"limit_{name}"]) for name, text in triage_config.LIMITS.items()]

    @property
    def phrase_rows(self) -> list[PhraseRow]:
        lists = signals.DEFAULT_PHRASES.get(self.settings_row.language or "en") or signals.ENGLISH_PHRASES
        rows = []
        for name in PHRASE_LISTS:
            defaults = tuple(sorted(getattr(lists, name)))
            rows.append(PhraseRow(name, len(defaults), defaults, self[f"mode_{name}"], self[f"phrases_{name}"]))
        return rows

    def settings_arguments(self) -> dict[str, Any]:
        """The keyword arguments of tracing.triage.triage_settings_update (call after is_valid())."""
        data = self.cleaned_data
        language = data["language"].strip()
        phrases: dict[str, Any] = {
            code: lists for code, lists in (self.settings_row.phrases or {}).items() if code != language
        }
        own: dict[str, Any] = {}
        for name in PHRASE_LISTS:
            given = _lines(data.get(f"phrases_{name}") or "")
            if given:
                own[name] = {"mode": data.get(f"mode_{name}") or "extend", "phrases": given}
        if own:
            phrases[language] = own
        return {
            "language": language,
            "phrases": phrases,
            "weights": {
                name: data[f"weight_{name}"]
                for name in signals.DEFAULT_WEIGHTS
                if data.get(f"weight_{name}") is not None
            },
            "thresholds": {
                name: data[f"threshold_{name}"]
                for name in triage_config.EXPOSED_THRESHOLDS
                if data.get(f"threshold_{name}") is not None
            },
            "limits": {name: data[f"limit_{name}"] for name in triage_config.LIMITS if data.get(f"limit_{name}")},
            "handoff_tools": _lines(data.get("handoff_tools") or ""),
            "review_budget_per_day": data["review_budget_per_day"] or 0,
            "review_strategies": list(data.get("review_strategies") or []),
        }

    def add_service_errors(self, errors: Sequence[Mapping[str, str]]) -> None:
        """Put tracing.triage's field errors (`weights.loop`, `phrases.en.quit`) on the form's fields."""
        prefixes = {"weights": ("weight_", 1), "thresholds": ("threshold_", 1), "limits": ("limit_", 1)}
        for error in errors:
            path = str(error.get("field", "")).split(".")
            message = str(error.get("message", "invalid"))
            name = path[0]
            if path[0] in prefixes and len(path) > 1:
                name = prefixes[path[0]][0] + path[1]
            elif path[0] == "phrases" and len(path) > 2:
                name = f"phrases_{path[2]}"
            self.add_error(name if name in self.fields else None, message)


# --- Review ---------------------------------------------------------------------------------------------

SAMPLE_PERIODS: dict[str, tuple[str, timedelta]] = {
    "24h": ("The last 24 hours", timedelta(hours=24)),
    "7d": ("The last 7 days", timedelta(days=7)),
    "30d": ("The last 30 days", timedelta(days=30)),
}


class ReviewSampleForm(forms.Form):
    strategy = forms.ChoiceField(choices=ReviewStrategy.choices, initial=ReviewStrategy.SIGNAL)
    agent = forms.ChoiceField(required=False, help_text="A sample stratified by agent covers every agent.")
    period = forms.ChoiceField(
        label="Trajectories of", choices=[(k, v[0]) for k, v in SAMPLE_PERIODS.items()], initial="7d"
    )
    budget = forms.IntegerField(label="How many", min_value=1, max_value=500, initial=20)
    allow_repeats = forms.BooleanField(
        label="Also draw trajectories this queue drew before", required=False, initial=False
    )

    def __init__(self, *args: Any, agents: Sequence[Agent], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._agents = {agent.slug: agent for agent in agents}
        field = self.fields["agent"]
        if isinstance(field, forms.ChoiceField):
            field.choices = [("", "Every agent"), *((agent.slug, agent.name) for agent in agents)]

    def sample_arguments(self, now: datetime) -> dict[str, Any]:
        data = self.cleaned_data
        return {
            "strategy": data["strategy"],
            "agent": self._agents.get(data.get("agent") or ""),
            "window_start": now - SAMPLE_PERIODS[data["period"]][1],
            "window_end": now,
            "budget": data["budget"],
            "allow_repeats": bool(data.get("allow_repeats")),
        }


class ReviewDecisionForm(forms.Form):
    decision = forms.ChoiceField(
        choices=[("informative", "Informative"), ("not_informative", "Not informative"), ("skip", "Skip")],
        widget=forms.RadioSelect,
    )
    failure_mode = forms.ChoiceField(required=False, choices=[("", "No failure mode"), *sampling.FAILURE_MODES.items()])
    note = forms.CharField(required=False, max_length=10_000, widget=forms.Textarea(attrs={"rows": 3}))

    def decision_arguments(self) -> dict[str, Any]:
        data = self.cleaned_data
        decision = data["decision"]
        return {
            "status": "skipped" if decision == "skip" else "reviewed",
            "informative": None if decision == "skip" else decision == "informative",
            "failure_mode": data.get("failure_mode") or "",
            "note": data.get("note") or "",
        }


# --- Alert rules ----------------------------------------------------------------------------------------


class AlertRuleForm(forms.Form):
    name = forms.CharField(max_length=200, help_text="e.g. Loop rate")
    signal = forms.ChoiceField(choices=list(alerts.ALERT_SIGNALS.items()))
    direction = forms.ChoiceField(
        label="Fire when the rate is",
        choices=AlertDirection.choices,
        required=False,  # a form posted without it keeps the rule's old meaning: above
        initial=AlertDirection.ABOVE,
        help_text="Above: a problem signal rising (loop, failure). Below: a good one dropping (satisfaction).",
    )
    threshold_percent = forms.FloatField(
        label="Threshold (%)", min_value=0, max_value=100, initial=2, help_text="The rate it is compared with."
    )
    window_minutes = forms.IntegerField(label="Window (minutes)", min_value=1, initial=60)
    min_trajectories = forms.IntegerField(
        label="At least this many trajectories",
        min_value=1,
        initial=20,
        help_text="So that one trajectory cannot page.",
    )
    severity = forms.ChoiceField(choices=AlertSeverity.choices, initial=AlertSeverity.WARNING)
    cooldown_minutes = forms.IntegerField(label="Cooldown (minutes)", min_value=1, initial=60)
    enabled = forms.BooleanField(required=False, initial=True)
    email_to = forms.CharField(
        label="Email to",
        required=False,
        help_text="Addresses, comma- or line-separated.",
        widget=forms.Textarea(attrs={"rows": 2}),
    )
    webhook_url = forms.URLField(label="Webhook URL", required=False, max_length=500, assume_scheme="https")
    webhook_secret = forms.CharField(
        label="Webhook secret",
        required=False,
        max_length=500,
        widget=forms.PasswordInput(render_value=False),
        help_text="Signs each POST (HMAC-SHA256, header X-Keel-Signature). Blank keeps the stored one.",
    )

    @classmethod
    def for_rule(cls, rule: AlertRule, data: Any = None) -> AlertRuleForm:
        return cls(
            data,
            initial={
                "name": rule.name,
                "signal": rule.signal,
                "direction": rule.direction,
                "threshold_percent": round(rule.threshold * 100, 4),
                "window_minutes": rule.window_minutes,
                "min_trajectories": rule.min_trajectories,
                "severity": rule.severity,
                "cooldown_minutes": rule.cooldown_minutes,
                "enabled": rule.enabled,
                "email_to": ", ".join(rule.email_to),
                "webhook_url": rule.webhook_url,
            },
        )

    def rule_fields(self) -> alerts.RuleFields:
        data = self.cleaned_data
        addresses = [
            part.strip() for part in (data.get("email_to") or "").replace("\n", ",").split(",") if part.strip()
        ]
        return alerts.RuleFields(
            name=data["name"],
            signal=data["signal"],
            threshold=data["threshold_percent"] / 100,
            direction=data.get("direction") or AlertDirection.ABOVE,
            window_minutes=data["window_minutes"],
            min_trajectories=data["min_trajectories"],
            severity=data["severity"],
            cooldown_minutes=data["cooldown_minutes"],
            enabled=bool(data.get("enabled")),
            email_to=addresses,
            webhook_url=data.get("webhook_url") or "",
        )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        percent, direction = data.get("threshold_percent"), data.get("direction") or AlertDirection.ABOVE
        if percent is not None and direction == AlertDirection.ABOVE and percent >= 100:
            self.add_error("threshold_percent", "Below 100%: no rate is above 100%.")
        elif percent is not None and direction == AlertDirection.BELOW and percent <= 0:
            self.add_error("threshold_percent", "Above 0%: no rate is below 0%.")
        return data

    def add_service_errors(self, errors: Sequence[Mapping[str, str]]) -> None:
        names = {"threshold": "threshold_percent"}
        for error in errors:
            name = names.get(str(error.get("field")), str(error.get("field")))
            self.add_error(name if name in self.fields else None, str(error.get("message", "invalid")))
