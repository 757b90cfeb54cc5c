"""What a curation selects: trajectories, each with its task, its conversation and its reward.

A curation's `query` (every key optional):
- `agents`: agent slugs; `started_after`, `started_before`: ISO times; `status`: "ok" | "error";
- `tags`: tags every trajectory has; `exclude_tags`: tags none has;
- `signals`: triage signals of which a trajectory has at least one; `without_signals`: none of these;
- `scores`: [{"name", "min"?, "max"?}], each a score the trajectory has within the bounds;
- `datasets`: dataset names: the trajectories eval runs made on their items, and the items' own sources;
- `runs`: eval run ids: the trajectories of their samples;
- `review`: {"informative"?: bool, "failure_modes"?: [...]}: reviewed in a review queue that way;
- `prompt_versions`: [{"prompt", "version"}].

Its `reward` says where each trajectory's reward comes from:
- {"source": "score", "name", "score_source"?: "human" | "evaluator" | "api"}: the mean of those scores;
- {"source": "run_score", "evaluator"}: the eval run's score of the sample the trajectory answered;
- {"source": "trajectory"}: the reward the trajectory itself reported (`keel.reward`);
- {"source": "group_judge", "evaluator"}: a group judge (RULER) scores each group's trajectories together, once per
  group: the rewards are kept (GroupJudgement), so later previews and the export read the same ones;
- {"source": "mix", "parts": [{...one of the above..., "weight"}]}: a weighted mean (group judges excluded).
A trajectory without a reward is left out (and counted). A human correction (a `correction` score) of a
trajectory becomes its preferred completion.

Grouping (`grouping`): "dataset_item" (the eval run item it answered, keyed `<dataset>/v<version>/<position>`),
"task_id" (`task.id`), "first_request" (its normalised first user request), or "auto": the first of these the
trajectory has.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Q, QuerySet

from agent_registry.models import Workspace
from tracing import selectors as tracing_selectors
from tracing.models import ReviewItem, Score, ScoreDataType, Trajectory

QUERY_KEYS = (
    "agents",
    "started_after",
    "started_before",
    "status",
    "tags",
    "exclude_tags",
    "signals",
    "without_signals",
    "scores",
    "datasets",
    "runs",
    "review",
    "prompt_versions",
)
GROUPINGS = ("auto", "dataset_item", "task_id", "first_request")
REWARD_SOURCES = ("score", "run_score", "trajectory", "group_judge", "mix")
SCORE_SOURCES = ("human", "evaluator", "api")
CHUNK = 200  # trajectories read (with their spans) at a time


class CurationInvalid(ValueError):
    def __init__(self, problems: list[dict[str, str]]) -> None:
        super().__init__("; ".join(f"{p['field']}: {p['message']}" for p in problems))
        self.problems = problems


# --- Validation -----------------------------------------------------------------------------------------


def _strings(problems: list[dict[str, str]], name: str, value: object) -> None:
    if not _non_empty_strings(value):
        problems.append({"field": name, "message": "must be a list of non-empty strings"})


def _time(problems: list[dict[str, str]], name: str, value: object) -> None:
    try:
        datetime.fromisoformat(str(value))
    except ValueError:
        problems.append({"field": name, "message": "must be an ISO 8601 time"})


def query_problems(query: object) -> list[dict[str, str]]:
    if not isinstance(query, Mapping):
        return [{"field": "query", "message": "must be an object"}]
    problems: list[dict[str, str]] = []
    for key, value in query.items():
        name = f"query.{key}"
        if key not in QUERY_KEYS:
            problems.append({"field": name, "message": f"unknown; use {', '.join(QUERY_KEYS)}"})
        elif key in ("agents", "tags", "exclude_tags", "signals", "without_signals", "datasets"):
            _strings(problems, name, value)
        elif key in ("started_after", "started_before"):
            _time(problems, name, value)
        elif key == "status" and value not in ("ok", "error"):
            problems.append({"field": name, "message": "must be ok or error"})
        elif key == "runs" and (not isinstance(value, list) or not all(_integer(i) for i in value)):
            problems.append({"field": name, "message": "must be a list of run ids"})
        elif key == "scores":
            if not isinstance(value, list) or not all(
                isinstance(item, Mapping)
                and isinstance(item.get("name"), str)
                and all(_number_or_none(item.get(bound)) for bound in ("min", "max"))
                for item in value
            ):
                problems.append({"field": name, "message": 'must be a list of {"name", "min"?, "max"?} (numbers)'})
        elif key == "review" and not (
            isinstance(value, Mapping)
            and isinstance(value.get("informative"), bool | None)
            and (value.get("failure_modes") is None or _non_empty_strings(value["failure_modes"]))
        ):
            problems.append({"field": name, "message": 'must be {"informative"?: bool, "failure_modes"?: [...]}'})
        elif key == "prompt_versions" and (
            not isinstance(value, list)
            or not all(
                isinstance(item, Mapping)
                and isinstance(item.get("prompt"), str)
                and (item.get("version") is None or _integer(item["version"]))
                for item in value
            )
        ):
            problems.append({"field": name, "message": 'must be a list of {"prompt", "version"?: integer}'})
    return problems


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number_or_none(value: object) -> bool:
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value))


def _non_empty_strings(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) and item for item in value)


def _reward_part_problems(reward: object, name: str, *, in_mix: bool = False) -> list[dict[str, str]]:
    if not isinstance(reward, Mapping):
        return [{"field": name, "message": "must be an object with a source"}]
    source = reward.get("source")
    if source not in REWARD_SOURCES or (in_mix and source in ("mix", "group_judge")):
        allowed = [s for s in REWARD_SOURCES if not in_mix or s not in ("mix", "group_judge")]
        return [{"field": f"{name}.source", "message": f"must be one of {', '.join(allowed)}"}]
    problems = []
    if source == "score":
        if not isinstance(reward.get("name"), str) or not reward.get("name"):
            problems.append({"field": f"{name}.name", "message": "name the score"})
        if reward.get("score_source") not in (None, *SCORE_SOURCES):
            problems.append({"field": f"{name}.score_source", "message": f"one of {', '.join(SCORE_SOURCES)}"})
    if source in ("run_score", "group_judge") and not isinstance(reward.get("evaluator"), str):
        problems.append({"field": f"{name}.evaluator", "message": "name the evaluator"})
    if source == "mix":
        parts = reward.get("parts")
        if not isinstance(parts, list) or not parts:
            return [{"field": f"{name}.parts", "message": "a mix needs parts"}]
        for index, part in enumerate(parts):
            problems += _reward_part_problems(part, f"{name}.parts[{index}]", in_mix=True)
            weight = part.get("weight", 1) if isinstance(part, Mapping) else None
            if isinstance(weight, bool) or not isinstance(weight, int | float) or weight <= 0:
                problems.append({"field": f"{name}.parts[{index}].weight", "message": "a positive number"})
    return problems


def reward_problems(reward: object) -> list[dict[str, str]]:
    return _reward_part_problems(reward, "reward")


def curation_problems(*, query: object, grouping: object, reward: object) -> list[dict[str, str]]:
    problems = query_problems(query) + reward_problems(reward)
    if grouping not in GROUPINGS:
        problems.append({"field": "grouping", "message": f"must be one of {', '.join(GROUPINGS)}"})
    return problems


# --- Selection ------------------------------------------------------------------------------------------


def trajectories(*, workspace: Workspace, query: Mapping[str, Any]) -> QuerySet[Trajectory]:
    """The finished trajectories the query selects, oldest first."""
    from evals.models import DatasetItem, RunSample

    found = Trajectory.objects.filter(workspace=workspace).exclude(status="running")
    if query.get("agents"):
        found = found.filter(agent__slug__in=query["agents"])
    if query.get("started_after"):
        found = found.filter(started_at__gte=datetime.fromisoformat(query["started_after"]))
    if query.get("started_before"):
        found = found.filter(started_at__lt=datetime.fromisoformat(query["started_before"]))
    if query.get("status"):
        found = found.filter(status=query["status"])
    for tag in query.get("tags") or ():
        found = found.filter(tags__contains=[tag])
    if query.get("exclude_tags"):
        found = found.exclude(tags__overlap=query["exclude_tags"])
    if query.get("signals"):
        found = found.filter(signal_names__overlap=query["signals"])
    if query.get("without_signals"):
        found = found.exclude(signal_names__overlap=query["without_signals"])
    for bound in query.get("scores") or ():
        scores = Score.objects.filter(workspace=workspace, name=bound["name"])
        if bound.get("min") is not None:
            scores = scores.filter(value__gte=bound["min"])
        if bound.get("max") is not None:
            scores = scores.filter(value__lte=bound["max"])
        found = found.filter(pk__in=scores.values("trajectory_id"))
    if query.get("datasets"):
        names = query["datasets"]
        made = RunSample.objects.filter(
            item__run__workspace=workspace, item__run__dataset_version__dataset__name__in=names
        ).values("trace_id")
        sources = DatasetItem.objects.filter(
            version__dataset__workspace=workspace, version__dataset__name__in=names
        ).values("source_trace_id")
        found = found.filter(Q(trace_id__in=made) | Q(trace_id__in=sources))
    if query.get("runs"):
        found = found.filter(
            trace_id__in=RunSample.objects.filter(
                item__run__workspace=workspace, item__run_id__in=query["runs"]
            ).values("trace_id")
        )
    review = query.get("review")
    if review:
        items = ReviewItem.objects.filter(sample__workspace=workspace, status="reviewed")
        if review.get("informative") is not None:
            items = items.filter(informative=bool(review["informative"]))
        if review.get("failure_modes"):
            items = items.filter(failure_mode__in=review["failure_modes"])
        found = found.filter(pk__in=items.values("trajectory_id"))
    for use in query.get("prompt_versions") or ():
        versions = Q(prompt_versions__prompt__name=use["prompt"])
        if use.get("version") is not None:
            versions &= Q(prompt_versions__version=use["version"])
        found = found.filter(pk__in=Trajectory.objects.filter(versions).values("pk"))
    return found.order_by("started_at", "pk")


# --- Rewards --------------------------------------------------------------------------------------------


@dataclass
class _Rewards:
    """Reward inputs of a chunk of trajectories, read in a few queries."""

    # trajectory -> (score name, score source) -> values
    scores: dict[int, dict[tuple[str, str], list[float]]] = field(default_factory=dict)
    run_scores: dict[tuple[str, str], float] = field(default_factory=dict)  # (trace id, evaluator)
    corrections: dict[int, str] = field(default_factory=dict)
    items: dict[str, str] = field(default_factory=dict)  # trace id -> the dataset item (or run item) it answered


def _reward_names(reward: Mapping[str, Any]) -> tuple[set[str], set[str]]:
    parts = reward.get("parts") if reward.get("source") == "mix" else [reward]
    scores = {str(part["name"]) for part in parts or () if part.get("source") == "score"}
    evaluators = {str(part["evaluator"]) for part in parts or () if part.get("source") == "run_score"}
    return scores, evaluators


def _rewards_read(workspace: Workspace, chunk: Sequence[Trajectory], reward: Mapping[str, Any]) -> _Rewards:
    from evals.models import RunSample, RunScore

    read = _Rewards()
    score_names, evaluator_names = _reward_names(reward)
    ids = [trajectory.pk for trajectory in chunk]
    trace_ids = [trajectory.trace_id for trajectory in chunk]
    for trajectory_id, name, source, value, data_type, text in Score.objects.filter(trajectory_id__in=ids).values_list(
        "trajectory_id", "name", "source", "value", "data_type", "string_value"
    ):
        if data_type == ScoreDataType.CORRECTION and text:
            read.corrections[trajectory_id] = text
        elif name in score_names and value is not None:
            read.scores.setdefault(trajectory_id, {}).setdefault((name, source), []).append(value)
    if evaluator_names:
        for trace_id, evaluator, value in RunScore.objects.filter(
            sample__item__run__workspace=workspace,
            sample__trace_id__in=trace_ids,
            evaluator_name__in=evaluator_names,
            score__isnull=False,
        ).values_list("sample__trace_id", "evaluator_name", "score"):
            if value is not None:
                read.run_scores[(trace_id, evaluator)] = value
    # A dataset item is named by its dataset, version and position, not its row id: the same in every
    # database (a restored backup, the demo seeded anywhere), so the validation split, a hash of the key, is too.
    for trace_id, dataset, version, position, run_item_id in RunSample.objects.filter(
        item__run__workspace=workspace, trace_id__in=trace_ids
    ).values_list(
        "trace_id",
        "item__dataset_item__version__dataset__name",
        "item__dataset_item__version__version",
        "item__dataset_item__position",
        "item_id",
    ):
        read.items[trace_id] = f"{dataset}/v{version}/{position}" if dataset is not None else f"run-item-{run_item_id}"
    return read


def _part_reward(part: Mapping[str, Any], trajectory: Trajectory, read: _Rewards) -> float | None:
    source = part["source"]
    if source == "trajectory":
        return trajectory.reward
    if source == "run_score":
        return read.run_scores.get((trajectory.trace_id, str(part["evaluator"])))
    if source == "score":
        wanted = part.get("score_source")
        values = [
            value
            for (name, score_source), found in read.scores.get(trajectory.pk, {}).items()
            if name == part["name"] and (wanted is None or score_source == wanted)
            for value in found
        ]
        return sum(values) / len(values) if values else None
    return None  # a group judge scores whole groups, at export


def reward_of(reward: Mapping[str, Any], trajectory: Trajectory, read: _Rewards) -> float | None:
    if reward.get("source") != "mix":
        return _part_reward(reward, trajectory, read)
    total = weight_sum = 0.0
    for part in reward["parts"]:
        value = _part_reward(part, trajectory, read)
        if value is None:
            return None  # every part is needed for a mix
        weight = float(part.get("weight", 1))
        total += weight * value
        weight_sum += weight
    return total / weight_sum


# --- Curated trajectories -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Curated:
    """One selected trajectory, ready to be grouped."""

    trace_id: str
    task_keys: Mapping[str, str]  # "dataset_item", "task_id", "first_request" -> key, where it has one
    task_text: str
    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...]
    reward: float | None
    correction: str | None
    tokens: int
    metadata: Mapping[str, Any]
    # The trajectory's figures, for a trainer's logs (ART's and Gym's per-rollout metrics).
    metrics: Mapping[str, float | int] = field(default_factory=dict)


def _metrics(trajectory: Trajectory) -> dict[str, float | int]:
    return {
        "steps": trajectory.step_count,
        "llm_calls": trajectory.llm_call_count,
        "tool_calls": trajectory.tool_call_count,
        "errors": trajectory.error_count,
        "tokens": trajectory.total_tokens,
        "latency_s": round(trajectory.latency_ms / 1000, 3),
        # No figure when no price covered the trajectory's model calls: 0 would say it was free.
        **({"cost_usd": float(trajectory.cost_usd)} if trajectory.cost_usd is not None else {}),
        "triage_score": trajectory.triage_score,
    }


def _first_request(messages: Sequence[Mapping[str, Any]]) -> str:
    for message in messages:
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def curated(
    *, workspace: Workspace, query: Mapping[str, Any], reward: Mapping[str, Any], limit: int | None = None
) -> Iterator[Curated]:
    """The query's trajectories with their rewards and conversations, read in chunks."""
    selected = trajectories(workspace=workspace, query=query).select_related("agent")
    if limit is not None:
        selected = selected[:limit]
    chunk: list[Trajectory] = []
    for trajectory in selected.iterator(chunk_size=CHUNK):
        chunk.append(trajectory)
        if len(chunk) >= CHUNK:
            yield from _chunk(workspace, chunk, reward)
            chunk = []
    if chunk:
        yield from _chunk(workspace, chunk, reward)


