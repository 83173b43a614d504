"""A cache of the board's checked task documents, each trusted while its file's inode, size and times are unchanged."""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import os
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .fsio import read_fd, write_atomic
from .redact import scrub_bytes
from .task import STATUSES

TaskDoc = dict[str, Any]
Stamp = tuple[int, int, int, int]  # (inode, size, ctime_ns, mtime_ns)

NAME = ".doccache"
# The cache of the listing fields alone (reads.listed_fields): its temp files are named like the
# other's, so that they are swept and wake no watcher alike.
FIELDS_NAME = ".doccache.fields"
MAGIC = b"hermes-sup-doccache"
VERSION = 1
MAX_BYTES = 64 << 20  # a bigger board reads its files as before; a bigger file here is not read
# A file changed less than this before it was read is not cached: the kernel stamps times from a
# coarse clock, so a rewrite within the same tick could keep every stamp (git's "racy clean" case).
# ctime, unlike mtime, cannot be set back by hand (`touch -d`), and any write or rename renews it.
RACY_NS = 1_000_000_000


def stamp_of(info: os.stat_result) -> Stamp:
    return info.st_ino, info.st_size, info.st_ctime_ns, info.st_mtime_ns


def encode(entries: dict[str, list[Any]], version: int | str = VERSION) -> bytes:
    """A cache file's bytes: a header line with a digest of the body, then the body (pure)."""
    body = json.dumps({"version": version, "entries": entries}, separators=(",", ":")).encode()
    return b"%s %s\n%s" % (MAGIC, hashlib.blake2b(body, digest_size=16).hexdigest().encode(), body)


def parse(data: bytes, version: int | str = VERSION) -> dict[str, Any]:
    """The entries of a cache file's bytes (pure); none if its digest does not match its body (a
    torn, damaged or hand-edited cache). Its documents
    are not checked again (that would cost as much as the cache saves): they were checked when read
    from their files, the digest says they are what was written, and `DocCache` reads only a
    cache its own user or the board's owner wrote."""
    header, _, body = data.partition(b"\n")
    if header != b"%s %s" % (MAGIC, hashlib.blake2b(body, digest_size=16).hexdigest().encode()):
        return {}
    try:
        top = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return {}
    if not isinstance(top, dict) or top.get("version") != version or not isinstance(top.get("entries"), dict):
        return {}
    return top["entries"]  # each entry's shape is checked when it is looked up (most are, once)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic garbage collection meanwhile: a scan makes hundreds of thousands of objects, none
    in a cycle, and the collector would walk them several times over while they are made (as long
    as the parse itself)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def trusted(info: os.stat_result, board_owner: int | None) -> bool:
    """Whether a cache file may be believed: a regular file that only this process's user or the
    board's owner wrote (another user's forgery would otherwise be believed), at most MAX_BYTES."""
    return (stat.S_ISREG(info.st_mode) and info.st_uid in (os.geteuid(), board_owner)
            and not info.st_mode & 0o022 and info.st_size <= MAX_BYTES)


class DocCache:
    """One scan's view of the cache file `root/.doccache`: documents whose files did not change
    since they were cached come from it; the rest are read and kept for `save`. With `project`,
    what is kept and handed out is `project(document)` instead, in the file `name` and under
    `version` (which says what `project` keeps: a cache of other fields is not believed)."""

    def __init__(self, root: Path, name: str = NAME, project: Callable[[TaskDoc], TaskDoc] | None = None,
                 version: int | str = VERSION) -> None:
        self.path = root / name
        self.project = project
        self.version = version
        self.started_ns = time.time_ns()
        self._old = self._load()  # raw: an entry is used only if its shape and stamp are right
        self._new: dict[str, Any] = {}
        self._visited: set[str] = set()
        self._changed = False

    def _load(self) -> dict[str, Any]:
        try:
            owner: int | None = os.stat(self.path.parent).st_uid
            # Never a link; a FIFO or a device is not read (O_NONBLOCK: opening a FIFO never waits).
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return {}
        try:
            if not trusted(os.fstat(fd), owner):
                return {}
            data = read_fd(fd, MAX_BYTES)
        except OSError:
            return {}
        finally:
            os.close(fd)
        return parse(data, self.version) if len(data) <= MAX_BYTES else {}

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
            return self._fresh(read, entry)
        if not stat.S_ISREG(info.st_mode):
            return self._fresh(read, entry)  # which says what is wrong with it
        cached = self._old.get(key)
        if (type(cached) is list and len(cached) == 5 and cached[0] == info.st_ino and cached[1] == info.st_size
                and cached[2] == info.st_ctime_ns and cached[3] == info.st_mtime_ns and type(cached[4]) is dict
                and cached[4].get("id") == entry.name[:-len(".json")]):
            self._new[key] = cached
            return cached[4]
        # Stamped before the read: a change during it gives the file a new stamp, read next time.
        doc = self._fresh(read, entry)
        if info.st_ctime_ns < self.started_ns - RACY_NS:
            self._new[key] = [*stamp_of(info), doc]  # saved before the scan hands `doc` to anyone who may change it
            self._changed = True
        # A file changed just now is read afresh every time: writing the cache again for it would
        # only make work (and each write is a change in the board's folder).
        return doc

    def _fresh(self, read: Callable[[Path], TaskDoc], entry: os.DirEntry[str]) -> TaskDoc:
        doc = read(Path(entry.path))
        return doc if self.project is None else self.project(doc)

    def save(self) -> None:
        """Write the cache back if anything in it changed; a reader who may not write it, or a full
        disk, leaves it as it was (it is only ever a shortcut)."""
        if not self._visited.issuperset(STATUSES):
            for key, value in self._old.items():
                if key.partition("/")[0] not in self._visited:
                    self._new.setdefault(key, value)  # of a folder this scan did not look at
        # With nothing read afresh, every entry kept is an old one: fewer means files are gone.
        if not self._changed and len(self._new) == len(self._old):
            return
        data = encode(self._new, self.version)
        if len(data) > MAX_BYTES or scrub_bytes(data) != data:
            return  # a key someone put in a task file by hand is not copied (writes are scrubbed)
        with contextlib.suppress(OSError):
            write_atomic(self.path, data, fsync=False)
