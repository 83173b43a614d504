"""`import-hermes --board`: the open tasks of a Hermes Agent `kanban.db` put on this board.

The database is opened read-only, never through a symlink, and bounded; what is read becomes plain
task fields (pure), all validated before the first is added. Each task gets an id derived from its
Hermes id (`hermes-<id>`), so running the import again adds only what is missing; its Hermes
parents that are open too become its `depends_on`, its comments a section of its body, and its
Hermes id, status and tenant are kept in `meta.hermes`. Claims do not carry over: an open task starts
in todo here, and one that waits on Hermes' board for something outside it (triage, scheduled,
blocked, review) is blocked here with a comment saying on what.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...kanban.task import TaskError, normalize, now_iso
from .profile import HermesImportError

if TYPE_CHECKING:
    import sqlite3

MAX_DB = 512 << 20
MAX_TASKS = 10_000
MAX_COMMENTS = 50_000
MAX_VALUE = 16 << 20  # bytes of one value read from kanban.db
READ_SECONDS = 60.0  # for all of kanban.db's reads
OPEN = ("triage", "todo", "scheduled", "ready", "running", "blocked", "review")
# Hermes' statuses that wait for something outside the board: blocked here, saying what on Hermes'.
WAITING = {
    "triage": "in triage on Hermes' board: it waits for a person to specify it",
    "scheduled": "scheduled on Hermes' board: it waits for its time or an automation to release it",
    "blocked": "blocked on Hermes' board",
    "review": "in review on Hermes' board: its work waits for a person's review",
}
PER_TASK = ("skills", "max_runtime_seconds", "model_override", "max_retries")


def _read_tables(copy: Path, path: Path) -> tuple[list[dict[str, Any]], list[Any], list[Any], dict[Any, Any]]:
    """kanban.db's open tasks (the columns this file has), links, comments and the runs' reasons."""
    import sqlite3

    from ...agents.hermesrun import open_hostile

    try:
        conn = open_hostile(copy, ("tasks", "task_links", "task_comments", "task_runs"), seconds=READ_SECONDS,
                            max_value=MAX_VALUE, readonly=False)
    except ValueError as exc:
        raise HermesImportError(f"--board: {path}: {exc}; a Hermes kanban.db holds tables only (nothing was "
                                "changed)") from None
    except sqlite3.Error as exc:  # the sqlite_master read is the first that looks inside
        raise HermesImportError(f"--board: {path} is not a Hermes kanban database, or is damaged: {exc}") from None
    try:
        marks = ",".join("?" * len(OPEN))
        columns = {str(row[1]) for row in conn.execute("PRAGMA table_info(tasks)")}
        # Columns Hermes added over its releases: read where the file has them.
        keys = ("id", "title", "body", "assignee", "status", "priority", "tenant",
                *(c for c in PER_TASK if c in columns))
        tasks = conn.execute(f"SELECT {', '.join(keys)} FROM tasks "
                             f"WHERE status IN ({marks}) ORDER BY created_at, id LIMIT {MAX_TASKS + 1}",
                             OPEN).fetchall()
        reasons = dict(_rows(conn, "SELECT task_id, summary FROM task_runs WHERE summary IS NOT NULL ORDER BY id",
                             MAX_TASKS * 10)) if "task_runs" in _tables(conn) else {}
        links = _rows(conn, "SELECT parent_id, child_id FROM task_links", MAX_TASKS * 10)
        comments = _rows(conn, "SELECT task_id, author, body FROM task_comments ORDER BY id", MAX_COMMENTS)
    except sqlite3.Error as exc:
        raise HermesImportError(f"--board: {path} is not a Hermes kanban database, or is damaged: {exc}") from None
    finally:
        conn.close()
    return [dict(zip(keys, row, strict=True)) for row in tasks], links, comments, reasons


def _tables(conn: sqlite3.Connection) -> set[str]:
    return {str(row[0]) for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def _rows(conn: sqlite3.Connection, sql: str, limit: int) -> list[tuple[Any, ...]]:
    return conn.execute(f"{sql} LIMIT {limit + 1}").fetchall()


def read_board(path: Path) -> tuple[list[dict[str, Any]], list[tuple[str, str]], list[tuple[str, str, str]]]:
    """(open tasks, links parent -> child, comments task/author/body) of a Hermes kanban.db."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise HermesImportError(f"--board: no kanban.db in the profile ({path})") from None
    if stat.S_ISLNK(info.st_mode):
        raise HermesImportError(f"--board: {path} is a symlink; it is not followed")
    if not stat.S_ISREG(info.st_mode):
        raise HermesImportError(f"--board: {path} is not a regular file")
    if info.st_size > MAX_DB:
        raise HermesImportError(f"--board: {path} is larger than {MAX_DB >> 20} MiB")
    from ...agents.hermesrun import private_copy

    # Read from a copy of our own: a FIFO planted at its -journal would hold the import in open().
    with private_copy(path, MAX_DB) as copy:
        if copy is None:
            raise HermesImportError(f"--board: {path} could not be copied to be read (changed while read?)")
        tasks, links, comments, reasons = _read_tables(copy, path)
    if len(tasks) > MAX_TASKS:
        raise HermesImportError(f"--board: more than {MAX_TASKS:,} open tasks; move them in parts by hand")
    if len(comments) > MAX_COMMENTS:
        raise HermesImportError(f"--board: more than {MAX_COMMENTS:,} comments")
    rows = tasks
    for row in rows:
        if isinstance(reasons.get(row["id"]), str):
            row["reason"] = reasons[row["id"]]
    return (rows, [(str(p), str(c)) for p, c in links],
            [(str(t), str(a), str(b)) for t, a, b in comments])


