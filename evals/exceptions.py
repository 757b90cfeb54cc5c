"""Errors of the evals: datasets, evaluators, suites, runs and online rules. Mapped to HTTP once, in config/api.py."""

from __future__ import annotations

from config.errors import Conflict, NotFound, PayloadTooLarge, ValidationFailed


class DatasetNotFound(NotFound):
    code = "dataset_not_found"


class DatasetVersionNotFound(NotFound):
    code = "dataset_version_not_found"


class DatasetExists(Conflict):
    code = "dataset_exists"


class DatasetTrajectoriesPresent(Conflict):
    code = "dataset_trajectories_present"


class DatasetInvalid(ValidationFailed):
    code = "dataset_invalid"


class DatasetItemPageInvalid(ValidationFailed):
    """A page of a version's items asked for with a cursor this API did not give out."""

    code = "invalid_query"


class DatasetItemsInvalid(ValidationFailed):
    """Items that break the item shape; `errors` lists each one: [{"line", "field", "message"}]."""

    code = "dataset_items_invalid"


class DatasetFileTooLarge(PayloadTooLarge):
    code = "dataset_file_too_large"


class TrajectoryNotUsable(ValidationFailed):
    """A trajectory holds nothing an item could be made of (no input messages and no input text)."""

    code = "trajectory_not_usable"


class EvalsConflict(Conflict):
    code = "evals_conflict"


class EvaluatorNotFound(NotFound):
    code = "evaluator_not_found"


class EvaluatorInvalid(ValidationFailed):
    code = "evaluator_invalid"


# An agent's suites, runs and online rules use its own evaluators and the workspace-wide ones (no agent):
# another agent's evaluator judges by that agent's rubric, policy and judge model. Each refusal below is a
# kind of the error its interface already shows (a suite's, a rule's), with this one code.
EVALUATOR_AGENT_MISMATCH = "evaluator_agent_mismatch"


class EvaluatorAgentMismatch(EvaluatorInvalid):
    """A new evaluator version (or a pairwise judge) that would judge another agent's suites, rules or runs."""

    code = EVALUATOR_AGENT_MISMATCH


class SuiteNotFound(NotFound):
    code = "suite_not_found"


class SuiteExists(Conflict):
    code = "suite_exists"


class SuiteInvalid(ValidationFailed):
    code = "suite_invalid"


class SuiteEvaluatorAgentMismatch(SuiteInvalid):
    """A suite of one agent given an evaluator of another agent."""

    code = EVALUATOR_AGENT_MISMATCH


class RunNotFound(NotFound):
    code = "run_not_found"


class OnlineRuleNotFound(NotFound):
    code = "online_rule_not_found"


class OnlineRuleInvalid(ValidationFailed):
    code = "online_rule_invalid"


class OnlineRuleEvaluatorAgentMismatch(OnlineRuleInvalid):
    """An online rule of one agent given an evaluator of another agent."""

    code = EVALUATOR_AGENT_MISMATCH


class RolloutsInvalid(ValidationFailed):
    """A rollouts file that cannot be imported; `errors` lists each problem: [{"line", "field", "message"}]."""

    code = "rollouts_invalid"
