"""Writes of the evals: datasets and their versions, evaluators, suites, and proposals from the commitment.

Every change to a dataset's items creates the next version with the whole item list (see
evals/models.py); nothing updates or deletes a version's items. Items are validated whole before
anything is written, so bad input leaves the dataset as it was.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError, transaction
from django.db.models import Max

from agent_registry.models import Agent, ApiKey, User, Workspace
from evals import dataset_items, exceptions, selectors
from evals.models import (
    Dataset,
    DatasetItem,
    DatasetVersion,
    Evaluator,
    OnlineRule,
    Suite,
    SuiteEvaluator,
    SuiteTarget,
)
from tracing import selectors as tracing_selectors
from tracing.models import Trajectory
from tracing.steps import TrajectoryView

AgentIds = selectors.AgentIds
# An upload larger than this is refused before it is parsed.
MAX_UPLOAD_BYTES = 20 * 1024 * 1024
MAX_ITEMS = 50_000


def _items_invalid(error: dataset_items.ItemsInvalid) -> exceptions.DatasetItemsInvalid:
    return exceptions.DatasetItemsInvalid(
        f"invalid items: {error}", errors=[problem.as_dict() for problem in error.problems]
    )


@transaction.atomic
def dataset_create(
    *,
    workspace: Workspace,
    name: str,
    description: str = "",
    agent: Agent | None = None,
    created_by: User | None = None,
    created_via_key: ApiKey | None = None,
) -> Dataset:
    """A dataset without versions; its first items create version 1. The name is unique per workspace."""
    dataset = Dataset(
        workspace=workspace,
        agent=agent,
        name=name,
        description=description,
        created_by=created_by,
        created_via_key=created_via_key,
    )
    try:
        dataset.full_clean(validate_constraints=False)
    except DjangoValidationError as error:
        raise exceptions.DatasetInvalid(
            "invalid dataset",
            errors=[{"field": key, "message": "; ".join(value)} for key, value in error.message_dict.items()],
        ) from None
    if Dataset.objects.filter(workspace=workspace, name=name).exists():
        raise exceptions.DatasetExists(f"a dataset named {name!r} exists")
    try:
        with transaction.atomic():
            dataset.save()
    except IntegrityError:  # a concurrent create with the same name won
        raise exceptions.DatasetExists(f"a dataset named {name!r} exists") from None
    return dataset


@transaction.atomic
def dataset_version_create_from_items(
    *,
    dataset: Dataset,
    items: Sequence[dataset_items.ItemData],
    message: str = "",
    created_by: User | None = None,
    created_via_key: ApiKey | None = None,
) -> DatasetVersion:
    """The dataset's next version, holding exactly `items` in order; an item without a key gets its
    input's hash (`dataset_items.items_keyed`), and two items with the same key are refused.

    The dataset row is locked so that two concurrent writes get consecutive numbers, not a conflict."""
    if len(items) > MAX_ITEMS:
        raise exceptions.DatasetInvalid(
            f"a version holds at most {MAX_ITEMS} items", errors=[{"field": "items", "message": "too many items"}]
        )
    try:
        items = dataset_items.items_keyed(items)
    except dataset_items.ItemsInvalid as error:
        raise _items_invalid(error) from None
    Dataset.objects.select_for_update().filter(pk=dataset.pk).get()
    latest = DatasetVersion.objects.filter(dataset=dataset).aggregate(latest=Max("version"))["latest"] or 0
    version = DatasetVersion(
        dataset=dataset,
        version=latest + 1,
        message=message,
        item_count=len(items),
        created_by=created_by,
        created_via_key=created_via_key,
    )
    version.full_clean()
    version.save()
    DatasetItem.objects.bulk_create(
        [
            DatasetItem(
                version=version,
                position=position,
                key=item.key,
                task=item.task,
                input_messages=[dict(message) for message in item.input_messages],
                reference_output=item.reference_output or "",
                expected_tool_calls=(
                    None if item.expected_tool_calls is None else [dict(call) for call in item.expected_tool_calls]
                ),
                expected_state=None if item.expected_state is None else dict(item.expected_state),
                metadata=dict(item.metadata),
                source_trace_id=item.source_trace_id,
            )
            for position, item in enumerate(items)
        ]
    )
    return version


def dataset_items_parse(data: Sequence[Any]) -> list[dataset_items.ItemData]:
    """Items sent as JSON; raises `DatasetItemsInvalid` naming each item (counted from 1) and field."""
    try:
        return dataset_items.items_parse(data)
    except dataset_items.ItemsInvalid as error:
        raise _items_invalid(error) from None


def dataset_items_from_upload(*, content: bytes, file_format: str) -> list[dataset_items.ItemData]:
    """The items of a JSONL or CSV file; raises `DatasetItemsInvalid` naming each bad line and field."""
    if file_format not in selectors.FORMATS:
        raise exceptions.DatasetInvalid(
            "format must be jsonl or csv", errors=[{"field": "format", "message": "must be jsonl or csv"}]
        )
    if len(content) > MAX_UPLOAD_BYTES:
        raise exceptions.DatasetFileTooLarge(f"the file is over {MAX_UPLOAD_BYTES} bytes")
    try:
        return dataset_items.items_from_file(content, file_format=file_format)
    except dataset_items.ItemsInvalid as error:
        raise _items_invalid(error) from None


def dataset_item_from_trajectory(
    *, trajectory: Trajectory, view: TrajectoryView | None = None
) -> dataset_items.ItemData:
    """An item from a stored trajectory: the messages its first model call read, its final answer as the
    reference, its tool calls (in order) as the expected ones, linked by its trace id. `view`: the
    trajectory's view when the caller has read it already."""
    view = view or tracing_selectors.trajectory_view(trajectory=trajectory)
    llm_steps = [step for step in view.steps if step.input_messages is not None or step.output_message is not None]
    messages: list[dict[str, Any]] = []
    first_read = next((step.input_messages for step in llm_steps if step.input_messages), None)
    if first_read:
        messages = [dict(message) for message in first_read]
    task = "" if messages else trajectory.input_preview
    if not messages and not task.strip():
        raise exceptions.TrajectoryNotUsable(
            f"trajectory {trajectory.trace_id} recorded no input messages or input to make an item of",
            errors=[{"field": "trace_ids", "message": f"{trajectory.trace_id} has no input"}],
        )
    reference: str | None = None
    for step in reversed(llm_steps):
        if step.output_message is not None:
            reference = dataset_items.content_text(step.output_message.get("content"))
            if reference:
                break
    if not reference:
        reference = trajectory.output_preview or None
    tool_calls = [
        {"name": call.name, "arguments": call.arguments if isinstance(call.arguments, dict) else {}}
        for call in view.tool_calls
    ]
    metadata: dict[str, Any] = {}
    if trajectory.agent_id is not None and trajectory.agent is not None:
        metadata["agent"] = trajectory.agent.slug
    if view.task_id:
        metadata["task_id"] = view.task_id
    return dataset_items.ItemData(
        task=task,
        input_messages=tuple(messages),
        reference_output=reference,
        expected_tool_calls=tuple(tool_calls),
        metadata=metadata,
        source_trace_id=trajectory.trace_id,
    )