def _chunk(workspace: Workspace, chunk: Sequence[Trajectory], reward: Mapping[str, Any]) -> Iterator[Curated]:
    read = _rewards_read(workspace, chunk, reward)
    views = tracing_selectors.trajectory_views(trajectories=chunk)
    prompt_versions: dict[int, list[str]] = defaultdict(list)
    for trajectory_id, name, version in Trajectory.prompt_versions.through.objects.filter(
        trajectory_id__in=[t.pk for t in chunk]
    ).values_list("trajectory_id", "promptversion__prompt__name", "promptversion__version"):
        prompt_versions[trajectory_id].append(f"{name}@{version}")
    for trajectory in chunk:
        view = views[trajectory.pk]
        messages = tuple(dict(message) for message in view.conversation)
        first = _first_request(messages) or trajectory.input_preview
        keys: dict[str, str] = {}
        if trajectory.trace_id in read.items:
            keys["dataset_item"] = read.items[trajectory.trace_id]
        if view.task_id or trajectory.task_id:
            keys["task_id"] = str(view.task_id or trajectory.task_id)
        if first.strip():
            keys["first_request"] = first
        yield Curated(
            trace_id=trajectory.trace_id,
            task_keys=keys,
            task_text=first,
            messages=messages,
            tools=tuple(dict(tool) for tool in view.tool_definitions),
            reward=reward_of(reward, trajectory, read),
            correction=read.corrections.get(trajectory.pk),
            tokens=trajectory.total_tokens,
            metadata={
                "trace_id": trajectory.trace_id,
                "agent": trajectory.agent.slug if trajectory.agent else None,
                "signals": list(trajectory.signal_names),
                "status": trajectory.status,
                "prompt_versions": prompt_versions.get(trajectory.pk, []),
                "started_at": trajectory.started_at.isoformat(),
            },
            metrics=_metrics(trajectory),
        )
