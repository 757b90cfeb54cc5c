from typing import Any

from django.core.management.base import BaseCommand

from agent_registry import demo


class Command(BaseCommand):
    help = "Create the demo workspace with its agents, requirements and prompts (idempotent)."

    def handle(self, *args: Any, **options: Any) -> None:
        workspace = demo.demo_seed()
        self.stdout.write(
            f"Demo workspace {workspace.slug!r} is ready; login {demo.DEMO_USERNAME} / {demo.DEMO_PASSWORD}"
        )
