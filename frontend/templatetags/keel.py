"""Small presentation filters for the dashboard's templates."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Any

from django import template
from django.utils import timezone
from django.utils.timesince import timesince

from frontend import trajectories as display

register = template.Library()

_ACRONYMS = {"pii": "PII", "csat": "CSAT", "llm": "LLM", "pr": "PR"}


@register.filter
def humanize(value: Any) -> str:
    """An enum value as words: `bounded_autonomy` → `Bounded autonomy`."""
    words = [_ACRONYMS.get(word, word) for word in str(value).split("_")]
    text = " ".join(words)
    return text[:1].upper() + text[1:]


@register.filter
def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


@register.filter
def diff_class(line: str) -> str:
    """The colour of one line of a unified diff."""
    if line.startswith(("+++", "---")):
        return "diff-meta"
    if line.startswith("@@"):
        return "diff-hunk"
    if line.startswith("+"):
        return "diff-add"
    if line.startswith("-"):
        return "diff-del"
    return ""


@register.filter
def percent(value: Any) -> str:
    try:
        return f"{float(value) * 100:g}%"
    except (TypeError, ValueError):
        return str(value)


@register.filter
def initials(value: Any) -> str:
    text = str(value).strip()
    return text[:2] if text else "?"


@register.filter
def ms(value: Any) -> str:
    """Milliseconds as the unit a person would say: 30000 → 30 s."""
    if value is None:
        return "—"
    number = int(value)
    if number >= 60_000 and number % 60_000 == 0:
        return f"{number // 60_000} min"
    if number >= 1000 and number % 1000 == 0:
        return f"{number // 1000} s"
    return f"{number} ms"


@register.filter
def cut_section(path: str) -> str:
    """The question a dotted path belongs to: `constraints.latency.latency_class` → `constraints`."""
    return str(path).split(".", 1)[0]


@register.filter
def severity_counts(findings: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for finding in findings or ():
        severity = str(getattr(finding, "severity", getattr(getattr(finding, "finding", None), "severity", "")))
        counts[severity] = counts.get(severity, 0) + 1
    return counts


@register.filter
def ago(value: datetime | None) -> str:
    """`3 minutes ago`; under a minute, `just now` rather than Django's `0 minutes`."""
    if value is None:
        return "—"
    if (timezone.now() - value).total_seconds() < 60:
        return "just now"
    return f"{timesince(value, depth=1)} ago"


@register.filter
def usd(value: Any) -> str:
    """A cost in US dollars, with the precision small amounts need: $0.0004, $0.000021, $0.021, $1.25.
    Under a cent, up to two significant digits and at least four places, so $0.00002 does not read $0.0000."""
    if value is None or value == "":
        return "—"
    try:
        amount = Decimal(str(value))
    except (InvalidOperation, ValueError):
        return str(value)
    if amount == 0:
        return "$0"

    def rounded(places: int) -> Decimal:  # half up, as money is read ($0.00345 is $0.0035, not $0.0034)
        return amount.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)

    if abs(amount) < Decimal("0.01"):
        whole, _, fraction = f"{rounded(max(4, 1 - amount.adjusted())):f}".partition(".")
        return f"${whole}.{fraction.rstrip('0').ljust(4, '0')}"
    if abs(amount) < 1:
        return f"${rounded(3):f}"
    return f"${rounded(2):,f}"


@register.simple_tag
def unpriced_note(calls: int, models: Sequence[str] = (), cost: Any = None) -> str:
    """Why a cost is unknown (`cost` None) or partial: "No price for model my-llama: 2 model calls without a
    cost, not in this sum." A workspace price set later prices the calls stored after it, not these."""
    named = f"No price for model{'s' if len(models) > 1 else ''} {', '.join(models)}: " if models else ""
    plural = "s" if calls != 1 else ""
    within = ", not in this sum" if cost is not None else ""
    return f"{named}{calls} model call{plural} without a cost{within}. A price added later prices new calls only."


@register.filter
def duration(value: Any) -> str:
    """Milliseconds as a duration: 840 ms, 8.5 s, 2 min 3 s."""
    if value is None or value == "":
        return "—"
    milliseconds = float(value)
    if milliseconds < 1:
        return f"{milliseconds:.2f} ms" if milliseconds else "0 ms"
    if milliseconds < 1000:
        return f"{milliseconds:.0f} ms"
    if milliseconds < 60_000:
        return f"{milliseconds / 1000:.1f} s"
    minutes, seconds = divmod(round(milliseconds / 1000), 60)
    return f"{minutes} min {seconds} s" if seconds else f"{minutes} min"


@register.filter
def number(value: Any) -> str:
    """An integer with thousands separators: 41179 → 41,179."""
    if value is None or value == "":
        return "—"
    try:
        return f"{int(value):,}"
    except (TypeError, ValueError):
        return str(value)


@register.filter
def score_value(score: Any) -> str:
    """A score's value as a person reads it: 4.5, yes / no, the category, or the corrected text."""
    data_type = getattr(score, "data_type", "")
    if data_type == "boolean":
        return "yes" if getattr(score, "value", 0) else "no"
    if data_type == "numeric":
        return f"{getattr(score, 'value', 0):g}"
    return str(getattr(score, "string_value", ""))


@register.filter
def signal_badges(instances: Any) -> list[Any]:
    """A trajectory's signals as badges (frontend.trajectories.signal_badges)."""
    return list(display.signal_badges(instances))


@register.filter
def share(value: Any, digits: int = 0) -> str:
    """A share in [0, 1] as a percentage: 0.8234 → 82%; None → —."""
    if value is None:
        return "—"
    try:
        return f"{float(value) * 100:.{int(digits)}f}%"
    except (TypeError, ValueError):
        return str(value)
