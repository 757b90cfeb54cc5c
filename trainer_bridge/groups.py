"""Recorded trajectories as training groups: grouping by task, the RL filters, and the preview of an export.

Pure module, no Django: the export service turns trajectories into `Rollout`s, groups them with
`group_rollouts`, curates them with `curate(groups, filters)` (or the single filters), shows `preview(...)`
and streams the groups to a writer in `trainer_bridge.formats`.

A group is every rollout of one task. The task is named, in this order, by the rollout's dataset item
(`item:<id>`), its `task.id` attribute (`task:<id>`), else its first user request normalised
(`request:<text>`, see `request_normalise`), so that the same question asked twice is one task.

A task can be asked under more than one prompt (`rollout_prompt`: two prompt versions, two system prompts, two order
numbers that normalise to one request). The group-relative formats (ART's TrajectoryGroups, trained with GRPO, and
NeMo Gym's tasks) need each group to be samples of one prompt, since a rollout's advantage is its reward against its
group's mean: the export service runs `separate_prompts` on their groups before the filters, so every filter below
sees one-prompt groups. The other formats keep the task's group (DPO pairs within a prompt on its own, see
`prompt_pairing`; SFT, KTO and OpenAI rows are one rollout each).

The filters, and the choices they make:
- `drop_unrewarded`: rollouts without a reward carry nothing for a reward-driven update; a group left empty goes.
- `drop_equal_rewards`: a group whose rewards are all equal has zero advantage everywhere (GRPO and ART skip
  such trajectories), so it is dropped rather than shipped as dead weight.
- `size_bounds(minimum, maximum)`: a smaller group goes; a larger one keeps `maximum` rollouts spread over its
  reward ranking: the best, the worst and evenly spaced ranks between (ties in file order), so the kept group
  has the full reward range and the same shape; the kept rollouts stay in their original order.
- `dedupe`: within a group, a rollout is a near-duplicate of an earlier one when it made the same tool calls
  (names and arguments, in order) and gave the same normalised final answer, or when the word-3-shingle
  Jaccard similarity of the two trajectories' texts reaches the threshold. The first one is kept.
- `balance`: groups are put in families (by default the agent that produced the group's first rollout) and
  each family keeps at most `per_family` groups (when None: as many as the smallest family has), chosen by a
  stable hash of the task so the choice does not depend on arrival order. It holds the groups in memory.
- `validation_split(share, seed)`: a task goes to validation when the hash of seed and task id falls below
  `share`, so a task's split never changes between exports with the same seed and no task is in both.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from itertools import groupby
from typing import Any, Final, Literal

Split = Literal["train", "validation"]
SPLITS: Final = ("train", "validation")
# Rewards closer than this are equal: float noise from averaging scores is not a preference.
REWARD_TOLERANCE: Final = 1e-9
DEFAULT_DEDUPE_THRESHOLD: Final = 0.9
SHINGLE_WORDS: Final = 3
PREVIEW_QUANTILES: Final = (0.1, 0.25, 0.5, 0.75, 0.9)

_PUNCTUATION = re.compile(r"[^\w]|_", re.UNICODE)
_WORD = re.compile(r"\w+", re.UNICODE)


class FilterError(ValueError):
    """A curation setting is invalid; `field` names the offending key."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True, slots=True)
class Rollout:
    """One recorded trajectory: OpenAI-style messages (assistant `tool_calls`, `tool` results), the tool
    definitions it was given, its reward (None: not rewarded), numeric metrics, metadata (signals, scores,
    prompt version, agent...), an optional human-corrected final answer, and its token count."""

    trace_id: str
    messages: tuple[Mapping[str, Any], ...]
    tools: tuple[Mapping[str, Any], ...] = ()
    reward: float | None = None
    metrics: Mapping[str, float | int | bool] = field(default_factory=dict)
    metadata: Mapping[str, Any] = field(default_factory=dict)
    correction: str | None = None
    tokens: int = 0
    dataset_item_id: str | None = None
    task_id: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "messages", tuple(self.messages))
        object.__setattr__(self, "tools", tuple(self.tools))
        if self.reward is not None:
            if isinstance(self.reward, bool) or not isinstance(self.reward, int | float):
                raise ValueError(f"reward must be a number or None, got {self.reward!r}")
            if not math.isfinite(self.reward):
                raise ValueError(f"reward must be finite, got {self.reward!r}")
            object.__setattr__(self, "reward", float(self.reward))
        if self.tokens < 0:
            raise ValueError(f"tokens must be non-negative, got {self.tokens!r}")


