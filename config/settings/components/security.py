"""Rate limits (agent_registry/ratelimit.py) and the client address behind reverse proxies."""

from django.core.exceptions import ImproperlyConfigured

from config.settings.env import env_bool, env_int, env_list

# Reverse proxies in front of Keel that append the client's address to X-Forwarded-For; 0 reads the
# peer's address. Rate limits per address and the audit log use it.
KEEL_TRUSTED_PROXY_HOPS = env_int("KEEL_TRUSTED_PROXY_HOPS", 0)

KEEL_RATE_LIMIT_ENABLED = env_bool("KEEL_RATE_LIMIT_ENABLED", True)

# Per API key and scope: (requests per second, burst). Generous: ingest and the gateway carry production
# traffic. KEEL_RATE_LIMIT_<SCOPE>_PER_SECOND and KEEL_RATE_LIMIT_<SCOPE>_BURST override each one.
_SCOPE_DEFAULTS = {
    "ingest": (1000, 2000),
    "gateway": (500, 1000),
    "read": (100, 200),
    "write": (50, 100),
    "train": (50, 100),
}
KEEL_RATE_LIMITS: dict[str, tuple[int, int]] = {}
for _scope, (_rate, _burst) in _SCOPE_DEFAULTS.items():
    _name = f"KEEL_RATE_LIMIT_{_scope.upper()}"
    KEEL_RATE_LIMITS[_scope] = (env_int(f"{_name}_PER_SECOND", _rate), env_int(f"{_name}_BURST", _burst))
    if KEEL_RATE_LIMITS[_scope][0] < 1 or KEEL_RATE_LIMITS[_scope][1] < 1:
        raise ImproperlyConfigured(f"{_name}_PER_SECOND and {_name}_BURST must be at least 1")
# Scopes whose buckets are kept in each process rather than in PostgreSQL (a limit per process): the hot
# paths, where a query per request costs more than the gateway's overhead budget.
KEEL_RATE_LIMIT_PROCESS_SCOPES = env_list("KEEL_RATE_LIMIT_PROCESS_SCOPES", ["ingest", "gateway"])

# Requests with an unknown, revoked or expired key, per client address: this many per window, then 429.
KEEL_RATE_LIMIT_AUTH_FAILURES = env_int("KEEL_RATE_LIMIT_AUTH_FAILURES", 30)
KEEL_RATE_LIMIT_AUTH_WINDOW_SECONDS = env_int("KEEL_RATE_LIMIT_AUTH_WINDOW_SECONDS", 60)
# Failed dashboard sign-ins, per client address and username; successful ones do not count.
KEEL_RATE_LIMIT_LOGIN_FAILURES = env_int("KEEL_RATE_LIMIT_LOGIN_FAILURES", 10)
KEEL_RATE_LIMIT_LOGIN_WINDOW_SECONDS = env_int("KEEL_RATE_LIMIT_LOGIN_WINDOW_SECONDS", 300)
for _name in ("AUTH_FAILURES", "AUTH_WINDOW_SECONDS", "LOGIN_FAILURES", "LOGIN_WINDOW_SECONDS"):
    if globals()[f"KEEL_RATE_LIMIT_{_name}"] < 1:
        raise ImproperlyConfigured(f"KEEL_RATE_LIMIT_{_name} must be at least 1")
