"""Forms of the routing pages: model targets, an agent's router configuration (rules and chain steps are
repeatable rows), tools, hand-off resolutions. They check shapes; routing.services checks the rules, and
the views put the services' errors back on the fields. Secrets are never rendered back."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django import forms

from routing.models import AgentTool, ModelTarget, RouterConfig, TierChoice
from routing.router import RULE_KINDS, TIERS

_ROW_KEY = re.compile(r"^(?P<prefix>rule|step)-(?P<index>\d+)-(?P<name>[a-z_]+)$")


def _target_choices(targets: Sequence[ModelTarget], empty: str) -> list[tuple[str, str]]:
    return [("", empty), *((target.alias, f"{target.alias} ({target.model})") for target in targets)]


# --- Model targets ----------------------------------------------------------------------------------


class ModelTargetForm(forms.Form):
    """Create or change a target. The key field is there for owners only (`can_manage_keys`): a member's
    form has none, so a member can neither set nor see whether one is being replaced."""

    alias = forms.SlugField(
        max_length=100, help_text="What agents and the gateway's `model` call it; unique in the workspace."
    )
    model = forms.CharField(
        max_length=300,
        label="litellm model",
        widget=forms.TextInput(attrs={"placeholder": "openai/gpt-4o-mini", "spellcheck": "false"}),
        help_text="Any litellm model string; an OpenAI-compatible server is openai/<its model name> with an API base.",
    )
    # Checked by the service (routing/services.py): Django's URL check refuses bare host names (http://vllm:8000).
    api_base = forms.CharField(
        max_length=500,
        required=False,
        label="API base",
        widget=forms.TextInput(attrs={"inputmode": "url", "placeholder": "http://127.0.0.1:8001/v1"}),
        help_text="For vLLM, llama.cpp, Ollama or a proxy; blank uses the provider's own.",
    )
    api_key = forms.CharField(
        max_length=2000,
        required=False,
        label="API key",
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password", "spellcheck": "false"}),
    )
    remove_api_key = forms.BooleanField(label="Remove the stored key", required=False)
    tier = forms.ChoiceField(
        choices=[("", "Any tier"), *TierChoice.choices[:3]],
        required=False,
        help_text="A hint shown where targets are chosen; the router configuration decides.",
    )
    timeout_seconds = forms.FloatField(label="Timeout, seconds", min_value=0.1, max_value=600, initial=30)
    max_retries = forms.IntegerField(label="Retries", min_value=0, max_value=10, initial=2)
    fallbacks = forms.CharField(
        required=False,
        max_length=1000,
        widget=forms.TextInput(attrs={"placeholder": "strong, local", "spellcheck": "false"}),
        help_text="Aliases of other targets, tried in this order while this one fails or rests.",
    )
    failure_threshold = forms.IntegerField(
        label="Failures before resting", min_value=1, max_value=100, initial=3, help_text="In a row."
    )
    cooldown_seconds = forms.IntegerField(label="Rest, seconds", min_value=0, max_value=86_400, initial=30)
    enabled = forms.BooleanField(label="Enabled", required=False, initial=True)

    def __init__(self, *args: Any, target: ModelTarget | None = None, can_manage_keys: bool, **kwargs: Any) -> None:
        if target is not None:
            kwargs.setdefault(
                "initial",
                {
                    "alias": target.alias,
                    "model": target.model,
                    "api_base": target.api_base,
                    "tier": target.tier,
                    "timeout_seconds": target.timeout_seconds,
                    "max_retries": target.max_retries,
                    "fallbacks": ", ".join(target.fallbacks),
                    "failure_threshold": target.failure_threshold,
                    "cooldown_seconds": target.cooldown_seconds,
                    "enabled": target.enabled,
                },
            )
        super().__init__(*args, **kwargs)
        self.target = target
        if target is not None:
            # The alias names the target in fallbacks and configurations: it does not change.
            del self.fields["alias"]
        if not can_manage_keys:
            del self.fields["api_key"]
            del self.fields["remove_api_key"]
        elif target is not None and target.api_key_encrypted:
            self.fields[
                "api_key"
            ].help_text = "A key is stored (encrypted). Leave this empty to keep it; it is never shown."
        else:
            self.fields["api_key"].help_text = "Stored encrypted and never shown again."
            del self.fields["remove_api_key"]

    def target_arguments(self) -> dict[str, Any]:
        """The keyword arguments of `model_target_create` (but the workspace) or `model_target_update`."""
        data = self.cleaned_data
        arguments: dict[str, Any] = {
            name: data[name]
            for name in (
                "model",
                "api_base",
                "tier",
                "timeout_seconds",
                "max_retries",
                "failure_threshold",
                "cooldown_seconds",
                "enabled",
            )
        }
        arguments["fallbacks"] = [alias.strip() for alias in data["fallbacks"].split(",") if alias.strip()]
        if "alias" in self.fields:
            arguments["alias"] = data["alias"]
        if "api_key" in self.fields:
            if data.get("remove_api_key"):
                arguments["api_key"] = ""
            elif data["api_key"]:
                arguments["api_key"] = data["api_key"]
        return arguments


# --- Repeatable rows (rules, chain steps) -------------------------------------------------------------


def posted_rows(data: Mapping[str, Any], prefix: str) -> list[dict[str, str]]:
    """`prefix-<index>-<name>` fields as one dict per row, in index order (the order on the page: a row
    added later gets a higher index). Rows whose every value is blank are dropped."""
    rows: dict[int, dict[str, str]] = {}
    for key in data:
        match = _ROW_KEY.match(key)
        if match and match["prefix"] == prefix:
            rows.setdefault(int(match["index"]), {})[match["name"]] = str(data.get(key, ""))
    return [row for _, row in sorted(rows.items()) if any(value.strip() for value in row.values())]


@dataclass
class RowsView:
    """What the row editor renders: the rows, a blank one for the template, and errors by row."""

    rows: list[dict[str, Any]]
    errors: list[str] = field(default_factory=list)

    @property
    def next_index(self) -> int:
        return len(self.rows)


RULE_KIND_CHOICES = sorted(RULE_KINDS)
ROUTABLE_TIERS = list(TIERS)


class RouterConfigForm(forms.Form):
    single_call_target = forms.ChoiceField(required=False, label="Single-call target")
    agentic_target = forms.ChoiceField(required=False, label="Agentic target")
    judge_target = forms.ChoiceField(
        required=False, label="Judge target", help_text="Scores shadow runs against the answer sent."
    )
    embedding_target = forms.ChoiceField(
        required=False, label="Embedding target", help_text="Blank: Keel's offline embedder."
    )
    intents = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false", "placeholder": "refund: money back, refund my"}),
        help_text="One intent a line: label, a colon, its phrases separated by commas. Intent rules match the label.",
    )
    neighbours = forms.IntegerField(min_value=1, max_value=200, help_text="Past requests the estimate reads.")
    min_neighbours = forms.IntegerField(
        min_value=1, max_value=200, label="Fewest neighbours", help_text="Below this, the default tier (cold start)."
    )
    cost_weight = forms.FloatField(min_value=0, max_value=10)
    latency_weight = forms.FloatField(min_value=0, max_value=10)
    risk_weight = forms.FloatField(min_value=0, max_value=10)
    shadow_rate = forms.FloatField(
        min_value=0,
        max_value=100,
        label="Shadow rate, %",
        help_text="Share of requests also sent, off the caller's path, through another tier and judged.",
    )
    speculative_single_call = forms.BooleanField(
        required=False,
        label="Start the single call while the router decides",
        help_text="Hides the router's time (and a remote embedder's) behind the model call. A request the router "
        "sends to another tier pays for a single call it does not use. Not with the cache on.",
    )
    cache_enabled = forms.BooleanField(required=False, label="Answer similar requests from the cache")
    cache_threshold = forms.FloatField(
        min_value=0.01, max_value=1, label="Cache similarity threshold", help_text="Cosine similarity, 0 to 1."
    )
    cache_ttl_hours = forms.FloatField(min_value=0.01, max_value=2160, label="Cache entries live, hours")
    cache_end_user_requests = forms.BooleanField(
        required=False, label="Cache requests that carry an end-user id", help_text="Only if answers are not personal."
    )
    human_message = forms.CharField(
        required=False,
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="What the caller is told when a request goes to a person.",
    )

    def __init__(self, *args: Any, config: RouterConfig, targets: Sequence[ModelTarget], **kwargs: Any) -> None:
        kwargs.setdefault(
            "initial",
            {
                "single_call_target": config.single_call_target.alias if config.single_call_target else "",
                "agentic_target": config.agentic_target.alias if config.agentic_target else "",
                "judge_target": config.judge_target.alias if config.judge_target else "",
                "embedding_target": config.embedding_target.alias if config.embedding_target else "",
                "intents": "\n".join(f"{label}: {', '.join(phrases)}" for label, phrases in config.intents.items()),
                "neighbours": config.neighbours,
                "min_neighbours": config.min_neighbours,
                "cost_weight": config.cost_weight,
                "latency_weight": config.latency_weight,
                "risk_weight": config.risk_weight,
                "shadow_rate": round(config.shadow_rate * 100, 4),
                "speculative_single_call": config.speculative_single_call,
                "cache_enabled": config.cache_enabled,
                "cache_threshold": config.cache_threshold,
                "cache_ttl_hours": round(config.cache_ttl_seconds / 3600, 4),
                "cache_end_user_requests": config.cache_end_user_requests,
                "human_message": config.human_message,
            },
        )
        super().__init__(*args, **kwargs)
        for name in ("single_call_target", "agentic_target", "judge_target"):
            self.fields[name].choices = _target_choices(targets, "The requirements' default")  # type: ignore[attr-defined]
        self.fields["embedding_target"].choices = _target_choices(targets, "Offline embedder")  # type: ignore[attr-defined]
        posted = posted_rows(self.data, "rule") if self.is_bound else None
        self.rules = RowsView(rows=posted if posted is not None else [dict(rule) for rule in config.rules])

    def clean_intents(self) -> dict[str, list[str]]:
        intents: dict[str, list[str]] = {}
        for number, line in enumerate(self.cleaned_data["intents"].splitlines(), start=1):
            if not line.strip():
                continue
            label, colon, phrases = line.partition(":")
            if not colon or not label.strip():
                raise forms.ValidationError(f"Line {number}: write the label, a colon, then its phrases.")
            intents[label.strip()] = [phrase.strip() for phrase in phrases.split(",") if phrase.strip()]
        return intents

    def config_arguments(self) -> dict[str, Any]:
        """The fields of `routing.services.router_config_update`."""
        data = self.cleaned_data
        arguments = {
            name: data[name]
            for name in (
                "single_call_target",
                "agentic_target",
                "judge_target",
                "embedding_target",
                "intents",
                "neighbours",
                "min_neighbours",
                "cost_weight",
                "latency_weight",
                "risk_weight",
                "speculative_single_call",
                "cache_enabled",
                "cache_threshold",
                "cache_end_user_requests",
                "human_message",
            )
        }
        arguments["shadow_rate"] = data["shadow_rate"] / 100
        arguments["cache_ttl_seconds"] = max(1, round(data["cache_ttl_hours"] * 3600))
        arguments["rules"] = [
            {key: row.get(key, "").strip() for key in ("name", "kind", "value", "to_tier", "reason")}
            for row in self.rules.rows
        ]
        return arguments


def chain_rows(data: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """The posted chain steps: as the page shows them again, as `chain_steps_set` takes them, and the
    errors of their shapes (an output schema that is not JSON)."""
    shown = posted_rows(data, "step")
    steps: list[dict[str, Any]] = []
    errors: list[str] = []
    for number, row in enumerate(shown, start=1):
        schema_text = row.get("output_schema", "").strip()
        schema: Any = None
        if schema_text:
            try:
                schema = json.loads(schema_text)
            except json.JSONDecodeError as error:
                errors.append(f"Step {number}: the output schema is not JSON ({error.msg}, line {error.lineno}).")
        version = row.get("prompt_version", "").strip()
        steps.append(
            {
                "name": row.get("name", "").strip(),
                "prompt_version": int(version) if version.isdigit() else None,
                "instructions": row.get("instructions", ""),
                "model_target": row.get("model_target", "").strip() or None,
                "output_schema": schema,
            }
        )
    return shown, steps, errors


# --- Tools --------------------------------------------------------------------------------------------


class AgentToolForm(forms.Form):
    name = forms.CharField(
        max_length=64,
        widget=forms.TextInput(attrs={"spellcheck": "false", "placeholder": "lookup_order"}),
        help_text="As the model calls it: letters, digits, _ and -.",
    )
    description = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 2}), help_text="Tells the model when to call it."
    )
    parameters = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 6, "spellcheck": "false", "class": "json-input"}),
        help_text='JSON Schema of the arguments, an object: {"type": "object", "properties": {...}}. Blank: none.',
    )
    endpoint_url = forms.URLField(
        required=False,
        max_length=500,
        label="Endpoint URL",
        assume_scheme="https",
        help_text="Keel calls it with the arguments; blank returns the call to the client (the OpenAI tool flow).",
    )
    endpoint_secret = forms.CharField(
        required=False,
        max_length=2000,
        label="Endpoint secret",
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
    )
    remove_endpoint_secret = forms.BooleanField(required=False, label="Remove the stored secret")
    timeout_seconds = forms.FloatField(label="Timeout, seconds", min_value=0.1, max_value=120, initial=10)

    def __init__(self, *args: Any, tool: AgentTool | None = None, can_manage_keys: bool, **kwargs: Any) -> None:
        if tool is not None:
            kwargs.setdefault(
                "initial",
                {
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": json.dumps(tool.parameters, indent=2),
                    "endpoint_url": tool.endpoint_url,
                    "timeout_seconds": tool.timeout_seconds,
                },
            )
        super().__init__(*args, **kwargs)
        if not can_manage_keys:
            del self.fields["endpoint_secret"]
            del self.fields["remove_endpoint_secret"]
        elif tool is not None and tool.endpoint_secret_encrypted:
            self.fields["endpoint_secret"].help_text = "A secret is stored (encrypted). Leave empty to keep it."
        else:
            self.fields["endpoint_secret"].help_text = "Signs Keel's calls to the endpoint; stored encrypted."
            del self.fields["remove_endpoint_secret"]

    def clean_parameters(self) -> dict[str, Any]:
        text = self.cleaned_data["parameters"].strip()
        if not text:
            return {}
        try:
            value = json.loads(text)
        except json.JSONDecodeError as error:
            raise forms.ValidationError(f"Not JSON: {error.msg} (line {error.lineno}).") from None
        if not isinstance(value, dict):
            raise forms.ValidationError("A JSON object is needed.")
        return value

    def tool_arguments(self) -> dict[str, Any]:
        data = self.cleaned_data
        arguments = {
            name: data[name] for name in ("name", "description", "parameters", "endpoint_url", "timeout_seconds")
        }
        if "endpoint_secret" in self.fields:
            if data.get("remove_endpoint_secret"):
                arguments["endpoint_secret"] = ""
            elif data["endpoint_secret"]:
                arguments["endpoint_secret"] = data["endpoint_secret"]
        return arguments


class HandoffResolveForm(forms.Form):
    resolution = forms.CharField(
        max_length=10_000, widget=forms.Textarea(attrs={"rows": 2}), help_text="What was done, for the record."
    )
