"""Production: refuses to start without a secret key and a real database server; HTTPS only."""

from django.core.exceptions import ImproperlyConfigured

from config.settings.base import *
from config.settings.components.database import DATABASE_EMBEDDED
from config.settings.env import env_bool, env_int, env_str

DEBUG = False
KEEL_DEMO_PROVIDER = env_bool("KEEL_DEMO_PROVIDER", False)

SECRET_KEY = env_str("DJANGO_SECRET_KEY")
if len(SECRET_KEY) < 32:
    raise ImproperlyConfigured("DJANGO_SECRET_KEY must be set to a random string of at least 32 characters.")
if DATABASE_EMBEDDED:
    raise ImproperlyConfigured(
        "DATABASE_URL must point at a PostgreSQL server with pgvector; the embedded database is for development."
    )

# Behind a proxy that terminates TLS, the header it sets to "https" (and overwrites when a client sends
# it) tells Django the request was secure; empty when Keel terminates TLS itself, since a client could
# then claim HTTPS by sending the header.
_proxy_ssl_header = env_str("DJANGO_SECURE_PROXY_SSL_HEADER", "X-Forwarded-Proto").strip()
SECURE_PROXY_SSL_HEADER = (
    ("HTTP_" + _proxy_ssl_header.upper().replace("-", "_"), "https") if _proxy_ssl_header else None
)
SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", True)
SECURE_HSTS_SECONDS = env_int("DJANGO_SECURE_HSTS_SECONDS", 60 * 60 * 24 * 365)
SECURE_HSTS_INCLUDE_SUBDOMAINS = True
SECURE_HSTS_PRELOAD = True
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
# No script reads the CSRF cookie: forms carry the token, htmx sends the one the page was rendered with.
CSRF_COOKIE_HTTPONLY = True
