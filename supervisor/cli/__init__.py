"""The `hermes-sup` command line: the root group, assembled from one module per command group.

Exit codes: 0 ok, 1 failure, 2 usage or configuration error. With --json a command prints one
JSON document to stdout (an error too, as {"error": ..., "exit_code": ...}); messages for people
go to stderr. `common` holds what every command shares; no command module imports this one, so the
commands are registered here, in one place, and nothing imports in a circle.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from ..cliargs import JsonUsageGroup
from ..config.workspace import SHARED_UMASK
from . import (
    dashboard,
    events,
    hermes,
    logs,
    migrate,
    prune,
    run,
    schedules,
    schema,
    setup,
    shell,
    skills,
    steer,
    task,
    tasklog,
    usage,
)
from .board import board_cmd  # the module is not imported as `board`: that name means the board here


@click.group(cls=JsonUsageGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
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


for _command in (
    setup.init, setup.doctor,
    run.up, run.status, run.restart, run.reload, run.down, steer.stop, steer.start,
    task.task, board_cmd, events.events, logs.logs, usage.usage, skills.skills,
    schedules.schedules, schema.schema_command, dashboard.dashboard, hermes.import_hermes, prune.prune_command,
    shell.completion, shell.systemd_unit,
):
    main.add_command(_command)
main.add_command(run.status, "ps")  # the same command: same options, same output
for _command in (tasklog.task_log, steer.task_wait, steer.task_comment):
    task.task.add_command(_command)
board_cmd.add_command(migrate.migrate_command)
