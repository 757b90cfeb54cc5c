"""`manage.py modeltargets_sync`: put the model targets of KEEL_MODEL_TARGETS in every workspace (or one).

Run it after changing the variable (and at deploy); it is idempotent. A workspace whose sync fails
(an alias of the declaration is a fallback nothing provides) is reported and the others go on.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from agent_registry.models import Workspace
from routing import exceptions, services


class Command(BaseCommand):
    help = "Create, update or disable the environment's model targets (KEEL_MODEL_TARGETS) in every workspace."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--workspace", help="only this workspace (slug)")

    def handle(self, *args: Any, **options: Any) -> None:
        spec: str = settings.KEEL_MODEL_TARGETS
        try:
            declared = services.model_target_spec_parse(spec)
        except exceptions.ModelTargetSpecInvalid as error:
            raise CommandError(self._describe(error)) from None
        workspaces = Workspace.objects.order_by("slug")
        if options["workspace"]:
            workspaces = workspaces.filter(slug=options["workspace"])
            if not workspaces.exists():
                raise CommandError(f"no workspace with slug {options['workspace']!r}")
        failed = []
        for workspace in workspaces:
            try:
                result = services.model_targets_sync_from_env(workspace=workspace, spec=spec)
            except exceptions.ModelTargetSpecInvalid as error:
                failed.append(workspace.slug)
                self.stderr.write(f"{workspace.slug}: nothing changed: {self._describe(error)}")
                continue
            parts = [
                f"{label} {', '.join(aliases)}"
                for label, aliases in (
                    ("created", result.created),
                    ("updated", result.updated),
                    ("unchanged", result.unchanged),
                    ("disabled", result.retired),
                )
                if aliases
            ]
            self.stdout.write(f"{workspace.slug}: {'; '.join(parts) or 'no environment targets'}")
        if failed:
            raise CommandError(f"KEEL_MODEL_TARGETS could not be applied to {', '.join(failed)}")
        self.stdout.write(f"{len(declared)} target{'s' if len(declared) != 1 else ''} declared in KEEL_MODEL_TARGETS.")

    @staticmethod
    def _describe(error: exceptions.ModelTargetSpecInvalid) -> str:
        items = error.extra.get("errors") or []
        return "; ".join(f"{item['field']}: {item['message']}" for item in items) or error.detail