def board_id(hermes_id: str) -> str:
    """This board's id of a Hermes task (pure)."""
    slug = re.sub(r"[^a-z0-9]+", "-", hermes_id.lower()).strip("-")[:56] or "task"
    return f"hermes-{slug}"


def board_tasks(tasks: list[dict[str, Any]], links: list[tuple[str, str]], comments: list[tuple[str, str, str]],
                agents: dict[str, str]) -> tuple[list[dict[str, Any]], list[str]]:
    """The task fields of the open Hermes tasks, parents first, and notes (pure). `agents` maps a
    Hermes assignee (a profile name) to an agent here; another assignee is dropped, with a note."""
    ids = {str(task["id"]): board_id(str(task["id"])) for task in tasks}
    if len(set(ids.values())) < len(ids):
        raise HermesImportError("--board: two Hermes task ids map to the same id here; move them by hand")
    parents: dict[str, list[str]] = {}
    for parent, child in links:
        if parent in ids and child in ids:
            parents.setdefault(child, []).append(ids[parent])
    said: dict[str, list[str]] = {}
    for task_id, author, body in comments:
        said.setdefault(task_id, []).append(f"- {author}: {body}")
    notes, fields = [], []
    dropped = sorted({str(t["assignee"]) for t in tasks if t.get("assignee") and str(t["assignee"]) not in agents})
    if dropped:
        notes.append(f"assignees with no agent here, left unassigned: {', '.join(dropped)}")
    for task in tasks:
        hermes_id = str(task["id"])
        body = str(task.get("body") or "")
        if said.get(hermes_id):
            body = (body + "\n\nComments on Hermes' board:\n" + "\n".join(said[hermes_id])).strip()
        kept, told = per_task(task)
        if kept.get("skills"):
            body = (body + "\n\nSkills to read first: " + ", ".join(kept["skills"])).strip()
        entry: dict[str, Any] = {
            "id": ids[hermes_id], "title": str(task.get("title") or hermes_id)[:500], "body": body,
            "priority": int(task["priority"]) if isinstance(task.get("priority"), int) else 0,
            "depends_on": parents.get(hermes_id, []),
            "meta": {"hermes": {**{key: task[key] for key in ("id", "status", "tenant") if task.get(key) is not None},
                                **kept}}}
        if isinstance(kept.get("max_retries"), int):
            entry["max_attempts"] = kept["max_retries"]  # Hermes gives up after that many failures, as we do
        waiting = WAITING.get(str(task.get("status")))
        if waiting:
            entry["status"] = "blocked"
            reason = task.get("reason") if isinstance(task.get("reason"), str) else ""
            entry["meta"]["hermes"]["why"] = f"{waiting}" + (f": {reason[:2000]}" if reason else "")
        notes += [f"Hermes task {hermes_id}: {line}" for line in told]
        if task.get("assignee") and str(task["assignee"]) in agents:
            entry["assignee"] = agents[str(task["assignee"])]
        fields.append(entry)
    order = {entry["id"]: index for index, entry in enumerate(fields)}
    placed: list[dict[str, Any]] = []
    seen: set[str] = set()

    def place(entry: dict[str, Any], trail: frozenset[str]) -> None:
        if entry["id"] in seen or entry["id"] in trail:
            return
        for dep in entry["depends_on"]:
            place(fields[order[dep]], trail | {entry["id"]})
        seen.add(entry["id"])
        placed.append(entry)

    for entry in fields:
        place(entry, frozenset())
    for entry in placed:
        try:
            normalize(entry, default_id=entry["id"], now=now_iso(), by="import-hermes", note="added")
        except TaskError as exc:
            raise HermesImportError(f"--board: Hermes task {entry['meta']['hermes']['id']} cannot be a task here: "
                                    f"{exc}") from None
    return placed, notes


