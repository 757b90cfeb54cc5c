"""Waits for the config cache's notifications (config/config_cache.py), for tests that switch it on with the
`config_listener` fixture (conftest.py). Such tests must commit (`django_db(transaction=True)`): the
triggers notify at commit."""

from __future__ import annotations

import time
from collections.abc import Callable

from config import config_cache


def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def settled(listener: config_cache.Listener) -> None:
    """Wait until the notifications of what the test set up have arrived (none for 0.2 s)."""
    last, since = listener.notifications, time.monotonic()
    while time.monotonic() - since < 0.2:
        time.sleep(0.01)
        if listener.notifications != last:
            last, since = listener.notifications, time.monotonic()
