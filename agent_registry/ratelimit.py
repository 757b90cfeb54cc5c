"""Rate limits: per API key and scope, on failed key authentication per client address, and on failed
sign-ins per address and username.

Every limit is a token bucket: `burst` tokens, refilled at `rate` per second; a request (or a failure)
takes one, and none left means 429 with Retry-After (the seconds until one is back). Buckets live in
PostgreSQL (`RateLimitBucket`, an UNLOGGED table), shared by every Keel process: one UPSERT refills,
takes and answers. Keel has no shared cache it could use instead (it runs with no Redis), and Django's
default cache is per process.

The hot scopes are the exception: KEEL_RATE_LIMIT_PROCESS_SCOPES (`ingest` and `gateway` by default)
keep their buckets in each process's memory, because the UPSERT costs more than the gateway's overhead
budget allows per request (bench/bench_rate_limit.py measures both). Such a limit is per process: with N
web processes a key may reach N times its rate. Failed authentications and sign-ins always count in the
database; they are rare for a legitimate client and must hold across processes.

The clock is `clock` (seconds), which tests replace to move time without sleeping.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings
from django.db import connection

from agent_registry.models import ApiKey, RateLimitBucket
from config.errors import Throttled

clock: Callable[[], float] = time.time

_TABLE = RateLimitBucket._meta.db_table
_LEVEL = "LEAST(%(burst)s, b.tokens + GREATEST(%(now)s - b.stamp, 0) * %(rate)s)"
_TAKE = f"""
INSERT INTO {_TABLE} AS b (key, tokens, stamp, allowed) VALUES (%(key)s, %(burst)s - 1, %(now)s, true)
ON CONFLICT (key) DO UPDATE SET
    tokens = CASE WHEN {_LEVEL} >= 1 THEN {_LEVEL} - 1 ELSE {_LEVEL} END,
    stamp = GREATEST(b.stamp, %(now)s),
    allowed = {_LEVEL} >= 1
RETURNING tokens, allowed
"""
_PEEK = f"SELECT {_LEVEL} FROM {_TABLE} AS b WHERE b.key = %(key)s"


class RateLimited(Throttled):
    code = "rate_limited"


@dataclass(frozen=True)
class Limit:
    """`burst` tokens, refilled at `rate` per second."""

    rate: float
    burst: float

    @classmethod
    def per_window(cls, count: int, seconds: int) -> Limit:
        """`count` in any `seconds`, refilled evenly (a full bucket again `seconds` after the last one)."""
        return cls(rate=count / seconds, burst=float(count))

    def retry_after(self, tokens: float) -> int:
        return max(1, math.ceil((1 - tokens) / self.rate))

    @property
    def refill_seconds(self) -> float:
        return self.burst / self.rate


@dataclass(frozen=True)
class Decision:
    allowed: bool
    retry_after: int = 0


# --- Buckets ----------------------------------------------------------------------------------------------


def _db_take(key: str, limit: Limit, now: float) -> Decision:
    with connection.cursor() as cursor:
        cursor.execute(_TAKE, {"key": key, "rate": limit.rate, "burst": limit.burst, "now": now})
        tokens, allowed = cursor.fetchone()
    return Decision(True) if allowed else Decision(False, limit.retry_after(tokens))


def _db_peek(key: str, limit: Limit, now: float) -> Decision:
    with connection.cursor() as cursor:
        cursor.execute(_PEEK, {"key": key, "rate": limit.rate, "burst": limit.burst, "now": now})
        row = cursor.fetchone()
    if row is None or row[0] >= 1:
        return Decision(True)
    return Decision(False, limit.retry_after(row[0]))


class ProcessBuckets:
    """Token buckets in this process's memory, for the hot scopes. Full buckets are dropped when the table
    grows past `max_keys`, so a process serving many keys keeps only the busy ones."""

    def __init__(self, max_keys: int = 10_000) -> None:
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()
        self.max_keys = max_keys

    def take(self, key: str, limit: Limit, now: float) -> Decision:
        with self._lock:
            tokens, stamp = self._buckets.get(key, (limit.burst, now))
            level = min(limit.burst, tokens + max(now - stamp, 0.0) * limit.rate)
            if level >= 1:
                self._store(key, level - 1, max(stamp, now), limit, now)
                return Decision(True)
            self._store(key, level, max(stamp, now), limit, now)
            return Decision(False, limit.retry_after(level))

    def _store(self, key: str, tokens: float, stamp: float, limit: Limit, now: float) -> None:
        if key not in self._buckets and len(self._buckets) >= self.max_keys:
            # Drop the buckets that are full again: forgetting them changes nothing.
            horizon = now - limit.refill_seconds
            self._buckets = {k: v for k, v in self._buckets.items() if v[1] >= horizon}
        self._buckets[key] = (tokens, stamp)

    def clear(self) -> None:
        with self._lock:
            self._buckets.clear()


process_buckets = ProcessBuckets()
# Client addresses this process saw go over the failed-authentication limit, with the time they may try
# again: they are refused before their key is even looked at, with no query.
_blocked_until: dict[str, float] = {}
_blocked_lock = threading.Lock()


def reset() -> None:
    """Forget this process's buckets and blocks (tests)."""
    process_buckets.clear()
    with _blocked_lock:
        _blocked_until.clear()


