"""Evaluators as runs use them: a stored `Evaluator` version turned into the object that scores.

Three families share one config shape, `{"type": ..., <settings>}`:
- deterministic verifiers and embedding similarity (evals/verifiers.py),
- LLM judges, the RULER-style group judge and the reference-free group evaluation (evals/judges.py),
  whose model calls go through the workspace's model targets (routing.providers, with their retries
  and fallbacks),
- trajectory metrics (evals/trajectory_metrics.py).

A group evaluator scores all samples of an item at once; the others score one sample at a time. Every
score carries the stored evaluator's name and version, whatever the object reports itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent_registry.models import Agent
from config.errors import KeelError
from evals import judges, trajectory_metrics, verifiers
from evals.models import Evaluator
from routing import providers
from routing.models import ModelTarget, RouterConfig

EvaluatorConfigError = verifiers.EvaluatorConfigError
ModelUnavailable = judges.ModelUnavailable
TYPES: tuple[str, ...] = (
    *verifiers.BUILT_INS,
    verifiers.CUSTOM_TYPE,
    *judges.JUDGE_TYPES,
    *trajectory_metrics.TRAJECTORY_METRICS,
)
# Types that read a model: a provider outage pauses a run that uses them.
MODEL_TYPES = frozenset(judges.JUDGE_TYPES)
# Types that compare two outputs: they compare runs, and cannot score a run's samples.
PAIRWISE_TYPES = frozenset({"pairwise_judge"})


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What a run keeps of an evaluator version: enough to build it again when the run resumes."""

    id: int | None
    name: str
    version: int
    type: str
    config: Mapping[str, Any]

    @classmethod
    def of(cls, evaluator: Evaluator) -> Snapshot:
        return cls(evaluator.pk, evaluator.name, evaluator.version, evaluator.type, dict(evaluator.config))

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Snapshot:
        return cls(data.get("id"), str(data["name"]), int(data["version"]), str(data["type"]), dict(data["config"]))

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "version": self.version,
            "type": self.type,
            "config": dict(self.config),
        }


@dataclass(frozen=True, slots=True)
class Built:
    """A ready evaluator: `single` scores one output, `group` scores an item's outputs together."""

    snapshot: Snapshot
    single: verifiers.Evaluator | None = None
    group: Any = None  # judges.GroupEvaluator

    def scores(self, item: verifiers.EvalItem, outputs: Sequence[verifiers.EvalOutput]) -> list[verifiers.Score]:
        """One score per output, stamped with the stored name and version. ModelUnavailable propagates."""
        if self.group is not None:
            try:
                results = list(self.group.evaluate_group(item, outputs))
            except ModelUnavailable:
                raise
            except Exception as error:  # noqa: BLE001 - a broken group evaluator errors the item, not the run
                results = [
                    verifiers.Score(self.snapshot.name, self.snapshot.version, None, False, error=f"{error}")
                    for _ in outputs
                ]
        else:
            assert self.single is not None
            results = [self._one(item, output) for output in outputs]
        return [
            dataclasses.replace(score, evaluator=self.snapshot.name, version=self.snapshot.version) for score in results
        ]

    def _one(self, item: verifiers.EvalItem, output: verifiers.EvalOutput) -> verifiers.Score:
        assert self.single is not None
        try:
            result = self.single.evaluate(item, output)
        except ModelUnavailable:
            raise
        except Exception:  # noqa: BLE001 - evaluate_safely turns it into an errored score
            return verifiers.evaluate_safely(self.single, item, output)
        return result


def agent_mismatches(
    chosen: Iterable[Evaluator], *, agent: Agent | None, field: str = "evaluators"
) -> list[dict[str, str]]:
    """One problem ({"field", "message"}) per evaluator of `chosen` that belongs to an agent other than
    `agent`. An agent's suite, run or online rule takes its own evaluators and the workspace-wide ones (no
    agent); what has no agent itself (a workspace-wide suite) may take any of the workspace's."""
    if agent is None:
        return []
    return [
        {
            "field": field,
            "message": f"the evaluator {evaluator.name} belongs to the agent {evaluator.agent.slug}, "
            f"not to {agent.slug}",
        }
        for evaluator in chosen
        # The agent is read only for a mismatch, to name it.
        if evaluator.agent_id not in (None, agent.pk) and evaluator.agent is not None
    ]