@dataclass(frozen=True, slots=True)
class Group:
    """The rollouts of one task. `task_id` is the grouping key, `task_text` the first user request as asked.
    `task_prompts` is how many prompts the task's rollouts ran under when `separate_prompts` made this group one
    prompt's share of its task (1: the group is its whole task)."""

    task_id: str
    task_text: str
    rollouts: tuple[Rollout, ...]
    split: Split = "train"
    task_prompts: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "rollouts", tuple(self.rollouts))
        if self.split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {self.split!r}")
        if isinstance(self.task_prompts, bool) or not isinstance(self.task_prompts, int) or self.task_prompts < 1:
            raise ValueError(f"task_prompts must be a positive integer, got {self.task_prompts!r}")

    @property
    def rewards(self) -> list[float]:
        return [rollout.reward for rollout in self.rollouts if rollout.reward is not None]


# --- Messages -------------------------------------------------------------------------------------------


def message_text(message: Mapping[str, Any]) -> str:
    """A message's text: its string content, or the text parts of a content list."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            part["text"] for part in content if isinstance(part, Mapping) and isinstance(part.get("text"), str)
        )
    return ""


def image_part_url(part: object) -> str | None:
    """The URL of an OpenAI-style image content part ({"type": "image_url", "image_url": {"url": ...}}, or the
    URL as a plain string), a data: URL or an http(s) one; None for any other part."""
    if not isinstance(part, Mapping) or part.get("type") != "image_url":
        return None
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, Mapping) else image
    return url if isinstance(url, str) and url else None


def message_images(message: Mapping[str, Any]) -> list[str]:
    """The URLs of a message's image content parts, in order."""
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [url for url in (image_part_url(part) for part in content) if url is not None]


def first_user_request(messages: Iterable[Mapping[str, Any]]) -> str:
    return next((message_text(message) for message in messages if message.get("role") == "user"), "")


def final_answer(messages: Sequence[Mapping[str, Any]]) -> str:
    """The text of the last assistant message ("" when there is none)."""
    for message in reversed(messages):
        if message.get("role") == "assistant":
            return message_text(message)
    return ""


def tool_call_sequence(messages: Iterable[Mapping[str, Any]]) -> tuple[tuple[str, str], ...]:
    """Every assistant tool call as (name, canonical JSON arguments), in order."""
    calls: list[tuple[str, str]] = []
    for message in messages:
        if message.get("role") != "assistant":
            continue
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            arguments = function.get("arguments", "")
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments) if arguments else {}
                except ValueError:
                    calls.append((str(function.get("name")), arguments))
                    continue
            calls.append((str(function.get("name")), json.dumps(arguments, sort_keys=True)))
    return tuple(calls)


# --- Grouping -------------------------------------------------------------------------------------------


def request_normalise(text: str) -> str:
    """A request as a grouping key: Unicode-folded, lower-case, punctuation removed, whitespace collapsed.

    Tokens that look like identifiers once their punctuation is gone (four digits or more, or digits and
    letters in a token of five characters or more: order numbers, dates, codes, uuids) become "#", so
    "Where is order #12345?" and "where is order 98765" are one task. Short numbers are kept ("book 2
    seats" and "book 3 seats" are different tasks), and so are short mixed tokens ("3rd", "5kg").
    """
    folded = unicodedata.normalize("NFKC", text).casefold()
    tokens = []
    for raw in folded.split():
        token = _PUNCTUATION.sub("", raw)
        if not token:
            continue
        digits = sum(character.isdigit() for character in token)
        if digits >= 4 or (digits and len(token) >= 5 and digits < len(token)):
            token = "#"
        tokens.append(token)
    return " ".join(tokens)


def task_key(
    *, dataset_item_id: str | None = None, task_id: str | None = None, messages: Iterable[Mapping[str, Any]] = ()
) -> str:
    """The task a trajectory answers: its dataset item, else its `task.id`, else its normalised first request."""
    if dataset_item_id:
        return f"item:{dataset_item_id}"
    if task_id:
        return f"task:{task_id}"
    return f"request:{request_normalise(first_user_request(messages))}"


def rollout_task_key(rollout: Rollout) -> str:
    return task_key(dataset_item_id=rollout.dataset_item_id, task_id=rollout.task_id, messages=rollout.messages)


