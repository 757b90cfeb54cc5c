"""The embedded broker's channel under a racing producer and consumer: every message arrives whole,
exactly once (kombu's own filesystem channel can hand a consumer a file still being written)."""

from __future__ import annotations

import threading
from pathlib import Path
from queue import Empty
from typing import Any

from kombu import Connection

MESSAGES = 3000


def _connection(folder: Path) -> Connection:
    for name in ("queue", "control"):
        (folder / name).mkdir(exist_ok=True)
    return Connection(
        "keelfs://",
        transport="config.broker:Transport",
        transport_options={
            "data_folder_in": str(folder / "queue"),
            "data_folder_out": str(folder / "queue"),
            "control_folder": str(folder / "control"),
        },
    )


def test_a_consumer_racing_a_producer_reads_every_message_whole_and_once(tmp_path):
    received: list[Any] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def consume() -> None:
        with _connection(tmp_path) as connection:
            channel: Any = connection.default_channel
            while not (done.is_set() and len(received) == MESSAGES):
                try:
                    received.append(channel._get("jobs"))
                except Empty:
                    if done.is_set() and not list((tmp_path / "queue").glob("*.jobs.msg")):
                        break
                except Exception as error:  # the failure this test exists to catch: a half-written file
                    errors.append(error)
                    break

    consumer = threading.Thread(target=consume)
    consumer.start()
    with _connection(tmp_path) as connection:
        channel: Any = connection.default_channel
        for number in range(MESSAGES):
            channel._put("jobs", {"number": number, "padding": "x" * 2000})
    done.set()
    consumer.join(timeout=60)

    assert errors == []
    assert sorted(message["number"] for message in received) == list(range(MESSAGES))
    assert list((tmp_path / "queue").iterdir()) == []