@transaction.atomic
def dataset_add_trajectories(
    *,
    dataset: Dataset,
    trace_ids: Sequence[str],
    agent_ids: AgentIds = None,
    message: str = "",
    created_by: User | None = None,
    created_via_key: ApiKey | None = None,
) -> DatasetVersion:
    """The next version: the latest version's items plus one item per trajectory, in the order given.
    A trajectory the latest version holds already is not added again; when it holds them all, there is
    no new version (DatasetTrajectoriesPresent, 409).

    Trajectories are looked up in the dataset's workspace (and the caller's agents); one that is not
    found or not usable fails the whole call, and no version is created."""
    if not trace_ids:
        raise exceptions.DatasetInvalid(
            "name at least one trace id", errors=[{"field": "trace_ids", "message": "must not be empty"}]
        )
    trajectories = [
        tracing_selectors.trajectory_get(workspace=dataset.workspace, trace_id=trace_id, agent_ids=agent_ids)
        for trace_id in dict.fromkeys(trace_ids)  # a trace named twice is added once
    ]
    # Locked before the latest version is read, so a concurrent write cannot slip in between.
    Dataset.objects.select_for_update().filter(pk=dataset.pk).get()
    latest = selectors.dataset_version_latest(dataset=dataset)
    previous = [] if latest is None else selectors.dataset_version_items(version=latest)
    present = {item.source_trace_id for item in previous if item.source_trace_id}
    new_items = [
        dataset_item_from_trajectory(trajectory=trajectory)
        for trajectory in trajectories
        if trajectory.trace_id not in present
    ]
    if latest is not None and not new_items:
        raise exceptions.DatasetTrajectoriesPresent(
            f"version {latest.version} of {dataset.name} holds every trajectory named already; no new version"
        )
    return dataset_version_create_from_items(
        dataset=dataset,
        items=[*previous, *new_items],
        message=message or f"added {len(new_items)} item(s) from trajectories",
        created_by=created_by,
        created_via_key=created_via_key,
    )


