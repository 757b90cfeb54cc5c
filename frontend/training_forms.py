"""Forms of the training pages: a curation (its query as fields, with a JSON box for the rarer keys, its
grouping, reward and filters) and a training job. They check shapes and turn the workspace's own rows into
choices (an id from another workspace is "not a valid choice"); trainer_bridge.services and
trainer_bridge.jobs check the rules, and the views put the services' errors back beside the fields."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC
from typing import Any

from django import forms

from agent_registry.models import Agent, PromptVersion
from evals.models import Dataset, Run, Suite
from trainer_bridge.curation import GROUPINGS, QUERY_KEYS, REWARD_SOURCES, SCORE_SOURCES
from trainer_bridge.groups import DEFAULT_DEDUPE_THRESHOLD
from trainer_bridge.models import NAME_PATTERN, Curation, Export, TrainingMethod

GROUPING_LABELS = {
    "auto": "Automatic (dataset item, else task id, else first request)",
    "dataset_item": "Dataset item (the eval run item answered)",
    "task_id": "Task id",
    "first_request": "First user request",
}
REWARD_LABELS = {
    "score": "A score on the trajectory",
    "run_score": "An eval run's evaluator score",
    "trajectory": "The trajectory's own reward",
    "group_judge": "A group judge (RULER) at export",
    "mix": "A weighted mix",
}
# The query keys the form has fields for; the others go in the JSON box.
QUERY_FIELDS = {
    "agents": "agents",
    "started_after": "started_after",
    "started_before": "started_before",
    "status": "status",
    "tags": "tags",
    "exclude_tags": "exclude_tags",
    "signals": "signals",
    "without_signals": "without_signals",
    "datasets": "datasets",
    "runs": "runs",
    "prompt_versions": "prompt_versions",
    "review": "review_informative",
}
LIST_FIELDS = ("tags", "exclude_tags", "signals", "without_signals")
FILTER_FIELDS = (
    "min_group_size",
    "max_group_size",
    "drop_unrewarded",
    "drop_equal_rewards",
    "dedupe",
    "dedupe_threshold",
    "balance",
    "max_groups_per_family",
    "validation_share",
)


def _words(raw: str) -> list[str]:
    return [word.strip() for word in raw.replace("\n", ",").split(",") if word.strip()]


def _json_object(raw: str, what: str) -> dict[str, Any]:
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as error:
        raise forms.ValidationError(f"not JSON: {error.msg} (line {error.lineno}, column {error.colno})") from None
    if not isinstance(value, dict):
        raise forms.ValidationError(f"must be a JSON object of {what}")
    return value


def _choices_set(form: forms.Form, name: str, rows: list[tuple[str, str]]) -> None:
    field = form.fields[name]
    if isinstance(field, forms.ChoiceField):
        field.choices = rows


def prompt_version_key(version: PromptVersion) -> str:
    return f"{version.prompt.name}@{version.version}"


def field_of(service_field: str, form: forms.Form) -> str | None:
    """The form field a service's error field ("query.agents", "reward.parts[0].weight", ...) belongs to."""
    head, _, rest = service_field.partition(".")
    if head == "query":
        key = rest.split(".")[0]
        return QUERY_FIELDS.get(key, "advanced_query")
    if head == "reward":
        if rest.startswith("parts"):
            return "reward_parts"
        return {"name": "reward_name", "evaluator": "reward_name", "score_source": "score_source"}.get(
            rest, "reward_source"
        )
    if head == "filters":
        return rest if rest in FILTER_FIELDS else None
    return head if head in form.fields else None