# --- Limits -----------------------------------------------------------------------------------------------


def _enabled() -> bool:
    return bool(settings.KEEL_RATE_LIMIT_ENABLED)


def scope_limit(scope: str) -> Limit:
    rate, burst = settings.KEEL_RATE_LIMITS[scope]
    return Limit(rate=float(rate), burst=float(burst))


def _refuse(decision: Decision, detail: str) -> RateLimited:
    return RateLimited(detail, retry_after=decision.retry_after)


def apikey_check(*, api_key: ApiKey, scope: str) -> None:
    """Take one request from the key's budget for `scope`; RateLimited when it is spent."""
    if not _enabled():
        return
    limit = scope_limit(scope)
    key = f"key:{api_key.pk}:{scope}"
    now = clock()
    if scope in settings.KEEL_RATE_LIMIT_PROCESS_SCOPES:
        decision = process_buckets.take(key, limit, now)
    else:
        decision = _db_take(key, limit, now)
    if not decision.allowed:
        raise _refuse(
            decision,
            f"this API key is over its {scope} rate limit ({limit.rate:g} requests per second, bursts of "
            f"{limit.burst:g}); retry in {decision.retry_after} s",
        )


def auth_failure_limit() -> Limit:
    return Limit.per_window(settings.KEEL_RATE_LIMIT_AUTH_FAILURES, settings.KEEL_RATE_LIMIT_AUTH_WINDOW_SECONDS)


def _auth_refusal(retry_after: int) -> RateLimited:
    return RateLimited(
        f"too many requests with an invalid API key from this address; retry in {retry_after} s",
        retry_after=retry_after,
    )


def auth_blocked_check(*, ip: str | None) -> None:
    """Refuse an address this process has seen go over the failed-authentication limit, before its key is
    checked (so a right guess during the block teaches nothing). Costs no query."""
    if not _enabled() or ip is None:
        return
    with _blocked_lock:
        until = _blocked_until.get(ip)
    if until is None:
        return
    now = clock()
    if until > now:
        raise _auth_refusal(max(1, math.ceil(until - now)))
    with _blocked_lock:
        _blocked_until.pop(ip, None)


def auth_failure_record(*, ip: str | None) -> None:
    """Count a request whose key was unknown, revoked or expired; RateLimited once the address is over."""
    if not _enabled() or ip is None:
        return
    now = clock()
    decision = _db_take(f"auth:{ip}", auth_failure_limit(), now)
    if not decision.allowed:
        with _blocked_lock:
            _blocked_until[ip] = now + decision.retry_after
        raise _auth_refusal(decision.retry_after)


def login_limit() -> Limit:
    return Limit.per_window(settings.KEEL_RATE_LIMIT_LOGIN_FAILURES, settings.KEEL_RATE_LIMIT_LOGIN_WINDOW_SECONDS)


def _login_key(ip: str | None, username: str) -> str:
    # Usernames compare case-insensitively here, so changing case does not buy more attempts.
    return f"login:{ip or '-'}:{username.strip().lower()[:150]}"


def login_check(*, ip: str | None, username: str) -> Decision:
    """Whether a sign-in for `username` from `ip` may be tried now (failures left in its budget)."""
    if not _enabled():
        return Decision(True)
    return _db_peek(_login_key(ip, username), login_limit(), clock())


def login_failure_record(*, ip: str | None, username: str) -> Decision:
    """Count a failed sign-in; the decision says whether another may follow at once."""
    if not _enabled():
        return Decision(True)
    return _db_take(_login_key(ip, username), login_limit(), clock())


def buckets_sweep() -> int:
    """Delete the buckets that are full again (forgetting them changes nothing); returns how many."""
    limits = [scope_limit(scope) for scope in settings.KEEL_RATE_LIMITS] + [auth_failure_limit(), login_limit()]
    horizon = clock() - max(limit.refill_seconds for limit in limits) - 60
    deleted, _ = RateLimitBucket.objects.filter(stamp__lt=horizon).delete()
    return deleted