# --- Evaluators -----------------------------------------------------------------------------------------


def _config_problems(config: Any) -> list[dict[str, str]]:
    from evals import evaluators

    if not isinstance(config, dict):
        return [{"field": "config", "message": "must be an object with a type"}]
    if config.get("type") not in evaluators.TYPES:
        return [{"field": "config.type", "message": f"must be one of {', '.join(evaluators.TYPES)}"}]
    try:
        evaluators.validate(config)
    except evaluators.EvaluatorConfigError as error:
        return [{"field": f"config.{error.field}", "message": error.message}]
    return []


@transaction.atomic
def evaluator_create(
    *,
    workspace: Workspace,
    name: str,
    config: dict[str, Any],
    description: str = "",
    agent: Agent | None = None,
    created_by: User | None = None,
) -> Evaluator:
    """The next version of the evaluator `name` (version 1 for a new name). Suites and online rules that
    used its previous version move to this one; runs keep the version they ran with."""
    problems = _config_problems(config)
    evaluator = Evaluator(
        workspace=workspace,
        agent=agent,
        name=name,
        version=1,
        type=str(config.get("type", "")) if isinstance(config, dict) else "",
        config=config if isinstance(config, dict) else {},
        description=description,
        created_by=created_by,
    )
    try:
        evaluator.full_clean(exclude=["workspace", "agent", "created_by", "type"], validate_constraints=False)
    except DjangoValidationError as error:
        problems += [{"field": key, "message": "; ".join(value)} for key, value in error.message_dict.items()]
    if agent is not None and agent.workspace_id != workspace.pk:
        problems.append({"field": "agent", "message": "the agent belongs to another workspace"})
    if problems:
        raise exceptions.EvaluatorInvalid(
            f"invalid evaluator: {problems[0]['field']}: {problems[0]['message']}", errors=problems
        )
    previous = Evaluator.objects.select_for_update().filter(workspace=workspace, name=name).order_by("-version").first()
    if previous is not None:
        evaluator.version = previous.version + 1
        evaluator.agent = agent or previous.agent
        evaluator.description = description or previous.description
        _evaluator_users_check(evaluator)
    evaluator.save()
    if previous is not None:
        SuiteEvaluator.objects.filter(evaluator__workspace=workspace, evaluator__name=name).update(evaluator=evaluator)
        for rule in OnlineRule.objects.filter(evaluators__workspace=workspace, evaluators__name=name).distinct():
            rule.evaluators.remove(*rule.evaluators.filter(name=name))
            rule.evaluators.add(evaluator)
    return evaluator


def _evaluator_users_check(evaluator: Evaluator) -> None:
    """A new version takes over the suites and online rules that use its name: refused when one of them
    belongs to another agent than the version's (a workspace-wide evaluator given an agent, or one moved
    to another agent), which would leave that suite or rule judged by another agent's evaluator."""
    if evaluator.agent is None:
        return
    named = {"workspace_id": evaluator.workspace_id, "name": evaluator.name}
    others = [
        f"the suite {name}"
        for name in Suite.objects.filter(
            suite_evaluators__evaluator__in=Evaluator.objects.filter(**named), agent__isnull=False
        )
        .exclude(agent=evaluator.agent)
        .order_by("name")
        .values_list("name", flat=True)
        .distinct()
    ] + [
        f"the online rule {name}"
        for name in OnlineRule.objects.filter(evaluators__in=Evaluator.objects.filter(**named))
        .exclude(agent=evaluator.agent)
        .order_by("name")
        .values_list("name", flat=True)
        .distinct()
    ]
    if others:
        message = f"this version would judge {', '.join(others)}, of another agent than {evaluator.agent.slug}"
        raise exceptions.EvaluatorAgentMismatch(
            f"invalid evaluator: agent: {message}", errors=[{"field": "agent", "message": message}]
        )


