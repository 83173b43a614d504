"""`hermes-sup prune`: what finished tasks leave under runs/ (transcripts, their records in the
tool-call logs, working folders), and on a board that keeps the task journal (PostgreSQL) its rows
of them, removed once they are older than a given age; the task documents, events.jsonl, the
LLM-call logs and model-call rows (what `usage` reads) and the budget ledger are kept."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...agents import worktrees
from ...agents.resume import set_aside_attempt
from ...agents.taskdir import folder_bytes, task_root
from ...kanban import BoardStore
from ...kanban.task import is_valid_id
from ..sweep import LOCK_FILE
from ..views.taskrecords import TOOL_LOG, agent_dirs

FINISHED = ("done", "failed", "cancelled")  # never todo, doing or blocked: someone may still work them
TRASH = ".pruning"  # runs/.pruning-<pid>/: what is being removed, moved out of every reader's way first


def finished_before(doc: dict[str, Any], cutoff: dt.datetime) -> bool:
    """Whether a task is finished and was last changed (its updated_at: finished, or commented on
    since) before `cutoff` (pure). A time that cannot be read keeps the task."""
    if doc.get("status") not in FINISHED or not is_valid_id(doc.get("id")):
        return False
    try:
        changed = dt.datetime.fromisoformat(str(doc.get("updated_at")).replace("Z", "+00:00"))
    except ValueError:
        return False
    if changed.tzinfo is None:
        return False
    return changed < cutoff


def journal_keep(line: bytes, ids: frozenset[str]) -> bool:
    """Whether a line of a tool-call log stays: every line but a record of a pruned task, damaged
    ones included (pure)."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return True
    return not (isinstance(record, dict) and record.get("task") in ids)


@dataclass
class Pruned:
    dry_run: bool
    tasks: list[dict[str, Any]] = field(default_factory=list)     # {task, status, paths, bytes}
    journals: list[dict[str, Any]] = field(default_factory=list)  # {path, records, bytes}
    notes: list[str] = field(default_factory=list)
    # The board's own journal rows of those tasks ({tasks, rows, bytes}); None: it keeps none.
    database: dict[str, int] | None = None

    @property
    def freed(self) -> int:
        return sum(item["bytes"] for item in self.tasks) + sum(item["bytes"] for item in self.journals) + \
            (self.database or {}).get("bytes", 0)

    def as_dict(self) -> dict[str, Any]:
        return {"dry_run": self.dry_run, "tasks": self.tasks, "journals": self.journals, "database": self.database,
                "bytes": self.freed, "notes": self.notes}


def task_paths(runs: Path, task_id: str) -> list[Path]:
    """What a task left under runs/: its transcript in each agent's (and delegated child's) folder,
    with the copies compression and repair kept beside it and its earlier attempts' conversations,
    and runs/tasks/<id>/."""
    found = []
    for _, folder in agent_dirs(runs):
        try:
            with os.scandir(folder / "transcripts") as entries:
                names = [(entry.name, entry.is_file(follow_symlinks=False) or entry.is_symlink()) for entry in entries]
        except OSError:
            continue
        for name, plain in names:
            rest = name.removeprefix(f"{task_id}.jsonl")
            if plain and ((rest != name and (rest in ("", ".damaged") or (rest[:1] == "." and rest[1:].isdigit())))
                          or set_aside_attempt(name, task_id) is not None):  # an earlier attempt's
                found.append(folder / "transcripts" / name)
    root = task_root(runs, task_id)
    if root.exists() or root.is_symlink():
        found.append(root)
    return sorted(set(found))


def _size(path: Path) -> int:
    if path.is_symlink() or not path.is_dir():
        try:
            return path.lstat().st_size
        except OSError:
            return 0
    return folder_bytes(path)


