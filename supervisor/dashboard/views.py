"""What the page shows, read the way the CLI reads it: the board as `board --json` (with why each
card waits), the agents as `status`, usage as `usage`, and one task as `task show --transcript`.

Reading is the edge; the shapes are built by the CLI's own pure functions (render, team, usage,
taskrecords), so the page and the terminal never disagree.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from pathlib import Path
from typing import Any

import psutil
from hermes_sup.kanban import BoardStore
from hermes_sup.kanban.events import decode_event
from hermes_sup.kanban.liveness import holder_alive

from .. import render, taskrecords, team
from ..cliargs import sane_state
from ..runner import tree_rss_mb
from ..statefile import read_state
from ..usage import read_logs, summarize
from ..workspace import Workspace

HOST = socket.gethostname()
RECENT_EVENTS = 30
RECENT_BLOCK = 256 << 10
MAX_LOG_LINES = 2000


def supervisor_state(ws: Workspace) -> tuple[dict[str, Any], bool]:
    """supervisor.json as the CLI may use it, and whether the supervisor it names runs."""
    state = sane_state(read_state(ws.runs_path / "supervisor.json"))
    pid, started = state.get("pid"), state.get("pid_started")
    alive = isinstance(pid, int) and bool(started) and holder_alive(pid, started, None) is True
    return state, alive


def heartbeat(runs: Path, name: str, pid: object) -> str | None:
    """When the agent `name` running as `pid` last said it was alive (its state.json), or None."""
    state = read_state(runs / name / "state.json")
    if not isinstance(state, dict) or state.get("pid") != pid or not isinstance(pid, int):
        return None
    beat = state.get("heartbeat")
    return beat if isinstance(beat, str) and len(beat) <= 64 else None


def agent_rows(state: dict[str, Any], alive: bool, runs: Path) -> list[dict[str, Any]]:
    """Per agent: host, pid, state, restarts, current task, rss, last exit, heartbeat time."""
    rows = []
    for name, agent in (state.get("agents") or {}).items():
        pid = agent.get("pid")
        running = alive and bool(pid) and holder_alive(pid, agent.get("pid_started"), None) is True
        rss = None
        if running:
            with contextlib.suppress(psutil.Error):
                rss = round(tree_rss_mb(pid), 1)
        rows.append({"name": name, "host": HOST, "pid": pid if running else None,
                     "state": agent.get("state") if alive else "not running",
                     "restarts": agent.get("restarts"), "task": agent.get("task") if alive else None,
                     "last_exit": agent.get("last_exit"), "held": agent.get("held"), "rss_mb": rss,
                     "heartbeat": heartbeat(runs, name, pid) if running else None})
    return rows


def usage_document(runs: Path) -> dict[str, Any]:
    records, notes = read_logs(runs)
    summary = summarize(records)
    return {"total": summary["total"], "agents": summary["agents"], "notes": notes[:20],
            "tasks": {key: {"cost_usd": value.get("cost_usd"), "calls": value.get("calls")}
                      for key, value in summary["tasks"].items()}}


def board_document(board: BoardStore, ws: Workspace, state: dict[str, Any], alive: bool) -> dict[str, Any]:
    """The board as `board --json` has it (columns, counts, the computed reason each card waits),
    each card with its creation time for its age. Read only: the supervisor ingests and recovers."""
    listing = board.list()
    members = team.load_team(ws, state, alive)
    document = render.board_document(listing.tasks, listing.damaged, None, team.reasons(listing.tasks, members))
    docs = {doc["id"]: doc for doc in listing.tasks}
    for items in document["columns"].values():
        for item in items:
            doc = docs[item["id"]]
            item["created_at"] = doc.get("created_at")
            item["host"] = (doc.get("claim") or {}).get("host")  # where its holder runs
    return document


def recent_events(path: Path, count: int = RECENT_EVENTS) -> list[dict[str, Any]]:
    """The newest `count` events of the log (read from its end: a long log costs one block)."""
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            start = max(0, size - RECENT_BLOCK)
            handle.seek(start)
            data = handle.read(size - start)
    except FileNotFoundError:
        return []
    lines = data.split(b"\n")
    lines = lines[1 if start else 0:-1]  # a line cut by the block's start; the last, maybe unfinished
    found = [event for event in map(decode_event, lines) if event is not None]
    return found[-count:]


def snapshot(board: BoardStore, ws: Workspace) -> dict[str, Any]:
    """Everything the page draws at once."""
    state, alive = supervisor_state(ws)
    return {"board": board_document(board, ws, state, alive), "recent": recent_events(ws.board_path / "events.jsonl"),
            "agents": agent_rows(state, alive, ws.runs_path),
            "supervisor": {"running": alive, "pid": state.get("pid") if alive else None, "host": HOST},
            "usage": usage_document(ws.runs_path), "at": time.time()}


def task_document(board: BoardStore, ws: Workspace, task_id: str) -> dict[str, Any]:
    """One task as `task show --transcript --json` prints it."""
    state, alive = supervisor_state(ws)
    doc = board.get(task_id)
    doc = team.with_reason(doc, team.explain(board, doc, team.load_team(ws, state, alive)))
    raws, notes = taskrecords.gather(ws.runs_path, doc["id"])
    entries = taskrecords.merge(raws, taskrecords.claims(doc))
    # As `task log` prints them (the page and the terminal agree); the newest part of a long log.
    lines = [line for entry in entries for line in render.log_lines(entry)]
    return {**doc, **taskrecords.overview(entries), "log": lines[-MAX_LOG_LINES:],
            "log_cut": max(0, len(lines) - MAX_LOG_LINES), "notes": notes}
