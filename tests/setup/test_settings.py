"""Settings read from the environment: production's refusals, DATABASE_URL, the broker choice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BASE_DIR = Path(__file__).resolve().parents[2]
PRINT = (
    "import json, django; from django.conf import settings; django.setup(); "
    "print(json.dumps({'db': settings.DATABASES['default'], 'broker': settings.CELERY_BROKER_URL}, default=str))"
)


def _settings(module: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {key: value for key, value in os.environ.items() if not key.startswith(("DJANGO_", "DATABASE_", "CELERY_"))}
    return subprocess.run(
        [sys.executable, "-c", PRINT],
        cwd=BASE_DIR,
        env={**clean, "DJANGO_SETTINGS_MODULE": module, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_production_refuses_to_start_without_a_secret_key():
    result = _settings("config.settings.production", DATABASE_URL="postgres://keel@db.internal:5432/keel")

    assert result.returncode != 0
    assert "DJANGO_SECRET_KEY must be set" in result.stderr


def test_production_refuses_the_embedded_database():
    result = _settings("config.settings.production", DJANGO_SECRET_KEY="x" * 50)

    assert result.returncode != 0
    assert "DATABASE_URL must point at a PostgreSQL server" in result.stderr


def test_production_starts_with_its_secrets_and_a_real_database():
    result = _settings(
        "config.settings.production",
        DJANGO_SECRET_KEY="x" * 50,
        DATABASE_URL="postgres://keel:pw@db.internal:6543/keel_prod",
        CELERY_BROKER_URL="redis://cache.internal:6379/0",
    )

    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    assert {key: printed["db"][key] for key in ("ENGINE", "HOST", "PORT", "NAME", "USER")} == {
        "ENGINE": "django.db.backends.postgresql",
        "HOST": "db.internal",
        "PORT": 6543,
        "NAME": "keel_prod",
        "USER": "keel",
    }
    assert printed["broker"] == "redis://cache.internal:6379/0"


@pytest.mark.parametrize("broker", ["", "amqp://guest:guest@127.0.0.1:5672//"])
def test_without_settings_the_database_is_embedded_and_the_broker_needs_no_server(broker):
    result = _settings("config.settings.local", **({"CELERY_BROKER_URL": broker} if broker else {}))

    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    assert printed["db"]["ENGINE"] == "config.embedded_db"
    assert printed["broker"] == (broker or "keelfs://")
