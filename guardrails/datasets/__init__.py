"""Labelled sets for the guardrail checks (JSONL, one item a line), and their loader.

The sets are written by `guardrails/datasets/build.py` (templates with many fillers plus handwritten
items, seeded, so a rebuild gives the same files); see README.md in this folder. Pure: no Django.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DATASETS_DIR = Path(__file__).resolve().parent
SET_NAMES = ("direct_injection", "indirect_injection", "leakage", "pii")


def dataset_load(name: str) -> list[dict[str, Any]]:
    """The items of one set, in file order."""
    if name not in SET_NAMES:
        raise ValueError(f"unknown guardrail dataset {name!r}; have {', '.join(SET_NAMES)}")
    path = DATASETS_DIR / f"{name}.jsonl"
    with path.open(encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]
