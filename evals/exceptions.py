"""Errors of the evals: datasets and their versions. Mapped to HTTP once, in config/api.py."""

from __future__ import annotations

from config.errors import Conflict, NotFound, PayloadTooLarge, ValidationFailed


class DatasetNotFound(NotFound):
    code = "dataset_not_found"


class DatasetVersionNotFound(NotFound):
    code = "dataset_version_not_found"


class DatasetExists(Conflict):
    code = "dataset_exists"


class DatasetInvalid(ValidationFailed):
    code = "dataset_invalid"


class DatasetItemsInvalid(ValidationFailed):
    """Items that break the item shape; `errors` lists each one: [{"line", "field", "message"}]."""

    code = "dataset_items_invalid"


class DatasetFileTooLarge(PayloadTooLarge):
    code = "dataset_file_too_large"


class TrajectoryNotUsable(ValidationFailed):
    """A trajectory holds nothing an item could be made of (no input messages and no input text)."""

    code = "trajectory_not_usable"
