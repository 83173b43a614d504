"""The `hermes-sup` command line.

Exit codes: 0 ok, 1 failure, 2 usage or configuration error. With --json a command prints one
JSON document to stdout (an error too, as {"error": ..., "exit_code": ...}); messages for people
go to stderr.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
from rich.console import Console

from kanban import STATUSES, Board, BoardError, TaskError
from kanban.fsio import write_json_atomic
from kanban.liveness import start_time
from kanban.task import TIERS, now_iso

from . import render
from .doctor import run_checks
from .workspace import ConfigError, Workspace, find_workspace, load_config, scaffold

F = TypeVar("F", bound=Callable[..., Any])

out = Console(soft_wrap=False)
err = Console(stderr=True, soft_wrap=True)  # messages stay one line for scripts and grep


class Failure(Exception):
    """A command failed in a way the user can act on; carries its exit code."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def emit_json(document: Any) -> None:
    # Indented for a person at a terminal; one line for a script, which also keeps json on its C
    # encoder (indent makes it several times slower, a third of `board --json` over 10,000 tasks).
    indent = 2 if sys.stdout.isatty() else None
    click.echo(json.dumps(document, indent=indent, ensure_ascii=False, default=str))


def _exit(message: str, code: int, as_json: bool) -> NoReturn:
    if as_json:
        emit_json({"error": message, "exit_code": code})
    err.print(f"[red]error:[/red] {message}", markup=True, highlight=False)
    sys.exit(code)


