"""OpenPipe ART: one `TrajectoryGroup` per line, as ART's own JSONL trajectory logs hold them.

Pure module, no Django. A line is

    {"trajectories": [{"messages_and_choices": [...], "tools": [...] | null, "additional_histories": [],
                       "reward": 1.0, "metrics": {...}, "metadata": {"trace_id": ..., "task_id": ...},
                       "logs": []}, ...],
     "exceptions": [], "metadata": {"task_id": ..., "task_text": ..., "split": "train"}, "metrics": {}, "logs": []}

the fields of ART's `Trajectory` and `TrajectoryGroup` pydantic models (openpipe-art 0.5.x,
`art/trajectories`), read back by `art.utils.trajectory_migration.dict_to_trajectory_group`.

Recorded assistant turns are written as plain Chat Completions message dicts, not as `Choice` objects.
In ART a `Choice` (a dict with a "message" key when read back) is a completion ART sampled itself, with
its logprobs and, from 0.5.2x on, vLLM's token ids; a recorded turn has neither, and ART 0.5.23 refuses a
trainable Choice without token ids. A dict assistant message is trained exactly when the train config sets
`allow_training_without_logprobs=True` (0.5.18 `preprocessing/tokenize.py`), which is what training on
recorded trajectories needs in any case; without it the turns are context. ART's metadata values are
scalars, so list and object metadata (signals, scores) is written as its JSON text; metrics keep only
numbers and booleans. A rollout without a reward is left out (ART's reward would silently default to 0).

A group is the rollouts of one prompt (`groups.separate_prompts`): ART computes each trajectory's advantage
against its group's mean reward (and RULER ranks a group's trajectories against each other), so a group of two
prompt versions would teach which prompt scored better, not which response. The export service separates the
groups before its filters; `write` separates again (a one-prompt group passes unchanged) so that no caller can
write a mixed group. The shares of a task keep its `task_id`; the manifest counts the tasks separated.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import IO, Any

from trainer_bridge.formats.base import (
    DEFAULT_REWARD_THRESHOLD,
    Counts,
    Tally,
    openai_messages,
    require,
    scalar_metadata,
    write_line,
)
from trainer_bridge.groups import Group, Preview, Rollout, separate_prompts

NAME = "art"
EXTENSION = "jsonl"
GROUP_RELATIVE = True  # see the module docstring


def trajectory_as_dict(rollout: Rollout, group: Group) -> dict[str, Any]:
    metadata = scalar_metadata(rollout.metadata)
    metadata.update(trace_id=rollout.trace_id, task_id=group.task_id, split=group.split)
    if rollout.correction:
        metadata["correction"] = rollout.correction
    metrics = {
        str(name): value
        for name, value in rollout.metrics.items()
        if isinstance(value, int | float | bool) and value == value  # NaN is not JSON
    }
    return {
        "messages_and_choices": openai_messages(rollout.messages),
        "tools": [dict(tool) for tool in rollout.tools] or None,
        "additional_histories": [],
        "reward": rollout.reward,
        "metrics": metrics,
        "metadata": metadata,
        "logs": [],
    }


def group_as_dict(group: Group) -> dict[str, Any] | None:
    trajectories = [trajectory_as_dict(rollout, group) for rollout in group.rollouts if rollout.reward is not None]
    if not trajectories:
        return None
    return {
        "trajectories": trajectories,
        "exceptions": [],
        "metadata": {"task_id": group.task_id, "task_text": group.task_text, "split": group.split},
        "metrics": {},
        "logs": [],
    }


def check(preview: Preview, *, threshold: float = DEFAULT_REWARD_THRESHOLD) -> None:
    require(preview.groups > 0, "ART needs at least one trajectory group; the curation left none")
    require(preview.rewarded > 0, "ART trains on rewards, and no rollout has one")


def write(groups: Iterable[Group], out: IO[bytes], *, threshold: float = DEFAULT_REWARD_THRESHOLD) -> Counts:
    tally = Tally()
    for group in separate_prompts(groups):
        line = group_as_dict(group)
        if line is None:
            tally.skipped += len(group.rollouts)
            continue
        write_line(out, line, tally)
        tally.group_written(group)
        tally.rollouts += len(line["trajectories"])
        tally.skipped += len(group.rollouts) - len(line["trajectories"])
    return tally.counts()