def group_rollouts(
    rollouts: Iterable[Rollout], key: Callable[[Rollout], str] = rollout_task_key, *, ordered: bool = False
) -> Iterator[Group]:
    """Rollouts grouped by task, groups in the order their first rollout came.

    With `ordered=True` the rollouts must arrive task by task (a query ordered by task key): groups are
    then yielded as each task ends, holding one group at a time, and a task seen again raises ValueError.
    Otherwise every rollout is held until the input ends.
    """
    if ordered:
        seen: set[str] = set()
        for task, members in groupby(rollouts, key=key):
            if task in seen:
                raise ValueError(f"rollouts are not ordered by task: {task!r} came back after another task")
            seen.add(task)
            batch = tuple(members)
            yield Group(task_id=task, task_text=first_user_request(batch[0].messages), rollouts=batch)
        return
    buckets: dict[str, list[Rollout]] = {}
    for rollout in rollouts:
        buckets.setdefault(key(rollout), []).append(rollout)
    for task, members_list in buckets.items():
        yield Group(task_id=task, task_text=first_user_request(members_list[0].messages), rollouts=tuple(members_list))


# --- Prompts --------------------------------------------------------------------------------------------


def rollout_prompt(rollout: Rollout) -> str:
    """What the rollout was prompted with, as a key: the prompt versions it ran under (`metadata["prompt_versions"]`)
    and its messages before its first assistant turn (the system prompt and the user input, images included).
    A group holds one task, and one task can be asked under two prompt versions or with two order numbers
    (`request_normalise`): a preference pair is only sound between rollouts whose keys are equal."""
    start = next(
        (index for index, message in enumerate(rollout.messages) if message.get("role") == "assistant"),
        len(rollout.messages),
    )
    versions = rollout.metadata.get("prompt_versions")
    prompt = {
        "prompt_versions": sorted(str(version) for version in versions) if isinstance(versions, list | tuple) else [],
        "messages": [
            [str(message.get("role")), message_text(message), message_images(message)]
            for message in rollout.messages[:start]
        ],
    }
    return json.dumps(prompt, ensure_ascii=False, sort_keys=True)


def same_prompt(rollouts: Iterable[Rollout]) -> list[list[Rollout]]:
    """The rollouts by `rollout_prompt`, in the order each prompt first came, each list in input order."""
    by_prompt: dict[str, list[Rollout]] = {}
    for rollout in rollouts:
        by_prompt.setdefault(rollout_prompt(rollout), []).append(rollout)
    return list(by_prompt.values())


def separate_prompts(groups: Iterable[Group]) -> Iterator[Group]:
    """Each group as one group per prompt (`same_prompt`: in the order each prompt first came, rollouts in
    their order), for the group-relative formats; a one-prompt group passes unchanged, so running this twice
    changes nothing. Streams: it holds one group at a time.

    Separated rather than keeping the task's largest prompt and dropping the rest: to ART (a TrajectoryGroup is
    the rollouts of one scenario, RULER ranks them against each other) and to GRPO (TRL's GRPOTrainer samples
    `num_generations` completions of each prompt) a task asked under v1 and v2 of a prompt is two prompts, so
    two groups; the larger share is not the better prompt (the retired version often has more traffic), and
    each share's rewards still compare responses to one prompt. A share that cannot teach anything (one
    rollout, equal rewards) then goes through the size and reward filters as any group does.

    Each share keeps the task's `task_id` (so the validation split, a hash of it, puts every share of a task on
    the same side), takes its own first request as `task_text`, and says in `task_prompts` how many shares its
    task had."""
    for group in groups:
        shares = same_prompt(group.rollouts)
        if len(shares) <= 1:
            yield group
            continue
        for share in shares:
            yield replace(
                group, task_text=first_user_request(share[0].messages), rollouts=tuple(share), task_prompts=len(shares)
            )


def prompt_pairing(
    rollouts: Iterable[Rollout], *, by_prompt: Sequence[Sequence[Rollout]] | None = None
) -> tuple[bool, int]:
    """What preference pairs the rollouts' prompts allow (`same_prompt`, worked out once, or given as
    `by_prompt` by a caller that has it): whether some prompt's rollouts have two distinct rewards (a
    best-against-worst pair exists), and how many rewarded rollouts no pair can use because of their prompt:
    the group's rewards differ, yet every rollout rewarded differently from them ran under another prompt
    (their own prompt's rewards are all equal)."""
    shares = same_prompt(rollouts) if by_prompt is None else by_prompt
    subgroups = [kept for members in shares if (kept := [rollout for rollout in members if rollout.reward is not None])]
    rewarded = [rollout for members in subgroups for rollout in members]
    varying = [
        rewards_vary([rollout.reward for rollout in members if rollout.reward is not None]) for members in subgroups
    ]
    if not rewards_vary([rollout.reward for rollout in rewarded if rollout.reward is not None]):
        return any(varying), 0
    return any(varying), sum(len(members) for members, varies in zip(subgroups, varying, strict=True) if not varies)


