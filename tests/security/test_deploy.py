"""Production settings: `manage.py check --deploy` has nothing to say with a realistic environment, and a
real response carries the security headers and cookie flags.

Production settings refuse the embedded database, so they run in a subprocess with a DATABASE_URL that
names a socket nobody listens on: nothing here may touch the database (or the network), and nothing does.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

BASE_DIR = Path(__file__).resolve().parents[2]
HOST = "keel.example.com"

# In a fresh interpreter with the production settings: the deploy checks, then requests to the sign-in
# page (it needs no database) over plain HTTP, over HTTPS, and over HTTP forwarded by a TLS proxy.
PROBE = """
import io, json, django
from django.core.management import call_command
from django.core.management.base import SystemCheckError
django.setup()
from django.test import Client

out = io.StringIO()
try:
    call_command("check", deploy=True, fail_level="WARNING", stdout=out, stderr=out)
    check = {"ok": True, "output": out.getvalue()}
except SystemCheckError as error:
    check = {"ok": False, "output": out.getvalue() + str(error)}

def answer(**extra):
    response = Client().get("/login/", HTTP_HOST="__HOST__", **extra)
    return {
        "status": response.status_code,
        "location": response.get("Location", ""),
        "headers": dict(response.headers),
        "cookies": {name: dict(morsel, value=morsel.value) for name, morsel in response.cookies.items()},
    }

from django.conf import settings
names = ["SESSION_COOKIE_SECURE", "SESSION_COOKIE_HTTPONLY", "SESSION_COOKIE_SAMESITE", "CSRF_COOKIE_SECURE",
         "CSRF_COOKIE_HTTPONLY", "SECURE_SSL_REDIRECT", "SECURE_PROXY_SSL_HEADER", "DEBUG"]
from django.test import override_settings
result = {
    "settings": {name: getattr(settings, name) for name in names},
    "check": check,
    "http": answer(),
    "https": answer(secure=True),
    "proxied": answer(HTTP_X_FORWARDED_PROTO="https"),
}
# What the check is for: HSTS switched off is reported.
with override_settings(SECURE_HSTS_SECONDS=0):
    try:
        call_command("check", deploy=True, fail_level="WARNING", stdout=io.StringIO(), stderr=io.StringIO())
        result["check_without_hsts"] = "no issues"
    except SystemCheckError as error:
        result["check_without_hsts"] = str(error)
# Keel terminating TLS itself (DJANGO_SECURE_PROXY_SSL_HEADER empty): a client's header is not trusted.
with override_settings(SECURE_PROXY_SSL_HEADER=None):
    result["proxied_without_proxy"] = answer(HTTP_X_FORWARDED_PROTO="https")
print(json.dumps(result))
""".replace("__HOST__", HOST)


def _environment(**overrides: str) -> dict[str, str]:
    inherited = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("DJANGO_", "DATABASE_", "CELERY_", "KEEL_"))
    }
    return {
        **inherited,
        "DJANGO_SETTINGS_MODULE": "config.settings.production",
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
        "DJANGO_ALLOWED_HOSTS": HOST,
        "DJANGO_CSRF_TRUSTED_ORIGINS": f"https://{HOST}",
        # A unix socket (a path) that does not exist: a connection attempt would fail at once, locally.
        "DATABASE_URL": "postgres://keel@%2Fnonexistent%2Fkeel-socket/keel",
        "CELERY_BROKER_URL": "redis://cache.internal:6379/0",
        "KEEL_PUBLIC_URL": f"https://{HOST}",
        **overrides,
    }


@pytest.fixture(scope="module")
def production() -> dict[str, Any]:
    process = subprocess.Popen(
        [sys.executable, "-c", PROBE],
        cwd=BASE_DIR,
        env=_environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=180)
    finally:
        process.kill()  # a no-op once it has ended; a probe that hangs does not outlive the test
        process.wait()
    assert process.returncode == 0, stderr
    result: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    return result


def test_check_deploy_is_clean_with_the_production_settings(production):
    assert production["check"] == {"ok": True, "output": "System check identified no issues (0 silenced).\n"}


def test_check_deploy_reports_what_is_missing(production):
    assert "security.W004" in production["check_without_hsts"]


def test_plain_http_is_sent_to_https(production):
    http = production["http"]

    assert (http["status"], http["location"]) == (301, f"https://{HOST}/login/")


@pytest.mark.parametrize("way", ["https", "proxied"])
def test_an_https_response_carries_the_security_headers(production, way):
    answer = production[way]
    headers = answer["headers"]

    assert answer["status"] == 200
    assert headers["Strict-Transport-Security"] == "max-age=31536000; includeSubDomains; preload"
    assert headers["X-Frame-Options"] == "DENY"
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Referrer-Policy"] == "same-origin"
    assert headers["Cross-Origin-Opener-Policy"] == "same-origin"
    policy = dict(part.strip().split(" ", 1) for part in headers["Content-Security-Policy"].split(";"))
    assert policy["script-src"] == "'self'"
    assert policy["style-src"] == "'self'"
    assert policy["object-src"] == "'none'"
    assert policy["frame-ancestors"] == "'none'"
    assert policy["base-uri"] == "'none'"
    assert "camera=()" in headers["Permissions-Policy"]
    csrf = answer["cookies"]["csrftoken"]
    assert (csrf["secure"], csrf["httponly"], csrf["samesite"]) == (True, True, "Lax")


def test_without_a_proxy_a_forwarded_proto_header_is_not_trusted(production):
    proxied = production["proxied_without_proxy"]

    assert (proxied["status"], proxied["location"]) == (301, f"https://{HOST}/login/")


def test_cookies_are_secure_and_the_session_is_out_of_scripts_reach(production):
    # Signing in needs the database, so the session cookie's flags are read from the settings.
    assert production["settings"] == {
        "SESSION_COOKIE_SECURE": True,
        "SESSION_COOKIE_HTTPONLY": True,
        "SESSION_COOKIE_SAMESITE": "Lax",
        "CSRF_COOKIE_SECURE": True,
        "CSRF_COOKIE_HTTPONLY": True,
        "SECURE_SSL_REDIRECT": True,
        "SECURE_PROXY_SSL_HEADER": ["HTTP_X_FORWARDED_PROTO", "https"],
        "DEBUG": False,
    }


@pytest.mark.parametrize(("variable", "header"), [("", None), ("X-Forwarded-Ssl-Proto", "HTTP_X_FORWARDED_SSL_PROTO")])
def test_the_proxy_header_is_read_from_the_environment(variable, header):
    # Only the settings module: no Django set-up, so it takes a moment, not seconds.
    result = subprocess.run(
        [sys.executable, "-c", "import config.settings.production as p; print(p.SECURE_PROXY_SSL_HEADER)"],
        cwd=BASE_DIR,
        env=_environment(DJANGO_SECURE_PROXY_SSL_HEADER=variable),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (str((header, "https")) if header else "None")


@pytest.mark.django_db
def test_dashboard_pages_carry_the_policy_in_every_environment(client: Client):
    response = client.get("/login/")

    assert response.status_code == 200
    assert "script-src 'self'" in response["Content-Security-Policy"]
    assert response["X-Frame-Options"] == "DENY"
    assert response["Cross-Origin-Opener-Policy"] == "same-origin"
