"""Django admin for staff: workspaces, people, keys, agents, requirements, prompts and the audit log.

Versions are immutable (the database refuses updates), so their admins are read-only; a key's hash
is never editable, and new keys are made in the dashboard or with `manage.py apikey_create`, where
the key is shown once.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.auth.admin import UserAdmin
from django.http import HttpRequest

from agent_registry.models import (
    Agent,
    ApiKey,
    AuditEvent,
    Membership,
    Prompt,
    PromptLabel,
    PromptLabelMove,
    PromptVersion,
    RequirementsVersion,
    User,
    WorkerHeartbeat,
    Workspace,
)


class ReadOnlyAdmin(admin.ModelAdmin[Any]):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


admin.site.register(User, UserAdmin)


class MembershipInline(admin.TabularInline[Membership, Workspace]):
    model = Membership
    extra = 0
    autocomplete_fields = ("user",)


@admin.register(Workspace)
class WorkspaceAdmin(admin.ModelAdmin[Workspace]):
    list_display = ("slug", "name", "created_at")
    search_fields = ("slug", "name")
    inlines = (MembershipInline,)


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin[ApiKey]):
    list_display = ("prefix", "name", "workspace", "scopes", "created_at", "last_used_at", "expires_at", "revoked_at")
    list_filter = ("workspace",)
    search_fields = ("prefix", "name")
    readonly_fields = ("prefix", "key_hash", "workspace", "created_by", "created_at", "last_used_at")
    fields = ("name", "workspace", "prefix", "key_hash", "scopes", "agents", "expires_at", "revoked_at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # a key is shown once; only the dashboard and the command can show it


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin[Agent]):
    list_display = ("slug", "name", "workspace", "status", "current_requirements", "trace_retention_days")
    list_filter = ("status", "workspace")
    search_fields = ("slug", "name")
    readonly_fields = ("current_requirements", "created_at", "updated_at")


@admin.register(RequirementsVersion)
class RequirementsVersionAdmin(ReadOnlyAdmin):
    list_display = ("agent", "version", "message", "created_by", "created_at")
    list_filter = ("agent__workspace",)


@admin.register(Prompt)
class PromptAdmin(admin.ModelAdmin[Prompt]):
    list_display = ("name", "agent", "workspace", "created_at")
    search_fields = ("name",)
    list_filter = ("workspace",)


@admin.register(PromptVersion)
class PromptVersionAdmin(ReadOnlyAdmin):
    list_display = ("prompt", "version", "type", "commit_message", "created_by", "created_at")
    search_fields = ("prompt__name",)


@admin.register(PromptLabel)
class PromptLabelAdmin(ReadOnlyAdmin):
    list_display = ("prompt", "name", "version", "updated_at")


@admin.register(PromptLabelMove)
class PromptLabelMoveAdmin(ReadOnlyAdmin):
    list_display = ("prompt", "label", "from_version", "to_version", "moved_by", "moved_at")


@admin.register(WorkerHeartbeat)
class WorkerHeartbeatAdmin(ReadOnlyAdmin):
    list_display = ("hostname", "last_seen_at", "beats")


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    """Append-only (the database refuses updates): read, never edited or deleted here."""

    list_display = ("created_at", "workspace", "action", "actor_label", "target_type", "target_name", "ip_address")
    list_filter = ("action", "actor_kind")
    search_fields = ("actor_label", "target_name")

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
