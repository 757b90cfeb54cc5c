"""Errors of the routing management plane: model targets, router configuration, chains, tools, hand-offs."""

from config.errors import Conflict, NotFound, ValidationFailed


class ModelTargetNotFound(NotFound):
    code = "model_target_not_found"


class ModelTargetInvalid(ValidationFailed):
    code = "model_target_invalid"


class ModelTargetAliasTaken(Conflict):
    code = "model_target_alias_taken"


class ModelTargetReadOnly(Conflict):
    """The target comes from KEEL_MODEL_TARGETS: the environment owns it, so the API and dashboard don't."""

    code = "model_target_read_only"


class ModelTargetInUse(Conflict):
    code = "model_target_in_use"


class ModelTargetSpecInvalid(ValidationFailed):
    code = "model_target_spec_invalid"


class RouterConfigInvalid(ValidationFailed):
    code = "router_config_invalid"


class ChainInvalid(ValidationFailed):
    code = "chain_invalid"


class AgentToolNotFound(NotFound):
    code = "agent_tool_not_found"


class AgentToolInvalid(ValidationFailed):
    code = "agent_tool_invalid"


class AgentToolNameTaken(Conflict):
    code = "agent_tool_name_taken"


class RoutingDecisionNotFound(NotFound):
    code = "routing_decision_not_found"


class RoutingDecisionListInvalid(ValidationFailed):
    code = "routing_decision_list_invalid"


class HandoffNotFound(NotFound):
    code = "handoff_not_found"


class HandoffInvalid(ValidationFailed):
    code = "handoff_invalid"


class HandoffConflict(Conflict):
    """The hand-off is not in a state that allows the change (claimed by someone else, already resolved)."""

    code = "handoff_conflict"


class CacheHitNotFound(NotFound):
    code = "cache_hit_not_found"


class PromptNotLabelled(Conflict):
    """The agent's `<slug>/system` prompt has no version labelled production: the gateway will not serve the
    agent with another prompt, or none, in its place."""

    code = "prompt_not_labelled"
