"""Celery: CELERY_BROKER_URL when set (redis://, amqp://), else kombu's filesystem transport (with
atomic writes: config/broker.py).

The filesystem transport needs no server, keeps queued messages across restarts and supports
fanout (so `celery inspect` works). Work state lives in PostgreSQL, not in the broker: a task
carries only ids, and a lost message costs a delay, never data (DESIGN.md, "Where work state lives").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from config.settings.env import env_int, env_str

_BASE_DIR = Path(__file__).resolve().parents[3]

CELERY_BROKER_URL = env_str("CELERY_BROKER_URL")
CELERY_BROKER_EMBEDDED = not CELERY_BROKER_URL
BROKER_DIR = Path(env_str("KEEL_BROKER_DIR", str(_BASE_DIR / "var" / "broker")))

CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, Any]
if CELERY_BROKER_EMBEDDED:
    # kombu's filesystem transport with atomic writes (config/broker.py), imported by kombu by its path
    # on the first connection; the URL only names it.
    CELERY_BROKER_URL = "keelfs://"
    CELERY_BROKER_TRANSPORT = "config.broker:Transport"
    for folder in ("queue", "control", "processed"):
        (BROKER_DIR / folder).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        # Producer and consumer share one folder: the transport moves a file out to take it.
        "data_folder_in": str(BROKER_DIR / "queue"),
        "data_folder_out": str(BROKER_DIR / "queue"),
        "control_folder": str(BROKER_DIR / "control"),
        "polling_interval": 0.1,
    }
elif CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
    # Redis redelivers an unacknowledged task only after its visibility timeout; keep it longer
    # than the longest task, and restore often so a killed worker's task comes back soon.
    # redis-py waits for an answer forever by default: a Redis that stops answering (frozen, cut off by
    # the network) would hang every request that sends a task. With a timeout the send fails, the row it
    # was about stays committed, and the sweeper sends it later (config/dispatch.py).
    _socket_timeout = env_int("CELERY_BROKER_SOCKET_TIMEOUT", 5)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "visibility_timeout": env_int("CELERY_VISIBILITY_TIMEOUT", 3600),
        "unacked_restore_interval": 10,
        "socket_timeout": _socket_timeout,
        "socket_connect_timeout": _socket_timeout,
    }
else:
    CELERY_BROKER_TRANSPORT_OPTIONS = {}

CELERY_RESULT_BACKEND = env_str("CELERY_RESULT_BACKEND") or None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_TIME_LIMIT = env_int("CELERY_TASK_TIME_LIMIT", 30 * 60)
CELERY_TASK_SOFT_TIME_LIMIT = CELERY_TASK_TIME_LIMIT - 30
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_TASK_ALWAYS_EAGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
