"""Stopping what a workspace's agents left running with no supervisor to do it (one that was SIGKILLed,
or the last escapes after `down`), under the supervisor lock so that no supervisor starts meanwhile."""

from __future__ import annotations

import os
from pathlib import Path

from . import cgroups
from .procs import marked, stop_all

LOCK_FILE = "supervisor.lock"


def workspace_cgroups(root: Path) -> set[Path]:
    """The agent cgroups of the workspace at `root` that hold a process, wherever the supervisor that made
    them ran: found from the processes' own /proc/<pid>/cgroup."""
    name = cgroups.base_name(root)
    mount = cgroups.mount_point()
    if mount is None:
        return set()
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        where = cgroups.cgroup_of(int(entry), mount)
        if where is not None and where.parent.name == name:
            found.add(where)
    return found


def sweep(root: Path, runs: Path, timeout: float) -> int | None:
    """Stop every process carrying a marker of this workspace (SIGTERM, SIGKILL after `timeout`), then
    kill whatever is left in its agents' cgroups (a process that dropped its environment too). Returns
    how many processes were signalled, or None when a supervisor holds the lock (it owns them)."""
    import filelock

    runs.mkdir(exist_ok=True)
    lock = filelock.FileLock(str(runs / LOCK_FILE), blocking=False)
    try:
        lock.acquire()
    except filelock.Timeout:
        return None
    try:
        count = stop_all(marked(root), timeout)
        folders = workspace_cgroups(root)
        for folder in folders:
            count += len(cgroups.members(folder))
            cgroups.kill(folder)
        for base in {folder.parent for folder in folders} | {cgroups.base_path(root)}:
            if base is not None and base.is_dir():
                cgroups.remove(base)
        return count
    finally:
        lock.release()
