"""A host's drop folder for the PostgreSQL board: the files of its kanban/inbox/ (read, parsed and judged
by the file board's own kanban/drops.py and kanban/ingest.py) set aside into rejected/ or .ingested/.

Only the local file handling lives here; the task row and its event are written by the store in one
transaction, so a crash between that commit and the file's move is repaired by the next ingest (the
same file, by its fingerprint, is never made into two tasks).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from ..errors import BoardError
from ..fsio import create_exclusive, safe_name, unique_path
from ..ingest import identity_of
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


def archive(root: Path, path: Path, task_id: str, identity: Any = None) -> None:
    """Keep an ingested drop in .ingested/ (its task's `source` names it); gone already is fine:
    another process of this host finished it. With the `identity` of the file that was read
    (kanban/ingest.py identity_of): a file renamed into its place since, a new drop, is put back
    into inbox/ (under a free name), not kept as the old one's."""
    dest = unique_path(root / ".ingested", f"{task_id}--{safe_name(path.name)}")
    try:
        os.rename(path, dest)
    except FileNotFoundError:
        return
    if identity is None or identity_of(os.lstat(dest)) == identity:
        return
    for _try in range(100):
        back = unique_path(root / "inbox", safe_name(path.name))
        try:
            os.link(dest, back, follow_symlinks=False)  # never over a file that took the name meanwhile
        except FileExistsError:
            continue
        os.unlink(dest)
        return
