"""A small per-process cache whose entries expire after a fixed time: what the gateway reads on every
request and that rarely changes. No Django imports; each caller decides what a stale entry may cost and
checks what it must (routing/selectors.py checks a fingerprint read with the agent; config/config_cache.py
keeps entries without a time limit, each under the generation of its listener)."""

from __future__ import annotations

import copy
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
M = TypeVar("M")


class TtlCache(Generic[K, V]):
    """At most `size` entries, each kept `seconds` after it was put; the least recently used goes first
    when full. Safe to share between a process's threads."""

    def __init__(self, *, seconds: float, size: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self.size = size
        self.clock = clock
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        """The live value for `key`, or None (so None itself is not worth caching)."""
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                return None
            expires, value = found
            if expires <= self.clock():
                del self._entries[key]
                return None
            self._entries.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._entries[key] = (self.clock() + self.seconds, value)
            self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)

    def discard(self, key: K) -> None:
        with self._lock:
            self._entries.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


def instance_copy(instance: M) -> M:
    """A copy of a cached Django model instance that one request may change: the instance, the related
    instances it loaded with it (select_related), and its list and dict values (JSON fields) are copied;
    the rest (numbers, text, times) is shared, as nothing changes it in place. A fifth of copy.deepcopy's
    time for a router configuration with its targets: deepcopy goes through pickling's machinery for
    every object of the tree, Django's state included."""
    if instance is None:
        return instance
    values: dict[str, Any] = dict(vars(instance))
    for name, value in values.items():
        if isinstance(value, list | dict):
            values[name] = copy.deepcopy(value)
    state = copy.copy(values["_state"])
    state.fields_cache = {name: instance_copy(related) for name, related in state.fields_cache.items()}
    values["_state"] = state
    clone = object.__new__(type(instance))
    vars(clone).update(values)
    return clone
