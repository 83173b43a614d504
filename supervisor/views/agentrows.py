"""Each agent as the dashboard's agents panel shows it: this host's read from runs/ and the process
table, and on a shared board every other host's as its supervisor published it with its heartbeat
(announce_host), judged here since another host wrote it."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ...kanban.liveness import holder_alive
from ..cliargs import sane_state
from ..procs import trees_rss_mb
from ..statefile import SUPERVISOR_FILE, read_state, supervisor_alive

MAX_TEXT = 200  # characters of a name, state, task or exit another host published
MAX_AGENTS = 500  # agents shown of one other host
# Other hosts' agents shown in all: anyone with the database can make hosts up (a real team is far
# smaller), and each row goes into every picture of every open page.
MAX_REMOTE_ROWS = 1000


def supervisor_state(runs: Path) -> tuple[dict[str, Any], bool]:
    """supervisor.json as the CLI may use it, and whether the supervisor it names runs."""
    state = sane_state(read_state(runs / SUPERVISOR_FILE))
    return state, supervisor_alive(state)


def heartbeat(runs: Path, name: str, pid: object) -> str | None:
    """When the agent `name` running as `pid` last said it was alive (its state.json), or None."""
    state = read_state(runs / name / "state.json")
    if not isinstance(state, dict) or state.get("pid") != pid or not isinstance(pid, int):
        return None
    beat = state.get("heartbeat")
    return beat if isinstance(beat, str) and len(beat) <= 64 else None


def agent_rows(state: dict[str, Any], alive: bool, runs: Path, host: str) -> list[dict[str, Any]]:
    """Per agent of this host: host, pid, state, restarts, current task, rss, last exit, heartbeat time."""
    rows = []
    agents = state.get("agents") or {}
    live = {name: agent["pid"] for name, agent in agents.items() if alive and agent.get("pid")
            and holder_alive(agent["pid"], agent.get("pid_started"), None) is True}
    memory = trees_rss_mb(live.values()) if live else {}  # one scan of the process table for them all
    for name, agent in agents.items():
        pid = agent.get("pid")
        running = name in live
        rss = round(memory[pid], 1) if running else None
        rows.append({"name": name, "host": host, "pid": pid if running else None,
                     "state": agent.get("state") if alive else "not running",
                     "restarts": agent.get("restarts"), "task": agent.get("task") if alive else None,
                     "last_exit": agent.get("last_exit"), "held": agent.get("held"), "rss_mb": rss,
                     "heartbeat": heartbeat(runs, name, pid) if running else None})
    return rows


def seconds_since(iso: object, now: float) -> float | None:
    """How long ago an ISO-8601 UTC time was (pure); None for anything else."""
    if not isinstance(iso, str):
        return None
    try:
        moment = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return max(0.0, now - moment.timestamp())


def published(runs: Path, now: float | None = None) -> list[dict[str, Any]]:
    """This host's agents as its heartbeat publishes them: the panel's row, with the agent's heartbeat
    as an age (seconds, by this host's clock, which wrote it) rather than a time another host's clock
    would misread."""
    state, alive = supervisor_state(runs)
    now = time.time() if now is None else now
    rows = []
    for row in agent_rows(state, alive, runs, ""):
        beat = row.pop("heartbeat")
        row.pop("host")
        rows.append({**row, "heartbeat_age": seconds_since(beat, now)})
    return rows


def _text(value: object) -> str | None:
    return value[:MAX_TEXT] if isinstance(value, str) else None


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 31 else None


def _seconds(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        return None
    return float(value)


def _iso(moment: float) -> str | None:
    try:
        return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    except (OverflowError, ValueError, OSError):  # an age another host published past any calendar
        return None


def remote_rows(hosts: list[dict[str, Any]], me: str, now: float) -> list[dict[str, Any]]:
    """Every other host's agents as the panel shows them (pure): what each published, each field
    kept only in the shape this host would have written it (another host, or anyone with the
    database, wrote it), its heartbeat a time on this server's clock (the agent's age when published
    plus the row's age by the database's clock), `silent` when its host stopped heartbeating."""
    rows = []
    for host in hosts:
        name = _text(host.get("host"))
        agents = host.get("agents")
        if name is None or name == me or not isinstance(agents, list):
            continue
        host_age = _seconds(host.get("age"))
        silent = host.get("silent") is True
        for agent in agents[:MAX_AGENTS]:
            if len(rows) >= MAX_REMOTE_ROWS:
                return rows
            if not isinstance(agent, dict) or _text(agent.get("name")) is None:
                continue
            beat = _seconds(agent.get("heartbeat_age"))
            rss = _seconds(agent.get("rss_mb"))
            rows.append({"name": _text(agent.get("name")), "host": name, "pid": _count(agent.get("pid")),
                         "state": _text(agent.get("state")), "restarts": _count(agent.get("restarts")),
                         "task": _text(agent.get("task")), "last_exit": _text(agent.get("last_exit")),
                         "held": agent.get("held") is True, "rss_mb": None if rss is None else round(rss, 1),
                         "heartbeat": None if beat is None or host_age is None else _iso(now - beat - host_age),
                         "remote": True, "silent": silent})
    return rows
