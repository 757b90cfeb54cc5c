"""Hugging Face TRL datasets, conversational: SFT, DPO and KTO rows, one JSON line each.

Pure module, no Django. The rows are TRL's documented conversational types (`docs/source/dataset_formats.md`):

    SFT  {"messages": [...], "tools": "<JSON list>", "split": "train"}
    DPO  {"prompt": [...], "chosen": [...], "rejected": [...], "tools": "<JSON list>", "split": "train"}
    KTO  {"prompt": [...], "completion": [...], "label": true, "tools": "<JSON list>", "split": "train"}

`split` is the group's ("train" or "validation", from the curation's `validation_share`): one file holds both,
and a row of a held-out task must not be trained on. Keel's worker holds "validation" rows out; with TRL,
`dataset.filter(lambda row: row["split"] == "train")` (the trainers drop the extra column when they tokenise).

Messages are TRL's shape: assistant tool calls {"id", "type": "function", "function": {"name", "arguments":
{...}}} with the arguments decoded to an object (chat templates render them; OpenAI's JSON string would be
rendered as a quoted string), tool results {"role": "tool", "name", "tool_call_id", "content"}, and an
assistant turn's missing content as "" (templates test `content is string`). `tools` is the JSON text of the
tool definitions: every TRL trainer that takes tools (`SFTTrainer`, `DPOTrainer`, `KTOTrainer`) json-decodes a
string column, and a string survives Arrow's schema inference, which would otherwise merge different tools'
parameter schemas into one struct with nulls.

Which rows (`threshold` is the reward that counts as good):
- SFT: each rollout rewarded at or above the threshold, and each corrected rollout with its final answer
  replaced by the correction (see `base.sft_examples`).
- DPO: per group, each correction against the answer it corrected, and the best rollout against the worst
  (see `base.group_pairs`); a group with equal rewards and no correction gives none.
- KTO: each rewarded rollout, prompt = its messages before the first assistant turn, completion = the rest,
  label = reward >= threshold; a corrected rollout also gives its corrected final answer labelled true
  (and its original answer is then labelled false, whatever its reward).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import IO, Any

from trainer_bridge.formats.base import (
    DEFAULT_REWARD_THRESHOLD,
    Counts,
    Tally,
    first_assistant_index,
    group_pairs,
    last_assistant_index,
    require,
    sft_examples,
    tool_call_arguments,
    tool_names_by_call_id,
    write_line,
)
from trainer_bridge.groups import Group, Preview, Rollout, message_text

EXTENSION = "jsonl"


def trl_messages(messages: Sequence[Mapping[str, Any]], names: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Messages in TRL's conversational shape (see the module docstring). `names` maps tool call ids to tool
    names, for a completion whose tool results answer calls made in its prompt."""
    names = {**(names or {}), **tool_names_by_call_id(messages)}
    converted: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role == "assistant":
            row: dict[str, Any] = {"role": "assistant", "content": message_text(message)}
            calls = [
                {
                    "id": str(call.get("id") or ""),
                    "type": "function",
                    "function": {
                        "name": str((call.get("function") or {}).get("name", "")),
                        "arguments": tool_call_arguments(call),
                    },
                }
                for call in message.get("tool_calls") or ()
            ]
            if calls:
                row["tool_calls"] = calls
            converted.append(row)
        elif role == "tool":
            call_id = str(message.get("tool_call_id") or "")
            converted.append(
                {
                    "role": "tool",
                    "name": str(message.get("name") or names.get(call_id, "")),
                    "tool_call_id": call_id,
                    "content": message_text(message),
                }
            )
        else:
            converted.append({"role": str(role), "content": message_text(message)})
    return converted


def tools_text(rollout: Rollout) -> str:
    return json.dumps([dict(tool) for tool in rollout.tools], ensure_ascii=False, sort_keys=True)


# --- SFT ------------------------------------------------------------------------------------------------


