"""Steering commands: `stop`/`start` one agent, `ps` (= `status`), `task wait` and `task comment`.

Registered on the command line's groups when cli.py imports this module (at its end).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import click
from rich.text import Text

from ...kanban import BoardStore, TaskError
from ...kanban.prefix import resolve_task_id
from ..cliargs import Seconds, emit_json
from ..interrupt import interruptible
from ..statefile import supervisor_alive
from .common import (
    Failure,
    command,
    err,
    handled,
    json_option,
    literal,
    open_board,
    out,
    read_supervisor_state,
    refreshed,
    workspace_of,
)
from .run import _ask


@command()
@click.argument("agent")
@json_option
@click.pass_context
@handled
def stop(ctx: click.Context, agent: str, as_json: bool) -> None:
    """Stop one agent (an agent with a count: AGENT stops all its instances, AGENT-2 one of them);
    it stays stopped, across reload and a new `up`, until `start`. Not counted as a restart."""
    _ask(ctx, {"cmd": "stop", "agent": agent}, as_json)


@command()
@click.argument("agent")
@json_option
@click.pass_context
@handled
def start(ctx: click.Context, agent: str, as_json: bool) -> None:
    """Start an agent stopped by `stop` (or fatal) again. Not counted as a restart."""
    _ask(ctx, {"cmd": "start", "agent": agent}, as_json)


# -- task wait --------------------------------------------------------------------------------------

WAIT_EXIT = {"done": 0, "failed": 1, "cancelled": 1, "blocked": 3}
TIMED_OUT = 124  # as timeout(1)
INTERRUPTED = 130
# The watcher's events are a wake-up, never the truth (see kanban/watch.py): the task is read again
# this often even when none came, and more often when there are no events to be had.
RECHECK_WATCHED = 2.0
RECHECK_POLLING = 0.5


def wait_exit(status: str) -> int | None:
    """The exit code of `task wait` for a task in `status`; None while it is still on its way (pure)."""
    return WAIT_EXIT.get(status)


def outcome_line(doc: dict[str, Any]) -> str:
    """One line saying how a waited-on task ended (pure)."""
    status = doc.get("status")
    if status == "blocked":
        why = doc.get("question") or doc.get("error")
        return f"{doc.get('id')}: blocked" + (f": {why}" if why else "")
    if status in ("failed", "cancelled") and doc.get("error"):
        return f"{doc.get('id')}: {status}: {doc['error']}"
    return f"{doc.get('id')}: {status}"


def wait_for_end(board: BoardStore, task_id: str, timeout: float | None) -> tuple[dict[str, Any], int]:
    """Block on the board's change events until the task is done, failed, cancelled or blocked, or
    the timeout passes; the task's document and the exit code."""
    board.start_watching()
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        seen = board.signal.generation
        doc = board.get(task_id)
        code = wait_exit(doc["status"])
        if code is not None:
            return doc, code
        nap = RECHECK_WATCHED if board.watch_mode == "inotify" else RECHECK_POLLING
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return doc, TIMED_OUT
            nap = min(nap, remaining)
        board.signal.wait(seen, nap)


@command("wait")
@click.argument("task_id", metavar="ID")
@click.option("--timeout", type=Seconds(), help="Give up after this many seconds (exit 124).")
@json_option
@click.pass_context
@handled
def task_wait(ctx: click.Context, task_id: str, timeout: float | None, as_json: bool) -> None:
    """Block until the task is done (exit 0), failed or cancelled (1) or blocked (3); 124 when the
    timeout passes first. --json: the task's document at the end."""
    ws = workspace_of(ctx)
    interruptible()
    try:
        with open_board(ctx) as board:
            refreshed(board)
            task_id = resolve_task_id(board, task_id)
            # Said only when there is something to wait for: a task already at its end needs no team.
            if wait_exit(board.get(task_id)["status"]) is None and not supervisor_alive(read_supervisor_state(ws)):
                err.print(Text.assemble(("note:", "yellow"), " ", literal(
                    f"hermes-sup is not running in {ws.root}; waiting for a change by hand or another supervisor")))
            doc, code = wait_for_end(board, task_id, timeout)
    except KeyboardInterrupt:
        sys.exit(INTERRUPTED)  # not 1, which says the task failed
    if as_json:
        emit_json(doc)
    elif code == TIMED_OUT:
        err.print(literal(f"{doc['id']}: still {doc['status']} after {timeout:g} s"), highlight=False)
    else:
        out.print(literal(outcome_line(doc), one_line=True), highlight=False, soft_wrap=True)
    sys.exit(code)


# -- task comment -----------------------------------------------------------------------------------

@command("comment")
@click.argument("task_id", metavar="ID")
@click.argument("text")
@json_option
@click.pass_context
@handled
def task_comment(ctx: click.Context, task_id: str, text: str, as_json: bool) -> None:
    """Add a comment to a task in any status (at most 1 MiB); it does not move the task."""
    if not text.strip():
        raise Failure("a comment must not be empty", 2)
    with open_board(ctx) as board:
        refreshed(board)
        try:
            doc = board.comment(resolve_task_id(board, task_id), text, by="cli")
        except TaskError as exc:  # over the size limit: the argument is the problem
            raise Failure(str(exc), 2) from None
    if as_json:
        emit_json(doc)
    else:
        out.print(literal(f"{doc['id']}: comment added ({len(doc.get('comments') or [])} in all)"), soft_wrap=True)
