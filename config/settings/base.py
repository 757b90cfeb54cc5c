"""Settings shared by every environment. Everything comes from environment variables
(see `.env.example`); local.py, test.py and production.py only override."""

from __future__ import annotations

import os
from pathlib import Path

import django_stubs_ext

from config.settings.components.celery import *
from config.settings.components.database import *
from config.settings.components.security import *
from config.settings.components.tracing import *
from config.settings.env import env_bool, env_int, env_list, env_str

BASE_DIR = Path(__file__).resolve().parents[2]

# Lets typed generics such as admin.ModelAdmin[Agent] run (django-stubs' runtime companion).
django_stubs_ext.monkeypatch()

# litellm fetches its price map from GitHub at import unless told to use the copy it ships.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
VAR_DIR = BASE_DIR / "var"

SECRET_KEY = env_str("DJANGO_SECRET_KEY", "keel-local-development-only-not-a-secret")
# Fernet key(s) for secrets stored in the database (config/crypto.py); empty: derived from SECRET_KEY.
KEEL_ENCRYPTION_KEY = env_str("KEEL_ENCRYPTION_KEY")
DEBUG = env_bool("DJANGO_DEBUG", False)
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS")

# The URL people open; printed by `make run` and used in links Keel sends (alerts, emails).
KEEL_PUBLIC_URL = env_str("KEEL_PUBLIC_URL", "http://127.0.0.1:8000")
KEEL_VERSION = "0.1.0"

# Model targets the operator declares (routing/services.py: model_targets_sync_from_env): a JSON list of
# {"alias", "model", "api_base"?, "api_key"?, "tier"?, "timeout_seconds"?, "max_retries"?, "fallbacks"?},
# put in every workspace by `manage.py modeltargets_sync`, read-only in the API and dashboard.
KEEL_MODEL_TARGETS = env_str("KEEL_MODEL_TARGETS")
# The demo's fake model provider (routing/demo_provider.py) serves targets named `keel-demo/...`, so the
# demo gateway answers with no model server; off in production.
KEEL_DEMO_PROVIDER = env_bool("KEEL_DEMO_PROVIDER", True)
# Targets on an OpenAI-compatible server (`openai/<model>` with an `api_base`) are called with Keel's own HTTP
# client instead of litellm (routing/openai_compatible.py); off, litellm calls them like every other target.
KEEL_OPENAI_COMPATIBLE_DIRECT = env_bool("KEEL_OPENAI_COMPATIBLE_DIRECT", True)
# The gateway's record of each request (routing decision, spans, cache entry, shadow run) is written by a
# thread after the answer has gone out (config/write_behind.py); off, the answer waits for it.
KEEL_GATEWAY_RECORD_BEHIND = env_bool("KEEL_GATEWAY_RECORD_BEHIND", True)
KEEL_WRITE_BEHIND_QUEUE_SIZE = env_int("KEEL_WRITE_BEHIND_QUEUE_SIZE", 1000)
KEEL_WRITE_BEHIND_EXIT_SECONDS = env_int("KEEL_WRITE_BEHIND_EXIT_SECONDS", 8)
KEEL_WRITE_BEHIND_HOLD_MS = env_int("KEEL_WRITE_BEHIND_HOLD_MS", 50)
# API keys, agents, guardrail policies, budgets and model targets as the gateway reads them on every
# request, kept per process and emptied by PostgreSQL's LISTEN/NOTIFY when they change (config/config_cache.py).
KEEL_CONFIG_CACHE = env_bool("KEEL_CONFIG_CACHE", True)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "ninja",  # serves the interactive API docs from its own static files, not a CDN
    "django_htmx",
    "django_celery_beat",
    "agent_registry",
    "tracing",
    "routing",
    "guardrails",
    "evals",
    "trainer_bridge",
    "frontend",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "config.middleware.SecurityHeadersMiddleware",
    # Before anything reads the URL or the body (and inside the security headers, which their refusals
    # carry too): a NUL in the URL is a 400, not a database error, and a chunked body without a
    # Content-Length a 411, not a body read as empty.
    "config.request_guard.UrlNulRefusalMiddleware",
    "config.request_guard.ChunkedBodyRefusalMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "agent_registry.middleware.AuditContextMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

# Response headers, in every environment so that the tests and the browser tests run under them
# (production.py adds HSTS, HTTPS redirects and secure cookies). Scripts and stylesheets come only from
# Keel's own static files: no inline script, no eval, no plugins, no framing; inline style attributes
# are allowed (the templates size bars with them), inline <style> elements are not.
KEEL_CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "style-src-attr 'unsafe-inline'",
        "img-src 'self' data:",
        "font-src 'self'",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)
KEEL_PERMISSIONS_POLICY = "camera=(), microphone=(), geolocation=(), payment=(), usb=()"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "frontend.context_processors.navigation",
            ],
        },
    },
]

AUTH_USER_MODEL = "agent_registry.User"
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "frontend:login"
LOGIN_REDIRECT_URL = "frontend:home"
LOGOUT_REDIRECT_URL = "frontend:login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = VAR_DIR / "static"
# Front-end libraries installed with npm (frontend/package.json), served from their dist folders: no CDN.
STATICFILES_DIRS = [
    BASE_DIR / "frontend" / "node_modules" / "htmx.org" / "dist",
    ("uplot", BASE_DIR / "frontend" / "node_modules" / "uplot" / "dist"),
]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
MEDIA_ROOT = Path(env_str("KEEL_MEDIA_ROOT", str(VAR_DIR / "media")))

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Largest request body Keel reads (OTLP batches are the big ones); larger gets 413.
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("KEEL_MAX_BODY_BYTES", 16 * 1024 * 1024)

# Alert emails (tracing.alerts). The console backend prints them; set an SMTP backend and its
# EMAIL_HOST/EMAIL_PORT/... variables to send real mail. Tests use Django's in-memory backend.
EMAIL_BACKEND = env_str("KEEL_EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
DEFAULT_FROM_EMAIL = env_str("KEEL_FROM_EMAIL", "Keel <keel@localhost>")

# API keys record their last use at most this often, so a busy key costs one write a minute.
API_KEY_LAST_USED_RESOLUTION_SECONDS = 60

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("KEEL_LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        "LiteLLM": {"level": "WARNING"},
        "httpx": {"level": "WARNING"},
        "pgserver": {"level": "WARNING"},
    },
}
