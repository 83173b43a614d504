"""What the page shows, read the way the CLI reads it: the board as `board --json` (its listing
fields, with why each shipped card waits), the agents as `status`, usage and budgets as `usage`, the
providers' breakers as `doctor`, and one task as `task show --transcript`. The board is read through
its protocol only.

Reading is the edge; the shapes are built by pure functions (picture.py, and the CLI's own render,
team, usage, taskrecords), so the page and the terminal never disagree.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

from ...agents import worktrees
from ...agents.ledger import LedgerError, open_reader
from ...kanban import BoardError, BoardStore
from ...kanban.backends import DEFAULT_BACKEND, check_board_config
from .. import team
from ..config.doctor import breaker_states
from ..config.workspace import ConfigError, Workspace, load_config
from ..governance.usage import budget_standing, open_board_model_calls, summarize, team_calls
from ..views import agentrows, render, taskrecords, timeline
from .picture import COLUMN_LIMIT, board_columns, shipped_costs

HOST = socket.gethostname()
RECENT_EVENTS = 30
RECENT_WINDOW = 64  # cursor units (bytes of the file log, events of PostgreSQL's) first looked back over
# The furthest back it looks: records that are no events (anyone who appends to the stream can write
# them) would otherwise double the window to the stream's start, read whole for every picture.
MAX_RECENT_WINDOW = 1 << 18
MAX_LOG_LINES = 2000


def supervisor_state(ws: Workspace) -> tuple[dict[str, Any], bool]:
    """supervisor.json as the CLI may use it, and whether the supervisor it names runs."""
    return agentrows.supervisor_state(ws.runs_path)


def host_agents(board: BoardStore) -> list[dict[str, Any]]:
    """Every host's agents as published with its heartbeat (a shared board), or none just now."""
    try:
        return board.host_agents()
    except (BoardError, OSError):
        return []  # the database away: this host's agents are still shown, from supervisor.json


def hosts_look(board: BoardStore, me: str) -> tuple[Any, list[dict[str, Any]]]:
    """Every host's published agents (one read), and what of them changes when another host's may
    have (each heartbeat, a host falling silent): the picture's key compares the one and its build
    draws the other, so a picture reads the hosts once."""
    rows = host_agents(board)
    return tuple((row.get("host"), row.get("heartbeat"), row.get("silent")) for row in rows
                 if row.get("host") != me), rows


def usage_document(runs: Path, board: BoardStore | None = None) -> dict[str, Any]:
    """The header's usage and each card's cost, as `usage` counts them: on a shared board (the file
    board keeps no journal rows, and `board` None reads none) the whole team's model calls."""
    records, notes = team_calls(runs, None if board is None else lambda: open_board_model_calls(board))
    summary = summarize(records)
    return {"total": summary["total"], "agents": summary["agents"], "notes": notes[:20],
            "tasks": {key: {"cost_usd": value.get("cost_usd"), "calls": value.get("calls")}
                      for key, value in summary["tasks"].items()}}


def board_document(board: BoardStore, ws: Workspace, state: dict[str, Any], alive: bool,
                   limit: int = COLUMN_LIMIT) -> dict[str, Any]:
    """The board as the page shows it (picture.board_columns), from what `board` reads: the listing
    fields of every task, not each task whole. Read only: the supervisor ingests and recovers."""
    listing = board.list_fields()
    return board_columns(listing.tasks, listing.damaged, team.load_team(ws, state, alive), limit)


def recent_events(board: BoardStore, count: int = RECENT_EVENTS) -> list[dict[str, Any]]:
    """The newest `count` events of the stream, read through the protocol from its end: a window
    before the end, doubled until it holds `count` events, reaches the start or MAX_RECENT_WINDOW,
    so a long stream costs a few short reads whatever a cursor counts (a window starting inside a
    line of the file log skips that line: only complete events are read)."""
    try:
        end = board.events_end()
        window = RECENT_WINDOW
        while True:
            start = max(0, end - window)
            found: list[dict[str, Any]] = []
            cursor = start
            while cursor < end:
                batch = board.events_since(cursor, max_events=1000)
                if batch.restarted or batch.cursor == cursor:
                    break  # replaced meanwhile, or nothing more yet: what was read is the newest there is
                found += [record for at, record in batch.events if at <= end]
                cursor = batch.cursor
            if len(found) >= count or start == 0 or window >= MAX_RECENT_WINDOW:
                # Each kind in its own words, as `hermes-sup events` prints it (one renderer for both).
                return [{**record, "line": render.event_line(record)} for record in found[-count:]]
            window *= 2
    except (BoardError, OSError):
        return []  # not readable just now (a database gone): the events come again with the stream