def handled(func: F) -> F:
    """Turn the errors a user can cause into a message and an exit code, never a traceback."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        as_json = bool(kwargs.get("as_json"))
        try:
            return func(*args, **kwargs)
        except ConfigError as exc:
            _exit(str(exc), 2, as_json)
        except Failure as exc:
            _exit(str(exc), exc.code, as_json)
        except (BoardError, TaskError) as exc:
            _exit(str(exc), 1, as_json)
        except OSError as exc:
            _exit(f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": "), 1, as_json)

    return wrapper  # type: ignore[return-value]


json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON document to stdout.")


def workspace_of(ctx: click.Context) -> Workspace:
    return find_workspace(ctx.obj.get("workspace"))


def open_board(ctx: click.Context) -> Board:
    ws = workspace_of(ctx)
    try:
        return Board(ws.board_path)
    except BoardError as exc:
        if "network filesystem" in str(exc):
            raise ConfigError(str(exc)) from None
        raise


def refreshed(board: Board) -> dict[str, Any]:
    """Without a running supervisor, a board command does its work: ingest drops, recover dead claims."""
    report = board.ingest()
    board.recover()
    return report.as_dict()


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("-w", "--workspace", type=click.Path(file_okay=False, path_type=Path),
              help="Workspace folder (else $HERMES_SUP_WORKSPACE, else the current folder upward).")
@click.version_option(package_name="hermes-sup")
@click.pass_context
def main(ctx: click.Context, workspace: Path | None) -> None:
    """hermes-sup: keep a team of LLM agents alive around a shared Kanban board of files."""
    ctx.ensure_object(dict)
    ctx.obj["workspace"] = workspace


# -- workspace --------------------------------------------------------------------------------------

@main.command()
@click.argument("directory", required=False, type=click.Path(file_okay=False, path_type=Path))
@json_option
@handled
def init(directory: Path | None, as_json: bool) -> None:
    """Scaffold a workspace in DIRECTORY (default: here): hermes.yaml, kanban/, skills/, runs/."""
    root = (directory or Path.cwd()).absolute()
    if root.exists() and not root.is_dir():
        raise Failure(f"{root} exists and is not a folder", 2)
    created = scaffold(root)
    Board(root / "kanban").close()
    if as_json:
        emit_json({"workspace": str(root), "created": created})
        return
    if created:
        out.print(f"workspace ready in {root}: created {', '.join(created)}")
    else:
        out.print(f"{root} is already a workspace; nothing to create")
    out.print("next: [bold]hermes-sup up[/bold], then drop a task file into kanban/inbox/")


# -- tasks ------------------------------------------------------------------------------------------

@main.group()
def task() -> None:
    """Add, read and change tasks on the board."""


@task.command("add")
@click.argument("title")
@click.option("--body", default="", help="The instruction for the agent.")
@click.option("--priority", type=int, default=0, show_default=True, help="Higher is claimed first.")
@click.option("--assignee", help="Only this agent may claim it.")
@click.option("--role", help="Only agents with this role may claim it.")
@click.option("--depends-on", "depends_on", multiple=True, help="A task that must be done first (repeatable).")
@click.option("--tier", type=click.Choice(TIERS), default="auto", show_default=True)
@click.option("--max-attempts", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--steps", "steps_json", help='A deterministic plan as JSON: [{"tool": NAME, "args": {...}}].')
@click.option("--id", "task_id", help="Choose the id (default: derived from the title).")
@json_option
@click.pass_context
@handled
def task_add(ctx: click.Context, title: str, body: str, priority: int, assignee: str | None, role: str | None,
             depends_on: tuple[str, ...], tier: str, max_attempts: int, steps_json: str | None,
             task_id: str | None, as_json: bool) -> None:
    """Add a task titled TITLE; prints its id."""
    fields: dict[str, Any] = {"title": title, "body": body, "priority": priority, "assignee": assignee,
                              "role": role, "depends_on": list(depends_on), "tier": tier,
                              "max_attempts": max_attempts}
    if task_id:
        fields["id"] = task_id
    if steps_json:
        try:
            fields["steps"] = json.loads(steps_json)
        except ValueError as exc:
            raise Failure(f"--steps is not valid JSON: {exc}", 2) from None
    with open_board(ctx) as board:
        refreshed(board)
        doc = board.add(fields, by="cli")
    if as_json:
        emit_json(doc)
    else:
        click.echo(doc["id"])


@task.command("list")
@click.option("--status", type=click.Choice(STATUSES), help="Only tasks in this status.")
@json_option
@click.pass_context
@handled
def task_list(ctx: click.Context, status: str | None, as_json: bool) -> None:
    """List tasks, in claim order within each status."""
    with open_board(ctx) as board:
        ingest = refreshed(board)
        listing = board.list(status)
        moved = board.quarantine_damaged(listing.damaged)
    if as_json:
        emit_json({"tasks": listing.tasks, "damaged": listing.damaged, "moved_aside": moved, "ingest": ingest})
        return
    render.print_ingest(err, ingest)
    if listing.tasks:
        out.print(render.task_table(listing.tasks))
    else:
        out.print("no tasks" + (f" in {status}" if status else ""))
    for item in listing.damaged:
        err.print(f"[red]damaged:[/red] {item['path']}: {item['reason']}")


@task.command("show")
@click.argument("task_id", metavar="ID")
@json_option
@click.pass_context
@handled
def task_show(ctx: click.Context, task_id: str, as_json: bool) -> None:
    """Show one task with its history."""
    with open_board(ctx) as board:
        refreshed(board)
        doc = board.get(task_id)
    if as_json:
        emit_json(doc)
    else:
        out.print(render.task_detail(doc))


def _change(ctx: click.Context, as_json: bool, action: Callable[[Board], dict[str, Any]]) -> None:
    with open_board(ctx) as board:
        refreshed(board)
        doc = action(board)
    if as_json:
        emit_json(doc)
    else:
        out.print(f"{doc['id']}: {doc['history'][-1]['from']} -> {doc['status']}")


@task.command("cancel")
@click.argument("task_id", metavar="ID")
@json_option
@click.pass_context
@handled
def task_cancel(ctx: click.Context, task_id: str, as_json: bool) -> None:
    """Cancel a task (a claim on it is revoked)."""
    _change(ctx, as_json, lambda board: board.cancel(task_id))


@task.command("retry")
@click.argument("task_id", metavar="ID")
@json_option
@click.pass_context
@handled
def task_retry(ctx: click.Context, task_id: str, as_json: bool) -> None:
    """Put a blocked, failed or cancelled task back in todo, with its attempts reset."""
    _change(ctx, as_json, lambda board: board.retry(task_id))


@task.command("move")
@click.argument("task_id", metavar="ID")
@click.argument("status", type=click.Choice([s for s in STATUSES if s != "doing"]))
@click.option("--note", default="", help="Why, for the task's history.")
@json_option
@click.pass_context
@handled
def task_move(ctx: click.Context, task_id: str, status: str, note: str, as_json: bool) -> None:
    """Move a task to STATUS by hand (doing is reserved for claims)."""
    _change(ctx, as_json, lambda board: board.move(task_id, status, note=note))


# -- the board --------------------------------------------------------------------------------------

@main.command("board")
@json_option
@click.pass_context
@handled
def board_cmd(ctx: click.Context, as_json: bool) -> None:
    """The board as columns, with counts and the top tasks of each."""
    with open_board(ctx) as board:
        ingest = refreshed(board)
        listing = board.list()
        board.quarantine_damaged(listing.damaged)
    document = render.board_document(listing.tasks, listing.damaged, ingest)
    if as_json:
        emit_json(document)
    else:
        render.print_board(out, document)


@main.command()
@json_option
@click.pass_context
@handled
def doctor(ctx: click.Context, as_json: bool) -> None:
    """Check the config, the board's filesystem, inotify limits, credentials and disk."""
    ws = workspace_of(ctx)
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
            out.print(f"[{colour[check['level']]}]{check['level']:>5}[/] {check['name']}: {check['detail']}",
                      highlight=False)
    if worst == "error":
        sys.exit(1)