class CurationForm(forms.Form):
    """A curation: which trajectories (the query), how they form groups, where each reward comes from, and
    the RL filters. On a saved curation the name cannot change."""

    name = forms.RegexField(
        regex=NAME_PATTERN,
        max_length=200,
        error_messages={"invalid": "Use letters, digits, '.', '_' and '-', starting with a letter or digit."},
        help_text="Unique in the workspace; exports and jobs refer to it.",
        widget=forms.TextInput(attrs={"spellcheck": "false"}),
    )
    description = forms.CharField(required=False, max_length=2000, widget=forms.Textarea(attrs={"rows": 2}))
    # --- The query
    agents = forms.MultipleChoiceField(required=False, widget=forms.CheckboxSelectMultiple)
    started_after = forms.DateTimeField(
        required=False,
        label="Started after (UTC)",
        input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S"],
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
    )
    started_before = forms.DateTimeField(
        required=False,
        label="Started before (UTC)",
        input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S"],
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
    )
    status = forms.ChoiceField(
        required=False, choices=[("", "Any"), ("ok", "Finished without error"), ("error", "Ended in an error")]
    )
    tags = forms.CharField(required=False, help_text="Comma-separated; a trajectory must have every one.")
    exclude_tags = forms.CharField(required=False, label="Without tags", help_text="Comma-separated.")
    signals = forms.CharField(
        required=False, help_text="Comma-separated triage signals; a trajectory must have at least one."
    )
    without_signals = forms.CharField(required=False, label="Without signals", help_text="Comma-separated.")
    datasets = forms.MultipleChoiceField(
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="Trajectories eval runs made on their items, and the items' own sources.",
    )
    runs = forms.MultipleChoiceField(
        required=False,
        label="Eval runs",
        widget=forms.SelectMultiple(attrs={"size": 4}),
        help_text="The trajectories of their samples.",
    )
    review_informative = forms.ChoiceField(
        required=False,
        label="Review label",
        choices=[("", "Any"), ("true", "Reviewed as informative"), ("false", "Reviewed as not informative")],
    )
    review_failure_modes = forms.CharField(
        required=False, label="Reviewed failure modes", help_text="Comma-separated; reviewed with one of these."
    )
    prompt_versions = forms.MultipleChoiceField(
        required=False, widget=forms.SelectMultiple(attrs={"size": 4}), help_text="Made with one of these."
    )
    advanced_query = forms.CharField(
        required=False,
        label="More query keys (JSON)",
        widget=forms.Textarea(
            attrs={"rows": 2, "spellcheck": "false", "placeholder": '{"scores": [{"name": "helpful", "min": 0.5}]}'}
        ),
        help_text=f"Any of {', '.join(QUERY_KEYS)}; a key here wins over its field above.",
    )
    # --- Grouping and reward
    grouping = forms.ChoiceField(choices=[(name, GROUPING_LABELS[name]) for name in GROUPINGS], initial="auto")
    reward_source = forms.ChoiceField(
        label="Reward source", choices=[(name, REWARD_LABELS[name]) for name in REWARD_SOURCES], initial="run_score"
    )
    reward_name = forms.CharField(
        required=False,
        max_length=200,
        label="Score or evaluator name",
        help_text="The score's name (score), or the evaluator's (eval run score, group judge).",
    )
    score_source = forms.ChoiceField(
        required=False,
        label="Scores from",
        choices=[("", "Any source"), *((name, name) for name in SCORE_SOURCES)],
        help_text="For a score reward.",
    )
    reward_parts = forms.CharField(
        required=False,
        label="Mix parts (JSON)",
        widget=forms.Textarea(
            attrs={
                "rows": 3,
                "spellcheck": "false",
                "placeholder": '[{"source": "score", "name": "helpful", "weight": 2}, {"source": "trajectory"}]',
            }
        ),
        help_text="For a mix: a list of rewards, each with a positive weight.",
    )
    # --- Filters
    min_group_size = forms.IntegerField(min_value=1, initial=2, label="Smallest group")
    max_group_size = forms.IntegerField(required=False, min_value=1, label="Largest group")
    drop_unrewarded = forms.BooleanField(required=False, initial=True, label="Drop rollouts without a reward")
    drop_equal_rewards = forms.BooleanField(
        required=False, initial=True, label="Drop groups whose rewards are all equal"
    )
    dedupe = forms.BooleanField(required=False, initial=True, label="Drop near-identical rollouts")
    dedupe_threshold = forms.FloatField(initial=DEFAULT_DEDUPE_THRESHOLD, label="Dedupe similarity threshold")
    balance = forms.BooleanField(required=False, label="Balance task families")
    max_groups_per_family = forms.IntegerField(required=False, min_value=1, label="Groups per family (balance)")
    validation_share = forms.FloatField(initial=0.0, label="Validation share", help_text="0 to below 1.")

    def __init__(
        self,
        *args: Any,
        agents: Sequence[Agent],
        datasets: Sequence[Dataset],
        runs: Sequence[Run],
        prompt_versions: Sequence[PromptVersion],
        curation: Curation | None = None,
        **kwargs: Any,
    ) -> None:
        if curation is not None:
            kwargs.setdefault("initial", self.initial_of(curation))
        super().__init__(*args, **kwargs)
        self.curation = curation
        _choices_set(self, "agents", [(agent.slug, agent.name) for agent in agents])
        _choices_set(self, "datasets", [(dataset.name, dataset.name) for dataset in datasets])
        _choices_set(self, "runs", [(str(run.pk), f"#{run.pk} {run.name or run}") for run in runs])
        _choices_set(
            self,
            "prompt_versions",
            [(prompt_version_key(version), f"{version.prompt.name} v{version.version}") for version in prompt_versions],
        )
        if curation is not None:
            del self.fields["name"]

    @staticmethod
    def initial_of(curation: Curation) -> dict[str, Any]:
        query = dict(curation.query)
        reward = dict(curation.reward)
        review = query.pop("review", None) or {}
        initial: dict[str, Any] = {
            "description": curation.description,
            "agents": query.pop("agents", []),
            "started_after": query.pop("started_after", None),
            "started_before": query.pop("started_before", None),
            "status": query.pop("status", ""),
            "datasets": query.pop("datasets", []),
            "runs": [str(pk) for pk in query.pop("runs", [])],
            "prompt_versions": [
                f"{use['prompt']}@{use['version']}" for use in query.pop("prompt_versions", []) if "version" in use
            ],
            "review_informative": "" if review.get("informative") is None else str(bool(review["informative"])).lower(),
            "review_failure_modes": ", ".join(review.get("failure_modes") or []),
            "grouping": curation.grouping,
            "reward_source": reward.get("source", ""),
            "reward_name": reward.get("name") or reward.get("evaluator") or "",
            "score_source": reward.get("score_source") or "",
            "reward_parts": json.dumps(reward["parts"]) if reward.get("parts") else "",
            **{name: curation.filters[name] for name in FILTER_FIELDS if name in curation.filters},
        }
        for name in LIST_FIELDS:
            initial[name] = ", ".join(query.pop(name, []))
        initial["advanced_query"] = json.dumps(query) if query else ""
        return initial

    def clean_advanced_query(self) -> dict[str, Any]:
        return _json_object(self.cleaned_data.get("advanced_query") or "", "query keys")

    def clean_reward_parts(self) -> list[Any] | None:
        raw = self.cleaned_data.get("reward_parts") or ""
        if not raw.strip():
            return None
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as error:
            raise forms.ValidationError(f"not JSON: {error.msg} (line {error.lineno}, column {error.colno})") from None
        if not isinstance(value, list):
            raise forms.ValidationError("must be a JSON list of rewards")
        return value

    def query(self) -> dict[str, Any]:
        data = self.cleaned_data
        query: dict[str, Any] = {}
        for name in ("agents", "datasets"):
            if data.get(name):
                query[name] = list(data[name])
        for name in ("started_after", "started_before"):
            if data.get(name):
                # A datetime-local input has no zone: the page says UTC.
                query[name] = data[name].replace(tzinfo=UTC).isoformat()
        if data.get("status"):
            query["status"] = data["status"]
        for name in LIST_FIELDS:
            if words := _words(data.get(name) or ""):
                query[name] = words
        if data.get("runs"):
            query["runs"] = [int(pk) for pk in data["runs"]]
        if data.get("prompt_versions"):
            uses = [key.rsplit("@", 1) for key in data["prompt_versions"]]
            query["prompt_versions"] = [{"prompt": prompt, "version": int(version)} for prompt, version in uses]
        review: dict[str, Any] = {}
        if data.get("review_informative"):
            review["informative"] = data["review_informative"] == "true"
        if modes := _words(data.get("review_failure_modes") or ""):
            review["failure_modes"] = modes
        if review:
            query["review"] = review
        query.update(data.get("advanced_query") or {})
        return query

    def reward(self) -> dict[str, Any]:
        data = self.cleaned_data
        source = data["reward_source"]
        name = (data.get("reward_name") or "").strip()
        reward: dict[str, Any] = {"source": source}
        if source == "score":
            reward["name"] = name
            if data.get("score_source"):
                reward["score_source"] = data["score_source"]
        elif source in ("run_score", "group_judge"):
            reward["evaluator"] = name
        elif source == "mix":
            reward["parts"] = data.get("reward_parts") or []
        return reward

    def filters(self) -> dict[str, Any]:
        data = self.cleaned_data
        return {name: data[name] for name in FILTER_FIELDS if data.get(name) is not None}

    def curation_fields(self) -> dict[str, Any]:
        return {
            "description": self.cleaned_data.get("description") or "",
            "query": self.query(),
            "grouping": self.cleaned_data["grouping"],
            "reward": self.reward(),
            "filters": self.filters(),
        }


