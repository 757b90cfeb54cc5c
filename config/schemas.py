"""Request-body schemas shared by the apps' API layers."""

from __future__ import annotations

from ninja import Schema
from pydantic import ConfigDict


class PatchSchema(Schema):
    """The body of a PATCH: every field optional, and a field it does not know is a 422. Ignoring it would
    answer 200 to a misspelt field and leave the value the caller meant to change as it was."""

    model_config = ConfigDict(extra="forbid")