@main.command()
@click.pass_context
@handled
def up(ctx: click.Context) -> None:
    """Run the workspace in the foreground until Ctrl-C.

    For now this keeps the board: drops are ingested the moment they land, claims of dead holders
    are recovered, and the board is redrawn as it changes. Agent processes are not started yet.
    """
    ws = workspace_of(ctx)
    load_config(ws.config_path)
    ws.runs_path.mkdir(exist_ok=True)
    import filelock  # only `up` needs it; 30 ms of start-up for every other command

    # One `up` per workspace. filelock's flock is released by the kernel when the process dies, so
    # a SIGKILLed `up` never leaves the workspace locked.
    singleton = filelock.FileLock(str(ws.runs_path / "supervisor.lock"), blocking=False)
    try:
        singleton.acquire()
    except filelock.Timeout:
        running = read_supervisor_state(ws)
        raise Failure(f"hermes-sup is already running in {ws.root} (pid {running.get('pid', '?')})") from None
    write_json_atomic(ws.runs_path / "supervisor.json", {
        "pid": os.getpid(), "pid_started": start_time(os.getpid()), "started_at": now_iso(), "agents": {},
    })
    board = open_board(ctx)
    stop = threading.Event()

    def request_stop(_signum: int, _frame: Any) -> None:
        stop.set()
        board.wake()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    board.start_watching()
    err.print(f"hermes-sup: keeping the board {board.root} (watcher: {board.watcher.mode}); "
              "agent supervision is not part of this build yet. Ctrl-C stops.")
    shown = None
    try:
        while not stop.is_set():
            seen = board.signal.generation
            ingest = refreshed(board)
            listing = board.list()
            document = render.board_document(listing.tasks, listing.damaged, ingest)
            picture = json.dumps([document["columns"], document["damaged"]], sort_keys=True, default=str)
            if picture != shown:  # a wake-up from our own writes changes nothing to show
                shown = picture
                if os.isatty(1):
                    out.clear()
                render.print_board(out, document)
            else:
                render.print_ingest(out, ingest)
            board.signal.wait(seen, 5.0)
    finally:
        board.close()
        singleton.release()
    err.print("hermes-sup: stopped")


def read_supervisor_state(ws: Workspace) -> dict[str, Any]:
    try:
        state = json.loads((ws.runs_path / "supervisor.json").read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}
