"""What every export format shares: its counts, its refusal, and the message surgery the formats agree on.

Pure module, no Django. A format module exposes

    write(groups: Iterable[Group], out: IO[bytes], *, threshold: float = DEFAULT_REWARD_THRESHOLD) -> Counts
    check(preview: Preview, *, threshold: float = DEFAULT_REWARD_THRESHOLD) -> None

`write` draws one group at a time and writes one JSON line at a time, so memory does not grow with the
export. `check` raises `FormatCannotRepresent` when the curated groups, as `groups.preview` describes
them, would give the format nothing (or nothing it can hold); the service calls it on the preview, before
it opens the file, so a refused export writes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, Final

from trainer_bridge.groups import Group, Rollout, message_text, rewards_vary, same_prompt, separated_task

# Rewards at or above this are "good": for SFT and OpenAI rows, and KTO's label. Binary rewards pass at 1,
# as in evals.gym; a continuous reward (a judge's score) needs the caller's threshold.
DEFAULT_REWARD_THRESHOLD: Final = 1.0


class FormatCannotRepresent(ValueError):
    """The curated groups give this format nothing it can hold (e.g. DPO with no pair); nothing was written."""


@dataclass(frozen=True, slots=True)
class Counts:
    """What a writer wrote: lines, groups that gave at least one line, rollouts used, rollouts left out; and
    what only some formats meet: rollouts DPO could not pair because the rollouts rewarded differently ran
    under another prompt (`groups.prompt_pairing`), tasks a group-relative format wrote as one group per prompt
    (`groups.separate_prompts`), images written from data: URLs, images kept as their http(s) URL (not
    downloaded), and image parts a row could not hold (dropped)."""

    lines: int = 0
    groups: int = 0
    rollouts: int = 0
    skipped: int = 0
    unpaired_by_prompt: int = 0
    tasks_separated_by_prompt: int = 0
    images: int = 0
    image_urls: int = 0
    images_dropped: int = 0


class Tally:
    """Counts as a writer goes."""

    def __init__(self) -> None:
        self.lines = self.groups = self.rollouts = self.skipped = 0
        self.unpaired_by_prompt = self.images = self.image_urls = self.images_dropped = 0
        self.tasks_separated_by_prompt = 0
        self._previous: Group | None = None

    def counts(self) -> Counts:
        return Counts(
            lines=self.lines,
            groups=self.groups,
            rollouts=self.rollouts,
            skipped=self.skipped,
            unpaired_by_prompt=self.unpaired_by_prompt,
            tasks_separated_by_prompt=self.tasks_separated_by_prompt,
            images=self.images,
            image_urls=self.image_urls,
            images_dropped=self.images_dropped,
        )

    def group_written(self, group: Group) -> None:
        """Count a group that gave lines, and the task it is a share of when `separate_prompts` made it."""
        self.groups += 1
        self.tasks_separated_by_prompt += separated_task(group, self._previous)
        self._previous = group


def json_line(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8") + b"\n"


def write_line(out: IO[bytes], value: Any, tally: Tally) -> None:
    out.write(json_line(value))
    tally.lines += 1


# --- Message surgery ------------------------------------------------------------------------------------


def first_assistant_index(messages: Sequence[Mapping[str, Any]]) -> int:
    """Where the model's part begins: the first assistant message (len(messages) when there is none)."""
    return next((index for index, message in enumerate(messages) if message.get("role") == "assistant"), len(messages))


def last_assistant_index(messages: Sequence[Mapping[str, Any]]) -> int | None:
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "assistant":
            return index
    return None


def corrected_messages(rollout: Rollout) -> list[Mapping[str, Any]] | None:
    """The rollout with its final answer replaced by the human correction: the last assistant message becomes
    {"role": "assistant", "content": correction} and what followed it goes. None without a correction."""
    if not rollout.correction:
        return None
    last = last_assistant_index(rollout.messages)
    messages = list(rollout.messages if last is None else rollout.messages[:last])
    messages.append({"role": "assistant", "content": rollout.correction})
    return messages


def ends_with_answer(messages: Sequence[Mapping[str, Any]]) -> bool:
    return bool(messages) and messages[-1].get("role") == "assistant"


def sft_examples(rollout: Rollout, threshold: float) -> list[Sequence[Mapping[str, Any]]]:
    """The conversations a rollout gives supervised fine-tuning: itself when its reward reaches the threshold,
    and its corrected version when a human corrected it (whatever its reward: the correction is the answer)."""
    examples: list[Sequence[Mapping[str, Any]]] = []
    corrected = corrected_messages(rollout)
    if corrected is not None:
        examples.append(corrected)
    elif rollout.reward is not None and rollout.reward >= threshold and ends_with_answer(rollout.messages):
        examples.append(rollout.messages)
    return examples


