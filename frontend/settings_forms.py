"""Forms of the settings pages: an agent's settings, the workspace's Langfuse mirror and its model prices.
They check shapes (required, numbers and their ranges, lengths the columns hold); the services check the
rules, and the views put the services' errors back on the fields."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django import forms

from agent_registry.models import Agent, AgentStatus
from tracing.models import LangfuseMirror, ModelPriceOverride

# The range the API accepts (agent_registry.schemas): a day at least, ten years at most.
RETENTION_DAYS_MIN = 1
RETENTION_DAYS_MAX = 3650


def decimal_plain(value: Decimal | None) -> str:
    """A price as a person would type it: 2.5, not 2.500000; blank for none."""
    if value is None:
        return ""
    return format(value.normalize(), "f")


class AgentSettingsForm(forms.Form):
    name = forms.CharField(max_length=200)
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}))
    status = forms.ChoiceField(
        choices=AgentStatus.choices,
        help_text="Shown beside the agent's name on every page. It does not change what Keel ingests.",
    )
    trace_retention_days = forms.IntegerField(
        label="Trace retention, days",
        required=False,
        min_value=RETENTION_DAYS_MIN,
        max_value=RETENTION_DAYS_MAX,
        help_text=(
            "Trajectories of this agent that ended longer ago than this are deleted nightly, in batches, "
            f"with their spans. Blank keeps them forever; {RETENTION_DAYS_MIN} to {RETENTION_DAYS_MAX} days."
        ),
    )

    @classmethod
    def for_agent(cls, agent: Agent, data: Any = None) -> AgentSettingsForm:
        return cls(
            data,
            initial={
                "name": agent.name,
                "description": agent.description,
                "status": agent.status,
                "trace_retention_days": agent.trace_retention_days,
            },
        )

    def agent_fields(self) -> dict[str, Any]:
        """The `fields` of `agent_registry.services.agent_update`."""
        return {name: self.cleaned_data[name] for name in self.fields}


class LangfuseMirrorForm(forms.Form):
    """The secret key is never rendered back, not even after a rejected post; left empty, the stored
    one is kept."""

    host = forms.CharField(
        max_length=500,
        widget=forms.TextInput(attrs={"inputmode": "url", "placeholder": "https://cloud.langfuse.com"}),
        help_text="Langfuse Cloud's URL for your region, or your own Langfuse's.",
    )
    public_key = forms.CharField(
        max_length=200, widget=forms.TextInput(attrs={"placeholder": "pk-lf-…", "spellcheck": "false"})
    )
    secret_key = forms.CharField(
        max_length=500,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password", "spellcheck": "false"}),
    )
    enabled = forms.BooleanField(
        label="Mirror new spans and scores",
        required=False,
        initial=True,
        help_text="Untick to pause: nothing new is queued while the mirror is paused.",
    )

    def __init__(self, *args: Any, mirror: LangfuseMirror | None, **kwargs: Any) -> None:
        if mirror is not None:
            kwargs.setdefault(
                "initial", {"host": mirror.host, "public_key": mirror.public_key, "enabled": mirror.enabled}
            )
        super().__init__(*args, **kwargs)
        secret_key = self.fields["secret_key"]
        if mirror is not None and mirror.secret_key_encrypted:
            secret_key.required = False
            secret_key.help_text = (
                "A key is stored (encrypted). Leave this empty to keep it, for the same host; it is never shown."
            )
        else:
            secret_key.help_text = "Stored encrypted and never shown again."

    def configure_arguments(self) -> dict[str, Any]:
        """The arguments of `tracing.langfuse_bridge.langfuse_mirror_configure` but the workspace."""
        data = self.cleaned_data
        return {
            "host": data["host"],
            "public_key": data["public_key"],
            "secret_key": data["secret_key"] or None,
            "enabled": data["enabled"],
        }


def _usd_per_million(label: str, required: bool = True) -> forms.DecimalField:
    # The column's precision: a larger number would be refused by the database, not by a rule.
    return forms.DecimalField(
        label=label,
        required=required,
        min_value=Decimal(0),
        max_digits=12,
        decimal_places=6,
        widget=forms.NumberInput(attrs={"step": "any"}),
    )


class ModelPriceForm(forms.Form):
    model = forms.CharField(
        max_length=300,
        help_text="As spans name it (the response model, else the request model); openai/gpt-4o also finds gpt-4o.",
    )
    input_usd_per_million = _usd_per_million("Input, USD per 1M tokens")
    output_usd_per_million = _usd_per_million("Output, USD per 1M tokens")
    cache_read_usd_per_million = _usd_per_million("Cache read, USD per 1M tokens", required=False)

    @classmethod
    def for_price(cls, price: ModelPriceOverride | None) -> ModelPriceForm:
        if price is None:
            return cls()
        return cls(
            initial={
                "model": price.model,
                "input_usd_per_million": decimal_plain(price.input_usd_per_million),
                "output_usd_per_million": decimal_plain(price.output_usd_per_million),
                "cache_read_usd_per_million": decimal_plain(price.cache_read_usd_per_million),
            }
        )

    def price_arguments(self) -> dict[str, Any]:
        """The arguments of `tracing.services.model_price_set` but the workspace."""
        return {name: self.cleaned_data[name] for name in self.fields}
