"""Handing a unit of work to a Celery worker once the transaction that made its row commits.

The row is the truth, the broker message only a nudge (DESIGN.md, "Where work state lives"): a batch,
a run, a replay, each has a status row and a sweeper that sends the units nobody took. So a broker that
cannot be reached when the row commits costs a delay, not the request: the failure is logged and the
sweeper sends the unit later. Raising here would answer 500 for work that is already committed, and a
client that retries it would make it twice.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from kombu.exceptions import OperationalError as BrokerUnavailable

logger = logging.getLogger("config.dispatch")


def task_send_on_commit(task: Any, *args: Any) -> None:
    """Send `task(*args)` after the current transaction commits (at once outside one). Only for tasks whose
    unit a sweeper hands out again: a failed send is logged, not raised."""
    name = str(task.name)

    def send() -> None:
        try:
            task.delay(*args)
        except (BrokerUnavailable, OSError) as error:
            logger.error("config.task_publish_failed", extra={"task": name, "task_args": args, "error": str(error)})

    transaction.on_commit(send)
