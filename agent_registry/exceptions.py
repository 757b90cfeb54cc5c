"""Errors of the registry: agents, requirements, prompts and keys."""

from config.errors import Conflict, MethodNotAllowed, NotFound, ValidationFailed


class AgentNotFound(NotFound):
    code = "agent_not_found"


class AgentInvalid(ValidationFailed):
    code = "agent_invalid"


class AgentSlugTaken(Conflict):
    code = "agent_slug_taken"


class RequirementsInvalid(ValidationFailed):
    code = "requirements_invalid"


class RequirementsVersionNotFound(NotFound):
    code = "requirements_version_not_found"


class PromptNotFound(NotFound):
    code = "prompt_not_found"


class PromptNameTaken(Conflict):
    code = "prompt_name_taken"


class PromptInvalid(ValidationFailed):
    code = "prompt_invalid"


class PromptTypeChanged(Conflict):
    code = "prompt_type_changed"


class PromptInUse(Conflict):
    code = "prompt_in_use"


class PromptVersionNotFound(NotFound):
    code = "prompt_version_not_found"


class PromptVersionImmutable(MethodNotAllowed):
    code = "prompt_version_immutable"


class PromptLabelNotFound(NotFound):
    code = "label_not_found"


class PromptLabelInvalid(ValidationFailed):
    code = "label_invalid"


class PromptResolveInvalid(ValidationFailed):
    code = "prompt_resolve_invalid"


class PromptVariablesMissing(ValidationFailed):
    code = "missing_variables"


class ApiKeyInvalid(ValidationFailed):
    code = "api_key_invalid"


class ApiKeyNotFound(NotFound):
    code = "api_key_not_found"


class WorkspaceNotFound(NotFound):
    code = "workspace_not_found"


class AuditEventListInvalid(ValidationFailed):
    code = "audit_event_list_invalid"