# --- Filters --------------------------------------------------------------------------------------------


def drop_unrewarded(groups: Iterable[Group]) -> Iterator[Group]:
    for group in groups:
        kept = tuple(rollout for rollout in group.rollouts if rollout.reward is not None)
        if kept:
            yield group if len(kept) == len(group.rollouts) else replace(group, rollouts=kept)


def rewards_vary(rewards: Sequence[float]) -> bool:
    return len(rewards) >= 2 and max(rewards) - min(rewards) > REWARD_TOLERANCE


def drop_equal_rewards(groups: Iterable[Group]) -> Iterator[Group]:
    """Groups with at least two distinct rewards (unrewarded rollouts are not counted)."""
    return (group for group in groups if rewards_vary(group.rewards))


def reward_spread(rollouts: Sequence[Rollout], count: int) -> tuple[Rollout, ...]:
    """`count` rollouts spread over the reward ranking (best first, unrewarded last, ties in input order):
    the best, the worst and evenly spaced ranks between; returned in their input order."""
    if count >= len(rollouts):
        return tuple(rollouts)
    if count <= 0:
        return ()
    ranking = sorted(
        range(len(rollouts)),
        key=lambda index: (rollouts[index].reward is None, -(rollouts[index].reward or 0.0), index),
    )
    if count == 1:
        picked = {ranking[0]}
    else:
        step = (len(rollouts) - 1) / (count - 1)
        picked = {ranking[round(position * step)] for position in range(count)}
    return tuple(rollouts[index] for index in sorted(picked))


def size_bounds(groups: Iterable[Group], minimum: int = 1, maximum: int | None = None) -> Iterator[Group]:
    """Groups of at least `minimum` rollouts; a group above `maximum` keeps a spread (see `reward_spread`)."""
    for group in groups:
        if len(group.rollouts) < minimum:
            continue
        if maximum is not None and len(group.rollouts) > maximum:
            group = replace(group, rollouts=reward_spread(group.rollouts, maximum))
        yield group


def _trajectory_text(rollout: Rollout) -> str:
    """What the rollout itself did, from its first assistant turn on: rollouts of one task share their
    system prompt and request, which would make any two of them look alike."""
    start = next((i for i, message in enumerate(rollout.messages) if message.get("role") == "assistant"), 0)
    parts: list[str] = []
    for message in rollout.messages[start:]:
        parts.append(message_text(message))
        for name, arguments in tool_call_sequence([message]):
            parts.append(f"{name} {arguments}")
    return " ".join(parts)


def shingles(text: str, size: int = SHINGLE_WORDS) -> frozenset[tuple[str, ...]]:
    words = _WORD.findall(text.casefold())
    if len(words) < size:
        return frozenset({tuple(words)}) if words else frozenset()
    return frozenset(tuple(words[index : index + size]) for index in range(len(words) - size + 1))


def jaccard(left: frozenset[Any], right: frozenset[Any]) -> float:
    if not left and not right:
        return 1.0
    return len(left & right) / len(left | right)


def dedupe(groups: Iterable[Group], threshold: float = DEFAULT_DEDUPE_THRESHOLD) -> Iterator[Group]:
    """Each group without near-identical rollouts (see the module docstring); the first of each is kept."""
    for group in groups:
        kept: list[Rollout] = []
        signatures: set[tuple[Any, ...]] = set()
        kept_shingles: list[frozenset[tuple[str, ...]]] = []
        for rollout in group.rollouts:
            signature = (tool_call_sequence(rollout.messages), request_normalise(final_answer(rollout.messages)))
            if signature in signatures:
                continue
            own = shingles(_trajectory_text(rollout))
            if any(jaccard(own, other) >= threshold for other in kept_shingles):
                continue
            signatures.add(signature)
            kept_shingles.append(own)
            kept.append(rollout)
        yield group if len(kept) == len(group.rollouts) else replace(group, rollouts=tuple(kept))


