"""`task log ID [-f]`: a task's transcript, tool calls and model calls, merged in time order across
the agents that worked it, and followed live as the agents append to their journals.

Registered on the command line's `task` group when cli.py imports this module (at its end).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import click
from rich.text import Text

from ...kanban import BoardError, BoardStore, TaskError
from ...kanban.prefix import resolve_task_id
from ..cliargs import json_text
from ..interrupt import interruptible
from ..views import render, taskrecords, timeline
from .common import command, err, handled, literal, open_board, refreshed, workspace_of

# The journals are plain files the agents append to: read again this often while following (the
# board's watcher sees the board, not them).
FOLLOW_INTERVAL = 0.25


class Printer:
    """Prints the entries of a task's log it has not printed yet, as text or as JSON lines."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.printed: set[timeline.Key] = set()

    def skip(self, gatherer: taskrecords.Gatherer) -> None:
        """A transcript rewritten (compressed) since the last poll: what it holds now was shown."""
        for source in gatherer.rewritten:
            count = len(gatherer.raws[source].records)
            self.printed.update(("message", source.agent, index) for index in range(count))
        gatherer.rewritten.clear()

    def show(self, keyed: list[tuple[timeline.Key, dict[str, Any]]]) -> None:
        for key, entry in keyed:
            if key in self.printed:
                continue
            self.printed.add(key)
            if self.as_json:
                click.echo(json_text(entry))  # no raw control or bidi character, as every --json
            else:
                for line in render.log_lines(entry):
                    click.echo(line)

    def note(self, notes: list[str]) -> None:
        for note in notes:
            err.print(Text.assemble(("note:", "yellow"), " ", literal(note, one_line=True)), soft_wrap=True)


def follow(board: BoardStore, gatherer: taskrecords.Gatherer, printer: Printer, interval: float) -> None:
    """Print what the agents append until Ctrl-C or SIGTERM, which end it as its help says (exit 0),
    as `logs -f` does."""
    interruptible()
    with contextlib.suppress(KeyboardInterrupt):
        while True:
            time.sleep(interval)
            printer.note(gatherer.poll())
            printer.skip(gatherer)
            printer.show(timeline.merge_keyed(gatherer.all(), held(board, gatherer.task_id), open_calls=False))


def held(board: BoardStore, task_id: str) -> list[tuple[str, str]]:
    """Who held the task when (a record copied to the next holder is shown under the one that wrote
    it); nothing if the task cannot be read now (removed or being rewritten): the log goes on."""
    try:
        return timeline.claims(board.get(task_id))
    except (BoardError, TaskError):
        return []


@command("log")
@click.argument("task_id", metavar="ID")
@click.option("-f", "--follow", "following", is_flag=True, help="Keep printing new records (Ctrl-C stops).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line, with a `kind` field.")
@click.pass_context
@handled
def task_log(ctx: click.Context, task_id: str, following: bool, as_json: bool) -> None:
    """The task's transcript (messages, with the tool calls the model asked for), its tool calls
    (input, output, duration, outcome) and model calls (provider, model, tokens, latency, cost), in
    time order across the agents that worked it."""
    with open_board(ctx) as board:
        refreshed(board)
        found = resolve_task_id(board, task_id)
        gatherer = taskrecords.Gatherer(workspace_of(ctx).runs_path, found, taskrecords.board_rows(board),
                                        board.journal_marks)
        printer = Printer(as_json)
        printer.note(gatherer.poll())
        gatherer.rewritten.clear()
        printer.show(timeline.merge_keyed(gatherer.all(), held(board, found), open_calls=not following))
        if not printer.printed and not as_json:  # an empty output would read as a failure to look
            printer.note([f"no records of {found} yet: no agent has worked on it"])
        if following:
            follow(board, gatherer, printer, FOLLOW_INTERVAL)
