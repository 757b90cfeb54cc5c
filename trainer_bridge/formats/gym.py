"""NeMo Gym rollouts JSONL: one rollout per line, written by `evals.gym` (the eval runs' Gym interchange).

Pure module, no Django. Each group is a Gym task (`_ng_task_index`: the group's place in the export), each
rollout a sample of it (`_ng_rollout_index`). `responses_create_params.input` is what the agent was given
(the messages before its first assistant turn); `response.output` is the rest as Responses API items:
assistant text as a `message` item and its tool calls as `function_call` items (both made by
`evals.gym.output_items_build`), tool results as `function_call_output` items, later user turns as user
`message` items. The reward is the rollout's (null when unrewarded: Gym's "errored"). Keel's fields (trace
id, task id and text, split, metadata, metrics, correction) sit under the "keel" key, which Gym ignores and
`evals.gym.rollouts_read` reads back.

A Gym task is one input (`responses_create_params` is the same for each of its samples, which Gym's tools group
by `_ng_task_index`), and NeMo RL's GRPO takes each rollout's baseline from the generations of its prompt
(`num_generations_per_prompt`): a group is therefore the rollouts of one prompt (`groups.separate_prompts`, as for
ART; `write` separates again, and the shares of a Keel task are Gym tasks of their own, keeping Keel's `task_id`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import IO, Any

from evals import gym
from trainer_bridge.formats.base import (
    DEFAULT_REWARD_THRESHOLD,
    Counts,
    Tally,
    first_assistant_index,
    openai_messages,
    require,
)
from trainer_bridge.groups import Group, Preview, Rollout, message_text, separate_prompts

NAME = "nemo_gym"
EXTENSION = "jsonl"
GROUP_RELATIVE = True  # see the module docstring


def output_items(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The model's part of a trajectory as Responses API output items (see the module docstring)."""
    items: list[dict[str, Any]] = []
    for message in openai_messages(messages):
        role = message.get("role")
        if role == "assistant":
            calls = [
                {"id": call["id"], "name": call["function"]["name"], "arguments": call["function"]["arguments"]}
                for call in message.get("tool_calls") or ()
            ]
            items.extend(gym.output_items_build(message_text(message), calls))
        elif role == "tool":
            items.append(
                {"type": "function_call_output", "call_id": message["tool_call_id"], "output": message_text(message)}
            )
        else:
            items.append(
                {"type": "message", "role": role, "content": [{"type": "input_text", "text": message_text(message)}]}
            )
    return items


def gym_rollout(rollout: Rollout, group: Group, task_index: int, sample: int) -> gym.Rollout:
    start = first_assistant_index(rollout.messages)
    metadata: dict[str, Any] = {
        **rollout.metadata,
        "trace_id": rollout.trace_id,
        "task_id": group.task_id,
        "task_text": group.task_text,
        "split": group.split,
        "metrics": dict(rollout.metrics),
    }
    if rollout.correction:
        metadata["correction"] = rollout.correction
    return gym.Rollout(
        task_index=task_index,
        sample=sample,
        input=[dict(message) for message in openai_messages(rollout.messages[:start])],
        output_items=output_items(rollout.messages[start:]),
        reward=rollout.reward,
        metadata=metadata,
    )


def check(preview: Preview, *, threshold: float = DEFAULT_REWARD_THRESHOLD) -> None:
    require(preview.rollouts > 0, "a NeMo Gym rollouts file needs at least one rollout; the curation left none")


def write(groups: Iterable[Group], out: IO[bytes], *, threshold: float = DEFAULT_REWARD_THRESHOLD) -> Counts:
    tally = Tally()

    def rollouts() -> Iterator[gym.Rollout]:
        for task_index, group in enumerate(separate_prompts(groups)):
            if group.rollouts:
                tally.group_written(group)
            for sample, rollout in enumerate(group.rollouts):
                tally.rollouts += 1
                yield gym_rollout(rollout, group, task_index, sample)

    tally.lines = gym.rollouts_write(rollouts(), out)
    return tally.counts()