# --- Suites ---------------------------------------------------------------------------------------------

SUITE_FIELDS = (
    "description",
    "dataset",
    "dataset_version",
    "target",
    "prompt_label",
    "prompt_version",
    "tier",
    "model_target",
    "variables",
    "samples",
    "concurrency",
    "schedule_cron",
    "schedule_enabled",
)
TIERS = ("single_call", "chain", "agentic", "human")


def _suite_problems(suite: Suite) -> list[dict[str, str]]:
    from evals import schedules

    problems: list[dict[str, str]] = []
    if suite.target not in SuiteTarget.values:
        problems.append({"field": "target", "message": f"must be one of {', '.join(SuiteTarget.values)}"})
    if not 1 <= suite.samples <= 64:
        problems.append({"field": "samples", "message": "k is 1 to 64"})
    if not 1 <= suite.concurrency <= 64:
        problems.append({"field": "concurrency", "message": "1 to 64 items at a time"})
    if not isinstance(suite.variables, dict):
        problems.append({"field": "variables", "message": "must be an object of variable name to value"})
    if suite.tier and suite.tier not in TIERS:
        problems.append({"field": "tier", "message": f"must be one of {', '.join(TIERS)}, or empty"})
    workspace_id = suite.workspace_id
    for field_name, row in (
        ("agent", suite.agent),
        ("dataset", suite.dataset),
        ("model_target", suite.model_target),
    ):
        if row is not None and row.workspace_id != workspace_id:
            problems.append({"field": field_name, "message": "belongs to another workspace"})
    if suite.dataset_version is not None and suite.dataset_version.dataset_id != suite.dataset_id:
        problems.append({"field": "dataset_version", "message": "is a version of another dataset"})
    if suite.prompt_version is not None and (
        suite.agent is None or suite.prompt_version.prompt.agent_id != suite.agent_id
    ):
        problems.append({"field": "prompt_version", "message": "is not a prompt version of the suite's agent"})
    if suite.target == SuiteTarget.AGENT and suite.agent is None:
        problems.append({"field": "agent", "message": "an agent target needs an agent"})
    if suite.target == SuiteTarget.MODEL_TARGET and suite.model_target is None:
        problems.append({"field": "model_target", "message": "a model target suite needs the model target"})
    if suite.schedule_cron and (error := schedules.cron_error(suite.schedule_cron)):
        problems.append({"field": "schedule_cron", "message": error})
    if suite.schedule_enabled and not suite.schedule_cron:
        problems.append({"field": "schedule_cron", "message": "a schedule needs a cron expression"})
    try:
        suite.full_clean(
            exclude=[
                "workspace",
                "agent",
                "dataset",
                "dataset_version",
                "prompt_version",
                "model_target",
                "created_by",
            ],
            validate_constraints=False,
        )
    except DjangoValidationError as error:
        problems += [{"field": key, "message": "; ".join(value)} for key, value in error.message_dict.items()]
    return problems


def _suite_evaluators_set(suite: Suite, chosen: Sequence[Evaluator]) -> None:
    from evals import evaluators

    if any(evaluator.workspace_id != suite.workspace_id for evaluator in chosen):
        raise exceptions.SuiteInvalid(
            "an evaluator of another workspace", errors=[{"field": "evaluators", "message": "unknown evaluator"}]
        )
    evaluators.agent_mismatch_refuse(
        chosen, agent=suite.agent, error=exceptions.SuiteEvaluatorAgentMismatch, about="invalid suite"
    )
    if any(evaluator.type in evaluators.PAIRWISE_TYPES for evaluator in chosen):
        raise exceptions.SuiteInvalid(
            "a pairwise judge compares two runs (GET /runs/compare?judge=...); it cannot score a suite's samples",
            errors=[{"field": "evaluators", "message": "a pairwise judge cannot be a suite's evaluator"}],
        )
    names = [evaluator.name for evaluator in chosen]
    if len(set(names)) != len(names):
        raise exceptions.SuiteInvalid(
            "each evaluator once", errors=[{"field": "evaluators", "message": "an evaluator is named twice"}]
        )
    SuiteEvaluator.objects.filter(suite=suite).delete()
    SuiteEvaluator.objects.bulk_create(
        [SuiteEvaluator(suite=suite, evaluator=evaluator, position=index) for index, evaluator in enumerate(chosen)]
    )


