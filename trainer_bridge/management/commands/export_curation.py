"""`manage.py export_curation`: export a curation from the shell and watch the worker write it.

    manage.py export_curation --workspace demo --curation ride-support-eval-groups --format art [--here]

The export is queued for a worker, as the dashboard's button does, and a progress bar follows it until it
ends (Ctrl-C stops watching, not the export). With `--here` this process writes the file itself. The
file's path and checksum go to stdout when it succeeded.
"""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agent_registry.models import Workspace
from config.errors import KeelError
from trainer_bridge import services
from trainer_bridge.models import ACTIVE, Curation, Export, ExportFormat, JobStatus

BAR_WIDTH = 40


def progress_line(export: Export) -> str:
    total = max(export.groups_total, 1)
    done = min(export.groups_done, total)
    filled = round(BAR_WIDTH * done / total)
    return f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {done}/{export.groups_total} groups  {export.status}"


class Command(BaseCommand):
    help = "Export a curation in a training format, showing the worker's progress until the file is written."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--workspace", required=True, help="workspace slug")
        parser.add_argument("--curation", required=True, help="curation name")
        parser.add_argument("--format", required=True, choices=ExportFormat.values)
        parser.add_argument("--threshold", type=float, default=1.0, help="reward that counts as a pass (SFT, KTO)")
        parser.add_argument(
            "--split",
            choices=services.EXPORT_SPLITS,
            default=services.EXPORT_SPLIT_ALL,
            help="the curation's train or validation split only (OpenAI takes them as separate files)",
        )
        parser.add_argument("--here", action="store_true", help="write the file in this process, not a worker")
        parser.add_argument("--poll-seconds", type=float, default=1.0)
        parser.add_argument("--timeout-seconds", type=float, default=3600.0)

    def handle(self, *args: Any, **options: Any) -> None:
        workspace = Workspace.objects.filter(slug=options["workspace"]).first()
        if workspace is None:
            raise CommandError(f"no workspace {options['workspace']!r}")
        curation = Curation.objects.filter(workspace=workspace, name=options["curation"]).first()
        if curation is None:
            raise CommandError(f"no curation {options['curation']!r} in {workspace.slug}")
        try:
            export = services.export_create(
                curation=curation,
                format=options["format"],
                threshold=options["threshold"],
                split=options["split"],
                dispatch=not options["here"],
            )
        except KeelError as error:
            raise CommandError(error.detail) from None
        self.stderr.write(f"export {export.pk}: {export.groups_total} groups of {curation.name} as {export.format}")
        if options["here"]:
            services.export_execute(export_id=export.pk)
        deadline = time.monotonic() + options["timeout_seconds"]
        export.refresh_from_db()
        while export.status in ACTIVE and time.monotonic() < deadline:
            self.stderr.write("\r" + progress_line(export), ending="")
            time.sleep(options["poll_seconds"])
            export.refresh_from_db()
        self.stderr.write("\r" + progress_line(export))
        if export.status != JobStatus.SUCCEEDED:
            raise CommandError(f"export {export.pk} is {export.status}: {export.error or 'still running'}")
        self.stdout.write(f"{export.path}\t{export.sha256}")
