"""Keel's gunicorn hooks (config/gunicorn.py): a web worker moves what it holds out of the cyclic
collector's reach once loaded, and again after its first requests."""

from __future__ import annotations

import gc
from types import SimpleNamespace

from config import gunicorn
from config.run import web_argv


def _tracked(objects: list[list[int]]) -> bool:
    """Whether the collector still walks these objects (frozen ones are in none of its generations)."""
    wanted = {id(item) for item in objects}
    return any(id(item) in wanted for item in gc.get_objects())


def test_a_worker_freezes_what_it_loaded_and_again_after_its_first_requests():
    worker = SimpleNamespace()
    first, then = min(gunicorn.FREEZE_AFTER_REQUESTS), max(gunicorn.FREEZE_AFTER_REQUESTS)
    threshold = gc.get_threshold()
    try:
        loaded = [[number] for number in range(100)]
        gunicorn.post_worker_init(worker)
        assert not _tracked(loaded)

        imported_lazily = [[number] for number in range(100)]
        for _ in range(first - 1):
            gunicorn.post_request(worker, None, {}, None)
        assert _tracked(imported_lazily)
        gunicorn.post_request(worker, None, {}, None)  # the first freeze after requests
        assert not _tracked(imported_lazily)

        made_later = [[number] for number in range(100)]
        for _ in range(then - first):
            gunicorn.post_request(worker, None, {}, None)
        assert not _tracked(made_later)
        request_scoped = [[number] for number in range(100)]
        for _ in range(1000):
            gunicorn.post_request(worker, None, {}, None)
        assert _tracked(request_scoped)  # no freezes after the last one
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


def test_a_worker_collects_its_youngest_generation_less_often():
    threshold = gc.get_threshold()
    try:
        gunicorn.post_worker_init(SimpleNamespace())

        assert gc.get_threshold() == (gunicorn.YOUNG_GENERATION_THRESHOLD, *threshold[1:])
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


def test_make_run_and_the_benchmarks_start_gunicorn_with_the_hooks():
    argv = web_argv("127.0.0.1", 8000, workers="2", threads="4")

    assert argv[argv.index("--config") + 1] == "python:config.gunicorn"
