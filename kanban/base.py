"""The file board's foundation: its folder checked and laid out, its one lock, task files read unfollowed."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Self

from . import fsinfo
from .errors import BoardError, BoardLocked, Damaged, TaskNotFound
from .events import EventTail, event
from .fsio import (
    AppendLog,
    read_bytes_nofollow,
    safe_name,
)
from .index import BoardIndex
from .lock import BoardLock, LockTimeout
from .task import (
    MAX_BYTES,
    STATUSES,
    TaskError,
    check_document,
    is_valid_id,
    now_iso,
)
from .watch import BoardWatcher, ChangeSignal

TaskDoc = dict[str, Any]

DEFAULT_LEASE = 60.0
ALLOW_NETWORK_FS_ENV = "HERMES_SUP_ALLOW_NETWORK_FS"
# A task document read back from a status folder is refused past this size: it starts under
# MAX_BYTES and grows only by its history, comments and result.
MAX_DOCUMENT_BYTES = 64 * MAX_BYTES
# Room comments never take: the holder's result, error and the rest of the task's history must
# still fit, or a teammate commenting could make a task that can never be completed.
COMMENT_RESERVE = 8 * MAX_BYTES
ERROR_SUFFIX = ".error.txt"
# The board's own folders and files: never a symlink, or the board would write where it points.
FOLDERS = (*STATUSES, "inbox", "rejected", ".pending", ".ingested")


class BoardBase:
    """The file board's state, folder layout, lock and reads of single task files (the parts every other part uses)."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        create: bool = True,
        allow_network_fs: bool | None = None,
        lease: float = DEFAULT_LEASE,
        lock_timeout: float = 60.0,
    ) -> None:
        self.root = Path(root).absolute()
        if not self.root.is_dir():
            if not create:
                raise BoardError(f"no board at {self.root}")
            self.root.mkdir(parents=True, mode=0o755)  # see _ensure_layout
        mount = fsinfo.filesystem_of(self.root)
        self.fs_type = mount.fstype if mount else "unknown"
        self.network_fs = fsinfo.is_network(self.fs_type)
        if allow_network_fs is None:
            allow_network_fs = os.environ.get(ALLOW_NETWORK_FS_ENV, "").lower() in ("1", "true", "yes")
        if self.network_fs and not allow_network_fs:
            raise BoardError(
                f"the board {self.root} is on a network filesystem ({self.fs_type}): file locks give no mutual "
                f"exclusion across its clients and it sends no change events. Put the board on a local disk, "
                f"or set {ALLOW_NETWORK_FS_ENV}=1 if only this machine uses it."
            )
        self.lease = lease
        self.events_path = self.root / "events.jsonl"
        self.problems: list[str] = []
        self._log = AppendLog(self.events_path)
        self._flock = BoardLock(self.root / ".lock", lock_timeout)
        self._tlock = threading.RLock()
        self._depth = 0
        self._finished_once = False
        self._index = BoardIndex()
        self._tail = EventTail(self.events_path)
        self._indexed_at: float | None = None
        self._last_recover = 0.0
        self._last_sweep = 0.0
        self._noted: dict[str, tuple[str | None, str | None]] = {}  # mark_waiting's last note, per version
        self.signal = ChangeSignal()
        self.watcher = BoardWatcher(self.root, self.signal)
        self._ensure_layout()

    # -- layout and locking -------------------------------------------------------------------

    def _check_links(self, names: Iterable[str] = (*FOLDERS, ".lock", "events.jsonl")) -> None:
        """Refuse to work through a symlink planted in place of one of the board's folders or files."""
        for name in names:
            path = self.root / name
            if path.is_symlink():
                raise BoardError(
                    f"{path} is a symlink (to {safe_name(os.readlink(path), 400)}); the board never works through "
                    f"links in its own folders. Replace it with a real {'file' if '.' in name[1:] else 'folder'}.")
            if name in FOLDERS and path.exists() and not path.is_dir():
                raise BoardError(f"{path} is not a folder; the board keeps its {name}/ tasks there. Move it away.")

    def _ensure_layout(self) -> None:
        self._check_links()
        existing = self.events_path.exists()
        for name in FOLDERS:
            folder = self.root / name
            if folder.is_dir():
                continue
            # Readable by the team's humans, writable by the board's owner alone whatever the umask
            # (000 would let anyone on the machine drop, move or delete tasks); a narrower umask narrows it.
            folder.mkdir(exist_ok=True, mode=0o755)
            if existing and name in STATUSES:
                # Never silently: a status folder that vanished took its tasks with it.
                note = f"status folder {name}/ was missing and has been recreated empty"
                self.problems.append(note)
                with self._locked():
                    self._log.append(event(now_iso(), f"{name}/", None, None, "board", note))

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._tlock:
            # Re-entrant: a section may call a verb that locks again (add looks up dependencies
            # with get). flock is not counted, so only the outermost section takes and drops it.
            if self._depth == 0:
                try:
                    self._flock.acquire()
                except LockTimeout as exc:
                    raise BoardLocked(f"the board lock {exc}; is a board process stopped while holding it?") from None
            self._depth += 1
            try:
                if self._depth == 1 and not self._finished_once:
                    self._finished_once = True
                    self._finish_interrupted()
                yield
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self._flock.release()

    def _path(self, status: str, task_id: str) -> Path:
        # Every task file name passes here, and a caller's id may be hostile ("../../x", from a
        # tool call or the command line): only a valid id names a file, and only inside the board.
        if not is_valid_id(task_id):
            raise TaskNotFound(f"{_short_text(task_id)} is not a task id")
        return self.root / status / f"{task_id}.json"

    def close(self) -> None:
        self.watcher.stop()
        self._log.close()
        self._flock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading --------------------------------------------------------------------------------

    def _raw(self, path: Path) -> bytes:
        """A task file's bytes; Damaged if it is a symlink, not a regular file, or oversized
        (never followed, never read without bound: a link to /dev/zero or a FIFO is planted easily)."""
        try:
            data = read_bytes_nofollow(path, MAX_DOCUMENT_BYTES)
        except FileNotFoundError:
            raise
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise Damaged("it is a symlink; the board never follows links in its folders") from None
            if exc.errno == errno.EINVAL:
                raise Damaged("it is not a regular file") from None
            raise Damaged(f"unreadable: {exc.strerror}") from None
        if len(data) > MAX_DOCUMENT_BYTES:
            raise Damaged(f"it is larger than {MAX_DOCUMENT_BYTES} bytes")
        return data

    def _read(self, path: Path) -> TaskDoc:
        return self._parse(self._raw(path), path.stem)

    def _parse(self, data: bytes, file_id: str | None = None) -> TaskDoc:
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise Damaged(f"not valid JSON ({str(exc)[:200]})") from exc
        try:
            return check_document(doc, file_id=file_id)
        except TaskError as exc:
            raise Damaged(str(exc)) from exc

    def _locate(self, task_id: str) -> tuple[str, Path] | None:
        hint = self._index.status.get(task_id)
        order = [hint] if hint else []
        order += [status for status in STATUSES if status != hint]
        for status in order:
            path = self._path(status, task_id)
            if os.path.lexists(path):
                return status, path
        return None

    def _missing(self, task_id: str) -> TaskNotFound:
        return TaskNotFound(f"no task '{task_id}' on the board {self.root}")

    def _locate_or_raise(self, task_id: str) -> tuple[str, Path]:
        """Where the task is (called under the lock, where nothing moves); TaskNotFound if nowhere."""
        found = self._locate(task_id)
        if found is None:
            raise self._missing(task_id)
        return found

    def _finish_interrupted(self, *, sweep: bool = True) -> None:
        """Finish what a killed process left half done; the transaction core (txn.py) defines it."""
        raise NotImplementedError



def _bounded(data: bytes, task_id: str) -> bytes:
    """`data`, unless it is a document the board would refuse to read back."""
    if len(data) > MAX_DOCUMENT_BYTES:
        raise BoardError(f"task {task_id}'s document would be {len(data)} bytes; a task document is at most "
                         f"{MAX_DOCUMENT_BYTES} bytes (its result or comments are too large)")
    return data


def _short_text(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _read_or_none(path: Path) -> bytes | None:
    """A task file's bytes, or None if it is gone or not a plain file (then it never equals bytes
    read before, and the locked path reads it again and says why)."""
    try:
        data = read_bytes_nofollow(path, MAX_DOCUMENT_BYTES)
    except OSError:
        return None
    return data if len(data) <= MAX_DOCUMENT_BYTES else None
