"""`board`: the board drawn once, as JSON, or watched as it changes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import click

from ...kanban import BoardStore
from ...kanban.doccache import collector_paused
from ...kanban.why import Team
from .. import team
from ..cliargs import JsonUsageCommand, JsonUsageGroup, emit_json, json_text
from ..ingestwarn import recent_rejections
from ..interrupt import interruptible
from ..statefile import supervisor_alive
from ..views import render
from .common import group, handled, json_option, open_board, out, read_supervisor_state, refreshed, workspace_of

# -- the board --------------------------------------------------------------------------------------

class BoardGroup(JsonUsageGroup, JsonUsageCommand):
    """`board` shows the board itself, and has subcommands (`board migrate`, cli/migrate.py)."""


@group("board", cls=BoardGroup, invoke_without_command=True)
@json_option
@click.option("--watch", is_flag=True,
              help="Redraw as tasks move, on the board's change events (--json: one document per line).")
@click.pass_context
@handled
def board_cmd(ctx: click.Context, as_json: bool, watch: bool) -> None:
    """The board as columns, with counts and the top tasks of each."""
    if ctx.invoked_subcommand is not None:
        return
    with open_board(ctx) as board:
        if watch:
            watch_board(board, as_json, lambda: team_now(ctx))
            return
        # Without the cyclic collector until it is printed: it walked the listing's hundreds of
        # thousands of objects (none in a cycle) again and again as they aged through its generations.
        with collector_paused():
            document = board_now(board, team_now(ctx), None if as_json else render.TOP_PER_COLUMN)
            if as_json:
                emit_json(document)
            else:
                render.print_board(out, document)


SETTLE = 0.05      # a burst of moves is drawn once it pauses this long...
SETTLE_MAX = 0.25  # ...or after this long, whichever comes first
SAFETY_RESCAN = 5.0  # events are a wake-up, not the truth (see kanban/watch.py): look again now and then


def board_now(board: BoardStore, members: Team | None, limit: int | None = None) -> dict[str, Any]:
    """The board as `board` shows it, after doing a board command's work (see refreshed) and
    setting damaged task files aside, with why each waiting task waits for the team `members`;
    with `limit`, only the first `limit` tasks of each column (what the picture shows: saying why
    each of 10,000 tasks waits would cost more than the rest of the command)."""
    ingest = refreshed(board)
    listing = board.list_fields()  # all a board shows or judges of a task, a fraction of its bytes
    board.quarantine_damaged(listing.damaged)
    ingested = set(ingest.get("ingested") or ())
    new = [doc for doc in listing.tasks if doc["id"] in ingested]
    shown = listing.tasks if limit is None else render.top_of_columns(listing.tasks, limit)
    statuses = {doc["id"]: doc["status"] for doc in listing.tasks}
    return render.board_document(listing.tasks, listing.damaged, ingest, team.reasons(shown, members, statuses),
                                 team.warnings_for(board, new, members), recent_rejections(board.root / "rejected"),
                                 limit=limit)


def team_now(ctx: click.Context) -> Team | None:
    """The team of hermes.yaml, with its agents' states when a supervisor runs."""
    ws = workspace_of(ctx)
    state = read_supervisor_state(ws)
    return team.load_team(ws, state, supervisor_alive(state))


def watch_board(board: BoardStore, as_json: bool, members: Callable[[], Team | None]) -> None:
    """Draw the board, then again each time the watcher reports a change that alters the picture."""
    from rich.live import Live

    board.start_watching()
    interruptible()  # leave the screen as Ctrl-C does
    live = Live(console=out, auto_refresh=False, screen=True) if out.is_terminal and not as_json else None
    drawn: Any = None
    try:
        if live is not None:
            live.start()
        while True:
            seen = board.signal.generation
            document = board_now(board, members(), None if as_json else render.TOP_PER_COLUMN)
            picture = {k: v for k, v in document.items() if k != "ingest"}
            if picture != drawn:
                drawn = picture
                if as_json:
                    click.echo(json_text(document))
                elif live is not None:
                    live.update(render.watched_board(document, board.watch_mode), refresh=True)
                else:
                    render.print_board(out, document)
            if board.signal.wait(seen, SAFETY_RESCAN):
                settle_until = time.monotonic() + SETTLE_MAX
                while time.monotonic() < settle_until:
                    seen = board.signal.generation
                    if not board.signal.wait(seen, SETTLE):
                        break
    except KeyboardInterrupt:
        pass
    finally:
        if live is not None:
            live.stop()
