"""OpenAI supervised fine-tuning JSONL for chat models: one example per line.

Pure module, no Django. A line is OpenAI's `FineTuneChatRequestInput`:

    {"messages": [{"role": "system", ...}, {"role": "user", ...},
                  {"role": "assistant", "content": null,
                   "tool_calls": [{"id": "call_1", "type": "function",
                                   "function": {"name": "lookup", "arguments": "{\"id\": 7}"}}]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "..."},
                  {"role": "assistant", "content": "..."}],
     "tools": [{"type": "function", "function": {...}}],
     "parallel_tool_calls": true}

Tool call arguments are JSON strings, as the Chat Completions API carries them. `tools` is left out when
the rollout had none, and `parallel_tool_calls` is written (true) only when some assistant turn made more
than one call, so an example never contradicts it.

The examples are SFT's (`base.sft_examples`): rollouts rewarded at or above the threshold, every assistant
turn trained; and corrected rollouts, where only the corrected final answer is trained: the earlier
assistant turns, which nobody checked, get `"weight": 0` (OpenAI's 0/1 per assistant message).

A file holds one split: `check` refuses groups of both (OpenAI's `training_file` and `validation_file` are
separate uploads), so a curation with a validation share is exported once per split.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import IO, Any

from trainer_bridge.formats.base import (
    DEFAULT_REWARD_THRESHOLD,
    Counts,
    Tally,
    openai_messages,
    require,
    sft_examples,
    write_line,
)
from trainer_bridge.groups import Group, Preview, Rollout

NAME = "openai"
EXTENSION = "jsonl"


def example_as_dict(rollout: Rollout, messages: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    converted = openai_messages(messages)
    if rollout.correction:
        assistants = [message for message in converted if message["role"] == "assistant"]
        for message in assistants[:-1]:
            message["weight"] = 0
    example: dict[str, Any] = {"messages": converted}
    if rollout.tools:
        example["tools"] = [dict(tool) for tool in rollout.tools]
    if any(len(message.get("tool_calls") or ()) > 1 for message in converted):
        example["parallel_tool_calls"] = True
    return example


def check(preview: Preview, *, threshold: float = DEFAULT_REWARD_THRESHOLD) -> None:
    # OpenAI takes the validation set as its own file (`validation_file`), and a line has no field that could
    # say which set it is in: one file of both would train on the held-out tasks.
    require(
        not (preview.splits.get("train") and preview.splits.get("validation")),
        "OpenAI fine-tuning takes the training and validation sets as separate files, and this curation holds "
        f"out {preview.splits.get('validation')} of its {preview.groups} groups: export the train split and the "
        "validation split separately",
    )
    best = preview.rewards.max
    require(
        preview.corrections > 0 or (best is not None and best >= threshold),
        f"OpenAI fine-tuning needs a rollout rewarded at least {threshold} or a corrected one; "
        f"the best reward is {best}",
    )


def write(groups: Iterable[Group], out: IO[bytes], *, threshold: float = DEFAULT_REWARD_THRESHOLD) -> Counts:
    tally = Tally()
    for group in groups:
        used = 0
        for rollout in group.rollouts:
            examples = sft_examples(rollout, threshold)
            for messages in examples:
                write_line(out, example_as_dict(rollout, messages), tally)
            used += bool(examples)
        tally.rollouts += used
        tally.skipped += len(group.rollouts) - used
        tally.groups += used > 0
    return tally.counts()
