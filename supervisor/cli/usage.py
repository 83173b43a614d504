"""`usage`: the team's model calls, tokens, cost and budgets from the LLM-call log."""

from __future__ import annotations

import time

import click
from rich.text import Text

from ...agents.ledger import LedgerError
from ..cliargs import emit_json
from ..config.workspace import ConfigError, board_settings, load_config
from ..governance.usage import board_model_calls, budget_standing_noted, summarize, team_calls
from ..views import render
from .common import command, err, handled, json_option, literal, open_board, out, print_table, workspace_of


@command()
@json_option
@click.pass_context
@handled
def usage(ctx: click.Context, as_json: bool) -> None:
    """Tokens and cost per agent, per task and per provider, from the LLM-call logs (on a shared
    board, every host's)."""
    ws = workspace_of(ctx)
    shared = board_settings(ws)[0].get("backend") != "files"  # a shared board: the other hosts' calls too
    records, notes = team_calls(ws.runs_path, (lambda: board_model_calls(lambda: open_board(ctx))) if shared else None)
    summary = summarize(records)
    try:
        config = load_config(ws.config_path)
        budgets, ledger_notes = budget_standing_noted(
            ws.runs_path, config.get("budgets"), time.time(), board=config.get("board"),
            host=config.get("host")) if config.get("budgets") else ([], [])
        notes += ledger_notes
        notes += [f"agent {agent['name']} runs a CLI (runtime: command) that reports no tokens or cost: its runs "
                  "are not in these figures" for agent in config.get("agents") or []
                  if agent.get("runtime") == "command"]
    except (ConfigError, LedgerError) as exc:
        budgets = []
        notes.append(f"budgets not shown: {exc}")
    if as_json:
        emit_json({**summary, "budgets": budgets, "notes": notes})
        return
    for note in notes:
        err.print(Text.assemble(("note:", "yellow"), " ", literal(note)))
    if budgets:
        print_table(render.budget_table(budgets))
    total = summary["total"]
    if not total["calls"]:
        out.print("no LLM calls yet")
        return
    print_table(render.usage_table("agent", summary["agents"]))
    print_table(render.usage_table("provider (model)", summary["providers"]))
    print_table(render.usage_table("task", summary["tasks"]))
    unpriced = f" ({total['unpriced_calls']} calls unpriced: add their models to `prices`)" \
        if total["unpriced_calls"] else ""
    about = "~" if total["estimated_calls"] else ""
    out.print(f"total: {total['calls']} calls, {about}{total['tokens_in']:,} tokens in ({total['tokens_cached']:,} "
              f"cached), {about}{total['tokens_out']:,} out, ${total['cost_usd']:.4f}{unpriced}")
    if total["estimated_calls"]:
        out.print(f"~ estimated: {total['estimated_calls']} calls ({total['tokens_estimated']:,} tokens) got no usage "
                  "from their server and are counted at 4 characters a token")
