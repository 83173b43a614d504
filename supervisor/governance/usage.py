"""`hermes-sup usage`: tokens and cost per agent, per task and per provider, summed from every
agent's LLM-call log (runs/<agent>/llm_calls.jsonl) and, on a board that keeps the task journal
(PostgreSQL), from its model-call rows, so any host shows the whole team's calls (each once).
These records, not the budget ledger, make the tables: only they carry tokens, providers, failed
and unpriced calls, and they exist without `budgets:`; the ledger (exact for priced spend) makes
the budgets table. Calls of a model missing from the price table
are counted as unpriced, never as free. Every call is logged, failed ones too (counted, with no
tokens); a call whose server reported no usage carries tokens estimated at 4 characters a token,
marked `estimated`, and the figures they are part of are shown as estimates. Spend against the caps
of `budgets:` comes from the board's budget ledger (runs/budget.jsonl, or the board's database on
PostgreSQL, where every host's agents reserve)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ...agents.budget import caps_from, is_amount, logged_count, standing
from ...agents.ledger import read_spend_noted
from ...kanban import BoardError, BoardStore
from ...kanban.journal import Journal
from ..config.workspace import ConfigError


def _blank() -> dict[str, Any]:
    return {"calls": 0, "failed_calls": 0, "tokens_in": 0, "tokens_out": 0, "tokens_cached": 0, "cost_usd": 0.0,
            "unpriced_calls": 0, "estimated_calls": 0, "tokens_estimated": 0}


def _dollars(value: Any) -> float | None:
    """A cost as logged; None (unpriced, never free) for anything that is not a finite amount."""
    return float(value) if is_amount(value) else None


INTERRUPTED = ("no outcome was logged: the agent ended during the call (killed?), or the call is still "
               "under way; prompt tokens estimated")


def ended_calls(records: Iterable[tuple[str, dict[str, Any]]]) -> set[tuple[str, Any]]:
    """(agent, call) of every call with a logged outcome (pure)."""
    return {(agent, r.get("call")) for agent, r in records if r.get("outcome") != "started"
            and isinstance(r.get("call"), str)}


def settle_call(agent: str, record: dict[str, Any], ended: set[tuple[str, Any]]) -> dict[str, Any] | None:
    """A call's start record (logged before the call): None when an outcome of that call was logged
    too, else an interrupted call with its estimated prompt tokens; any other record as it is (pure)."""
    if record.get("outcome") != "started":
        return record
    call = record.get("call")
    if isinstance(call, str) and (agent, call) in ended:  # only text is an id (another host wrote the row)
        return None
    return {**record, "outcome": "interrupted", "tokens_in": logged_count(record.get("prompt_estimate")),
            "tokens_out": 0, "estimated": True, "error": INTERRUPTED}


def settle_calls(records: Iterable[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """The LLM-call records with each start record settled (see settle_call): a call the agent did
    not survive is counted, none twice (pure)."""
    records = list(records)
    ended = ended_calls(records)
    return [(agent, settled) for agent, record in records
            if (settled := settle_call(agent, record, ended)) is not None]


def _add(total: dict[str, Any], record: dict[str, Any]) -> None:
    total["calls"] += 1
    if record.get("outcome") != "ok":
        total["failed_calls"] += 1
        if record.get("outcome") == "interrupted" and record.get("estimated") is True:
            # The prompt reached the server (a kill mid-call): its tokens, estimated, unpriced.
            total["tokens_in"] += logged_count(record.get("tokens_in"))
            total["estimated_calls"] += 1
            total["tokens_estimated"] += logged_count(record.get("tokens_in"))
        return
    before = total["tokens_in"] + total["tokens_out"]
    for key in ("tokens_in", "tokens_out", "tokens_cached"):
        total[key] += logged_count(record.get(key))
    if record.get("estimated") is True:  # its tokens, as counted just above
        total["estimated_calls"] += 1
        total["tokens_estimated"] += total["tokens_in"] + total["tokens_out"] - before
    cost = _dollars(record.get("cost_usd"))
    if cost is None:
        total["unpriced_calls"] += 1
    else:
        total["cost_usd"] = round(total["cost_usd"] + cost, 8)


def summarize(records: Iterable[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """records: (agent, llm-call record) pairs. Pure."""
    result: dict[str, Any] = {"total": _blank(), "agents": {}, "tasks": {}, "providers": {}}
    for agent, record in settle_calls(records):
        task = record.get("task")
        for bucket, key in (("agents", agent), ("tasks", task if isinstance(task, str) and task else "-"),
                            ("providers", f"{record.get('provider')} ({record.get('model')})")):
            _add(result[bucket].setdefault(key, _blank()), record)
        _add(result["total"], record)
    return result


def read_logs(runs: Path) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
    """This host's agents' model calls: runs/<agent>/llm_calls.jsonl."""
    records, notes = [], []
    for path in sorted(runs.glob("*/llm_calls.jsonl")):
        read = Journal(path).read()
        notes += [f"{path.parent.name}: {note}" for note in read.notes]
        records += [(path.parent.name, record) for record in read.records]
    return records, notes


def _identity(record: dict[str, Any]) -> str:
    # A call's records carry its id and time: the same record in a file and in the database is one call.
    return json.dumps(record, sort_keys=True, ensure_ascii=False, default=str)


def team_records(local: list[tuple[str, dict[str, Any]]], rows: list[dict[str, Any]] | None
                 ) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
    """The team's model calls (pure): this host's records, then the board database's llm journal rows
    (every host's calls made for a task) that are not among them, each record once. The rows are
    a best-effort copy, so this host's files still count the calls whose copy never arrived (a lost
    claim, the database away); `rows` None: a board that keeps none (the file board)."""
    if rows is None:
        return local, []
    seen = {_identity(record) for _agent, record in local}
    merged, skipped = list(local), 0
    for row in rows:
        entry = row.get("entry")
        if not isinstance(entry, dict):
            skipped += 1
            continue
        identity = _identity(entry)
        if identity not in seen:
            seen.add(identity)
            merged.append((str(row.get("agent") or "-"), entry))
    notes = [f"{skipped} model-call row(s) in the board's database are not records and are skipped"] if skipped else []
    return merged, notes


def _unread_note(exc: Exception) -> list[str]:
    return [f"only this host's model calls are shown: the board's journal could not be read ({exc})"]


def board_model_calls(open_board: Callable[[], BoardStore]) -> tuple[list[dict[str, Any]] | None, list[str]]:
    """Every host's model calls as the board keeps them (its journal's llm rows; None from a board
    that keeps none), or None and a note when the board cannot be read: this host's then stand alone."""
    try:
        with open_board() as board:
            return open_board_model_calls(board)
    except (BoardError, ConfigError) as exc:
        return None, _unread_note(exc)