def sft_check(preview: Preview, *, threshold: float = DEFAULT_REWARD_THRESHOLD) -> None:
    best = preview.rewards.max
    require(
        preview.corrections > 0 or (best is not None and best >= threshold),
        f"SFT needs a rollout rewarded at least {threshold} or a corrected one; the best reward is {best}",
    )


def sft_write(groups: Iterable[Group], out: IO[bytes], *, threshold: float = DEFAULT_REWARD_THRESHOLD) -> Counts:
    tally = Tally()
    for group in groups:
        used = 0
        for rollout in group.rollouts:
            examples = sft_examples(rollout, threshold)
            for messages in examples:
                row = {"messages": trl_messages(messages), "tools": tools_text(rollout), "split": group.split}
                write_line(out, row, tally)
            used += bool(examples)
        tally.rollouts += used
        tally.skipped += len(group.rollouts) - used
        tally.groups += used > 0
    return tally.counts()


# --- DPO ------------------------------------------------------------------------------------------------


def dpo_check(preview: Preview, *, threshold: float = DEFAULT_REWARD_THRESHOLD) -> None:
    require(
        preview.pairable_groups > 0,
        "DPO needs pairs: a group with two different rewards or a corrected answer, and there is none",
    )


def dpo_write(groups: Iterable[Group], out: IO[bytes], *, threshold: float = DEFAULT_REWARD_THRESHOLD) -> Counts:
    tally = Tally()
    for group in groups:
        pairs = group_pairs(group)
        tools = tools_text(group.rollouts[0]) if group.rollouts else "[]"
        used = 0
        for pair in pairs:
            names = tool_names_by_call_id(pair.prompt)
            row = {
                "prompt": trl_messages(pair.prompt),
                "chosen": trl_messages(pair.chosen, names),
                "rejected": trl_messages(pair.rejected, names),
                "tools": tools,
                "split": group.split,
            }
            write_line(out, row, tally)
            used += pair.rollouts
        used = min(used, len(group.rollouts))
        tally.rollouts += used
        tally.skipped += len(group.rollouts) - used
        tally.groups += bool(pairs)
    return tally.counts()


# --- KTO ------------------------------------------------------------------------------------------------


def kto_check(preview: Preview, *, threshold: float = DEFAULT_REWARD_THRESHOLD) -> None:
    require(
        preview.rewarded > 0 or preview.corrections > 0,
        "KTO labels rollouts by their reward or a correction, and no rollout has either",
    )


def _kto_rows(
    rollout: Rollout, threshold: float
) -> list[tuple[Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]], bool]]:
    rows: list[tuple[Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]], bool]] = []
    last = last_assistant_index(rollout.messages)
    if rollout.correction and last is not None:
        prompt = rollout.messages[:last]
        rows.append((prompt, [{"role": "assistant", "content": rollout.correction}], True))
        rows.append((prompt, [rollout.messages[last]], False))
    elif rollout.reward is not None:
        start = first_assistant_index(rollout.messages)
        if rollout.messages[start:]:
            rows.append((rollout.messages[:start], rollout.messages[start:], rollout.reward >= threshold))
    return [row for row in rows if row[0] and row[0][-1].get("role") in ("user", "tool")]


def kto_write(groups: Iterable[Group], out: IO[bytes], *, threshold: float = DEFAULT_REWARD_THRESHOLD) -> Counts:
    tally = Tally()
    for group in groups:
        used = 0
        for rollout in group.rollouts:
            rows = _kto_rows(rollout, threshold)
            for prompt, completion, label in rows:
                names = tool_names_by_call_id(prompt)
                row = {
                    "prompt": trl_messages(prompt),
                    "completion": trl_messages(completion, names),
                    "label": label,
                    "tools": tools_text(rollout),
                    "split": group.split,
                }
                write_line(out, row, tally)
            used += bool(rows)
        tally.rollouts += used
        tally.skipped += len(group.rollouts) - used
        tally.groups += used > 0
    return tally.counts()
