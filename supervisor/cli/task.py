"""The `task` commands that add, read and change tasks: add, list, show, cancel, answer, retry, move.

Registered on the command line's `task` group when cli.py imports this module (at its end).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.text import Text

from ...agents import worktrees
from ...agents.taskdir import list_files, work_folder
from ...kanban import STATUSES, BoardStore
from ...kanban.prefix import resolve_task_id
from ...kanban.task import TIERS, TaskError, normalize, now_iso, slugify
from .. import team
from ..cliargs import MAX_PRIORITY, emit_json, parse_steps
from ..views import render
from .board import team_now
from .common import (
    Failure,
    err,
    group,
    handled,
    json_option,
    literal,
    open_board,
    out,
    print_table,
    refreshed,
    workspace_of,
)


@group()
def task() -> None:
    """Add, read and change tasks on the board."""


@task.command("add")
@click.argument("title")
@click.option("--body", default="", help="The instruction for the agent.")
@click.option("--priority", type=click.IntRange(-MAX_PRIORITY, MAX_PRIORITY), default=0, show_default=True,
              help="Higher is claimed first.")
@click.option("--assignee", help="Only this agent may claim it.")
@click.option("--role", help="Only agents with this role may claim it.")
@click.option("--depends-on", "depends_on", multiple=True, help="A task that must be done first (repeatable).")
@click.option("--tier", type=click.Choice(TIERS), default="auto", show_default=True,
              help="The providers' tier for its model calls (auto: by its size, one up per failed attempt).")
@click.option("--max-attempts", type=click.IntRange(1, 1000), default=3, show_default=True,
              help="Attempts before it fails for good.")
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
        fields["steps"] = parse_steps(steps_json)
    try:  # fields a person typed that no board would take are a usage error (2), found before the board opens
        normalize(fields, default_id=task_id or slugify(title) or "task", now=now_iso(), by="cli", note="")
    except TaskError as exc:
        raise Failure(str(exc), 2) from None
    with open_board(ctx) as board:
        refreshed(board)
        doc = board.add(fields, by="cli")
        warnings = team.warnings_for(board, [doc], team_now(ctx))  # added all the same: a person may fix the team
    if as_json:
        emit_json({**doc, "warnings": warnings})
        return
    for warning in warnings:
        err.print(Text.assemble(("warning:", "yellow"), " ", literal(warning)), highlight=False)
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
        print_table(render.task_table(listing.tasks))
    else:
        out.print("no tasks" + (f" in {status}" if status else ""))
    for item in listing.damaged:
        err.print(Text.assemble(("damaged:", "red"), " ", literal(f"{item['path']}: {item['reason']}")))


@task.command("show")
@click.argument("task_id", metavar="ID")
@click.option("--transcript", is_flag=True, help="Also its transcript, tool calls and model calls, in order.")
@json_option
@click.pass_context
@handled
def task_show(ctx: click.Context, task_id: str, transcript: bool, as_json: bool) -> None:
    """Show one task: its fields, result or error, the question it waits on, comments, history, why
    it is not moving, and from the agents' records the models that served it, the files it wrote and
    its cost so far."""
    from ..views import taskrecords, timeline  # the records' readers and the cost tables: `show`'s alone

    with open_board(ctx) as board:
        refreshed(board)
        doc = board.get(resolve_task_id(board, task_id))
        doc = team.with_reason(doc, team.explain(board, doc, team_now(ctx)))
        raws, notes = taskrecords.gather(workspace_of(ctx).runs_path, doc["id"], taskrecords.board_rows(board))
    entries = timeline.merge(raws, timeline.claims(doc))
    runs = workspace_of(ctx).runs_path
    doc = {**doc, **timeline.overview(entries), "folder": task_files(runs, doc["id"]),
           "worktrees": {name: worktrees.summary(rec) for name, rec in worktrees.records(runs, doc["id"]).items()}}
    if as_json:
        emit_json({**doc, **({"transcript": entries} if transcript else {}), "notes": notes})
        return
    out.print(render.task_detail(doc))
    if transcript:
        for entry in entries:
            for line in render.log_lines(entry):
                click.echo(line)
    for note in notes:
        err.print(Text.assemble(("note:", "yellow"), " ", literal(note, one_line=True)), soft_wrap=True)


def task_files(runs: Path, task_id: str) -> dict[str, Any] | None:
    """The task's working folder and the files in it now (what its holders wrote and left), or None
    when it has none (never worked by an agent, or pruned)."""
    folder = work_folder(runs, task_id)
    if not folder.is_dir() or folder.is_symlink():
        return None
    return list_files(folder)


def _change(ctx: click.Context, as_json: bool, action: Callable[[BoardStore], dict[str, Any]]) -> None:
    with open_board(ctx) as board:
        refreshed(board)
        doc = action(board)
    if as_json:
        emit_json(doc)
    else:
        out.print(literal(f"{doc['id']}: {doc['history'][-1]['from']} -> {doc['status']}"))


@task.command("cancel")
@click.argument("task_id", metavar="ID")
@json_option
@click.pass_context
@handled
def task_cancel(ctx: click.Context, task_id: str, as_json: bool) -> None:
    """Cancel a task (a claim on it is revoked)."""
    _change(ctx, as_json, lambda board: board.cancel(resolve_task_id(board, task_id)))


@task.command("answer")
@click.argument("task_id", metavar="ID")
@click.argument("text")
@json_option
@click.pass_context
@handled
def task_answer(ctx: click.Context, task_id: str, text: str, as_json: bool) -> None:
    """Answer the question a blocked task asked (ask_human): it goes back to todo, and TEXT is the
    result of the model call or step that asked."""
    _change(ctx, as_json, lambda board: board.answer(resolve_task_id(board, task_id), text))


@task.command("retry")
@click.argument("task_id", metavar="ID")
@json_option
@click.pass_context
@handled
def task_retry(ctx: click.Context, task_id: str, as_json: bool) -> None:
    """Put a blocked, failed or cancelled task back in todo, with its attempts reset."""
    _change(ctx, as_json, lambda board: board.retry(resolve_task_id(board, task_id)))


@task.command("move")
@click.argument("task_id", metavar="ID")
@click.argument("status", type=click.Choice([s for s in STATUSES if s != "doing"]))
@click.option("--note", default="", help="Why, for the task's history.")
@json_option
@click.pass_context
@handled
def task_move(ctx: click.Context, task_id: str, status: str, note: str, as_json: bool) -> None:
    """Move a task to STATUS by hand (doing is reserved for claims)."""
    _change(ctx, as_json, lambda board: board.move(resolve_task_id(board, task_id), status, note=note))