@dataclass(frozen=True, slots=True)
class Pair:
    """A preference between two completions of one prompt (prompt ends with a user or tool message)."""

    prompt: Sequence[Mapping[str, Any]]
    chosen: Sequence[Mapping[str, Any]]
    rejected: Sequence[Mapping[str, Any]]
    rollouts: int  # rollouts it used (1 for a correction, 2 for best against worst)


def _split_completion(
    messages: Sequence[Mapping[str, Any]],
) -> tuple[Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]]]:
    start = first_assistant_index(messages)
    return messages[:start], messages[start:]


def group_pairs(group: Group) -> list[Pair]:
    """A group's preference pairs: each correction against the answer it corrected (prompt: everything before
    the final answer), then, for each prompt of the group (`groups.same_prompt`: the same prompt versions,
    system prompt and user input), its best-rewarded rollout against its worst (prompt: their shared messages
    before the first assistant turn). Equal rewards give no pair, and neither do rollouts of different prompts:
    the pair's prompt would be one of them, and the other completion did not answer it."""
    pairs: list[Pair] = []
    for rollout in group.rollouts:
        last = last_assistant_index(rollout.messages)
        if not rollout.correction or last is None:
            continue
        original = rollout.messages[last]
        if message_text(original).strip() == rollout.correction.strip() and not original.get("tool_calls"):
            continue
        pairs.append(
            Pair(
                prompt=rollout.messages[:last],
                chosen=[{"role": "assistant", "content": rollout.correction}],
                rejected=[original],
                rollouts=1,
            )
        )
    for rewarded in same_prompt(rollout for rollout in group.rollouts if rollout.reward is not None):
        if not rewards_vary([rollout.reward for rollout in rewarded if rollout.reward is not None]):
            continue
        # max/min keep the first of equals: the earliest best and the earliest worst.
        best = max(rewarded, key=lambda rollout: rollout.reward or 0.0)
        worst = min(rewarded, key=lambda rollout: rollout.reward or 0.0)
        prompt, chosen = _split_completion(best.messages)
        _, rejected = _split_completion(worst.messages)
        if prompt and chosen and rejected:
            pairs.append(Pair(prompt=prompt, chosen=chosen, rejected=rejected, rollouts=2))
    return [pair for pair in pairs if pair.prompt and pair.prompt[-1].get("role") in ("user", "tool")]


def tool_call_arguments(call: Mapping[str, Any]) -> Any:
    """A tool call's arguments decoded from their JSON string (left as they are when they are not JSON)."""
    arguments = (call.get("function") or {}).get("arguments", "")
    if isinstance(arguments, str):
        try:
            return json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return arguments
    return arguments


def tool_call_arguments_text(call: Mapping[str, Any]) -> str:
    """A tool call's arguments as the JSON string OpenAI carries."""
    arguments = (call.get("function") or {}).get("arguments", "")
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def tool_names_by_call_id(messages: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    names: dict[str, str] = {}
    for message in messages:
        for call in message.get("tool_calls") or ():
            if call.get("id"):
                names[str(call["id"])] = str((call.get("function") or {}).get("name", ""))
    return names


def scalar_metadata(metadata: Mapping[str, Any]) -> dict[str, str | int | float | bool | None]:
    """Metadata as scalars (ART's and many consumers' limit): lists and objects become their JSON text."""
    flat: dict[str, str | int | float | bool | None] = {}
    for key, value in metadata.items():
        if value is None or isinstance(value, str | int | float | bool):
            flat[str(key)] = value
        else:
            flat[str(key)] = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    return flat


def require(condition: bool, message: str) -> None:
    if not condition:
        raise FormatCannotRepresent(message)


def openai_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages in the Chat Completions shape: assistant tool calls as {"id", "type": "function", "function":
    {"name", "arguments": JSON string}}, every tool result naming its call. A call without an id gets
    `call_<message>_<n>`, and a tool result without `tool_call_id` answers the earliest unanswered call."""
    converted: list[dict[str, Any]] = []
    unanswered: list[str] = []
    for position, message in enumerate(messages):
        role = message.get("role")
        if role == "assistant" and message.get("tool_calls"):
            calls = []
            for number, call in enumerate(message.get("tool_calls") or ()):
                call_id = str(call.get("id") or f"call_{position}_{number}")
                unanswered.append(call_id)
                function = call.get("function") or {}
                calls.append(
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": str(function.get("name", "")),
                            "arguments": tool_call_arguments_text(call),
                        },
                    }
                )
            content = message.get("content")
            converted.append({"role": "assistant", "content": content if content else None, "tool_calls": calls})
        elif role == "tool":
            call_id = message.get("tool_call_id") or (unanswered[0] if unanswered else f"call_{position}")
            if call_id in unanswered:
                unanswered.remove(call_id)
            converted.append({"role": "tool", "tool_call_id": str(call_id), "content": message_text(message)})
        else:
            converted.append({key: value for key, value in message.items() if key != "tool_calls"})
    return converted
