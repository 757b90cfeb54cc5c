"""Starting and stopping real Celery processes against the test database, for the Celery tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from celery import Celery
from django.db import connection

BASE_DIR = Path(__file__).resolve().parents[2]

# Tests that start processes of their own (Celery workers on the shared Redis database and RabbitMQ vhost,
# Keel under load, faults): under `make test`'s two pytest workers, one such test runs at a time (conftest.py).
PROCESS_TESTS = pytest.mark.processes


def process_env(broker_url: str | None, broker_dir: Path) -> dict[str, str]:
    """Environment for a Celery process that uses the test database and the given broker."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.test", "KEEL_BROKER_DIR": str(broker_dir)}
    settings = connection.settings_dict
    if os.environ.get("DATABASE_URL"):
        env["DATABASE_URL"] = (
            f"postgres://{settings['USER']}:{settings['PASSWORD']}@{settings['HOST']}:{settings['PORT']}/{settings['NAME']}"
        )
    else:
        env["KEEL_DATABASE_NAME"] = settings["NAME"]
    env.pop("CELERY_BROKER_URL", None)
    if broker_url is not None:
        env["CELERY_BROKER_URL"] = broker_url
    return env


def celery_start(
    args: list[str], env: dict[str, str], log: Path, *, new_session: bool = False
) -> subprocess.Popen[bytes]:
    with log.open("wb") as output:  # the child keeps its own descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "config", *args],
            cwd=BASE_DIR,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=new_session,  # a process group of its own, to kill it whole
        )


def celery_stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def celery_producer(broker_url: str | None, broker_dir: Path) -> Celery:
    """A Celery app that sends to the given broker (the filesystem one in `broker_dir` when None)."""
    if broker_url is not None:
        return Celery("producer", broker=broker_url)
    for folder in ("queue", "control", "processed"):
        (broker_dir / folder).mkdir(parents=True, exist_ok=True)
    return Celery(
        "producer",
        broker="keelfs://",
        broker_transport="config.broker:Transport",
        broker_transport_options={
            "data_folder_in": str(broker_dir / "queue"),
            "data_folder_out": str(broker_dir / "queue"),
            "control_folder": str(broker_dir / "control"),
        },
    )
