"""The team as "why is it not moving" sees it (kanban/why.py), read from hermes.yaml, supervisor.json
and the agents' state.json, and the reasons and warnings the CLI shows for tasks.

Reading is the edge; the decisions are kanban/why.py's pure functions. Every file read here may be
damaged or forged: a value of the wrong type is taken as unknown, never trusted.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..kanban import BoardError, BoardStore
from ..kanban.fsio import read_bytes_nofollow
from ..kanban.why import Member, Team, Waiting, claim_warnings, why_waiting
from .config.workspace import ConfigError, Workspace, load_config
from .spec import build_specs

# An agent's waiting reason is a line of its own making; longer is not a reason but a damaged file.
MAX_REASON = 500
MAX_STATE = 1 << 20  # an agent's state.json: a few hundred bytes, its children listed


def agent_waiting(runs: Path, name: str, pid: object) -> str | None:
    """What the agent `name` (running as `pid`) reports in its state.json about leaving LLM tasks in
    todo: a reason, "" for nothing, None when it cannot be told (no file, another process's, damaged)."""
    try:  # never a FIFO left there to hang `board`, nor a huge file
        raw = read_bytes_nofollow(runs / name / "state.json", MAX_STATE)
        state = json.loads(raw) if len(raw) <= MAX_STATE else None
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(state, dict) or state.get("pid") != pid or not isinstance(pid, int):
        return None
    waiting = state.get("waiting")
    return waiting if isinstance(waiting, str) and len(waiting) <= MAX_REASON else None


def load_team(ws: Workspace, state: Mapping[str, Any], alive: bool) -> Team | None:
    """The team of hermes.yaml, with each agent's state when a supervisor runs (`state` is its
    supervisor.json, `alive` whether it runs); None when hermes.yaml cannot be read."""
    try:
        specs = build_specs(load_config(ws.config_path), ws.root)
    except (ConfigError, OSError, ValueError, TypeError):
        return None
    agents = state.get("agents") if alive else None
    agents = agents if isinstance(agents, Mapping) else {}
    members = []
    for spec in specs:
        found = agents.get(spec.name)
        info: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
        live = info.get("state") in ("running", "starting")
        members.append(Member(
            name=spec.name, roles=spec.roles, tier=spec.tier,
            state=info.get("state") if isinstance(info.get("state"), str) else None,
            task=info.get("task") if isinstance(info.get("task"), str) else None,
            waiting=agent_waiting(ws.runs_path, spec.name, info.get("pid")) if live else None))
    return Team(members=tuple(members), running=alive)


def dependency_statuses(board: BoardStore, docs: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """The status of every task the `docs` depend on that is on the board (one read each)."""
    found: dict[str, str] = {}
    for doc in docs:
        for dep in doc.get("depends_on") or ():
            if dep in found:
                continue
            try:
                found[dep] = board.get(dep)["status"]
            except BoardError:
                continue  # not on the board (or unreadable): a missing dependency
    return found


def reasons(tasks: list[dict[str, Any]], team: Team | None,
            statuses: Mapping[str, str] | None = None) -> dict[str, Waiting]:
    """Why each todo or blocked task of `tasks` waits, by id; `statuses` maps every task id on the
    board to its status (by default `tasks` are the whole board)."""
    if statuses is None:
        statuses = {doc["id"]: doc["status"] for doc in tasks}
    found = {}
    for doc in tasks:
        if doc["status"] in ("todo", "blocked"):
            why = why_waiting(doc, statuses, team)
            if why is not None:
                found[doc["id"]] = why
    return found


def with_reason(doc: dict[str, Any], why: Waiting | None) -> dict[str, Any]:
    """The task as `task show` prints it: `waiting` is the computed reason (not the note an agent
    left on it), `waiting_kind` its word for scripts; both None when it is not waiting."""
    return {**doc, "waiting": why.text if why else None, "waiting_kind": why.kind if why else None}


def explain(board: BoardStore, doc: dict[str, Any], team: Team | None) -> Waiting | None:
    return why_waiting(doc, dependency_statuses(board, [doc]), team)


def warnings_for(board: BoardStore, docs: Iterable[dict[str, Any]], team: Team | None) -> list[str]:
    """The warnings for new tasks no agent of the team could ever claim."""
    docs = list(docs)
    statuses = dependency_statuses(board, docs)
    return [line for doc in docs for line in claim_warnings(doc, statuses, team)]
