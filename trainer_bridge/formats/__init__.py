"""Export formats for curated trajectory groups; every module here is pure (no Django).

    art        OpenPipe ART TrajectoryGroups (art.py)
    trl_sft    TRL conversational SFT (trl.py)
    trl_dpo    TRL conversational DPO, pairs of one prompt (trl.py)
    trl_kto    TRL conversational KTO, labelled by reward (trl.py)
    openai     OpenAI chat fine-tuning JSONL (openai_ft.py)
    nemo_gym   NeMo Gym rollouts JSONL (gym.py, through evals.gym)

How the export service uses them, so that a refused export writes nothing:

    summary = preview(curate(groups_from_query(), filters))         # first pass; holds only the rewards
    format_get(name).check(summary, threshold=threshold)            # FormatCannotRepresent: refuse, no file
    with open(path, "wb") as out:                                   # only now
        manifest = export_write(curate(groups_from_query(), filters), out, format_name=name,
                                curation={"filters": filters.as_dict(), "preview": summary.as_dict()},
                                created_at=now, threshold=threshold)

`check` reads only the preview, so the first pass can run the same query again rather than hold the
groups (curation is deterministic: the same rollouts give the same groups). `format_get` raises
`UnknownFormat` for a name not in `FORMATS`.

A `group_relative` format (ART, NeMo Gym) trains each rollout against its group's mean reward, so its groups
hold the rollouts of one prompt. For it, both passes separate the groups by prompt before curating them (and
before a group judge ranks them), so that the filters see the groups the file will hold:

    grouped = groups_from_query()
    if format_get(name).group_relative:
        grouped = separate_prompts(grouped)                         # one group per prompt of each task
    summary = preview(curate(grouped, filters))

Its writer separates again (a one-prompt group passes unchanged), so a mixed group never reaches the file.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import IO, Final, Protocol

from trainer_bridge.formats import art, gym, openai_ft, trl
from trainer_bridge.formats.base import DEFAULT_REWARD_THRESHOLD, Counts, FormatCannotRepresent
from trainer_bridge.groups import Group, Preview

__all__ = [
    "DEFAULT_REWARD_THRESHOLD",
    "FORMATS",
    "Counts",
    "ExportFormat",
    "FormatCannotRepresent",
    "UnknownFormat",
    "format_get",
]


class Writer(Protocol):
    def __call__(self, groups: Iterable[Group], out: IO[bytes], *, threshold: float = ...) -> Counts: ...


class Checker(Protocol):
    def __call__(self, preview: Preview, *, threshold: float = ...) -> None: ...


@dataclass(frozen=True, slots=True)
class ExportFormat:
    name: str
    extension: str
    content_type: str
    write: Writer
    check: Checker
    group_relative: bool = False  # its groups hold one prompt's rollouts (see the module docstring)


class UnknownFormat(ValueError):
    pass


_JSONL: Final = "application/jsonl"
FORMATS: Final[dict[str, ExportFormat]] = {
    export_format.name: export_format
    for export_format in (
        ExportFormat("art", "jsonl", _JSONL, art.write, art.check, group_relative=art.GROUP_RELATIVE),
        ExportFormat("trl_sft", "jsonl", _JSONL, trl.sft_write, trl.sft_check),
        ExportFormat("trl_dpo", "jsonl", _JSONL, trl.dpo_write, trl.dpo_check),
        ExportFormat("trl_kto", "jsonl", _JSONL, trl.kto_write, trl.kto_check),
        ExportFormat("openai", "jsonl", _JSONL, openai_ft.write, openai_ft.check),
        ExportFormat("nemo_gym", "jsonl", _JSONL, gym.write, gym.check, group_relative=gym.GROUP_RELATIVE),
    )
}


def format_get(name: str) -> ExportFormat:
    try:
        return FORMATS[name]
    except KeyError:
        raise UnknownFormat(f"unknown export format {name!r} (known: {', '.join(FORMATS)})") from None
