"""Gunicorn's server hooks for Keel's web processes: `gunicorn -c python:config.gunicorn` (config/run.py).

Python's cyclic garbage collector stops every thread of a process while it walks the objects it tracks,
and a web worker tracks a few hundred thousand that live as long as it does: Django's, litellm's and its
price map, pydantic's models. A full collection paused a worker for 120-300 ms on this 2-core machine,
several times in its first few thousand requests (timed with gc.callbacks over 1,600 gateway requests),
and each pause landed on the requests in flight. `gc.freeze()` moves every object tracked so far out of
the collector's reach: once the application is loaded, and again after the first requests, which import
what the gateway and litellm import only when first used. Collections afterwards walk only what requests create.

Frozen objects are never collected as cycles; whatever cyclic garbage exists at a freeze stays (a bounded,
one-time amount). Objects freed by reference counting are freed as before.

The youngest generation is collected after YOUNG_GENERATION_THRESHOLD more objects were allocated than
freed, not Python's 700. An ingest request builds the objects of its 500 spans, which live until it
ends: at 700, collections came every few spans and walked the request's objects as they moved up the
generations, 4.9 to 7.1 µs per span stored inside collections (timed with gc.callbacks, in process, after a
freeze), against 0.2 to 0.4 at 10,000 (bench/RESULTS.md, 2026-11-30). Garbage in cycles waits for at
most that many objects more.
"""

from __future__ import annotations

import gc
import itertools
from typing import Any

# After how many requests (of the worker) to freeze again, for what the first requests imported.
FREEZE_AFTER_REQUESTS = frozenset({50, 500})
YOUNG_GENERATION_THRESHOLD = 10_000


def post_worker_init(worker: Any) -> None:
    worker.keel_requests = itertools.count(1)  # next() on it is atomic: the worker's threads share it
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_GENERATION_THRESHOLD, middle, oldest)


def post_request(worker: Any, req: Any, environ: Any, resp: Any) -> None:
    if next(worker.keel_requests) in FREEZE_AFTER_REQUESTS:
        gc.freeze()
