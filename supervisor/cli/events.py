"""`events [-f] [--since CURSOR] [--json]`: the board's transitions and the supervisor's events (and
the alerts sent) as one stream with a resumable cursor.

Registered on the command line when cli.py imports this module (at its end).
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

import click
from rich.text import Text

from ...kanban import BoardStore
from ...kanban.events import CursorError, parse_cursor
from ..cliargs import json_text
from ..interrupt import interruptible
from ..views.render import event_line, literal
from .common import Failure, command, err, handled, json_option, open_board

# Wake-ups come from writes to the log itself (the board's watcher leaves it out: its wake-ups are
# task files moving, before the event is appended, and the supervisor's events move no file), and
# from the board's watcher; the log is also read on its own this often, in case one was missed.
RECHECK_WATCHED = 1.0
RECHECK_POLLING = 0.25
def event_json(cursor: int, record: dict[str, Any]) -> str:
    """One event as one JSON line with the cursor to resume after it (pure)."""
    return json_text({"cursor": cursor, **record})


def print_since(board: BoardStore, cursor: int, as_json: bool, inode: int | None = None) -> tuple[int, int | None]:
    """Print every complete event after `cursor` in the log `inode` names (None: the one there now);
    the cursor after the last one, and the log's inode."""
    while True:
        batch = board.events_since(cursor, inode=inode)
        inode = batch.inode
        if batch.restarted:
            err.print(Text.assemble(("note:", "yellow"), " ", literal(
                f"{batch.why or 'the event log was replaced'}; reading it from its start")))
        if batch.bad:
            err.print(Text.assemble(("note:", "yellow"), " ", literal(
                f"{batch.bad} unreadable {batch.bad_what or 'event(s)'} skipped")))
        for end, record in batch.events:
            click.echo(event_json(end, record) if as_json else event_line(record))
        if batch.cursor == cursor:
            return cursor, inode
        cursor = batch.cursor


@command()
@click.option("-f", "--follow", is_flag=True, help="Keep printing new events (Ctrl-C stops).")
@click.option("--since", "since", metavar="CURSOR", default="0",
              help="Only the events after this cursor (from `--json`'s `cursor`); 0: all.")
@json_option
@click.pass_context
@handled
def events(ctx: click.Context, follow: bool, since: str, as_json: bool) -> None:
    """The board's events (every task transition) and the supervisor's (agents started, exited,
    restarting, fatal, stopped or started by hand, reloads; alerts sent), oldest first; --json: one
    JSON object per line with its `kind` (board, supervisor, alert) and the `cursor` to give --since
    to resume after it."""
    try:
        cursor = parse_cursor(since)
    except CursorError as exc:
        raise Failure(str(exc), 2) from None
    with open_board(ctx) as board:
        try:
            board.check_cursor(cursor)
        except CursorError as exc:
            raise Failure(str(exc), 2) from None
        try:
            if follow:
                # Ctrl-C and SIGTERM end it as its help says (exit 0), as `logs -f` does.
                board.start_watching()
                interruptible()
                with contextlib.suppress(KeyboardInterrupt):
                    follow_events(board, cursor, as_json)
            else:
                print_since(board, cursor, as_json)
        except BrokenPipeError:
            # The reader went away (`events -f | head`): the stream's normal end, not an error. Any
            # output still buffered goes nowhere, so that Python's exit does not complain of it.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def follow_events(board: BoardStore, cursor: int, as_json: bool) -> None:
    inode = None
    stop = board.watch_events()
    watched = stop is not None and board.watch_mode == "inotify"
    try:
        while True:
            seen = board.signal.generation
            cursor, inode = print_since(board, cursor, as_json, inode)
            board.signal.wait(seen, RECHECK_WATCHED if watched else RECHECK_POLLING)
    finally:
        if stop is not None:
            stop()
