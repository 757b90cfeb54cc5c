"""docs/triage.md documents the defaults the code runs with: if a weight or a phrase changes, so must the page."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tracing import signals, triage_config

DOC = (Path(__file__).resolve().parents[3] / "docs" / "triage.md").read_text()


def test_every_default_weight_is_documented():
    for name, weight in signals.DEFAULT_WEIGHTS.items():
        assert f"| `{name}` | {signals.SIGNAL_CATEGORIES[name]} | {weight:g} |" in DOC


def test_every_default_english_phrase_is_documented():
    for field in dataclasses.fields(signals.ENGLISH_PHRASES):
        assert f"#### `{field.name}`" in DOC
        for phrase in getattr(signals.ENGLISH_PHRASES, field.name):
            if field.name == "human_request" and " " in phrase and not phrase.endswith("please"):
                continue  # documented as verbs x targets
            assert f"`{phrase}`" in DOC, (field.name, phrase)


def test_every_adjustable_threshold_is_documented():
    defaults = signals.Thresholds()
    for name in triage_config.EXPOSED_THRESHOLDS:
        assert f"| `{name}` | {getattr(defaults, name):g} |" in DOC
