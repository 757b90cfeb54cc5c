"""The manifest that travels with an exported file: what it holds, how it was curated, and its checksum.

Pure module, no Django. `HashingWriter` wraps the file being written and hashes the bytes as they pass,
so the sha256 costs no second read of the file; `export_write` runs a format's writer through it and
returns the `Manifest`.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from importlib import metadata
from typing import IO, Any, Final, cast

from typing_extensions import Buffer

from trainer_bridge.formats.base import DEFAULT_REWARD_THRESHOLD, Counts
from trainer_bridge.groups import Group

DISTRIBUTION: Final = "keel"  # pyproject.toml's [project] name


def keel_version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


class HashingWriter(io.RawIOBase):
    """A binary sink that forwards every write to `out` and keeps its sha256 and `size` in bytes."""

    def __init__(self, out: IO[bytes]) -> None:
        super().__init__()
        self._out = out
        self._hash = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Buffer, /) -> int:
        view = memoryview(data).cast("B")
        self._out.write(view)
        self._hash.update(view)
        self.size += len(view)
        return len(view)

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest()


def counts_notes(counts: Counts) -> tuple[str, ...]:
    """What a reader of the file should know that its lines do not say: rollouts left unpaired for a prompt
    mismatch, tasks written as one group per prompt, images kept as URLs (nobody downloaded them), image parts
    left out."""
    notes: list[str] = []
    if counts.tasks_separated_by_prompt:
        notes.append(
            f"{counts.tasks_separated_by_prompt} tasks were asked under more than one prompt (prompt version, system "
            "prompt or user input): each prompt's rollouts are a group of their own, sharing the task's task_id, since "
            "a group-relative advantage compares a rollout's reward with its group's mean; each such group went "
            "through the size and reward filters like any other"
        )
    if counts.unpaired_by_prompt:
        notes.append(
            f"{counts.unpaired_by_prompt} rewarded rollouts were left unpaired: in their group, every rollout "
            "rewarded differently ran under another prompt (prompt version, system prompt or user input), and a "
            "preference pair needs one prompt"
        )
    if counts.images:
        notes.append(f"{counts.images} images from data: URLs were decoded, checked and written in the rows")
    if counts.image_urls:
        notes.append(
            f"{counts.image_urls} images are http(s) URLs, kept as URLs and not downloaded: whoever loads the rows "
            "fetches them (transformers' image processors do when TRL trains)"
        )
    if counts.images_dropped:
        notes.append(
            f"{counts.images_dropped} image parts were left out: not an image data: URL or an http(s) URL, or in a "
            "completion, where TRL takes no image"
        )
    return tuple(notes)


@dataclass(frozen=True, slots=True)
class Manifest:
    format: str
    curation: Mapping[str, Any]  # the filters, the threshold, the preview: what the caller wants on record
    counts: Counts
    notes: tuple[str, ...]  # see `counts_notes`
    sha256: str
    size: int  # bytes
    keel_version: str
    created_at: datetime

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["created_at"] = self.created_at.isoformat()
        data["notes"] = list(self.notes)
        return data

    def as_json(self) -> bytes:
        return json.dumps(self.as_dict(), ensure_ascii=False, indent=2, sort_keys=True, default=str).encode("utf-8")


def export_write(
    groups: Iterable[Group],
    out: IO[bytes],
    *,
    format_name: str,
    curation: Mapping[str, Any],
    created_at: datetime,
    threshold: float = DEFAULT_REWARD_THRESHOLD,
) -> Manifest:
    """Write the groups in the named format to `out` and describe the result. Call the format's `check` on
    the preview first: this writes whatever the groups give."""
    from trainer_bridge.formats import format_get  # the registry imports this module

    export_format = format_get(format_name)
    sink = HashingWriter(out)
    counts = export_format.write(groups, cast(IO[bytes], sink), threshold=threshold)
    return Manifest(
        format=export_format.name,
        curation=dict(curation),
        counts=counts,
        notes=counts_notes(counts),
        sha256=sink.sha256,
        size=sink.size,
        keel_version=keel_version(),
        created_at=created_at,
    )
