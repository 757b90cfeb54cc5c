"""Django admin for staff: read-only views of what ingest stored, and the outboxes' state."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db import models
from django.http import HttpRequest

from tracing.models import IngestBatch, LangfuseExport, LangfuseMirror, ModelPriceOverride, Replay, Score, Trajectory


class ReadOnlyAdmin(admin.ModelAdmin[Any]):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(IngestBatch)
class IngestBatchAdmin(ReadOnlyAdmin):
    list_display = ("pk", "workspace", "source", "span_count", "status", "attempts", "received_at", "processed_at")
    list_filter = ("status", "source")
    exclude = ("body",)


@admin.register(Trajectory)
class TrajectoryAdmin(ReadOnlyAdmin):
    list_display = ("trace_id", "workspace", "agent", "name", "status", "started_at", "span_count", "triage_score")
    list_filter = ("status", "workspace")
    search_fields = ("trace_id", "session_id")


@admin.register(Score)
class ScoreAdmin(ReadOnlyAdmin):
    list_display = ("name", "data_type", "value", "string_value", "source", "trajectory", "created_at")
    list_filter = ("data_type", "source")


@admin.register(Replay)
class ReplayAdmin(ReadOnlyAdmin):
    list_display = ("pk", "original", "from_step", "status", "created_at", "finished_at")
    list_filter = ("status",)


@admin.register(ModelPriceOverride)
class ModelPriceOverrideAdmin(admin.ModelAdmin[ModelPriceOverride]):
    list_display = ("model", "workspace", "input_usd_per_million", "output_usd_per_million")


@admin.register(LangfuseMirror)
class LangfuseMirrorAdmin(admin.ModelAdmin[LangfuseMirror]):
    list_display = ("workspace", "host", "enabled", "last_success_at", "last_error_at", "delivered_spans")
    exclude = ("secret_key_encrypted",)  # set through the API; never shown
    # Django 6 assumes https for a URL typed without a scheme; say so now (Django 5.2 warns otherwise).
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}


@admin.register(LangfuseExport)
class LangfuseExportAdmin(ReadOnlyAdmin):
    list_display = ("pk", "workspace", "kind", "status", "attempts", "next_attempt_at", "last_error")
    list_filter = ("status", "kind")
    exclude = ("payload",)
