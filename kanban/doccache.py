"""A cache of the board's checked task documents, each trusted while its file's inode, size and times are unchanged."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .fsio import read_bytes_nofollow, write_atomic
from .redact import scrub_bytes
from .task import STATUSES, TaskError, check_document

TaskDoc = dict[str, Any]
Stamp = tuple[int, int, int, int]  # (inode, size, ctime_ns, mtime_ns)

NAME = ".doccache"
VERSION = 1
MAX_BYTES = 64 << 20  # a bigger board reads its files as before; a bigger file here is not read
# A file changed less than this before it was read is not cached: the kernel stamps times from a
# coarse clock, so a rewrite within the same tick could keep every stamp (git's "racy clean" case).
# ctime, unlike mtime, cannot be set back by hand (`touch -d`), and any write or rename renews it.
RACY_NS = 1_000_000_000


def stamp_of(info: os.stat_result) -> Stamp:
    return info.st_ino, info.st_size, info.st_ctime_ns, info.st_mtime_ns


def parse(data: bytes) -> dict[str, tuple[Stamp, TaskDoc]]:
    """The trustworthy entries of a cache file's bytes (pure): anything malformed is left out, and
    every document is checked again as a task file is, so a hand-made cache cannot hand a reader a
    document the board would have refused."""
    try:
        top = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return {}
    if not isinstance(top, dict) or top.get("version") != VERSION or not isinstance(top.get("entries"), dict):
        return {}
    entries: dict[str, tuple[Stamp, TaskDoc]] = {}
    for key, value in top["entries"].items():
        folder, _, name = key.partition("/")
        if not (folder in STATUSES and isinstance(value, list) and len(value) == 5 and name.endswith(".json")
                and all(type(part) is int for part in value[:4])):
            continue
        try:
            doc = check_document(value[4], file_id=name[:-len(".json")])
        except (TaskError, AttributeError, TypeError):
            continue
        entries[key] = (tuple(value[:4]), doc)  # type: ignore[assignment]
    return entries


class DocCache:
    """One scan's view of the cache file `root/.doccache`: documents whose files did not change
    since they were cached come from it; the rest are read and kept for `save`."""

    def __init__(self, root: Path) -> None:
        self.path = root / NAME
        self.started_ns = time.time_ns()
        self._old = self._load()
        self._new: dict[str, list[Any]] = {}
        self._visited: set[str] = set()
        self._changed = False

    def _load(self) -> dict[str, tuple[Stamp, TaskDoc]]:
        try:
            data = read_bytes_nofollow(self.path, MAX_BYTES)  # never a link, a FIFO or a device
        except OSError:
            return {}
        if len(data) > MAX_BYTES:
            return {}
        return parse(data)

    def read(self, folder: str, entry: os.DirEntry[str], read: Callable[[Path], TaskDoc]) -> TaskDoc:
        """The document of the task file `entry` in `folder`, from the cache if its stamp still
        matches, else from `read` (whose FileNotFoundError and Damaged pass through)."""
        self._visited.add(folder)
        key = f"{folder}/{entry.name}"
        try:
            info = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            raise
        except OSError:
            return read(Path(entry.path))
        if not stat.S_ISREG(info.st_mode):
            return read(Path(entry.path))  # which says what is wrong with it
        now = stamp_of(info)
        cached = self._old.get(key)
        if cached is not None and cached[0] == now:
            doc = cached[1]
            self._new[key] = [*now, doc]
            return doc
        # Stamped before the read: a change during it gives the file a new stamp, read next time.
        doc = read(Path(entry.path))
        self._changed = True
        if info.st_ctime_ns < self.started_ns - RACY_NS:
            self._new[key] = [*now, doc]  # saved before the scan hands `doc` to anyone who may change it
        return doc

    def save(self) -> None:
        """Write the cache back if anything in it changed; a reader who may not write it, or a full
        disk, leaves it as it was (it is only ever a shortcut)."""
        for key in self._old:
            if key.partition("/")[0] not in self._visited:
                self._new.setdefault(key, [*self._old[key][0], self._old[key][1]])  # a folder not scanned
            elif key not in self._new:
                self._changed = True  # its file is gone
        if not self._changed:
            return
        data = json.dumps({"version": VERSION, "entries": self._new}, separators=(",", ":")).encode()
        if len(data) > MAX_BYTES or scrub_bytes(data) != data:
            return  # a key someone put in a task file by hand is not copied (writes are scrubbed)
        with contextlib.suppress(OSError):
            write_atomic(self.path, data, fsync=False)
