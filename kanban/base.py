"""The file board's folder: checked and laid out, its one lock, its event log, task files read unfollowed."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from . import fsinfo, reads
from .errors import BoardError, BoardLocked, Damaged, TaskNotFound
from .events import event
from .fsio import AppendLog, read_bytes_nofollow, safe_name
from .index import BoardIndex
from .lock import BoardLock, LockTimeout
from .task import MAX_BYTES, STATUSES, TaskError, check_document, is_valid_id, now_iso
from .watch import BoardWatcher, ChangeSignal

TaskDoc = dict[str, Any]
_T = TypeVar("_T")

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
PATHS_KEPT = 4096  # task file paths a board keeps made


class Folder:
    """The board's folder and what every other part of the board uses: its layout, its lock, its
    event log, where each task is (the index) and reads of single task files.

    The first locked section of a process finishes what a killed one left half done: `Board` gives
    the transaction core's repair as `on_first_lock` before anything takes the lock.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        create: bool = True,
        allow_network_fs: bool | None = None,
        lock_timeout: float = 60.0,
    ) -> None:
        self.root = Path(root).absolute()
        self._folders: dict[str, Path] = {}
        self._paths: dict[tuple[str, str], Path] = {}
        if not self.root.is_dir():
            if not create:
                raise BoardError(f"no board at {self.root}")
            self.root.mkdir(parents=True, mode=0o755)  # see ensure_layout
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
        self.events_path = self.root / "events.jsonl"
        self.problems: list[str] = []
        self.log = AppendLog(self.events_path)
        self.flock = BoardLock(self.root / ".lock", lock_timeout)
        self.tlock = threading.RLock()
        self.depth = 0
        self._finished_once = False
        self.on_first_lock: Callable[[], None] = lambda: None
        # Where each task is, and the todo candidates in claim order; kept current by the claims.
        self.index = BoardIndex()
        self.signal = ChangeSignal()
        self.watcher = BoardWatcher(self.root, self.signal)

    # -- layout and locking -------------------------------------------------------------------

    def check_links(self, names: Iterable[str] = (*FOLDERS, ".lock", "events.jsonl")) -> None:
        """Refuse to work through a symlink planted in place of one of the board's folders or files."""
        for name in names:
            path = self.root / name
            if path.is_symlink():
                raise BoardError(
                    f"{path} is a symlink (to {safe_name(os.readlink(path), 400)}); the board never works through "
                    f"links in its own folders. Replace it with a real {'file' if '.' in name[1:] else 'folder'}.")
            if name in FOLDERS and path.exists() and not path.is_dir():
                raise BoardError(f"{path} is not a folder; the board keeps its {name}/ tasks there. Move it away.")

    def ensure_layout(self) -> None:
        self.check_links()
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
                with self.locked():
                    self.log.append(event(now_iso(), f"{name}/", None, None, "board", note))

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        with self.tlock:
            # Re-entrant: a section may call a verb that locks again (add looks up dependencies
            # with get). flock is not counted, so only the outermost section takes and drops it.
            if self.depth == 0:
                try:
                    self.flock.acquire()
                except LockTimeout as exc:
                    raise BoardLocked(f"the board lock {exc}; is a board process stopped while holding it?") from None
            self.depth += 1
            try:
                if self.depth == 1 and not self._finished_once:
                    self._finished_once = True
                    self.on_first_lock()
                yield
            finally:
                self.depth -= 1
                if self.depth == 0:
                    self.flock.release()

    def path(self, status: str, task_id: str) -> Path:
        # Kept: pathlib's joins were a tenth of a task's work, and a task's file is named a dozen
        # times. Only valid ids are kept, so a hit needs no check.
        path = self._paths.get((status, task_id)) if type(task_id) is str else None
        if path is not None:
            return path
        # Every task file name passes here, and a caller's id may be hostile ("../../x", from a
        # tool call or the command line): only a valid id names a file, and only inside the board.
        if not is_valid_id(task_id):
            raise TaskNotFound(f"{_short_text(task_id)} is not a task id")
        folder = self._folders.get(status)
        if folder is None:
            folder = self._folders[status] = self.root / status
        if len(self._paths) >= PATHS_KEPT:
            self._paths.clear()
        path = self._paths[(status, task_id)] = folder / f"{task_id}.json"
        return path

    def consistent(self, scan: Callable[[], _T]) -> _T:
        """`scan`'s result from a moment when no task moved. Folders are scanned one after
        another, and a task moved meanwhile is missed (it left a folder not scanned yet for one
        already scanned) or seen twice. Every move is made under the lock and changes the
        board's generation, so a lock-free scan is kept when the lock was free as it began and the
        generation is the same after it; otherwise the scan is repeated under the lock."""
        for _attempt in range(3):
            try:
                before = self._idle_generation()
            except OSError:
                # A reader who may not open the lock file (a board another user owns) cannot
                # hold off movers; a generation unchanged across the scan is all it can check.
                before = reads.generation(self.root)
            if before is None:
                continue  # a move may be under way right now
            result = scan()
            if reads.generation(self.root) == before:
                return result
        try:
            with self.locked():
                return scan()
        except (BoardLocked, PermissionError):
            # Held for the whole wait by a stopped or stuck process (nothing moves meanwhile), or
            # a lock file this reader may not open.
            return scan()

    def _idle_generation(self) -> reads.Generation | None:
        """The generation, read while holding the lock if it is free (never waiting for it), or
        None if another process holds it: a move begun before the read, but not finished, would
        otherwise go unseen."""
        with self.tlock:
            if self.depth:
                return reads.generation(self.root)  # this thread holds the lock: nothing moves
            if not self.flock.try_acquire():
                return None
            try:
                return reads.generation(self.root)
            finally:
                self.flock.release()

    def close(self) -> None:
        self.watcher.stop()
        self.log.close()
        self.flock.close()

    # -- reading --------------------------------------------------------------------------------

    def raw(self, path: Path) -> bytes:
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

    def read(self, path: Path) -> TaskDoc:
        return self.parse(self.raw(path), path.stem)

    def parse(self, data: bytes, file_id: str | None = None) -> TaskDoc:
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise Damaged(f"not valid JSON ({str(exc)[:200]})") from exc
        try:
            return check_document(doc, file_id=file_id)
        except TaskError as exc:
            raise Damaged(str(exc)) from exc

    def locate(self, task_id: str) -> tuple[str, Path] | None:
        hint = self.index.status.get(task_id)
        order = [hint] if hint else []
        order += [status for status in STATUSES if status != hint]
        for status in order:
            path = self.path(status, task_id)
            if os.path.lexists(path):
                return status, path
        return None

    def missing(self, task_id: str) -> TaskNotFound:
        return TaskNotFound(f"no task '{task_id}' on the board {self.root}")

    def locate_or_raise(self, task_id: str) -> tuple[str, Path]:
        """Where the task is (called under the lock, where nothing moves); TaskNotFound if nowhere."""
        found = self.locate(task_id)
        if found is None:
            raise self.missing(task_id)
        return found


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