def open_board_model_calls(board: BoardStore) -> tuple[list[dict[str, Any]] | None, list[str]]:
    """`board_model_calls` of a board already open (the dashboard's), left open."""
    try:
        return board.journal_rows(None, "llm"), []
    except (BoardError, OSError) as exc:
        return None, _unread_note(exc)


def team_calls(runs: Path, rows: Callable[[], tuple[list[dict[str, Any]] | None, list[str]]] | None
               ) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
    """The model calls `usage` counts, and notes: this host's logs (runs/), and on a shared board
    (`rows`: `board_model_calls` or `open_board_model_calls`; None on the file board, which keeps
    no rows) every host's as its database keeps them, each call once (`team_records`). The one
    place `usage` and the dashboard read the team's spend from, so they never disagree."""
    records, notes = read_logs(runs)
    if rows is None:
        return records, notes
    found, board_notes = rows()
    records, merge_notes = team_records(records, found)
    return records, notes + board_notes + merge_notes


def budget_standing(runs: Path, budgets: Any, now: float, *, board: Any = None,
                    host: str | None = None) -> list[dict[str, Any]]:
    """Spend (settled and still reserved) against each cap of hermes.yaml's `budgets`, from the
    ledger of the board hermes.yaml's `board:` and `host:` name (runs/ of the workspace whose runs/
    this is, or the board's database, read without creating anything there): scope, cap, limit,
    spent, left. Raises LedgerError."""
    return budget_standing_noted(runs, budgets, now, board=board, host=host)[0]


def budget_standing_noted(runs: Path, budgets: Any, now: float, *, board: Any = None,
                          host: str | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """`budget_standing`, and notes for the reader (a database with no ledger yet). Today is the
    ledger's (the database's clock on PostgreSQL, as the agents reserve by it), else `now`'s.
    Raises LedgerError."""
    spend = read_spend_noted(runs.parent, board if isinstance(board, dict) else None, host=host)
    rows = standing(spend.entries, caps_from(budgets if isinstance(budgets, dict) else None),
                    now if spend.now is None else spend.now)
    return [{**row, "left": round(max(0.0, row["limit"] - row["spent"]), 8)} for row in rows], spend.notes
