"""Tests: the real PostgreSQL (embedded pgvector server unless DATABASE_URL), fast hashing, no network."""

from config.settings.base import *
from config.settings.env import env_str

DEBUG = False
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}

# Several test runs may share one embedded server (helpers, CI); each names its own database.
DATABASES["default"]["TEST"] = {"NAME": env_str("KEEL_TEST_DATABASE_NAME", "test_keel")}
ALLOWED_HOSTS = ["testserver", "localhost", "127.0.0.1"]
# Static files come from the finders in tests (live_server serves them); no collectstatic needed.
MIDDLEWARE = [entry for entry in MIDDLEWARE if entry != "whitenoise.middleware.WhiteNoiseMiddleware"]
# live_server threads serve keep-alive clients (Langfuse SDK, Chromium); a persistent connection per
# thread would outlive the test and block the test database's teardown.
DATABASES["default"]["CONN_MAX_AGE"] = 0
# Alert emails land in django.core.mail.outbox.
EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
# No DNS at test time: outbound hosts (alert webhooks, the Langfuse mirror) resolve through a fake that knows
# only the names a test gives it (tracing/tests/fake_dns.py). Private addresses stay refused: a test that
# delivers to 127.0.0.1 permits it itself (KEEL_OUTBOUND_ALLOW_PRIVATE).
KEEL_OUTBOUND_RESOLVER = "tracing.tests.fake_dns.resolve"
# Rate limits are off in tests; tests/security/test_rate_limits.py switches them on.
KEEL_RATE_LIMIT_ENABLED = False
# Each test runs in a transaction that the write-behind thread's own connection cannot see, so the gateway
# writes its record before answering here. The thread is tested by itself and behind real servers
# (config/tests/test_write_behind.py, tests/faults, tests/load).
KEEL_GATEWAY_RECORD_BEHIND = False
# The listener's connection would hold each test database open. The `config_listener` fixture switches the
# cache on for one test (config/tests/test_config_cache.py, routing/tests/test_gateway_config_cache.py); the
# servers that tests/load and tests/faults start run with it on, as `make run` does.
KEEL_CONFIG_CACHE = False
