"""Scrubbing secrets out of text that Keel stores, logs or sends back: an error a provider, a tool endpoint
or Langfuse answered with, which may quote the credentials it was sent (careless services echo the
Authorization header, some providers the key itself).

`redact(text, *secrets)` replaces each known secret (and its Basic-auth and JSON-escaped forms) with
"[redacted]", and any credential after `Bearer` or `Basic`, known or not. No Django imports: pure text.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable
from typing import Any

REDACTED = "[redacted]"
# Shorter values are not worth hiding and would blank out ordinary words.
_MIN_SECRET_LENGTH = 6
_CREDENTIAL = re.compile(r"(?i)\b(bearer|basic)(\s+|%20|\+)([A-Za-z0-9._~+/=:-]{8,})")


def _forms(secrets: Iterable[str]) -> list[str]:
    forms: list[str] = []
    for secret in secrets:
        if len(secret) < _MIN_SECRET_LENGTH:
            continue
        forms.append(secret)
        escaped = json.dumps(secret)[1:-1]
        if escaped != secret:
            forms.append(escaped)
    # The longest first, so that a secret inside another is not replaced half.
    return sorted(set(forms), key=len, reverse=True)


def basic_credential(username: str, password: str) -> str:
    """What `Authorization: Basic ...` carries for these: base64 of `username:password`."""
    return base64.b64encode(f"{username}:{password}".encode()).decode()


def redact(text: str, *secrets: str) -> str:
    for form in _forms(secrets):
        text = text.replace(form, REDACTED)
    return _CREDENTIAL.sub(lambda found: f"{found.group(1)}{found.group(2)}{REDACTED}", text)


def redact_value(value: Any, *secrets: str) -> Any:
    """`redact` applied to every string in a JSON-like value (keys included), the structure kept."""
    if isinstance(value, str):
        return redact(value, *secrets)
    if isinstance(value, dict):
        return {redact_value(key, *secrets): redact_value(item, *secrets) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [redact_value(item, *secrets) for item in value]
    return value
