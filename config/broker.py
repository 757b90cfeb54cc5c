"""The embedded broker: kombu's filesystem transport with one fix (`keelfs://`, Celery's broker_transport).

kombu's filesystem producer creates the message file under its final name and then writes into it,
while the consumer takes files by moving them without the producer's lock. A consumer that polls in
between reads an empty or partial file, fails to decode it and the worker exits, losing that message
until the sweeper re-queues its work (seen under the gateway benchmark's load). Here the producer
writes under a name no consumer matches and renames it into place: a rename within one directory is
atomic, so a consumer sees a whole message or none.
"""

from __future__ import annotations

import os
import uuid
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

SCHEME = "keelfs"


class Channel(filesystem.Channel):
    # The signature of kombu's filesystem channel, which already differs from its base class's.
    def _put(self, queue: str, payload: dict[str, Any], **kwargs: Any) -> None:  # type: ignore[override]
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        # The consumer takes only names whose part after the first dot is "<queue>.msg".
        partial = os.path.join(self.data_folder_out, f".{name}.part")
        try:
            with open(partial, "wb") as file:
                file.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as error:
            raise ChannelError(f"cannot add message {name!r} to {self.data_folder_out!r}") from error


class Transport(filesystem.Transport):
    Channel = Channel
    driver_type = SCHEME
    driver_name = SCHEME
