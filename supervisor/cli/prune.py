"""`hermes-sup prune --older-than D [--dry-run]`: free the space finished tasks take under runs/.

Registered on the command line's main group when cli.py imports this module (at its end).
"""

from __future__ import annotations

import click
from rich.text import Text

from ..cliargs import emit_json
from ..upkeep.prune import parse_age, prune
from .common import Failure, command, err, handled, json_option, literal, open_board, out, workspace_of


@command("prune")
@click.option("--older-than", "older_than", required=True, metavar="D",
              help="Only tasks finished (done, failed, cancelled) and unchanged for this long: 30m, 12h, 7d.")
@click.option("--dry-run", is_flag=True, help="Only list what would be removed.")
@json_option
@click.pass_context
@handled
def prune_command(ctx: click.Context, older_than: str, dry_run: bool, as_json: bool) -> None:
    """Remove what finished tasks left under runs/ (their transcripts, their records in the tool-call
    logs, their working folders) and, on a PostgreSQL board, their journal rows; the task documents,
    the LLM-call logs and model-call rows (usage) and the budget ledger are kept, and a task that is
    todo, doing or blocked is never touched."""
    try:
        seconds = parse_age(older_than)
    except ValueError as exc:
        raise Failure(str(exc), 2) from None
    runs = workspace_of(ctx).runs_path
    with open_board(ctx) as board:
        result = prune(runs, board, seconds, dry_run=dry_run)
    if as_json:
        emit_json(result.as_dict())
        return
    verb = "would remove" if dry_run else "removed"
    for item in result.tasks:
        out.print(literal(f"{verb} {item['task']} ({item['status']}): {len(item['paths'])} path(s), "
                          f"{item['bytes']:,} bytes"), soft_wrap=True)
        for path in item["paths"]:
            out.print(literal(f"  {path}"), soft_wrap=True)
    for item in result.journals:
        out.print(literal(f"{verb} {item['records']} record(s) from {item['path']}: {item['bytes']:,} bytes"),
                  soft_wrap=True)
    if result.database is not None and result.database["rows"]:
        out.print(f"{verb} {result.database['rows']:,} journal row(s) of {result.database['tasks']} task(s) from "
                  f"the board's database: {result.database['bytes']:,} bytes", soft_wrap=True)
    for note in result.notes:
        err.print(Text.assemble(("note:", "yellow"), " ", literal(note)), soft_wrap=True)
    freed = "would free" if dry_run else "freed"
    out.print(f"{len(result.tasks)} task(s), {freed} {result.freed:,} bytes", soft_wrap=True)
