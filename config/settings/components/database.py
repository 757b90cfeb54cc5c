"""Database: DATABASE_URL when set, else the embedded PostgreSQL with pgvector.

The embedded server lives in `var/pg` (or KEEL_PGDATA), is shared by every Keel process on the
machine, and is started by the first connection (config/embedded_db).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dj_database_url

from config import embedded_postgres
from config.settings.env import env_int, env_str

_BASE_DIR = Path(__file__).resolve().parents[3]

DATABASE_URL = env_str("DATABASE_URL")
DATABASE_EMBEDDED = not DATABASE_URL
EMBEDDED_DATA_DIR = embedded_postgres.data_dir_default(_BASE_DIR)
EMBEDDED_DATABASE_NAME = env_str("KEEL_DATABASE_NAME", "keel")

DATABASE_DEFAULT: dict[str, Any]
if DATABASE_EMBEDDED:
    DATABASE_DEFAULT = {
        "ENGINE": "config.embedded_db",
        "NAME": EMBEDDED_DATABASE_NAME,
        "USER": embedded_postgres.SUPERUSER,
        "PASSWORD": "",
        "HOST": "",  # filled with the server's socket directory on first connection
        "PORT": "",
    }
else:
    DATABASE_DEFAULT = dict(dj_database_url.parse(DATABASE_URL))
    DATABASE_DEFAULT["ENGINE"] = "django.db.backends.postgresql"

DATABASE_DEFAULT["CONN_MAX_AGE"] = env_int("DATABASE_CONN_MAX_AGE", 60)
DATABASE_DEFAULT["CONN_HEALTH_CHECKS"] = True
DATABASES = {"default": DATABASE_DEFAULT}
