"""What a model call cost, from its token usage. Pure module, no Django.

Prices come from litellm's price map, read straight from the JSON file litellm ships (importing
litellm takes seconds and may reach for the network; reading its data file does neither), and from
per-workspace overrides, which win. A span that reports its own cost keeps it.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from functools import cache
from pathlib import Path
from typing import Any

_PRICE_FILE = "model_prices_and_context_window_backup.json"
_MILLION = Decimal(1_000_000)


@dataclass(frozen=True, slots=True)
class ModelPrice:
    """USD per token."""

    input: Decimal
    output: Decimal
    cache_read: Decimal | None = None

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
        cache_read = entry.get("cache_read_input_token_cost")
        prices[model] = ModelPrice(
            input=Decimal(str(input_cost)),
            output=Decimal(str(output_cost)),
            cache_read=Decimal(str(cache_read)) if isinstance(cache_read, (int, float)) else None,
        )
    return prices


def _candidates(model: str) -> tuple[str, ...]:
    return (model, model.split("/", 1)[1]) if "/" in model else (model,)


@cache
def _litellm_price(model: str) -> ModelPrice | None:
    # Asked once per model name and process: every generation span of a batch asks again.
    prices = litellm_prices()
    return next((prices[name] for name in _candidates(model) if name in prices), None)


def price_find(model: str, overrides: Mapping[str, ModelPrice] | None = None) -> ModelPrice | None:
    """The price of `model`: an override, else litellm's; `openai/gpt-4o` also finds `gpt-4o`."""
    if overrides:
        for name in _candidates(model):
            if name in overrides:
                return overrides[name]
    return _litellm_price(model)


def generation_cost(
    model: str | None,
    input_tokens: int | None,
    output_tokens: int | None,
    cache_read_tokens: int | None = None,
    overrides: Mapping[str, ModelPrice] | None = None,
) -> Decimal | None:
    """USD for one call; None when the model has no known price or no tokens were reported."""
    if not model or (input_tokens is None and output_tokens is None):
        return None
    price = price_find(model, overrides)
    if price is None:
        return None
    cached = max(0, min(cache_read_tokens or 0, input_tokens or 0)) if price.cache_read is not None else 0
    fresh_input = (input_tokens or 0) - cached
    cost = price.input * fresh_input + price.output * (output_tokens or 0)
    if cached and price.cache_read is not None:
        cost += price.cache_read * cached
    return cost.quantize(Decimal("0.00000001"))
