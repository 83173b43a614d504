"""`hermes-sup status` (and `ps`): each agent's state as the supervisor has it, with what /proc says
of it now; kept apart from `up` and `down` so that a look while a large team starts imports little."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click
import psutil

from .. import proctable
from ..cliargs import emit_json, sane_children, sane_state
from ..config.workspace import Workspace
from ..control import CONTROL_SOCKET, SOCKET_DIR, request
from ..statefile import read_state, supervisor_alive
from .common import (
    Failure,
    command,
    handled,
    json_option,
    literal,
    out,
    print_table,
    read_supervisor_state,
    workspace_of,
)


def live_children(runs: Path, name: str, procs: Mapping[int, proctable.Proc]) -> list[dict[str, Any]]:
    """The delegated child agents an agent reports in its state.json that are still running: the same
    process, pid and start time, as the agent saw start (a pid alone may have been reused since)."""
    return [child for child in sane_children(read_state(runs / name / "state.json"))
            if proctable.alive(procs, child["pid"], child["pid_started"])]


def status_rows(state: dict[str, Any], runs: Path) -> list[dict[str, Any]]:
    """Per agent: name, pid, state, restarts, uptime, task, rss, cpu, last exit (live from /proc),
    and its delegated children. CPU is sampled over one short interval for all agents together;
    everything else comes from one read of the process table (proctable.py)."""
    procs = proctable.table()
    now = time.time()
    agents = state.get("agents") or {}
    alive = {name: agent["pid"] for name, agent in agents.items()
             if agent.get("pid") and proctable.alive(procs, agent["pid"], agent.get("pid_started"))}
    memory = proctable.trees_rss_mb(procs, alive.values())
    rows = []
    for name, agent in agents.items():
        row = {"name": name, **{k: agent.get(k) for k in ("pid", "state", "restarts", "task", "last_exit", "held")},
               "uptime_s": None, "rss_mb": None, "cpu_percent": None, "children": []}
        pid = alive.get(name)
        if pid:
            row["children"] = live_children(runs, name, procs)
            row["uptime_s"] = round(now - procs[pid].started, 1)
            row["rss_mb"] = round(memory[pid], 1)
        rows.append(row)
    if alive:
        # Each agent's CPU over its own interval: read twice, each read timed (the table's scan of
        # every process would otherwise count as part of the 0.1 s, and inflate the figure).
        boot = psutil.boot_time()
        first = {pid: (time.monotonic(), proctable.read(pid, boot)) for pid in alive.values()}
        time.sleep(0.1)
        for row in rows:
            pid = alive.get(row["name"])
            if pid is None:
                continue
            began_at, before = first[pid]
            later, ended_at = proctable.read(pid, boot), time.monotonic()
            if before is not None and later is not None and later.started == before.started:
                row["cpu_percent"] = round(100 * (later.cpu - before.cpu) / (ended_at - began_at), 1)
    return rows


def ask_supervisor(ws: Workspace, payload: dict[str, Any], timeout: float = 10.0) -> dict[str, Any] | None:
    """One command to the supervisor's control socket; None if nobody listens there."""
    try:
        reply = request(ws.runs_path, payload, timeout=timeout)
    except ValueError:
        reply = []
    if reply is not None and not isinstance(reply, dict):
        where = ws.runs_path / SOCKET_DIR / CONTROL_SOCKET
        raise Failure(f"the supervisor's control socket {where} answered something that is not a reply")
    return reply


@command()
@json_option
@click.pass_context
@handled
def status(ctx: click.Context, as_json: bool) -> None:
    """Per agent: pid, state, restarts, uptime, current task, rss, cpu, last exit, delegated children."""
    ws = workspace_of(ctx)
    state = read_supervisor_state(ws)
    running = supervisor_alive(state)
    if running:
        reply = ask_supervisor(ws, {"cmd": "status"}, timeout=5)
        if reply and reply.get("ok"):
            state = sane_state(reply.get("state"))
    rows = status_rows(state, ws.runs_path)
    document = {"running": running, "supervisor_pid": state.get("pid") if running else None,
                "workspace": str(ws.root), "agents": rows}
    if as_json:
        emit_json(document)
        return
    if not running:
        out.print("hermes-sup is not running in this workspace" + (" (last known state below)" if rows else ""))
    else:
        out.print(literal(f"hermes-sup running (pid {state.get('pid')}) in {ws.root}"))
    if rows:
        from ..views import render  # rich's tables: not for --json

        print_table(render.status_table(rows))
