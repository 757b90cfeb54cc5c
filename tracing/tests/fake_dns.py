"""A resolver without DNS for the tests (`KEEL_OUTBOUND_RESOLVER` in config/settings/test.py): it knows
only the names a test gives it through the `fake_dns` fixture, and counts what it was asked."""

from __future__ import annotations

import socket

HOSTS: dict[str, list[str]] = {}
ASKED: list[str] = []


def resolve(host: str) -> list[str]:
    ASKED.append(host)
    try:
        return list(HOSTS[host])
    except KeyError:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known (fake DNS)") from None
