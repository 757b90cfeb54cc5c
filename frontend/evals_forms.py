"""Forms of the evals pages: a suite, an online rule and its backfill, a comparison of two runs, and adding
a trajectory to a dataset. They check shapes and turn the workspace's own rows into choices (so an id from
another workspace is "not a valid choice"); evals.services and evals.online check the rules, and the views
put the services' errors back beside the fields."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from django import forms

from agent_registry.models import Agent, PromptVersion
from evals.models import DATASET_NAME_PATTERN, Dataset, Evaluator, OnlineRule, Run, Suite, SuiteTarget
from evals.services import TIERS
from frontend.forms import storable_json_check
from routing.models import ModelTarget


def _choices(rows: Sequence[tuple[str, str]], empty: str | None) -> list[tuple[str, str]]:
    return [("", empty), *rows] if empty is not None else list(rows)


def _evaluator_label(evaluator: Evaluator) -> str:
    return f"{evaluator.name} v{evaluator.version} ({evaluator.type})"


class SuiteForm(forms.Form):
    """A suite: which dataset, what answers it (an agent's prompt through the gateway, a model target, or the
    recorded trajectories), which evaluators score it, k samples per item, and an optional cron schedule."""

    name = forms.CharField(
        max_length=200,
        help_text="Letters, digits, '.', '_' and '-'; unique in the workspace.",
        widget=forms.TextInput(attrs={"spellcheck": "false"}),
    )
    agent = forms.ChoiceField(required=False, help_text="The agent whose prompt answers (for an agent target).")
    description = forms.CharField(required=False, max_length=2000, widget=forms.Textarea(attrs={"rows": 2}))
    dataset = forms.ChoiceField(required=False)
    target = forms.ChoiceField(choices=SuiteTarget.choices, initial=SuiteTarget.AGENT)
    prompt_label = forms.CharField(
        required=False,
        max_length=64,
        initial="production",
        label="Prompt label",
        help_text="The version this label points to when a run starts; an explicit version below wins.",
    )
    prompt_version = forms.ChoiceField(required=False, label="Prompt version")
    tier = forms.ChoiceField(
        required=False, choices=[("", "The router decides"), *((tier, tier) for tier in TIERS)], label="Tier"
    )
    model_target = forms.ChoiceField(required=False, label="Model target", help_text="For a model target suite.")
    variables = forms.CharField(
        required=False,
        label="Prompt variables (JSON)",
        widget=forms.Textarea(attrs={"rows": 2, "spellcheck": "false", "placeholder": '{"company": "Acme Rides"}'}),
        help_text="Sent with every request; an item's metadata.variables add to them.",
    )
    evaluators = forms.MultipleChoiceField(
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="The latest version of each; a run keeps the versions it started with.",
    )
    samples = forms.IntegerField(
        min_value=1,
        max_value=64,
        initial=1,
        label="k (samples per item)",
        help_text="pass@k is reported for k = 1, 4, 16.",
    )
    concurrency = forms.IntegerField(min_value=1, max_value=64, initial=4, help_text="Items answered at a time.")
    schedule_cron = forms.CharField(
        required=False,
        max_length=100,
        label="Schedule (cron, UTC)",
        widget=forms.TextInput(attrs={"placeholder": "0 2 * * *", "spellcheck": "false"}),
        help_text="Five fields: minute hour day-of-month month day-of-week; or nightly, weekly, hourly.",
    )
    schedule_enabled = forms.BooleanField(required=False, label="Run on the schedule")

    def __init__(
        self,
        *args: Any,
        agents: Sequence[Agent],
        datasets: Sequence[Dataset],
        prompt_versions: Sequence[PromptVersion],
        model_targets: Sequence[ModelTarget],
        evaluators: Sequence[Evaluator],
        suite: Suite | None = None,
        **kwargs: Any,
    ) -> None:
        if suite is not None:
            kwargs.setdefault("initial", self.initial_of(suite))
        super().__init__(*args, **kwargs)
        self.suite = suite
        self.agents = {agent.slug: agent for agent in agents}
        self.datasets = {dataset.name: dataset for dataset in datasets}
        self.prompt_versions = {str(version.pk): version for version in prompt_versions}
        self.model_targets = {target.alias: target for target in model_targets}
        self.evaluator_rows = {evaluator.name: evaluator for evaluator in evaluators}
        self._set_choices("agent", [(slug, agent.name) for slug, agent in self.agents.items()], "No agent")
        self._set_choices("dataset", [(name, name) for name in self.datasets], "No dataset yet")
        self._set_choices(
            "prompt_version",
            [
                (
                    pk,
                    f"{version.prompt.name} v{version.version}",
                )
                for pk, version in self.prompt_versions.items()
            ],
            "The label's version",
        )
        self._set_choices(
            "model_target", [(alias, f"{alias} ({target.model})") for alias, target in self.model_targets.items()], "—"
        )
        self._set_choices("evaluators", [(name, _evaluator_label(e)) for name, e in self.evaluator_rows.items()], None)
        if suite is not None:
            # A suite's name is its address; renaming is not offered.
            del self.fields["name"]
            del self.fields["agent"]

    def _set_choices(self, name: str, rows: list[tuple[str, str]], empty: str | None) -> None:
        field = self.fields[name]
        if isinstance(field, forms.ChoiceField):
            field.choices = _choices(rows, empty)

    @staticmethod
    def initial_of(suite: Suite) -> dict[str, Any]:
        return {
            "description": suite.description,
            "dataset": suite.dataset.name if suite.dataset else "",
            "target": suite.target,
            "prompt_label": suite.prompt_label,
            "prompt_version": str(suite.prompt_version_id or ""),
            "tier": suite.tier,
            "model_target": suite.model_target.alias if suite.model_target else "",
            "variables": json.dumps(suite.variables, ensure_ascii=False) if suite.variables else "",
            "evaluators": [link.evaluator.name for link in suite.suite_evaluators.all()],
            "samples": suite.samples,
            "concurrency": suite.concurrency,
            "schedule_cron": suite.schedule_cron,
            "schedule_enabled": suite.schedule_enabled,
        }

    def clean_name(self) -> str:
        name: str = self.cleaned_data["name"].strip()
        if not re.match(DATASET_NAME_PATTERN, name):
            raise forms.ValidationError("Use letters, digits, '.', '_' and '-', starting with a letter or digit.")
        return name

    def clean_variables(self) -> dict[str, Any]:
        text = (self.cleaned_data.get("variables") or "").strip()
        if not text:
            return {}
        try:
            value = json.loads(text)
        except json.JSONDecodeError as error:
            raise forms.ValidationError(f"Not JSON: {error.msg} (line {error.lineno}, column {error.colno}).") from None
        except RecursionError:
            raise forms.ValidationError("Not JSON Keel can store: nested too deeply.") from None
        storable_json_check(text)
        if not isinstance(value, dict):
            raise forms.ValidationError('An object of variable name to value, e.g. {"company": "Acme Rides"}.')
        return value

    def agent_chosen(self) -> Agent | None:
        return self.agents.get(self.cleaned_data.get("agent") or "")

    def chosen_evaluators(self) -> list[Evaluator]:
        return [self.evaluator_rows[name] for name in self.cleaned_data["evaluators"]]

    def suite_fields(self) -> dict[str, Any]:
        """The fields as evals.services.suite_create and suite_update take them."""
        data = self.cleaned_data
        dataset = self.datasets.get(data["dataset"] or "")
        fields: dict[str, Any] = {
            "description": data["description"],
            "dataset": dataset,
            "target": data["target"],
            "prompt_label": data["prompt_label"],
            "prompt_version": self.prompt_versions.get(data["prompt_version"] or ""),
            "tier": data["tier"],
            "model_target": self.model_targets.get(data["model_target"] or ""),
            "variables": data["variables"],
            "samples": data["samples"],
            "concurrency": data["concurrency"],
            "schedule_cron": data["schedule_cron"].strip(),
            "schedule_enabled": data["schedule_enabled"],
        }
        if self.suite is not None and (dataset is None or dataset.pk != self.suite.dataset_id):
            # A pinned version belongs to the dataset it was pinned on.
            fields["dataset_version"] = None
        return fields


class ProposeForm(forms.Form):
    agent = forms.ChoiceField()

    def __init__(self, *args: Any, agents: Sequence[Agent], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.agents = {agent.slug: agent for agent in agents}
        field = self.fields["agent"]
        if isinstance(field, forms.ChoiceField):
            field.choices = [(slug, agent.name) for slug, agent in self.agents.items()]

    def agent_chosen(self) -> Agent:
        return self.agents[self.cleaned_data["agent"]]


class CompareForm(forms.Form):
    """Run A (the baseline) and run B (the candidate), from the workspace's finished runs."""

    a = forms.ChoiceField(label="Run A (baseline)")
    b = forms.ChoiceField(label="Run B (candidate)")

    def __init__(self, *args: Any, runs: Sequence[Run], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.runs = {str(run.pk): run for run in runs}
        rows = [(pk, f"#{pk} {run.name or run}") for pk, run in self.runs.items()]
        for name in ("a", "b"):
            field = self.fields[name]
            if isinstance(field, forms.ChoiceField):
                field.choices = rows

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("a") and data.get("a") == data.get("b"):
            self.add_error("b", "Pick another run than A.")
        return data


def _json_object(text: str, what: str) -> dict[str, Any]:
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise forms.ValidationError(f"Not JSON: {error.msg} (line {error.lineno}).") from None
    except RecursionError:
        raise forms.ValidationError("Not JSON Keel can store: nested too deeply.") from None
    storable_json_check(text)
    if not isinstance(value, dict):
        raise forms.ValidationError(f"A JSON object is needed: {what}.")
    return value


class OnlineRuleForm(forms.Form):
    """Score a sampled share of an agent's production trajectories, a delay after they end."""

    name = forms.CharField(max_length=200, help_text="Letters, digits, '.', '_' and '-'; unique in the workspace.")
    agent = forms.ChoiceField()
    evaluators = forms.MultipleChoiceField(widget=forms.CheckboxSelectMultiple)
    filter = forms.CharField(
        required=False,
        max_length=10_000,
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false", "class": "json-input"}),
        help_text='JSON, e.g. {"status": "error", "tags": ["refund"]}; keys: status, tags, exclude_tags, tier, '
        "signal, prompt_version.",
    )
    sample_rate = forms.FloatField(
        min_value=0,
        max_value=1,
        initial=1.0,
        label="Sample rate",
        help_text="0 to 1: the share of trajectories scored.",
    )
    delay_seconds = forms.IntegerField(
        min_value=0, initial=60, label="Delay, seconds", help_text="After a trajectory ends, so its spans have arrived."
    )
    enabled = forms.BooleanField(required=False, initial=True)

    def __init__(
        self,
        *args: Any,
        agents: Sequence[Agent],
        evaluators: Sequence[Evaluator],
        rule: OnlineRule | None = None,
        **kwargs: Any,
    ) -> None:
        if rule is not None:
            kwargs.setdefault(
                "initial",
                {
                    "evaluators": [evaluator.name for evaluator in rule.evaluators.all()],
                    "filter": json.dumps(rule.filter) if rule.filter else "",
                    "sample_rate": rule.sample_rate,
                    "delay_seconds": rule.delay_seconds,
                    "enabled": rule.enabled,
                },
            )
        super().__init__(*args, **kwargs)
        self.agents = {agent.slug: agent for agent in agents}
        self.evaluator_rows = {evaluator.name: evaluator for evaluator in evaluators}
        for name, rows in (
            ("agent", [(slug, agent.name) for slug, agent in self.agents.items()]),
            ("evaluators", [(name, _evaluator_label(e)) for name, e in self.evaluator_rows.items()]),
        ):
            field = self.fields[name]
            if isinstance(field, forms.ChoiceField):
                field.choices = rows
        if rule is not None:
            del self.fields["name"]
            del self.fields["agent"]

    def clean_filter(self) -> dict[str, Any]:
        return _json_object(self.cleaned_data["filter"], "keys and their values")

    def rule_fields(self) -> dict[str, Any]:
        data = self.cleaned_data
        return {
            "evaluators_used": [self.evaluator_rows[name] for name in data["evaluators"]],
            "filter": data["filter"],
            "sample_rate": data["sample_rate"],
            "delay_seconds": data["delay_seconds"],
            "enabled": data["enabled"],
        }


class BackfillForm(forms.Form):
    start = forms.DateTimeField(
        label="From (UTC)", widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M")
    )
    end = forms.DateTimeField(
        label="Until (UTC)", widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M")
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        start, end = data.get("start"), data.get("end")
        if isinstance(start, datetime) and isinstance(end, datetime):
            # The form reads the times as UTC (the page says so), whatever the server's time zone.
            data["start"], data["end"] = start.replace(tzinfo=UTC), end.replace(tzinfo=UTC)
            if data["end"] <= data["start"]:
                self.add_error("end", "Must be after the start.")
        return data


class DatasetAddForm(forms.Form):
    """Add a trajectory to an existing dataset of the workspace, or to a new one made by name."""

    dataset = forms.ChoiceField(required=False, label="Dataset")
    new_name = forms.CharField(
        required=False,
        max_length=200,
        label="Or a new dataset",
        widget=forms.TextInput(attrs={"placeholder": "new-dataset-name", "spellcheck": "false"}),
    )

    def __init__(self, *args: Any, datasets: Sequence[Dataset], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.datasets = {dataset.name: dataset for dataset in datasets}
        field = self.fields["dataset"]
        if isinstance(field, forms.ChoiceField):
            field.choices = [("", "Choose a dataset…"), *((name, name) for name in self.datasets)]

    def clean_new_name(self) -> str:
        name: str = self.cleaned_data["new_name"].strip()
        if name and not re.match(DATASET_NAME_PATTERN, name):
            raise forms.ValidationError("Use letters, digits, '.', '_' and '-', starting with a letter or digit.")
        return name

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        chosen, new_name = data.get("dataset"), data.get("new_name")
        if "new_name" in self.errors:
            return data
        if chosen and new_name:
            self.add_error("new_name", "Choose a dataset or name a new one, not both.")
        elif not chosen and not new_name:
            self.add_error("dataset", "Choose a dataset, or name a new one.")
        return data

    def dataset_chosen(self) -> Dataset | None:
        return self.datasets.get(self.cleaned_data.get("dataset") or "")
