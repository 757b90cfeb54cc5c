"""The template filters that format figures."""

from __future__ import annotations

import pytest

from frontend.templatetags.keel import usd


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (None, "—"),
        ("0.00000000", "$0"),
        (0.00002, "$0.00002"),  # a small model call: not $0.0000
        ("0.00002150", "$0.000022"),
        (0.0004, "$0.0004"),
        (0.009, "$0.0090"),
        (0.0012345, "$0.0012"),
        (0.021, "$0.021"),
        (1234.5, "$1,234.50"),
        ("0.00345", "$0.0035"),  # half up, not to even
        ("0.00115", "$0.0012"),
        ("0.0125", "$0.013"),
        ("2.345", "$2.35"),
        ("1E-9", "$0.000000001"),
    ],
)
def test_usd_keeps_what_small_costs_need(value: object, shown: str) -> None:
    assert usd(value) == shown
