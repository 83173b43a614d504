"""`init` (a new workspace) and `doctor` (what would stop a team, checked before it starts)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click
from rich.text import Text

from ..cliargs import emit_json
from ..config.scaffold import EXAMPLE_NAMES, keep_out_of_git, scaffold
from ..config.workspace import WORKSPACE_ENV, Workspace, open_workspace_board, private_dir
from .common import Failure, command, handled, json_option, literal, out, visible, workspace_of

# -- workspace --------------------------------------------------------------------------------------

@command()
@click.argument("directory", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--example", is_flag=False, flag_value="team", default=None, metavar="[team|research]",
              help="An example team with its tasks in kanban/inbox/: team (planner, two workers, reviewer; the "
                   "default) or research (papers read into a report, in granted folders).")
@json_option
@click.pass_context
@handled
def init(ctx: click.Context, directory: Path | None, example: str | None, as_json: bool) -> None:
    """Scaffold a workspace in DIRECTORY (default: -w, else $HERMES_SUP_WORKSPACE, else here):
    hermes.yaml, kanban/, skills/, runs/."""
    if example is not None and example not in EXAMPLE_NAMES:
        # `init --example DIR`, as it was written before examples had names: the team, in DIR.
        if directory is not None:
            raise Failure(f"no example named {example!r}; the examples are {', '.join(EXAMPLE_NAMES)}", 2)
        directory, example = Path(example), "team"
    root = init_root(directory, ctx.obj.get("workspace"), os.environ.get(WORKSPACE_ENV), Path.cwd())
    if root.exists() and not root.is_dir():
        raise Failure(f"{root} exists and is not a folder", 2)
    if example and (root / "hermes.yaml").exists():
        raise Failure(f"{root / 'hermes.yaml'} already exists; --example needs a folder without a team", 2)
    created = scaffold(root, example=example)
    open_workspace_board(Workspace(root)).close()
    private_dir(root / "runs")
    created += keep_out_of_git(root)
    if as_json:
        emit_json({"workspace": str(root), "created": created})
        return
    if created:
        out.print(literal(f"workspace ready in {root}: created {', '.join(created)}"), soft_wrap=True)
    else:
        out.print(literal(f"{root} is already a workspace; nothing to create"), soft_wrap=True)
    start = "hermes-sup up" if root == Path.cwd().absolute() else f"cd {root} && hermes-sup up"
    out.print(Text.assemble("next: ", (visible(start, one_line=True), "bold"),
                            ", then drop a task file into kanban/inbox/"), soft_wrap=True)  # one line for scripts


def init_root(directory: Path | None, workspace: Path | None, env: str | None, cwd: Path) -> Path:
    """Where `init` scaffolds (pure): DIRECTORY, else -w, else $HERMES_SUP_WORKSPACE, else the
    current folder, as every other command finds its workspace; DIRECTORY and -w naming two folders
    is a usage error rather than a guess."""
    def absolute(path: Path | str) -> Path:
        return (cwd / Path(path).expanduser()).absolute()

    if directory is not None and workspace is not None and absolute(directory) != absolute(workspace):
        raise Failure(f"init {directory} and -w {workspace} name two folders; name one", 2)
    chosen = directory if directory is not None else workspace if workspace is not None else env or None
    return absolute(chosen) if chosen else cwd.absolute()



@command()
@json_option
@click.pass_context
@handled
def doctor(ctx: click.Context, as_json: bool) -> None:
    """Check the config, credentials (present, never their values), providers, process containment,
    the board's filesystem, watcher, inotify limits, damaged files and disk."""
    ws = workspace_of(ctx)
    from ..config.doctor import (
        BOARD_CONFIG,
        run_checks,
    )  # it brings the providers' code along, which no other command needs

    checks = run_checks(ws)
    worst = "ok"
    for check in checks:
        if check["level"] == "error":
            worst = "error"
        elif check["level"] == "warn" and worst == "ok":
            worst = "warn"
    if as_json:
        emit_json({"workspace": str(ws.root), "status": worst, "checks": checks})
    else:
        colour = {"ok": "green", "warn": "yellow", "error": "red", "info": "blue"}
        for check in checks:
            out.print(Text.assemble((f"{check['level']:>5}", colour[check["level"]]), " ",
                                    literal(f"{check['name']}: {check['detail']}")), highlight=False)
    if any(check["name"] == BOARD_CONFIG and check["level"] == "error" for check in checks):
        sys.exit(2)
    if worst == "error":
        sys.exit(1)
