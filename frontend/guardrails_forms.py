"""Forms of the guardrails pages: an agent's policy (its document as JSON), a decision on an approval
request, a budget. They check shapes; guardrails.services and guardrails.budgets check the rules, and the
views put the services' errors back beside the form."""

from __future__ import annotations

import json
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from django import forms

from agent_registry.models import Agent, ApiKey
from frontend.forms import storable_json_check
from guardrails import policy
from guardrails.models import BudgetPeriod, BudgetScope


class GuardrailPolicyForm(forms.Form):
    document = forms.CharField(
        label="Policy document",
        max_length=200_000,
        widget=forms.Textarea(attrs={"rows": 24, "spellcheck": "false", "class": "json-input"}),
        help_text="JSON: checks, model_checks, pii_kinds, pseudonymize, allowed_topics, tool_constraints, "
        "rate_limits, approval_tools, amount_arguments, approval_ttl_hours.",
    )
    rotate_canary = forms.BooleanField(
        required=False,
        label="Rotate the canary",
        help_text="A new canary secret: every prompt's canary token changes, so a leaked one stops matching.",
    )

    def __init__(self, *args: Any, document: policy.PolicyDocument | None = None, **kwargs: Any) -> None:
        if document is not None:
            kwargs.setdefault("initial", {"document": json.dumps(document.model_dump(mode="json"), indent=2)})
        super().__init__(*args, **kwargs)

    def clean_document(self) -> dict[str, Any]:
        text = self.cleaned_data["document"]
        try:
            value = json.loads(text)
        except json.JSONDecodeError as error:
            raise forms.ValidationError(f"Not JSON: {error.msg} (line {error.lineno}).") from None
        except RecursionError:
            raise forms.ValidationError("Not JSON Keel can store: nested too deeply.") from None
        storable_json_check(text)
        if not isinstance(value, dict):
            raise forms.ValidationError("A JSON object is needed.")
        return value


class ApprovalDecisionForm(forms.Form):
    decision = forms.ChoiceField(choices=[("approve", "Approve"), ("reject", "Reject")])
    note = forms.CharField(
        required=False,
        max_length=10_000,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="Why, for the audit trail.",
    )


class BudgetForm(forms.Form):
    """One budget: whose spending (the workspace, an agent, a key or an end user), per day or month, in
    money, tokens or both."""

    scope = forms.ChoiceField(choices=BudgetScope.choices)
    period = forms.ChoiceField(choices=BudgetPeriod.choices)
    agent = forms.ChoiceField(required=False, help_text="For an agent's budget.")
    api_key = forms.ChoiceField(required=False, label="API key", help_text="For a key's budget.")
    end_user = forms.CharField(
        required=False,
        max_length=200,
        label="End user",
        help_text="For an end user's budget: the request's user field.",
    )
    limit_usd = forms.DecimalField(
        required=False, min_value=Decimal(0), max_digits=14, decimal_places=6, label="Limit, USD"
    )
    limit_tokens = forms.IntegerField(required=False, min_value=0, max_value=2**63 - 1, label="Limit, tokens")
    soft_limit_percent = forms.FloatField(
        required=False,
        min_value=1,
        max_value=100,
        label="Soft limit, %",
        help_text="Raise an alert once this share of the limit is spent.",
    )

    def __init__(self, *args: Any, agents: Sequence[Agent], api_keys: Sequence[ApiKey], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.agents = {str(agent.pk): agent for agent in agents}
        self.api_keys = {str(key.pk): key for key in api_keys}
        # The choices are the workspace's own, so an id from another workspace is "not a valid choice".
        for name, choices in (
            ("agent", [(pk, agent.name) for pk, agent in self.agents.items()]),
            ("api_key", [(pk, key.name) for pk, key in self.api_keys.items()]),
        ):
            field = self.fields[name]
            if isinstance(field, forms.ChoiceField):
                field.choices = [("", "—"), *choices]

    def budget_arguments(self) -> dict[str, Any]:
        data = self.cleaned_data
        scope = data["scope"]
        share = data["soft_limit_percent"]
        return {
            "scope": scope,
            "period": data["period"],
            "agent": self.agents.get(data["agent"]) if scope == BudgetScope.AGENT else None,
            "api_key": self.api_keys.get(data["api_key"]) if scope == BudgetScope.API_KEY else None,
            "end_user": data["end_user"] if scope == BudgetScope.END_USER else "",
            "limit_usd": data["limit_usd"],
            "limit_tokens": data["limit_tokens"],
            "soft_limit_share": share / 100 if share is not None else None,
        }