def _schedule_settle(suite: Suite, was_enabled: bool, old_cron: str) -> None:
    from evals import schedules

    if suite.schedule_enabled and (not was_enabled or old_cron != suite.schedule_cron):
        schedules.schedule_start(suite=suite)


@transaction.atomic
def suite_create(
    *,
    workspace: Workspace,
    name: str,
    agent: Agent | None = None,
    evaluators_used: Sequence[Evaluator] = (),
    proposed: bool = False,
    created_by: User | None = None,
    **fields: Any,
) -> Suite:
    unknown = sorted(set(fields) - set(SUITE_FIELDS))
    if unknown:
        raise exceptions.SuiteInvalid(
            f"unknown suite fields: {', '.join(unknown)}",
            errors=[{"field": key, "message": "unknown"} for key in unknown],
        )
    suite = Suite(workspace=workspace, agent=agent, name=name, proposed=proposed, created_by=created_by, **fields)
    problems = _suite_problems(suite)
    if Suite.objects.filter(workspace=workspace, name=name).exists():
        problems.append({"field": "name", "message": "a suite with this name exists"})
    if problems:
        raise exceptions.SuiteInvalid(
            f"invalid suite: {problems[0]['field']}: {problems[0]['message']}", errors=problems
        )
    _schedule_settle(suite, False, "")
    suite.save()
    _suite_evaluators_set(suite, evaluators_used)
    return suite


@transaction.atomic
def suite_update(*, suite: Suite, evaluators_used: Sequence[Evaluator] | None = None, **fields: Any) -> Suite:
    unknown = sorted(set(fields) - set(SUITE_FIELDS))
    if unknown:
        raise exceptions.SuiteInvalid(
            f"unknown suite fields: {', '.join(unknown)}",
            errors=[{"field": key, "message": "unknown"} for key in unknown],
        )
    Suite.objects.select_for_update().filter(pk=suite.pk).get()
    was_enabled, old_cron = suite.schedule_enabled, suite.schedule_cron
    for key, value in fields.items():
        setattr(suite, key, value)
    problems = _suite_problems(suite)
    if problems:
        suite.refresh_from_db()
        raise exceptions.SuiteInvalid(
            f"invalid suite: {problems[0]['field']}: {problems[0]['message']}", errors=problems
        )
    _schedule_settle(suite, was_enabled, old_cron)
    suite.proposed = False  # edited by the team: no longer only Keel's proposal
    suite.save()
    if evaluators_used is not None:
        _suite_evaluators_set(suite, evaluators_used)
    return suite


def suite_delete(*, suite: Suite) -> None:
    suite.delete()


# --- Proposals from the evaluation commitment -------------------------------------------------------------


@dataclass(frozen=True)
class Proposal:
    suites: list[Suite]
    rules: list[OnlineRule]


def judge_alias(agent: Agent) -> str | None:
    from routing.models import ModelTarget, RouterConfig

    config = RouterConfig.objects.select_related("judge_target").filter(agent=agent).first()
    if config is not None and config.judge_target is not None:
        return config.judge_target.alias
    target = ModelTarget.objects.filter(workspace_id=agent.workspace_id, enabled=True).order_by("alias").first()
    return target.alias if target else None


