"""A host's drop folder for the PostgreSQL board: the files of its kanban/inbox/ (read, parsed and judged
by the file board's own kanban/drops.py and kanban/ingest.py) set aside into rejected/ or .ingested/.

Only the local file handling lives here; the task row and its event are written by the store in one
transaction, so a crash between that commit and the file's move is repaired by the next ingest (the
same file, by its fingerprint, is never made into two tasks).
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from pathlib import Path

from .. import drops
from ..errors import BoardError
from ..fsio import create_exclusive, safe_name, unique_path
from ..task import now_iso

ERROR_SUFFIX = ".error.txt"
FOLDERS = ("inbox", "rejected", ".ingested")


def ensure_layout(root: Path) -> None:
    """Create the drop folders under `root`; refuse a symlink in their place (files would be moved
    where it points)."""
    root.mkdir(parents=True, exist_ok=True)
    for name in FOLDERS:
        path = root / name
        if path.is_symlink():
            raise BoardError(f"{path} is a symlink; the board's drop folders must be real folders")
        path.mkdir(exist_ok=True)


def ready(root: Path) -> tuple[list[Path], list[str]]:
    """The drops in `root`/inbox finished being written, oldest first, and the names still being
    written (the file board's rule, kanban/drops.decide, without a watcher's hint)."""
    found: list[Path] = []
    waiting: list[str] = []
    writers: set[tuple[int, int]] | None = None
    writers_read = False
    now = time.time()
    for drop in drops.scan(root):
        try:
            st = os.lstat(drop.path)
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(st.st_mode):
            found.append(drop.path)  # symlinks, folders, devices: rejected at once
            continue
        is_task = drops.is_task_file(drop.path.name)
        has_writer: bool | None = False
        if is_task:
            if not writers_read:
                writers, writers_read = drops.open_writers(root), True
            has_writer = None if writers is None else (st.st_dev, st.st_ino) in writers
        state = drops.decide(is_task_type=is_task, hinted_complete=False, has_writer=has_writer,
                             quiet_for=now - st.st_mtime)
        if state == "wait":
            waiting.append(f"inbox/{safe_name(drop.path.name)}")
        else:
            found.append(drop.path)
    return found, waiting


def set_aside(root: Path, path: Path, reason: str) -> Path:
    """Move a rejected drop into rejected/ (a free name), beside NAME.error.txt saying why. Nothing
    planted in rejected/ is written through: the note is created exclusively, without following links."""
    name = safe_name(path.name)
    note = (f"inbox/{name} was rejected on {now_iso()}: {reason}\n"
            "Fix the file and drop it into inbox/ again.\n").encode("utf-8", "backslashreplace")
    for _try in range(100):
        dest = unique_path(root / "rejected", name, (ERROR_SUFFIX,))
        with contextlib.suppress(FileExistsError):
            create_exclusive(dest.with_name(dest.name + ERROR_SUFFIX), note)
            break
    else:
        raise BoardError(f"no free name for {name} in {root / 'rejected'}")
    os.rename(path, dest)
    return dest


def archive(root: Path, path: Path, task_id: str) -> None:
    """Keep an ingested drop in .ingested/ (its task's `source` names it); gone already is fine:
    another process of this host finished it."""
    with contextlib.suppress(FileNotFoundError):
        os.rename(path, unique_path(root / ".ingested", f"{task_id}--{safe_name(path.name)}"))
