"""The export command: a curation exported from the shell with a progress bar, its file and checksum printed."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from trainer_bridge.models import Export, JobStatus
from trainer_bridge.tests.test_exports import _curation

pytestmark = pytest.mark.django_db


def test_an_export_from_the_shell_prints_its_file_and_checksum(gateway: Any, run: Any) -> None:
    curation = _curation(gateway, run)
    out, err = io.StringIO(), io.StringIO()

    call_command(
        "export_curation",
        "--workspace", gateway.workspace.slug, "--curation", curation.name, "--format", "trl_dpo", "--here",
        stdout=out, stderr=err,
    )  # fmt: skip

    path, checksum = out.getvalue().strip().split("\t")
    assert hashlib.sha256(Path(path).read_bytes()).hexdigest() == checksum
    assert "2/2 groups  succeeded" in err.getvalue()
    assert Export.objects.get().status == JobStatus.SUCCEEDED


def test_a_refused_export_is_a_command_error(gateway: Any, run: Any) -> None:
    curation = _curation(gateway, run)
    curation.query = {"tags": ["nothing-has-this"]}
    curation.save()
    with pytest.raises(CommandError, match="selects no groups"):
        call_command(
            "export_curation", "--workspace", gateway.workspace.slug, "--curation", curation.name, "--format", "art",
            stdout=io.StringIO(), stderr=io.StringIO(),
        )  # fmt: skip
    assert not Export.objects.exists()
