"""Fixtures of the trainer bridge's tests: the gateway on the fake provider (routing's), exported files in a
temporary media folder, and an eval run whose k answers per item become groups."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from evals import runs
from evals.tests.test_runs import _script, _suite
from routing.tests import conftest as routing_fixtures
from routing.tests.conftest import Gateway
from routing.tests.fakes import FakeGatewayLLM
from tracing import services as tracing_services
from tracing.models import IngestBatch

fake = routing_fixtures.fake
gateway = routing_fixtures.gateway


@pytest.fixture(autouse=True)
def media(tmp_path: Path, settings: Any) -> Path:
    settings.MEDIA_ROOT = tmp_path / "media"
    return tmp_path


@pytest.fixture
def run(gateway: Gateway, fake: FakeGatewayLLM) -> Any:
    """A k = 4 eval run over four items: two items with mixed answers, one all right, one all wrong."""
    suite = _suite(gateway, samples=4)
    _script(fake, ["ok", "no", "ok", "no"] + ["ok"] * 4 + ["no", "no", "ok", "no"] + ["no"] * 4)
    done = runs.run_execute(run_id=runs.run_create(suite=suite, dispatch=False).pk)
    for batch_id in IngestBatch.objects.filter(status="pending").values_list("pk", flat=True):
        tracing_services.span_batch_process(batch_id=batch_id)
    return done