class TrainingJobForm(forms.Form):
    """A training job on a finished export: the method, the base model, the few settings people change most
    (the rest as JSON), how the trained adapter will be served, and the suite that compares it."""

    name = forms.CharField(required=False, max_length=200)
    export = forms.ChoiceField(help_text="A finished export: ART for GRPO, TRL SFT for SFT, TRL DPO for DPO.")
    method = forms.ChoiceField(choices=TrainingMethod.choices, initial=TrainingMethod.GRPO)
    base_model = forms.CharField(
        max_length=500,
        label="Base model",
        help_text="A path or hub id the GPU machine can load.",
        widget=forms.TextInput(attrs={"spellcheck": "false", "placeholder": "Qwen/Qwen2.5-0.5B-Instruct"}),
    )
    steps = forms.IntegerField(min_value=1, initial=100)
    learning_rate = forms.FloatField(initial=1e-5, label="Learning rate")
    lora_r = forms.IntegerField(min_value=1, initial=8, label="LoRA r")
    config = forms.CharField(
        required=False,
        label="More settings (JSON)",
        widget=forms.Textarea(
            attrs={"rows": 2, "spellcheck": "false", "placeholder": '{"batch_size": 4, "kl_coef": 0.04}'}
        ),
        help_text="Any other training setting: batch_size, lora_alpha, kl_coef, dpo_beta, validation_every, ...",
    )
    serve_model = forms.CharField(
        required=False,
        max_length=500,
        label="Serve as (model string)",
        help_text="The litellm model string that will serve the adapter; Keel registers it as a model target.",
        widget=forms.TextInput(attrs={"spellcheck": "false", "placeholder": "hosted_vllm/my-adapter"}),
    )
    serve_api_base = forms.URLField(required=False, label="Serving API base", assume_scheme="https")
    compare_suite = forms.ChoiceField(
        required=False,
        label="Compare with the incumbent on",
        help_text="An eval suite run on the trained model, against the suite's latest run.",
    )

    def __init__(self, *args: Any, exports: Sequence[Export], suites: Sequence[Suite], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.exports = {str(export.pk): export for export in exports}
        _choices_set(
            self,
            "export",
            [
                ("", "Choose an export"),
                *(
                    (pk, f"#{pk} {export.curation.name if export.curation else 'deleted curation'} ({export.format})")
                    for pk, export in self.exports.items()
                ),
            ],
        )
        _choices_set(self, "compare_suite", [("", "No comparison"), *((s.name, s.name) for s in suites)])

    def clean_config(self) -> dict[str, Any]:
        return _json_object(self.cleaned_data.get("config") or "", "training settings")

    def export_chosen(self) -> Export:
        return self.exports[self.cleaned_data["export"]]

    def job_fields(self) -> dict[str, Any]:
        data = self.cleaned_data
        config: Mapping[str, Any] = {
            "steps": data["steps"],
            "learning_rate": data["learning_rate"],
            "lora_r": data["lora_r"],
            **data["config"],
        }
        serve: dict[str, Any] | None = None
        if data.get("serve_model"):
            serve = {"model": data["serve_model"]}
            if data.get("serve_api_base"):
                serve["api_base"] = data["serve_api_base"]
        return {
            "name": data.get("name") or "",
            "method": data["method"],
            "base_model": data["base_model"],
            "config": dict(config),
            "serve": serve,
            "compare_suite": data.get("compare_suite") or "",
        }