def agent_mismatch_refuse(
    chosen: Iterable[Evaluator],
    *,
    agent: Agent | None,
    error: type[KeelError],
    about: str,
    note: str = "",
    field: str = "evaluators",
) -> None:
    """Raise `error` ("<about>: <the first mismatch><note>", with every mismatch as `errors`) when one of
    `chosen` belongs to an agent other than `agent` (`agent_mismatches`)."""
    mismatches = agent_mismatches(chosen, agent=agent, field=field)
    if mismatches:
        raise error(f"{about}: {mismatches[0]['message']}{note}", errors=mismatches)


def _model_text(target: ModelTarget) -> judges.Complete:
    def complete(messages: list[dict[str, Any]], response_format: dict[str, Any] | None) -> str:
        parameters: dict[str, Any] = {"temperature": 0}
        if response_format is not None:
            parameters["response_format"] = response_format
        try:
            answer = providers.completion(target=target, messages=messages, parameters=parameters)
        except providers.ProviderFailed as error:
            attempts = error.extra.get("attempts") or []
            refused = any((attempt.get("status_code") or 0) in range(400, 429) for attempt in attempts)
            if refused:  # the provider will refuse this request again: the item errors, the run goes on
                raise RuntimeError(error.detail) from None
            raise ModelUnavailable(error.detail) from None
        return answer.text

    return complete


def _judge_target(*, workspace_id: int, agent_id: int | None, alias: str | None) -> ModelTarget:
    if alias:
        target = ModelTarget.objects.filter(workspace_id=workspace_id, alias=alias, enabled=True).first()
        if target is None:
            raise EvaluatorConfigError("model", f"there is no enabled model target {alias!r}")
        return target
    config = RouterConfig.objects.select_related("judge_target").filter(agent_id=agent_id).first() if agent_id else None
    if config is not None and config.judge_target is not None:
        return config.judge_target
    raise EvaluatorConfigError("model", "name the judge's model target (the agent's router has no judge target)")


def validate(config: Mapping[str, Any]) -> None:
    """Raise EvaluatorConfigError when the config cannot build an evaluator; model targets are not looked
    up here (see `build`)."""

    def unused(_: str | None) -> judges.Complete:
        def complete(messages: list[dict[str, Any]], response_format: dict[str, Any] | None) -> str:
            raise ModelUnavailable("validation builds judges without a model")

        return complete

    _construct(config, complete_for=unused)


def _construct(config: Mapping[str, Any], *, complete_for: Callable[[str | None], judges.Complete]) -> Any:
    if not isinstance(config, Mapping):
        raise EvaluatorConfigError("config", "an evaluator config is an object")
    kind = config.get("type")
    if kind in judges.JUDGE_TYPES:
        return judges.judge_from_config(config, complete_for=complete_for)
    if kind in trajectory_metrics.TRAJECTORY_METRICS:
        return trajectory_metrics.trajectory_metric_from_config(config)
    return verifiers.evaluator_from_config(config)


def _complete_for(workspace_id: int, agent_id: int | None) -> Callable[[str | None], judges.Complete]:
    def complete_for(alias: str | None) -> judges.Complete:
        return _model_text(_judge_target(workspace_id=workspace_id, agent_id=agent_id, alias=alias))

    return complete_for


def build_pairwise(snapshot: Snapshot, *, workspace_id: int, agent_id: int | None) -> judges.PairwiseJudge:
    """A pairwise judge, for comparing two runs' answers."""
    built = _construct(snapshot.config, complete_for=_complete_for(workspace_id, agent_id))
    if not isinstance(built, judges.PairwiseJudge):
        raise EvaluatorConfigError("type", f"{snapshot.type} is not a pairwise judge")
    return built


def build(snapshot: Snapshot, *, workspace_id: int, agent_id: int | None) -> Built:
    """The evaluator of a snapshot; judge models are the named model targets (or the agent's judge)."""
    built = _construct(snapshot.config, complete_for=_complete_for(workspace_id, agent_id))
    if judges.is_group_evaluator(built):
        return Built(snapshot, group=built)
    if not isinstance(built, verifiers.Evaluator):
        raise EvaluatorConfigError("type", f"{snapshot.type} compares two outputs; it cannot score a run's samples")
    return Built(snapshot, single=built)
