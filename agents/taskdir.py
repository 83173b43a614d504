"""A task's own working folder, runs/tasks/<task-id>/work/: where the file tools and the terminal of
whoever holds the task work, kept across retries and take-overs (until `prune` removes it)."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import Any

from ..kanban.task import is_valid_id

TASKS_DIR = "tasks"     # under runs/; an agent may not be named so (see supervisor/config/checks.py)
WORK_DIR = "work"
MAX_LISTED = 200        # files `task show` lists; the count of the rest is given
MAX_WALKED = 10_000     # entries looked at while listing: a folder of a million files is not read whole


def task_root(runs: Path, task_id: str) -> Path:
    """runs/tasks/<task-id>/ (pure). Refused for anything but a task id: never a path out of runs/."""
    if not is_valid_id(task_id):
        raise ValueError(f"not a task id: {task_id!r}")
    return runs / TASKS_DIR / task_id


def work_folder(runs: Path, task_id: str) -> Path:
    """runs/tasks/<task-id>/work/ (pure)."""
    return task_root(runs, task_id) / WORK_DIR


def ensure_work_folder(runs: Path, task_id: str) -> Path:
    """The task's working folder, created (0700) if missing. Raises OSError when a folder on the way
    is not a real folder (a symlink would move every holder's files somewhere else)."""
    folder = work_folder(runs, task_id)
    for path in (runs / TASKS_DIR, folder.parent, folder):
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode):
            raise OSError(f"{path} is not a folder ({'a symlink' if stat.S_ISLNK(info.st_mode) else 'a file'}); "
                          "move it away so the task's working folder can be made")
    return folder


def list_files(folder: Path, limit: int = MAX_LISTED, walked: int = MAX_WALKED) -> dict[str, Any]:
    """The regular files under `folder` as {path (relative), bytes}, sorted, at most `limit` of them,
    and how many more there are: symlinks are listed as links, never followed."""
    found: list[dict[str, Any]] = []
    seen = 0
    stack = [folder]
    while stack and seen < walked:
        current = stack.pop()
        try:
            with os.scandir(current) as entries:
                for entry in entries:
                    seen += 1
                    if seen > walked:
                        break
                    relative = os.path.relpath(entry.path, folder)
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(Path(entry.path))
                    elif entry.is_symlink():
                        found.append({"path": relative, "bytes": None, "link": True})
                    elif entry.is_file(follow_symlinks=False):
                        found.append({"path": relative, "bytes": entry.stat(follow_symlinks=False).st_size})
        except OSError:
            continue
    found.sort(key=lambda item: item["path"])
    return {"path": str(folder), "files": found[:limit], "more": max(0, len(found) - limit),
            "complete": not stack and seen <= walked}


def folder_bytes(folder: Path) -> int:
    """The bytes of every file under `folder`, symlinks not followed (0 when there is none)."""
    total = 0
    for root, dirs, files in os.walk(folder, followlinks=False):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total
