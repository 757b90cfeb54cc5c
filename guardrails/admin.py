from django.contrib import admin
from django.http import HttpRequest

from guardrails.models import (
    ApprovalEvent,
    ApprovalRequest,
    Budget,
    BudgetAlert,
    BudgetUsage,
    GuardrailPolicy,
    GuardrailViolation,
)


@admin.register(GuardrailPolicy)
class GuardrailPolicyAdmin(admin.ModelAdmin[GuardrailPolicy]):
    list_display = ("agent", "workspace", "updated_at")
    exclude = ("canary_secret_encrypted",)
    readonly_fields = ("workspace", "agent", "updated_by", "updated_via_key", "created_at", "updated_at")


@admin.register(GuardrailViolation)
class GuardrailViolationAdmin(admin.ModelAdmin[GuardrailViolation]):
    list_display = ("created_at", "agent", "layer", "check_name", "action", "score", "failure")
    list_filter = ("layer", "action", "failure")
    search_fields = ("check_name", "trace_id")

    def has_change_permission(self, request: HttpRequest, obj: GuardrailViolation | None = None) -> bool:
        return False  # the audit trail is append-only


class ApprovalEventInline(admin.TabularInline[ApprovalEvent, ApprovalRequest]):
    model = ApprovalEvent
    extra = 0
    can_delete = False
    readonly_fields = ("kind", "actor_user", "actor_key", "note", "trace_id", "created_at")


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(admin.ModelAdmin[ApprovalRequest]):
    # Decisions go through approval_decide (the dashboard or the API), so they are audited; read-only here.
    list_display = ("created_at", "agent", "tool", "status", "decided_by", "decided_at")
    list_filter = ("status",)
    inlines = (ApprovalEventInline,)

    def has_change_permission(self, request: HttpRequest, obj: ApprovalRequest | None = None) -> bool:
        return False


@admin.register(Budget)
class BudgetAdmin(admin.ModelAdmin[Budget]):
    list_display = ("workspace", "scope", "scope_value", "period", "limit_usd", "limit_tokens", "soft_limit_share")
    list_filter = ("scope", "period")


@admin.register(BudgetUsage)
class BudgetUsageAdmin(admin.ModelAdmin[BudgetUsage]):
    list_display = ("budget", "period_start", "spent_usd", "reserved_usd", "spent_tokens", "reserved_tokens")


@admin.register(BudgetAlert)
class BudgetAlertAdmin(admin.ModelAdmin[BudgetAlert]):
    list_display = ("created_at", "budget", "period_start", "kind")
