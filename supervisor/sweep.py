"""Stopping what a workspace's agents left running with no supervisor to do it (one that was SIGKILLed,
or the last escapes after `down`), under the supervisor lock so that no supervisor starts meanwhile."""

from __future__ import annotations

from pathlib import Path

from . import cgroups
from .procs import marked, stop_all

LOCK_FILE = "supervisor.lock"


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
        folders = cgroups.workspace_cgroups(root)
        for folder in folders:
            count += len(cgroups.members(folder))
            cgroups.kill(folder)
        for base in {folder.parent for folder in folders} | {cgroups.base_path(root)}:
            if base is not None and base.is_dir():
                cgroups.remove(base)
        return count
    finally:
        lock.release()