def per_task(task: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A Hermes task's own settings that carry over (skills named in the body, max_retries as
    max_attempts) and the ones kept in meta.hermes only, each said (pure)."""
    kept: dict[str, Any] = {}
    said: list[str] = []
    raw = task.get("skills")
    if isinstance(raw, str) and raw.strip():
        import json

        try:
            names = json.loads(raw)
        except ValueError:
            names = None
        if isinstance(names, list) and all(isinstance(n, str) for n in names) and names:
            kept["skills"] = [n[:100] for n in names[:20]]
    retries = task.get("max_retries")
    if isinstance(retries, int) and not isinstance(retries, bool) and 1 <= retries <= 100:
        kept["max_retries"] = retries
    for key, what in (("max_runtime_seconds", "a run's time limit"), ("model_override", "a model of its own")):
        value = task.get(key)
        if isinstance(value, (int, str)) and not isinstance(value, bool) and str(value).strip():
            kept[key] = value if isinstance(value, int) else value[:200]
            said.append(f"{key} {kept[key]} ({what}) is kept in meta.hermes, not acted on: set it on the agent "
                        "that takes the task (max_runtime, providers)")
    return kept, said


def conflicts(board: Any, fields: list[dict[str, Any]]) -> list[str]:
    """The ids taken on the board by a task that is not the same Hermes task (checked before anything
    is written); a task an earlier import added is not one."""
    from ...kanban import TaskNotFound

    taken = []
    for entry in fields:
        with contextlib.suppress(TaskNotFound):
            existing = board.get(entry["id"])
            if (existing.get("meta") or {}).get("hermes", {}).get("id") != entry["meta"]["hermes"]["id"]:
                taken.append(entry["id"])
    return taken


def add_tasks(board: Any, fields: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """Put the tasks on the board: (added, already there from an earlier import)."""
    from ...kanban import BoardError, TaskNotFound

    added, there = [], []
    for entry in fields:
        try:
            board.get(entry["id"])
        except TaskNotFound:
            board.add(entry, by="import-hermes")
            why = entry["meta"]["hermes"].get("why")
            if why:  # blocked from the start, never claimed in between; the comment says why
                with contextlib.suppress(BoardError):
                    board.comment(entry["id"], f"{why} (unblock it with hermes-sup task unblock {entry['id']} when "
                                  "it may be worked)", by="import-hermes")
            added.append(entry["id"])
        else:
            there.append(entry["id"])
    return added, there
