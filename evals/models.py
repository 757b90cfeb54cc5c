"""Versioned datasets: a dataset is a name in a workspace; its items live in numbered versions.

A version is immutable once created: every change (an upload, items from trajectories, items sent
through the API) creates the next version holding the whole new item list, so a run that names a
version always sees the same items. Items are copied into each version, which keeps reads simple;
the sizes eval datasets have make that affordable.
"""

from __future__ import annotations

from typing import ClassVar

from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from agent_registry.models import Agent, ApiKey, User, Workspace

# Names appear in URLs (/datasets/{name}), so they keep to characters a path needs no escaping for.
DATASET_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


class Dataset(models.Model):
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    agent = models.ForeignKey(Agent, null=True, blank=True, on_delete=models.SET_NULL, related_name="datasets")
    name = models.CharField(
        max_length=200,
        validators=[RegexValidator(DATASET_NAME_PATTERN, "use letters, digits, '.', '_' and '-'")],
    )
    description = models.TextField(blank=True)
    created_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_via_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["workspace", "name"], name="dataset_name_unique"),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        if self.agent is not None and self.agent.workspace_id != self.workspace_id:
            raise ValidationError({"agent": "the agent belongs to another workspace"})


class DatasetVersion(models.Model):
    """One immutable state of a dataset's items, numbered from 1 per dataset."""

    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField()
    message = models.TextField(blank=True)
    item_count = models.PositiveIntegerField(default=0)
    created_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_via_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["dataset", "version"], name="datasetversion_number_unique"),
            models.CheckConstraint(condition=Q(version__gte=1), name="datasetversion_number_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.dataset_id} v{self.version}"


class DatasetItem(models.Model):
    """An item of one version. `source_trace_id` links it to the trajectory it came from (blank when
    uploaded); a trace id, not a foreign key, so that retention deleting the trajectory keeps the item."""

    version = models.ForeignKey(DatasetVersion, on_delete=models.CASCADE, related_name="items")
    position = models.PositiveIntegerField()
    task = models.TextField(blank=True)
    input_messages = models.JSONField(default=list, blank=True)
    reference_output = models.TextField(blank=True)  # blank: no reference
    expected_tool_calls = models.JSONField(null=True, blank=True)
    expected_state = models.JSONField(null=True, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    source_trace_id = models.CharField(max_length=32, blank=True)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["version", "position"], name="datasetitem_position_unique"),
        ]
        indexes: ClassVar = [
            models.Index(fields=["source_trace_id"], name="datasetitem_source_trace", condition=~Q(source_trace_id="")),
        ]

    def __str__(self) -> str:
        return f"item {self.position} of version {self.version_id}"
