"""What a model call cost, from its token usage. Pure module, no Django.

Prices come from litellm's price map, read straight from the JSON file litellm ships (importing
litellm takes seconds and may reach for the network; reading its data file does neither), and from
per-workspace overrides, which win. A span that reports its own cost keeps it, unless it reports 0 for a
model the workspace prices.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from functools import cache
from pathlib import Path
from typing import Any

_PRICE_FILE = "model_prices_and_context_window_backup.json"
_MILLION = Decimal(1_000_000)
# A provider's dated snapshot of a model: gpt-4o-2024-08-06, claude-sonnet-4-5-20250929, claude-sonnet-4-5@20250929.
_SNAPSHOT_DATE = re.compile(r"[-@](?:\d{4}-\d{2}-\d{2}|20\d{6})$")
# litellm's long-context prices: `input_cost_per_token_above_200k_tokens` and its output and cache-read kin.
_TIER_KEY = re.compile(
    r"^(?:input_cost_per_token|output_cost_per_token|cache_read_input_token_cost|cache_creation_input_token_cost)"
    r"_above_(\d+)(k?)_tokens$"
)


@dataclass(frozen=True, slots=True)
class ModelPrice:
    """USD per token."""

    input: Decimal
    output: Decimal
    cache_read: Decimal | None = None
    # Writing a prompt to the provider's cache (Anthropic: 1.25 times input); None charges it as input.
    cache_write: Decimal | None = None
    # (prompt size, price) by size: a call whose prompt has more input tokens than a tier's size is charged
    # at that tier's prices for all of its tokens, as the provider bills it (and litellm counts it).
    tiers: tuple[tuple[int, ModelPrice], ...] = ()

    def for_prompt(self, input_tokens: int) -> ModelPrice:
        """The price of a call whose prompt has `input_tokens` input tokens (cached ones included)."""
        chosen = self
        for size, price in self.tiers:
            if input_tokens > size:
                chosen = price
        return chosen

    @classmethod
    def per_million(cls, input_usd: Decimal, output_usd: Decimal, cache_read_usd: Decimal | None = None) -> ModelPrice:
        return cls(
            input=input_usd / _MILLION,
            output=output_usd / _MILLION,
            cache_read=None if cache_read_usd is None else cache_read_usd / _MILLION,
        )


@cache
def litellm_prices() -> dict[str, ModelPrice]:
    """litellm's price map, model name → price; empty if litellm is not installed."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or spec.origin is None:
        return {}
    path = Path(spec.origin).parent / _PRICE_FILE
    if not path.exists():
        return {}
    raw: dict[str, Any] = json.loads(path.read_text())
    prices: dict[str, ModelPrice] = {}
    for model, entry in raw.items():
        if not isinstance(entry, dict):
            continue
        input_cost, output_cost = entry.get("input_cost_per_token"), entry.get("output_cost_per_token")
        if not isinstance(input_cost, (int, float)) or not isinstance(output_cost, (int, float)):
            continue
        cache_read, cache_write = entry.get("cache_read_input_token_cost"), entry.get("cache_creation_input_token_cost")
        base = ModelPrice(
            input=Decimal(str(input_cost)),
            output=Decimal(str(output_cost)),
            cache_read=Decimal(str(cache_read)) if isinstance(cache_read, (int, float)) else None,
            cache_write=Decimal(str(cache_write)) if isinstance(cache_write, (int, float)) else None,
        )
        tiers = _tiers(entry, base)
        prices[model] = dataclasses.replace(base, tiers=tiers) if tiers else base
    return prices


def _tiers(entry: Mapping[str, Any], base: ModelPrice) -> tuple[tuple[int, ModelPrice], ...]:
    """The entry's long-context prices; a rate a tier does not name stays the base rate."""

    def rate(key: str) -> Decimal | None:
        value = entry.get(key)
        return Decimal(str(value)) if isinstance(value, (int, float)) else None

    sizes: dict[int, str] = {}
    for key in entry:
        if found := _TIER_KEY.match(key):
            sizes[int(found[1]) * (1000 if found[2] else 1)] = found[1] + found[2]
    tiers: list[tuple[int, ModelPrice]] = []
    for size, name in sorted(sizes.items()):
        input_rate = rate(f"input_cost_per_token_above_{name}_tokens")
        output_rate = rate(f"output_cost_per_token_above_{name}_tokens")
        cache_read = rate(f"cache_read_input_token_cost_above_{name}_tokens")
        cache_write = rate(f"cache_creation_input_token_cost_above_{name}_tokens")
        price = ModelPrice(
            input=base.input if input_rate is None else input_rate,
            output=base.output if output_rate is None else output_rate,
            cache_read=base.cache_read if cache_read is None else cache_read,
            cache_write=base.cache_write if cache_write is None else cache_write,
        )
        tiers.append((size, price))
    return tuple(tiers)


def _candidates(model: str) -> tuple[str, ...]:
    return (model, model.split("/", 1)[1]) if "/" in model else (model,)


@cache
def _litellm_price(model: str) -> ModelPrice | None:
    # Asked once per model name and process: every generation span of a batch asks again.
    prices = litellm_prices()
    return next((prices[name] for name in _candidates(model) if name in prices), None)


def _undated(names: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(undated for name in names if (undated := _SNAPSHOT_DATE.sub("", name)) != name)


def price_find(model: str, overrides: Mapping[str, ModelPrice] | None = None) -> ModelPrice | None:
    """The price of `model`: an override, else litellm's; `openai/gpt-4o` also finds `gpt-4o`.

    An override for a model also prices its dated snapshots (`gpt-4o-2024-08-06`, `claude-sonnet-4-5-20250929`),
    over litellm's price for the snapshot: providers answer with the snapshot that served a call, and spans name
    the model as answered, while a negotiated rate is for the model."""
    return override_find(model, overrides) or _litellm_price(model)


def override_find(model: str, overrides: Mapping[str, ModelPrice] | None) -> ModelPrice | None:
    """The workspace's own price of `model` (or of the model a dated snapshot is of), if it has one."""
    if overrides:
        names = _candidates(model)
        for name in names + _undated(names):
            if name in overrides:
                return overrides[name]
    return None


def generation_cost(
    model: str | None,
    input_tokens: int | None,
    output_tokens: int | None,
    cache_read_tokens: int | None = None,
    overrides: Mapping[str, ModelPrice] | None = None,
    cache_write_tokens: int | None = None,
) -> Decimal | None:
    """USD for one call; None when the model has no known price or no tokens were reported."""
    if not model or (input_tokens is None and output_tokens is None):
        return None
    found = price_find(model, overrides)
    if found is None:
        return None
    prompt = input_tokens or 0
    price = found.for_prompt(prompt)
    # The cache's tokens are among the prompt's: each part at its own rate, the rest at the input rate.
    cached = max(0, min(cache_read_tokens or 0, prompt)) if price.cache_read is not None else 0
    written = max(0, min(cache_write_tokens or 0, prompt - cached)) if price.cache_write is not None else 0
    cost = price.input * (prompt - cached - written) + price.output * (output_tokens or 0)
    if cached and price.cache_read is not None:
        cost += price.cache_read * cached
    if written and price.cache_write is not None:
        cost += price.cache_write * written
    return cost.quantize(Decimal("0.00000001"))