def budget_rows(ws: Workspace, now: float) -> tuple[list[dict[str, Any]], str | None]:
    """Spend against each cap of hermes.yaml's `budgets`, as `usage` shows it, and a note when they
    cannot be shown. The one place the page reads spend: it follows `usage` wherever the ledger is
    (runs/budget.jsonl, or the board's database where every host's agents reserve)."""
    try:
        config = load_config(ws.config_path)
        budgets = config.get("budgets")
        if not budgets:
            return [], None
        return budget_standing(ws.runs_path, budgets, now, board=config.get("board"), host=config.get("host")), None
    except (ConfigError, LedgerError) as exc:
        return [], f"budgets not shown: {exc}"


class LedgerVersion:
    """What says that spend changed on a board whose ledger is in its database (PostgreSQL): the
    ledger's version, one row read on a connection of its own, opened at the first look (a page
    open) and kept until close(). On the file board None: runs/budget.jsonl is watched instead."""

    def __init__(self, ws: Workspace) -> None:
        self.ws = ws
        self._ledger: Any = None
        self._lock = threading.Lock()
        try:
            config = load_config(ws.config_path)
            self._board, self._host = config.get("board"), config.get("host")
            self.shared = check_board_config(self._board)["backend"] != DEFAULT_BACKEND
        except (ConfigError, BoardError):  # changed since the board opened: budget_rows says what is wrong
            self.shared = False

    def __call__(self) -> Any:
        if not self.shared:
            return None
        with self._lock:
            try:
                if self._ledger is None:  # a reader: a page open creates no table
                    self._ledger = open_reader(self.ws.root, self._board, host=self._host)
                return None if self._ledger is None else self._ledger.version()
            except LedgerError:  # the database away just now: a marker, looked at again next time
                return "unreadable"

    def close(self) -> None:
        with self._lock:
            ledger, self._ledger = self._ledger, None
        if ledger is not None:
            ledger.close()


def breaker_rows(runs: Path, now: float) -> list[dict[str, str]]:
    """Each agent's provider breakers as doctor shows them (its reader, its words)."""
    return [{"agent": agent, "provider": provider, "level": level, "state": words}
            for agent, provider, level, words in breaker_states(runs, now)]


def snapshot(board: BoardStore, ws: Workspace, host: str = HOST, *, hosts: list[dict[str, Any]] | None = None,
             limit: int = COLUMN_LIMIT) -> dict[str, Any]:
    """Everything the page draws at once; `host` is this one's name on the board (hermes.yaml `host:`),
    `hosts` the hosts' published agents when already read (hosts_look), `limit` the cards per column."""
    state, alive = supervisor_state(ws)
    now = time.time()
    # This host's agents from supervisor.json (the local truth), every other host's as published.
    agents = agentrows.agent_rows(state, alive, ws.runs_path, host) + \
        agentrows.remote_rows(host_agents(board) if hosts is None else hosts, host, now)
    document = board_document(board, ws, state, alive, limit)
    budgets, budget_note = budget_rows(ws, now)
    usage = usage_document(ws.runs_path, board)
    usage["tasks"] = shipped_costs(usage["tasks"], document)  # the shipped cards' alone
    usage["notes"] += [budget_note] if budget_note else []
    return {"board": document, "recent": recent_events(board), "agents": agents,
            "supervisor": {"running": alive, "pid": state.get("pid") if alive else None, "host": host},
            "usage": usage, "budgets": budgets, "breakers": breaker_rows(ws.runs_path, now),
            "held": document["counts"].get("doing", 0), "at": now}


def task_document(board: BoardStore, ws: Workspace, task_id: str) -> dict[str, Any]:
    """One task as `task show --transcript --json` prints it."""
    state, alive = supervisor_state(ws)
    doc = board.get(task_id)
    doc = team.with_reason(doc, team.explain(board, doc, team.load_team(ws, state, alive)))
    raws, notes = taskrecords.gather(ws.runs_path, doc["id"], taskrecords.board_rows(board))
    entries = timeline.merge(raws, timeline.claims(doc))
    # As `task log` prints them (the page and the terminal agree); the newest part of a long log.
    lines = [line for entry in entries for line in render.log_lines(entry)]
    trees = {name: worktrees.summary(record) for name, record in worktrees.records(ws.runs_path, doc["id"]).items()}
    return {**doc, **timeline.overview(entries), "log": lines[-MAX_LOG_LINES:],
            "log_cut": max(0, len(lines) - MAX_LOG_LINES), "notes": notes, "worktrees": trees}