def _metric_config(metric: Any, *, trajectory: bool, derived: Any, judge: str | None) -> dict[str, Any]:
    """A first evaluator for a committed metric: a trajectory check where one measures it, else a judge
    with the metric's description as its rubric. The team edits it; the name stays the metric's."""
    name = metric.name
    if trajectory and "compliance" in name and derived is not None:
        gated = [rule["action"] for rule in derived.approval_rules.value if rule.get("approval") == "always"]
        constraints = [
            {"tool": rule["action"], "argument": "amount", "max": float(rule["amount_usd"])}
            for rule in derived.approval_rules.value
            if rule.get("approval") == "above_amount"
        ]
        return {
            "type": "policy_compliance",
            "gated_actions": gated,
            "constraints": constraints,
            "allowed_tools": list(derived.tool_allow_list.value),
        }
    goal = metric.description or name.replace("_", " ")
    # The commitment's target is on the metric's own scale (a rate, a 1-5 rating); the judge scores how
    # well one answer serves the goal, higher being better, and the team calibrates it against people.
    rubric = f"The team measures: {goal}. Score how well the response serves this, a higher score being better."
    config: dict[str, Any] = {"type": "llm_judge", "rubric": rubric, "scale": "0-10"}
    if judge:
        config["model"] = judge
    return config


@transaction.atomic
def suites_propose(*, agent: Agent, created_by: User | None = None) -> Proposal:
    """Suites and online rules from the agent's evaluation commitment, as its derived configuration
    names them: output metrics → a nightly suite on the agent's dataset; trajectory metrics → an online
    rule at the governance sampling rate. Each metric gets an evaluator named after it (made once).
    Idempotent: what exists is left as the team edited it."""
    from agent_registry import requirements as requirements_module
    from agent_registry import selectors as registry_selectors
    from evals import evaluators, online, schedules

    answers = registry_selectors.requirements_current(agent=agent)
    if answers is None:
        raise exceptions.SuiteInvalid(
            f"the agent {agent.slug} has no requirements yet",
            errors=[{"field": "agent", "message": "answer the six forcing questions first"}],
        )
    derived = requirements_module.derived_configuration(answers)
    judge = judge_alias(agent)
    workspace = agent.workspace
    datasets = list(Dataset.objects.filter(workspace=workspace, agent=agent).order_by("name")[:2])
    made_suites: list[Suite] = []
    made_rules: list[OnlineRule] = []

    def evaluator_for(metric: Any, *, trajectory: bool) -> Evaluator:
        existing = Evaluator.objects.filter(workspace=workspace, name=metric.name).order_by("-version").first()
        if existing is not None:
            # Evaluator names are the workspace's: another agent's evaluator of the same metric judges by
            # that agent's rubric and policy, so it is not taken, and this agent's cannot have the name.
            evaluators.agent_mismatch_refuse(
                [existing],
                agent=agent,
                error=exceptions.SuiteEvaluatorAgentMismatch,
                about=f"the metric {metric.name} cannot be proposed",
                note=" (evaluator names are unique in a workspace)",
            )
            return existing
        return evaluator_create(
            workspace=workspace,
            agent=agent,
            name=metric.name,
            config=_metric_config(metric, trajectory=trajectory, derived=derived, judge=judge),
            description=f"Proposed from {agent.slug}'s evaluation commitment: {metric.description}".strip(": "),
            created_by=created_by,
        )

    for spec in derived.eval_suites.value:
        if spec["name"] == "output-quality":
            name = f"{agent.slug}-output-quality"
            if Suite.objects.filter(workspace=workspace, name=name).exists():
                continue
            chosen = [evaluator_for(metric, trajectory=False) for metric in answers.evaluation.output_metrics]
            made_suites.append(
                suite_create(
                    workspace=workspace,
                    agent=agent,
                    name=name,
                    description="Proposed from the evaluation commitment: the output metrics, nightly.",
                    dataset=datasets[0] if len(datasets) == 1 else None,
                    schedule_cron=schedules.PRESETS.get(spec["schedule"], ""),
                    schedule_enabled=len(datasets) == 1,
                    evaluators_used=chosen,
                    proposed=True,
                    created_by=created_by,
                )
            )
        elif spec["name"] == "trajectory-audit":
            name = f"{agent.slug}-trajectory-audit"
            if OnlineRule.objects.filter(workspace=workspace, name=name).exists():
                continue
            chosen = [evaluator_for(metric, trajectory=True) for metric in answers.evaluation.trajectory_metrics]
            made_rules.append(
                online.online_rule_create(
                    agent=agent,
                    name=name,
                    evaluators_used=chosen,
                    sample_rate=float(derived.trajectory_sampling_rate.value),
                    delay_seconds=60,
                    proposed=True,
                    created_by=created_by,
                )
            )
    return Proposal(suites=made_suites, rules=made_rules)