def prune(runs: Path, board: BoardStore, older_than: float, *, dry_run: bool = False,
          now: dt.datetime | None = None) -> Pruned:
    """Remove (or, dry, only list) what finished tasks last changed more than `older_than` seconds
    ago left under `runs`, and the board's journal rows of them (`journal_prune`). The tool-call
    logs are rewritten only while no supervisor runs (its agents keep them open to append);
    otherwise their records stay and a note says so."""
    import filelock

    result = Pruned(dry_run=dry_run)
    cutoff = (now or dt.datetime.now(dt.UTC)) - dt.timedelta(seconds=older_than)
    trash = runs / f"{TRASH}-{os.getpid()}"
    picked: list[str] = []
    aged: list[str] = []
    repos: set[str] = set()
    with board.exclusive():  # no retry or move may bring a task back to life meanwhile
        for doc in board.list().tasks:
            if not finished_before(doc, cutoff):
                continue
            aged.append(doc["id"])
            paths = task_paths(runs, doc["id"])
            if not paths:
                continue
            picked.append(doc["id"])
            trees = worktrees.records(runs, doc["id"])
            repos.update(str(record.get("repo")) for record in trees.values())
            result.tasks.append({"task": doc["id"], "status": doc["status"], "paths": [str(p) for p in paths],
                                 "bytes": sum(_size(p) for p in paths),
                                 # A worktree goes; its branch stays in the repository, commits and all.
                                 "branches_kept": sorted(str(record.get("branch")) for record in trees.values())})
            if not dry_run:
                # A rename is quick under the lock; the deletion, however large, happens after it.
                for index, path in enumerate(paths):
                    trash.mkdir(mode=0o700, exist_ok=True)
                    path.rename(trash / f"{doc['id']}.{index}")
    if not dry_run and trash.exists():
        shutil.rmtree(trash, ignore_errors=True)
    for repo in sorted(repos) if not dry_run else ():
        with contextlib.suppress(worktrees.WorktreeError):  # git forgets the removed trees; branches stay
            worktrees.git(["worktree", "prune"], Path(repo))
    if aged:
        # After the lock: the board holds each task finished while its rows go, and deleting many
        # rows must not hold the whole team off. Tasks of other hosts have rows here too.
        result.database = board.journal_prune(aged, dry_run=dry_run)
    if not picked:
        return result
    lock = filelock.FileLock(str(runs / LOCK_FILE), blocking=False)
    try:
        lock.acquire()
    except filelock.Timeout:
        result.notes.append(f"the team is running: the records of these tasks in each agent's {TOOL_LOG} are kept "
                            "(its agents append to it); run prune again after `hermes-sup down` to remove them")
        return result
    try:
        ids = frozenset(picked)
        for _, folder in agent_dirs(runs):
            entry = _rewrite(folder / TOOL_LOG, ids, dry_run)
            if entry is not None:
                result.journals.append(entry)
    finally:
        lock.release()
    return result


def _rewrite(path: Path, ids: frozenset[str], dry_run: bool) -> dict[str, Any] | None:
    """Drop the records of `ids` from one tool-call log, replacing it atomically; None when it holds none."""
    if path.is_symlink() or not path.is_file():
        return None
    data = path.read_bytes()
    lines = data.split(b"\n")
    tail = lines.pop()  # a torn last line (or nothing) stays as it is
    kept = [line for line in lines if journal_keep(line, ids)]
    if len(kept) == len(lines):
        return None
    new = b"".join(line + b"\n" for line in kept) + tail
    if not dry_run:
        temporary = path.with_name(f".{path.name}.prune")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(new)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    return {"path": str(path), "records": len(lines) - len(kept), "bytes": len(data) - len(new)}


def parse_age(text: str) -> float:
    """Seconds of `--older-than`: a number and a unit, s, m, h or d (7d, 12h) (pure)."""
    value = text.strip()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    number, unit = value[:-1], value[-1:]
    try:
        seconds = float(number) * units[unit]
    except (KeyError, ValueError):
        raise ValueError(f"--older-than wants a duration (30m, 12h, 7d), not {value!r}") from None
    if not seconds >= 0 or seconds == float("inf"):
        raise ValueError(f"--older-than wants a duration (30m, 12h, 7d), not {value!r}")
    return seconds
