"""Request and response shapes of the registry API."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from ninja import Field, Schema
from pydantic import AwareDatetime

from agent_registry.models import AgentStatus, Scope
from config.schemas import PatchSchema


class ErrorOut(Schema):
    detail: str
    code: str


# The errors any API request can get: a bad or too large body, no key or a key without the scope, an unknown
# object, invalid fields.
COMMON_ERROR_STATUSES = (400, 401, 403, 404, 413, 422)


def error_responses(*statuses: int) -> dict[int, type[Schema]]:
    """The error answers an operation declares (Keel's `{"detail", "code"}`): the common ones plus `statuses`."""
    return dict.fromkeys(sorted({*COMMON_ERROR_STATUSES, *statuses}), ErrorOut)


class FindingOut(Schema):
    code: str
    severity: Literal["error", "warning", "info"]
    message: str
    fields: list[str]


# --- Agents -----------------------------------------------------------------------------------


class AgentIn(Schema):
    slug: str = Field(pattern=r"^[a-z0-9][a-z0-9\-]{0,63}$", description="URL-safe identifier, unique in the workspace")
    name: str = Field(min_length=1, max_length=200)
    description: str = Field("", max_length=10_000)
    status: AgentStatus = AgentStatus.DRAFT
    requirements: dict[str, Any] | None = Field(None, description="answers to save as requirements version 1")


class AgentPatch(PatchSchema):
    name: str | None = Field(None, min_length=1, max_length=200)
    description: str | None = Field(None, max_length=10_000)
    status: AgentStatus | None = None
    trace_retention_days: int | None = Field(None, ge=1, le=3650, description="delete trajectories older than this")


class AgentOut(Schema):
    slug: str
    name: str
    description: str
    status: str
    owner: str | None
    requirements_version: int | None
    trace_retention_days: int | None
    created_at: datetime
    updated_at: datetime


class AgentDetailOut(AgentOut):
    feasibility: list[FindingOut]


# --- Requirements -----------------------------------------------------------------------------


class RequirementsIn(Schema):
    answers: dict[str, Any]
    message: str = Field("", max_length=500)


class RequirementsCheckIn(Schema):
    answers: dict[str, Any]


class RequirementsVersionOut(Schema):
    version: int
    current: bool
    message: str
    author: str | None
    created_at: datetime
    answers: dict[str, Any]
    feasibility: list[FindingOut]


class RequirementsVersionSummaryOut(Schema):
    version: int
    current: bool
    message: str
    author: str | None
    created_at: datetime


class RequirementsCheckOut(Schema):
    feasibility: list[FindingOut]
    configuration: dict[str, Any]


class ChangeOut(Schema):
    path: str
    kind: Literal["added", "removed", "changed"]
    before: Any = None
    after: Any = None


class RequirementsDiffOut(Schema):
    from_version: int
    to_version: int
    changes: list[ChangeOut]


class DerivedOut(Schema):
    value: Any
    sources: list[str]
    explanation: str


class ConfigurationOut(Schema):
    requirements_version: int
    allowed_tiers: DerivedOut
    tier_budgets: DerivedOut
    budgets: DerivedOut
    approval_rules: DerivedOut
    tool_allow_list: DerivedOut
    mandatory_guardrails: DerivedOut
    eval_suites: DerivedOut
    router: DerivedOut
    trajectory_sampling_rate: DerivedOut


# --- Prompts ----------------------------------------------------------------------------------

Template = str | list[dict[str, Any]]


class PromptIn(Schema):
    agent: str = Field(description="slug of the agent the prompt belongs to")
    name: str = Field(min_length=1, max_length=200)
    type: Literal["text", "chat"] = "text"
    template: Template
    config: dict[str, Any] = Field(default_factory=dict)
    description: str = Field("", max_length=10_000)
    tags: list[str] = Field(default_factory=list, max_length=50)
    commit_message: str = Field("", max_length=500)
    labels: list[str] = Field(default_factory=list, max_length=20)


class PromptPatch(PatchSchema):
    description: str | None = Field(None, max_length=10_000)
    tags: list[str] | None = Field(None, max_length=50, description="replaces the tags")


class PromptVersionIn(Schema):
    template: Template
    type: Literal["text", "chat"] | None = None
    config: dict[str, Any] | None = None
    commit_message: str = Field("", max_length=500)
    labels: list[str] = Field(default_factory=list, max_length=20)


class LabelOut(Schema):
    name: str
    version: int
    updated_at: datetime


class PromptOut(Schema):
    name: str
    agent: str
    description: str
    tags: list[str]
    latest_version: int | None
    labels: list[LabelOut]
    created_at: datetime


class PromptVersionOut(Schema):
    name: str
    version: int
    type: Literal["text", "chat"]
    template: Template
    config: dict[str, Any]
    variables: list[str]
    labels: list[str]
    commit_message: str
    author: str | None
    created_at: datetime


class LabelMoveIn(Schema):
    version: int = Field(ge=1)


class LabelMoveOut(Schema):
    label: str
    from_version: int | None
    to_version: int | None
    moved_by: str | None
    moved_at: datetime


class PromptDiffOut(Schema):
    from_version: int
    to_version: int
    template: list[str]
    config: list[str]


class RenderIn(Schema):
    label: str | None = None
    version: int | None = Field(None, ge=1)
    variables: dict[str, Any] = Field(default_factory=dict)
    placeholders: dict[str, list[dict[str, Any]]] = Field(default_factory=dict)


class RenderOut(Schema):
    name: str
    version: int
    type: Literal["text", "chat"]
    prompt: Template
    config: dict[str, Any]


# --- API keys ---------------------------------------------------------------------------------


class ApiKeyIn(Schema):
    name: str = Field(min_length=1, max_length=200)
    scopes: list[Scope] = Field(min_length=1)
    agents: list[str] = Field(default_factory=list, description="agent slugs; empty means every agent")
    # With its offset ("Z", "+02:00"): a naive time names no instant, and cannot be compared with now.
    expires_at: AwareDatetime | None = None


class ApiKeyOut(Schema):
    id: int
    name: str
    prefix: str
    scopes: list[str]
    agents: list[str]
    created_at: datetime
    last_used_at: datetime | None
    expires_at: datetime | None
    revoked_at: datetime | None


class ApiKeyCreatedOut(ApiKeyOut):
    key: str = Field(description="the key itself; shown this once and never again")


class WorkspaceOut(Schema):
    slug: str
    name: str


# --- Langfuse compatibility -------------------------------------------------------------------


class LangfusePromptOut(Schema):
    type: Literal["text", "chat"]
    name: str
    version: int
    prompt: Template
    config: dict[str, Any]
    labels: list[str]
    tags: list[str]
    commitMessage: str | None  # Langfuse's field name


class LangfusePromptIn(Schema):
    name: str = Field(min_length=1, max_length=200)
    type: Literal["text", "chat"] = "text"
    prompt: Template
    config: dict[str, Any] | None = None
    labels: list[str] = Field(default_factory=list)
    tags: list[str] | None = None
    commitMessage: str | None = None  # Langfuse's field name


# --- Audit log --------------------------------------------------------------------------------


class AuditEventQuery(Schema):
    action: str | None = Field(None, description="an action (`apikey.created`) or a prefix ending in a dot (`apikey.`)")
    actor: str | None = Field(None, description="a username, an API key's prefix, or `keel`")
    since: datetime | None = None
    until: datetime | None = None
    limit: int = Field(50, ge=1, le=200)
    cursor: str | None = None


class AuditActorOut(Schema):
    kind: Literal["user", "api_key", "keel"]
    name: str = Field(description="the username, the key's name and prefix, or Keel (kept after either is deleted)")
    username: str | None
    key_prefix: str | None


class AuditTargetOut(Schema):
    type: str = Field(description="the kind of object, as app.model (`routing.modeltarget`); empty for none")
    id: str
    name: str


class AuditEventOut(Schema):
    id: int
    action: str
    actor: AuditActorOut
    target: AuditTargetOut
    details: dict[str, Any]
    ip_address: str | None
    created_at: datetime


class AuditEventPageOut(Schema):
    items: list[AuditEventOut]
    next_cursor: str | None
