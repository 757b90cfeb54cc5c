"""The web process never loads torch, and the GPU worker never loads Django: each side imports only what it runs.

Checked in a fresh interpreter, since this test process has long imported both."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _loaded_after(code: str) -> set[str]:
    script = f"{code}\nimport sys\nprint(' '.join(sorted({{name.split('.')[0] for name in sys.modules}})))"
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={"DJANGO_SETTINGS_MODULE": "config.settings.test", "PATH": "/usr/bin:/bin"},
    )
    return set(done.stdout.split())


def test_the_web_process_validates_a_training_config_without_torch() -> None:
    loaded = _loaded_after(
        "import django; django.setup()\n"
        "import config.urls\n"
        "from trainer_bridge import jobs\n"
        "assert jobs._config_problems('grpo', {'steps': 0}) == "
        "[{'field': 'config.steps', 'message': 'must be at least 1, not 0'}]"
    )
    assert "trainer_bridge" in loaded
    assert not loaded & {"torch", "transformers", "peft"}


def test_the_worker_runs_without_django() -> None:
    loaded = _loaded_after("from trainer_bridge import worker")
    assert "torch" in loaded
    assert "django" not in loaded