def _stable_fraction(*parts: object) -> float:
    digest = hashlib.sha256(":".join(str(part) for part in parts).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def group_agent(group: Group) -> str:
    """The default family of a group for `balance`: the agent of its first rollout."""
    return str(group.rollouts[0].metadata.get("agent", "")) if group.rollouts else ""


def balance(
    groups: Iterable[Group], per_family: int | None = None, family: Callable[[Group], str] = group_agent
) -> list[Group]:
    """At most `per_family` groups per family (None: the smallest family's count), the ones whose task hash
    is lowest, in input order. Holds every group."""
    held = list(groups)
    families: dict[str, list[int]] = {}
    for index, group in enumerate(held):
        families.setdefault(family(group), []).append(index)
    if not families:
        return []
    cap = min(len(members) for members in families.values()) if per_family is None else per_family
    kept: set[int] = set()
    for members in families.values():
        members.sort(key=lambda index: (_stable_fraction("balance", held[index].task_id), index))
        kept.update(members[:cap])
    return [group for index, group in enumerate(held) if index in kept]


def task_in_validation(task_id: str, share: float, seed: int) -> bool:
    return _stable_fraction("split", seed, task_id) < share


def validation_split(groups: Iterable[Group], share: float, seed: int = 0) -> Iterator[Group]:
    """Each group marked "validation" or "train" by a stable hash of its task (see the module docstring)."""
    for group in groups:
        split: Split = "validation" if task_in_validation(group.task_id, share, seed) else "train"
        yield group if group.split == split else replace(group, split=split)


@dataclass(frozen=True, slots=True)
class Filters:
    """What `curate` applies, in this order: drop unrewarded rollouts, dedupe, size bounds, drop groups with
    equal rewards, balance families, validation split. Build from user input with `Filters.from_dict`."""

    drop_unrewarded: bool = True
    dedupe: bool = True
    dedupe_threshold: float = DEFAULT_DEDUPE_THRESHOLD
    min_group_size: int = 2
    max_group_size: int | None = None
    drop_equal_rewards: bool = True
    balance: bool = False
    max_groups_per_family: int | None = None
    validation_share: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("drop_unrewarded", "dedupe", "drop_equal_rewards", "balance"):
            if not isinstance(getattr(self, name), bool):
                raise FilterError(name, "must be true or false")
        for name in ("min_group_size", "max_group_size", "max_groups_per_family", "seed"):
            value = getattr(self, name)
            if value is None and name in ("max_group_size", "max_groups_per_family"):
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise FilterError(name, "must be an integer")
            if name != "seed" and value < 1:
                raise FilterError(name, "must be at least 1")
        if self.max_group_size is not None and self.max_group_size < self.min_group_size:
            raise FilterError("max_group_size", f"must be at least min_group_size ({self.min_group_size})")
        for name in ("dedupe_threshold", "validation_share"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise FilterError(name, "must be a number")
        if not 0 < self.dedupe_threshold <= 1:
            raise FilterError("dedupe_threshold", "must be above 0 and at most 1")
        if not 0 <= self.validation_share < 1:
            raise FilterError("validation_share", "must be at least 0 and below 1")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Filters:
        known = {item.name for item in fields(cls)}
        for name in data:
            if name not in known:
                raise FilterError(str(name), f"unknown setting (known: {', '.join(sorted(known))})")
        return cls(**data)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def curate(groups: Iterable[Group], filters: Filters) -> Iterator[Group]:
    """The groups through every filter `filters` turns on (streaming, except `balance`)."""
    if filters.drop_unrewarded:
        groups = drop_unrewarded(groups)
    if filters.dedupe:
        groups = dedupe(groups, filters.dedupe_threshold)
    groups = size_bounds(groups, filters.min_group_size, filters.max_group_size)
    if filters.drop_equal_rewards:
        groups = drop_equal_rewards(groups)
    if filters.balance:
        groups = balance(groups, filters.max_groups_per_family)
    return validation_split(groups, filters.validation_share, filters.seed)


# --- Preview --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RewardDistribution:
    count: int
    min: float | None
    max: float | None
    mean: float | None
    std: float | None  # population standard deviation, as GRPO's group advantages use
    quantiles: Mapping[str, float]  # "p10", "p25", "p50", "p75", "p90" (nearest rank)


@dataclass(frozen=True, slots=True)
class Preview:
    """What an export would hold. The `formats` checks read it: `pairable_groups` (a group with a correction, or
    two distinct rewards under one prompt: DPO's pairs), `rewarded`/`unrewarded` rollouts, `corrections`,
    `rewards.max`. `unpaired_by_prompt` counts the rollouts DPO cannot pair because the rollouts rewarded
    differently from them ran under another prompt (see `prompt_pairing`). `mixed_prompt_groups` counts the
    groups whose rollouts ran under more than one prompt (`rollout_prompt`): a group-relative export (ART,
    NeMo Gym) would separate them. `tasks_separated_by_prompt` counts the tasks `separate_prompts` made into one
    group per prompt, of those with a group left after the filters (0 unless the groups were separated)."""

    groups: int
    rollouts: int
    rewarded: int
    unrewarded: int
    corrections: int
    pairable_groups: int
    unpaired_by_prompt: int
    mixed_prompt_groups: int
    tasks_separated_by_prompt: int
    splits: Mapping[str, int]
    group_sizes: Mapping[int, int]  # group size -> number of groups
    rewards: RewardDistribution
    signals: Mapping[str, int]  # signal type -> rollouts it fired on
    tokens: int

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["group_sizes"] = {str(size): count for size, count in sorted(self.group_sizes.items())}
        return data


def _nearest_rank(ordered: Sequence[float], share: float) -> float:
    rank = max(1, math.ceil(share * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def reward_distribution(rewards: Iterable[float]) -> RewardDistribution:
    ordered = sorted(rewards)
    if not ordered:
        return RewardDistribution(count=0, min=None, max=None, mean=None, std=None, quantiles={})
    mean = math.fsum(ordered) / len(ordered)
    std = math.sqrt(math.fsum((value - mean) ** 2 for value in ordered) / len(ordered))
    quantiles = {f"p{round(share * 100)}": _nearest_rank(ordered, share) for share in PREVIEW_QUANTILES}
    return RewardDistribution(
        count=len(ordered), min=ordered[0], max=ordered[-1], mean=mean, std=std, quantiles=quantiles
    )


def rollout_signals(rollout: Rollout) -> list[str]:
    """The signal types in `metadata["signals"]`: a list of names, a list of {"type": ...}, or a name -> count map."""
    raw = rollout.metadata.get("signals")
    if isinstance(raw, Mapping):
        return [str(name) for name, count in raw.items() if count]
    if isinstance(raw, str):
        return [raw]
    if isinstance(raw, Iterable):
        return [str(item.get("type")) if isinstance(item, Mapping) else str(item) for item in raw]
    return []


def separated_task(group: Group, previous: Group | None) -> bool:
    """Whether `group` is the first share of a task `separate_prompts` separated, given the group before it:
    the shares of a task come one after another (`separate_prompts` yields them so, and no filter reorders
    groups), so counting tasks holds nothing but the previous group."""
    return group.task_prompts > 1 and (previous is None or previous.task_id != group.task_id)


def preview(groups: Iterable[Group]) -> Preview:
    """The figures of the groups, in one pass holding only their rewards."""
    group_count = rollouts = unrewarded = corrections = pairable = unpaired = tokens = 0
    mixed = separated = 0
    previous: Group | None = None
    rewards: list[float] = []
    sizes: Counter[int] = Counter()
    splits: Counter[str] = Counter()
    signals: Counter[str] = Counter()
    for group in groups:
        group_count += 1
        sizes[len(group.rollouts)] += 1
        splits[group.split] += 1
        own = group.rewards
        rewards.extend(own)
        group_corrections = sum(1 for rollout in group.rollouts if rollout.correction)
        corrections += group_corrections
        by_prompt = same_prompt(group.rollouts)
        prompt_pairs, prompt_unpaired = prompt_pairing(group.rollouts, by_prompt=by_prompt)
        pairable += prompt_pairs or group_corrections > 0
        unpaired += prompt_unpaired
        mixed += len(by_prompt) > 1
        separated += separated_task(group, previous)
        previous = group
        for rollout in group.rollouts:
            rollouts += 1
            unrewarded += rollout.reward is None
            tokens += rollout.tokens
            signals.update(set(rollout_signals(rollout)))
    return Preview(
        groups=group_count,
        rollouts=rollouts,
        rewarded=len(rewards),
        unrewarded=unrewarded,
        corrections=corrections,
        pairable_groups=pairable,
        unpaired_by_prompt=unpaired,
        mixed_prompt_groups=mixed,
        tasks_separated_by_prompt=separated,
        splits={split: splits[split] for split in SPLITS},
        group_sizes=dict(sorted(sizes.items())),
        rewards=reward_distribution(rewards),
        signals=dict(signals.most_common()),
        tokens=tokens,
    )
