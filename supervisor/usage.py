"""`hermes-sup usage`: tokens and cost per agent, per task and per provider, summed from every
agent's LLM-call log (runs/<agent>/llm_calls.jsonl). Calls of a model missing from the price table
are counted as unpriced, never as free. Every call is logged, failed ones too (counted, with no
tokens); a call whose server reported no usage carries tokens estimated at 4 characters a token,
marked `estimated`, and the figures they are part of are shown as estimates. Spend against the caps
of `budgets:` comes from the board's budget ledger (runs/budget.jsonl, or the board's database on
PostgreSQL, where every host's agents reserve)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hermes_sup.agents.budget import caps_from, standing
from hermes_sup.agents.ledger import read_spend_noted
from hermes_sup.kanban.journal import Journal


def _blank() -> dict[str, Any]:
    return {"calls": 0, "failed_calls": 0, "tokens_in": 0, "tokens_out": 0, "tokens_cached": 0, "cost_usd": 0.0,
            "unpriced_calls": 0, "estimated_calls": 0, "tokens_estimated": 0}


def _count(value: Any) -> int:
    """A token count as logged, or 0 for anything that is not one (a damaged or forged record)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _dollars(value: Any) -> float | None:
    """A cost as logged; None (unpriced, never free) for anything that is not a finite amount."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    return float(value) if ok else None


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
    if (agent, record.get("call")) in ended:
        return None
    return {**record, "outcome": "interrupted", "tokens_in": _count(record.get("prompt_estimate")),
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
            total["tokens_in"] += _count(record.get("tokens_in"))
            total["estimated_calls"] += 1
            total["tokens_estimated"] += _count(record.get("tokens_in"))
        return
    before = total["tokens_in"] + total["tokens_out"]
    for key in ("tokens_in", "tokens_out", "tokens_cached"):
        total[key] += _count(record.get(key))
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
        for bucket, key in (("agents", agent), ("tasks", record.get("task") or "-"),
                            ("providers", f"{record.get('provider')} ({record.get('model')})")):
            _add(result[bucket].setdefault(key, _blank()), record)
        _add(result["total"], record)
    return result


def read_logs(runs: Path) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
    records, notes = [], []
    for path in sorted(runs.glob("*/llm_calls.jsonl")):
        read = Journal(path).read()
        notes += [f"{path.parent.name}: {note}" for note in read.notes]
        records += [(path.parent.name, record) for record in read.records]
    return records, notes


def budget_standing(runs: Path, budgets: Any, now: float, *, board: Any = None,
                    host: str | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """Spend (settled and still reserved) against each cap of hermes.yaml's `budgets`, from the
    ledger of the board hermes.yaml's `board:` and `host:` name (runs/ of the workspace whose runs/
    this is, or the board's database, read without creating anything there): scope, cap, limit,
    spent, left; and notes for the reader. Raises LedgerError."""
    entries, notes = read_spend_noted(runs.parent, board if isinstance(board, dict) else None, host=host)
    rows = standing(entries, caps_from(budgets if isinstance(budgets, dict) else None), now)
    return [{**row, "left": round(max(0.0, row["limit"] - row["spent"]), 8)} for row in rows], notes
