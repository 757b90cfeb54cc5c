"""Recompute triage signals of stored trajectories, e.g. after the detectors or the weights changed."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from tracing import selectors, services, tasks


class Command(BaseCommand):
    help = "Recompute the triage signals of trajectories (all, or one workspace's, or one agent's)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--workspace", help="workspace slug")
        parser.add_argument("--agent", help="agent slug (needs --workspace)")
        parser.add_argument("--chunk", type=int, default=500, help="trajectories per task")
        parser.add_argument("--sync", action="store_true", help="compute here instead of in Celery workers")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["agent"] and not options["workspace"]:
            raise CommandError("--agent needs --workspace")
        if options["chunk"] < 1:
            raise CommandError("--chunk must be at least 1")
        try:
            chunks = selectors.trajectory_id_chunks(
                workspace_slug=options["workspace"], agent_slug=options["agent"], size=options["chunk"]
            )
        except selectors.ScopeNotFound as error:
            raise CommandError(str(error)) from None
        total = 0
        for ids in chunks:
            if options["sync"]:
                services.trajectory_signals_recompute(trajectory_ids=ids)
            else:
                tasks.trajectory_signals_recompute.delay(ids)
            total += len(ids)
        verb = "recomputed" if options["sync"] else "queued for recomputation"
        self.stdout.write(f"{total} trajectories {verb}")
