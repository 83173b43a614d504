"""The drop zone `inbox/`: which files are candidates, and when a file is finished being written.

Only inbox/ is a drop zone. Files directly in the board folder are left alone: in a source checkout
that folder also holds the package's modules, and a file taken from there would vanish into the
git-ignored .ingested/ or rejected/.

A file written in place (`cp`, a shell redirect, a script) appears before its content does, so it
is taken only once it is known complete: the watcher saw it closed after writing or renamed into
place, or no process has it open for writing any more. Editors and tools that write a temp file
and rename it produce names that are skipped here until the rename.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .fsio import safe_name
from .parse import EXTENSIONS

# Temp and backup names of editors, browsers, rsync and download tools.
SKIP_SUFFIXES = (".tmp", ".temp", ".swp", ".swx", ".swo", ".part", ".partial", ".crdownload", ".download",
                 "~", ".bak", ".error.txt")
# An unknown file type in inbox/ is rejected only once it has sat still this long: editors create
# short-lived probe files (vim's "4913") that must not be rejected.
UNKNOWN_TYPE_GRACE = 2.0
# Without any sign of completion, a file is taken once it has been quiet this long and no writer
# is visible (the last resort when /proc cannot be read).
QUIET_FALLBACK = 2.0


@dataclass(frozen=True)
class Drop:
    path: Path


def skipped_name(name: str) -> bool:
    return (
        name.startswith((".", "#"))
        or name.endswith(SKIP_SUFFIXES)
        or name.endswith("#")
    )


def name_problem(name: str) -> str | None:
    """Why a dropped file's name is refused, or None (pure). Python reads bytes that are not UTF-8
    in a name as lone surrogates, which cannot be written to a UTF-8 log or shown."""
    if any("\udc80" <= char <= "\udcff" for char in name):
        return "file name is not valid UTF-8; rename the file"
    if any(ord(char) < 0x20 or 0x7F <= ord(char) <= 0x9F for char in name):
        return "file name holds control characters; rename the file"
    return None


def is_task_file(name: str) -> bool:
    return name.lower().endswith(EXTENSIONS)


def scan(root: Path) -> list[Drop]:
    """Candidates in inbox/, oldest first."""
    found: list[tuple[float, Drop]] = []
    try:
        entries = list(os.scandir(root / "inbox"))
    except FileNotFoundError:
        return []
    for entry in entries:
        if skipped_name(entry.name):
            continue
        try:
            mtime = entry.stat(follow_symlinks=False).st_mtime
        except FileNotFoundError:
            continue
        found.append((mtime, Drop(Path(entry.path))))
    found.sort(key=lambda item: (item[0], item[1].path.name))
    return [drop for _mtime, drop in found]


def decide(*, is_task_type: bool, hinted_complete: bool, has_writer: bool | None, quiet_for: float) -> str:
    """'ready', 'wait', or 'reject-type' for a candidate (pure).

    has_writer is None when writers cannot be seen (no /proc): then only quiet time tells.
    """
    if not is_task_type:
        return "reject-type" if quiet_for >= UNKNOWN_TYPE_GRACE else "wait"
    if hinted_complete:
        return "ready"
    if has_writer is None:
        return "ready" if quiet_for >= QUIET_FALLBACK else "wait"
    return "wait" if has_writer else "ready"


def ready(root: Path, hinted: Callable[[Path, int], bool] | None = None) -> tuple[list[Path], list[str]]:
    """The drops in `root`/inbox finished being written, oldest first, and those still being
    written (as inbox/NAME), by `decide`: the rule of every backend. `hinted(path, mtime_ns)` says a
    watcher saw the file complete (the file board's); without it, only writers and quiet time tell."""
    candidates = scan(root)
    found: list[Path] = []
    waiting: list[str] = []
    if not candidates:
        return found, waiting
    writers: set[tuple[int, int]] | None = None
    writers_read = False
    now = time.time()
    for drop in candidates:
        try:
            st = os.lstat(drop.path)
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(st.st_mode):
            found.append(drop.path)  # symlinks, folders, devices: rejected at once
            continue
        complete = hinted is not None and hinted(drop.path, st.st_mtime_ns)
        is_task = is_task_file(drop.path.name)
        has_writer: bool | None = False
        if is_task and not complete:
            # One pass over /proc for all the drops, and only when one needs it.
            if not writers_read:
                writers, writers_read = open_writers(root), True
            has_writer = None if writers is None else (st.st_dev, st.st_ino) in writers
        state = decide(is_task_type=is_task, hinted_complete=complete, has_writer=has_writer,
                       quiet_for=now - st.st_mtime)
        if state == "wait":
            waiting.append(f"inbox/{safe_name(drop.path.name)}")
        else:
            found.append(drop.path)
    return found, waiting


def open_writers(root: Path) -> set[tuple[int, int]] | None:
    """(st_dev, st_ino) of every file under `root` that a visible process holds open for writing,
    read from Linux /proc in one pass; None if that cannot be known."""
    if not os.path.isdir("/proc/self/fd"):
        return None
    prefix = str(root) + os.sep
    found: set[tuple[int, int]] = set()
    try:
        pids = [entry.name for entry in os.scandir("/proc") if entry.name.isdigit()]
    except OSError:
        return None
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                if not os.readlink(f"{fd_dir}/{fd}").startswith(prefix):
                    continue
                with open(f"/proc/{pid}/fdinfo/{fd}") as info:
                    flags = next((int(line.split()[1], 8) for line in info if line.startswith("flags:")), 0)
                if flags & os.O_ACCMODE in (os.O_WRONLY, os.O_RDWR):
                    st = os.stat(f"{fd_dir}/{fd}")
                    found.add((st.st_dev, st.st_ino))
            except (OSError, ValueError, IndexError, StopIteration):
                continue
    return found
