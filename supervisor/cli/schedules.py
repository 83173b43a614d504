"""`schedules [--json]`: each schedule of hermes.yaml with its next due time and its last run.

Registered on the command line when cli.py imports this module (at its end).
"""

from __future__ import annotations

from datetime import UTC, datetime

import click

from ..cliargs import emit_json
from ..config.workspace import load_config
from ..governance.schedules import STATE_FILE, listing, read_state, schedules_of
from ..views.render import literal
from .common import command, handled, json_option, out, workspace_of


@command()
@json_option
@click.pass_context
@handled
def schedules(ctx: click.Context, as_json: bool) -> None:
    """Each schedule (cron, in UTC), its next due time, and the last due time a task was added for."""
    ws = workspace_of(ctx)
    rows = listing(schedules_of(load_config(ws.config_path)), read_state(ws.runs_path / STATE_FILE),
                   datetime.now(UTC))
    if as_json:
        emit_json({"schedules": rows})
        return
    if not rows:
        out.print("no schedules (add them under `schedules:` in hermes.yaml)")
        return
    for row in rows:
        last = f"last {row['last_due']}" + (f" ({row['last_task']})" if row["last_task"] else " (started, none due)") \
            if row["last_due"] else "never run (starts with the next `up`)"
        line = f"{row['name']}  \"{row['cron']}\"  next {row['next_due'] or '-'}  {last}  {row['title']}"
        out.print(literal(line, one_line=True))
