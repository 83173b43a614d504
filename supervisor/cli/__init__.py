"""The `hermes-sup` command line: the root group, assembled from one module per command group.

Exit codes: 0 ok, 1 failure, 2 usage or configuration error. With --json a command prints one
JSON document to stdout (an error too, as {"error": ..., "exit_code": ...}); messages for people
go to stderr. `common` holds what every command shares; no command module imports this one, so the
commands are registered here, in one place, and nothing imports in a circle.
"""

from __future__ import annotations

import functools
import importlib
import os
from pathlib import Path

import click

from ..cliargs import JsonUsageGroup
from ..config.workspace import SHARED_UMASK

# Each command by name: its module in this package and the command's name there. A module is
# imported when its command runs (or a help lists it), not at every start: `status` need not import
# the dashboard, migration and everything else, which took a fifth of every command's start-up.
COMMANDS: dict[str, tuple[str, str]] = {
    "init": ("setup", "init"), "doctor": ("setup", "doctor"),
    "up": ("run", "up"), "status": ("status", "status"), "ps": ("status", "status"),  # ps: the same command
    "restart": ("run", "restart"), "reload": ("run", "reload"), "down": ("run", "down"),
    "stop": ("steer", "stop"), "start": ("steer", "start"),
    "task": ("task", "task"), "board": ("board", "board_cmd"), "events": ("events", "events"),
    "logs": ("logs", "logs"), "usage": ("usage", "usage"), "skills": ("skills", "skills"),
    "schedules": ("schedules", "schedules"), "schema": ("schema", "schema_command"),
    "dashboard": ("dashboard", "dashboard"), "import-hermes": ("hermes", "import_hermes"),
    "prune": ("prune", "prune_command"), "completion": ("shell", "completion"),
    "systemd-unit": ("shell", "systemd_unit"),
}
# Commands of a group that live in other modules, by name: each loaded when it is asked for.
SUBCOMMANDS: dict[str, dict[str, tuple[str, str]]] = {
    "task": {"log": ("tasklog", "task_log"), "wait": ("steer", "task_wait"), "comment": ("steer", "task_comment")},
    "board": {"migrate": ("migrate", "migrate_command")},
}


def _load(module: str, name: str) -> click.Command:
    command = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    assert isinstance(command, click.Command)
    return command


class Commands(JsonUsageGroup):
    """The root group: loads a command's module the first time the command is asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            command = _load(*COMMANDS[cmd_name])
            if isinstance(command, JsonUsageGroup):
                for name, where in SUBCOMMANDS.get(cmd_name, {}).items():
                    if name not in command.commands:
                        command.lazy[name] = functools.partial(_load, *where)
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)


@click.group(cls=Commands, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("-w", "--workspace", type=click.Path(file_okay=False, path_type=Path),
              help="Workspace folder (else $HERMES_SUP_WORKSPACE, else the current folder upward).")
@click.version_option(package_name="hermes-sup")
@click.pass_context
def main(ctx: click.Context, workspace: Path | None) -> None:
    """hermes-sup: keep a team of LLM agents alive around a shared Kanban board of files."""
    # Nothing a command creates (hermes.yaml, the board's folders) is writable by others, even
    # under umask 000; `up` narrows further (see there).
    os.umask(os.umask(SHARED_UMASK) | SHARED_UMASK)
    ctx.ensure_object(dict)
    ctx.obj["workspace"] = workspace

