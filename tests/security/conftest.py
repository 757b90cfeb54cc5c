"""The access tests' world, built once per module (see world.py)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from django.db import transaction
from django.test import override_settings
from pytest_django import DjangoDbBlocker

from routing.tests.fakes import fake_gateway_provider
from tests.security.world import World, no_network, world_build


@pytest.fixture(scope="module")
def world(
    django_db_setup: None, django_db_blocker: DjangoDbBlocker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    media = tmp_path_factory.mktemp("security")
    # Thousands of refusals are expected here; Django would log a warning for each (errors still show).
    request_log = logging.getLogger("django.request")
    level = request_log.level
    request_log.setLevel(logging.ERROR)
    try:
        with (
            # Keys record their last use at most once an hour here, not once a minute: the sweeps make
            # thousands of requests with a few keys, and each would otherwise also write.
            override_settings(MEDIA_ROOT=media / "media", API_KEY_LAST_USED_RESOLUTION_SECONDS=3600),
            django_db_blocker.unblock(),
            fake_gateway_provider(),
            no_network(),
            transaction.atomic(),
        ):
            built = world_build(media)
            yield built
            transaction.set_rollback(True)
    finally:
        request_log.setLevel(level)
