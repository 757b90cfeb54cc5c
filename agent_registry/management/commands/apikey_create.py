"""`manage.py apikey_create`: mint an API key from the shell.

Only the key goes to stdout, so a script can capture it (`KEY=$(manage.py apikey_create --agent x)`);
what was created is described on stderr.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agent_registry import services
from agent_registry.models import Agent, Scope, Workspace
from config.errors import KeelError

DEFAULT_SCOPES = (Scope.INGEST.value, Scope.GATEWAY.value, Scope.READ.value)


class Command(BaseCommand):
    help = (
        "Create an API key and print it (only the key on stdout). With --agent the key is limited to that "
        "agent; without it, --workspace is required and the key serves every agent of the workspace."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--agent", help="slug of the agent the key is limited to")
        parser.add_argument(
            "--workspace", help="workspace slug; required without --agent, or when the agent slug is ambiguous"
        )
        parser.add_argument(
            "--scopes",
            nargs="+",
            default=list(DEFAULT_SCOPES),
            metavar="SCOPE",
            help=f"one or more of {', '.join(Scope.values)} (default: {' '.join(DEFAULT_SCOPES)})",
        )
        parser.add_argument("--name", help="a name to recognise the key by (default: 'CLI key for <agent>')")

    def handle(self, *args: Any, **options: Any) -> None:
        agent_slug: str | None = options["agent"]
        workspace_slug: str | None = options["workspace"]
        # `--scopes read,write` works as well as `--scopes read write`.
        scopes = [scope for value in options["scopes"] for scope in value.split(",") if scope]

        workspace = None
        if workspace_slug is not None:
            workspace = Workspace.objects.filter(slug=workspace_slug).first()
            if workspace is None:
                raise CommandError(f"no workspace with slug {workspace_slug!r}")

        agents: list[Agent] = []
        if agent_slug is not None:
            agent = self._agent(agent_slug, workspace)
            workspace = agent.workspace
            agents = [agent]
        elif workspace is None:
            raise CommandError("pass --agent <slug>, or --workspace <slug> for a key that serves every agent")

        name = options["name"] or f"CLI key for {agent_slug or workspace.slug}"
        try:
            api_key, raw_key = services.apikey_create(workspace=workspace, name=name, scopes=scopes, agents=agents)
        except KeelError as error:
            problems = "; ".join(f"{item['field']}: {item['message']}" for item in error.extra.get("errors", []))
            raise CommandError(f"{error.detail} ({problems})" if problems else error.detail) from None

        self.stderr.write(
            f"Created API key {api_key.name!r} ({api_key.prefix}...) in workspace {workspace.slug!r}, "
            f"scopes {' '.join(api_key.scopes)}, "
            f"{f'limited to agent {agent_slug!r}' if agent_slug else 'for every agent'}. "
            "It is shown once, below on stdout.",
            style_func=self.style.SUCCESS,
        )
        self.stdout.write(raw_key)

    def _agent(self, slug: str, workspace: Workspace | None) -> Agent:
        candidates = Agent.objects.select_related("workspace").filter(slug=slug).order_by("workspace__slug")
        if workspace is not None:
            candidates = candidates.filter(workspace=workspace)
        found = list(candidates)
        if not found:
            where = f" in workspace {workspace.slug!r}" if workspace is not None else ""
            raise CommandError(f"no agent with slug {slug!r}{where}")
        if len(found) > 1:
            slugs = ", ".join(agent.workspace.slug for agent in found)
            raise CommandError(f"agent {slug!r} exists in several workspaces ({slugs}); pass --workspace")
        return found[0]
