"""The filesystem board: task documents as JSON files in status folders, changed under one lock.

Every transition follows the same steps, so a process killed at any point leaves a state that a
later locked operation finishes (roll forward) or discards:

1. the new document is written to a temp file beside the old one and fsync'd (before the lock
   when it can be: the slow part stays out of the critical section),
2. under the lock, a marker `.pending/<id>` names the task (a claim places it earlier, to reserve
   its pick; a task leaving doing/ needs none, see `_commit`),
3. the temp file is renamed over the old document,
4. the transition is appended to `events.jsonl`,
5. the file is renamed into the folder of its new status, and the marker removed.

A task is thus always in exactly one folder; a document whose status differs from its folder is a
transition caught between steps 3 and 5, which its marker (or its being in doing/) says.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psutil

from . import fsinfo, reads, rules
from .errors import BoardError, BoardLocked, ClaimLost, Damaged, InvalidTransition, TaskNotFound
from .events import CursorRead, EventTail, check_cursor, event, read_since
from .faults import fault
from .fsio import (
    AppendLog,
    create_exclusive,
    dumps,
    read_bytes_nofollow,
    safe_name,
    tmp_path_for,
    tmp_writer_pid,
    unique_path,
    write_atomic,
    write_json_atomic,
    write_temp,
)
from .index import BoardIndex
from .ingest import IngestMixin
from .liveness import HOST, holder_alive, stale_reason, start_time
from .lock import BoardLock, LockTimeout
from .reads import Listing
from .task import (
    MAX_BYTES,
    STATUSES,
    TaskError,
    check_document,
    find_cycle,
    is_valid_id,
    normalize,
    now_iso,
    slugify,
)
from .watch import BoardWatcher, ChangeSignal

TaskDoc = dict[str, Any]
_T = TypeVar("_T")

DEFAULT_LEASE = 60.0
# How long a waiting claimer sleeps between rescans when no event wakes it.
RESCAN_INTERVAL = 2.0
POLL_INTERVAL = 1.0
# A claim that finds nothing rescans the folders if the index is older than this.
RESYNC_AFTER = 2.0
RECOVER_INTERVAL = 2.0
# A waiting claimer sweeps dead writers' temp files (a listing of every status folder) this rarely.
SWEEP_INTERVAL = 60.0
# A temp file whose writer is alive is left alone unless it is older than this.
STALE_TMP_AGE = 600.0
# Tasks this process has reserved (marked) and not yet committed or given up; a marker naming
# this process is live only while its task is in here.
_RESERVED: collections.Counter[str] = collections.Counter()
_RESERVED_LOCK = threading.Lock()


def _reservation_started(task_id: str) -> None:
    with _RESERVED_LOCK:
        _RESERVED[task_id] += 1


def _reservation_done(task_id: str) -> None:
    with _RESERVED_LOCK:
        _RESERVED[task_id] -= 1
        if _RESERVED[task_id] <= 0:
            del _RESERVED[task_id]
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


class Board(IngestMixin):
    """A Kanban board in a folder. Safe to use from several processes and threads at once."""

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

    def __enter__(self) -> Board:
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

    def get(self, task_id: str) -> TaskDoc:
        """The task's current document: a lock-free read (files are only ever replaced whole), and
        if that misses, a read under the lock. A task being moved is, for an instant, in neither
        folder a lock-free look-up visits in turn (it left doing/ after doing/ was looked at, and
        todo/ was looked at before it arrived); every move is made under the lock, so a look-up
        holding it finds a task that exists."""
        if not is_valid_id(task_id):
            raise TaskNotFound(f"{_short_text(task_id)} is not a task id")
        doc = self._get_once(task_id)
        if doc is None:
            with self._locked():
                doc = self._get_once(task_id)
        if doc is None:
            raise self._missing(task_id)
        return doc

    def _get_once(self, task_id: str) -> TaskDoc | None:
        for _attempt in range(5):
            found = self._locate(task_id)
            if found is None:
                return None
            try:
                return self._read(found[1])
            except FileNotFoundError:
                continue  # moved between the look-up and the read
            except Damaged as exc:
                raise BoardError(f"task {task_id} in {found[0]}/ is damaged: {exc}") from exc
        return None

    def list(self, status: str | None = None) -> Listing:
        """Every task (or those in one status), in claim order within each status, each once."""
        if status is not None and status not in STATUSES:
            raise BoardError(f"unknown status '{status}'; statuses are {', '.join(STATUSES)}")
        return self._consistent(lambda: reads.scan(self.root, status, self._read))

    def counts(self) -> dict[str, int]:
        """How many tasks each status folder holds, each task counted once."""
        return self._consistent(lambda: reads.count(self.root))

    def _consistent(self, scan: Callable[[], _T]) -> _T:
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
            with self._locked():
                return scan()
        except (BoardLocked, PermissionError):
            # Held for the whole wait by a stopped or stuck process (nothing moves meanwhile), or
            # a lock file this reader may not open.
            return scan()

    def _idle_generation(self) -> reads.Generation | None:
        """The generation, read while holding the lock if it is free (never waiting for it), or
        None if another process holds it: a move begun before the read, but not finished, would
        otherwise go unseen."""
        with self._tlock:
            if self._depth:
                return reads.generation(self.root)  # this thread holds the lock: nothing moves
            if not self._flock.try_acquire():
                return None
            try:
                return reads.generation(self.root)
            finally:
                self._flock.release()

    # -- writing: the one transition path -------------------------------------------------------
    #
    # The fsync, the slow part, happens before the lock is taken when it can (`_prepare`): the
    # locked section then only checks that the task is still as the new document assumed and
    # renames. Concurrent fsyncs share journal commits, so claimers no longer queue behind each
    # other's disk flushes.

    def _prepare(self, folder: str, new: TaskDoc) -> Path:
        """The new document, fsync'd to a temp file beside the task's current file."""
        return write_temp(self._path(folder, new["id"]), _bounded(dumps(new), new["id"]))

    def _keep_old(self, folder: str, task_id: str) -> Path | None:
        """A second link to the task's current file, made before the lock: the rename that
        replaces the file inside the lock then only drops a link count, and the old inode is
        freed (several journal updates) when the caller removes this link after the lock."""
        current = self._path(folder, task_id)
        keeper = tmp_path_for(current)
        try:
            os.link(current, keeper, follow_symlinks=False)
        except FileNotFoundError:
            return None
        return keeper

    def _marker(self, task_id: str) -> Path:
        return self.root / ".pending" / task_id

    def _mark(self, task_id: str) -> None:
        """Place the marker for a transition made under the lock (replacing any other)."""
        marker = self._marker(task_id)
        self._remove_marker(marker)
        os.symlink(_owner_text(), marker)

    def _remove_marker(self, marker: Path) -> None:
        """Remove a marker (under the lock). The board's markers are symlinks; anything else in
        .pending/ was put there by hand and is moved aside, so it can neither hide its task nor
        stop every transition with an error."""
        try:
            marker.unlink(missing_ok=True)
        except IsADirectoryError:
            self._set_aside(marker, f"pending--{safe_name(marker.name)}",
                            f".pending/{safe_name(marker.name)} is a folder, not a marker of the board; it was "
                            f"moved here on {now_iso()} so the task it names can be worked again.\n")

    def _has_marker(self, task_id: str) -> bool:
        return os.path.lexists(self._marker(task_id))

    def _marker_is_live(self, path: Path) -> bool:
        """Whether the process a marker names is still running (a live claimer's reservation)."""
        try:
            pid_text, started_text = os.readlink(path).split()
            pid, started = int(pid_text), float(started_text)
        except (OSError, ValueError):
            return False
        if pid == os.getpid() and abs(started - _own_start_time()) < 0.05:
            with _RESERVED_LOCK:
                return _RESERVED[path.name] > 0
        return holder_alive(pid, started, HOST) is not False

    def _commit(self, folder: str, new: TaskDoc, prepared: Path | None = None, *, reserved: bool = False) -> TaskDoc:
        """Make `new` the task's state (under the lock). `prepared` is its fsync'd temp file, if
        already written; `reserved` says this process's marker is already in place."""
        task_id, dst = new["id"], new["status"]
        src_path = self._path(folder, task_id)
        moving = dst != folder
        try:
            if prepared is None:
                prepared = self._prepare(folder, new)
            # Leaving doing/ needs no marker: recover() reads every document there, and nothing
            # enters doing/ by hand, so a document in doing/ with another status is always a
            # transition to finish.
            if moving and not reserved and folder != "doing":
                self._mark(task_id)
                fault("marked")
            os.rename(prepared, src_path)
        except BaseException:
            if prepared is not None:
                prepared.unlink(missing_ok=True)
            raise
        fault("written")
        entry = new["history"][-1]
        self._log.append(event(entry["at"], task_id, entry["from"], entry["to"], entry["by"], entry["note"]))
        fault("logged")
        if moving:
            self._move_into_place(src_path, dst, task_id)
            fault("moved")
        if not reserved:
            # A claimer removes its own reservation after releasing the lock: one journaled
            # operation fewer inside it. Until then the marker names a live process, and the
            # task is in doing/, so nothing acts on it.
            _unlink_marker(self._marker(task_id))
        return new

    def _move_into_place(self, src_path: Path, dst: str, task_id: str) -> None:
        dst_path = self._path(dst, task_id)
        if os.path.lexists(dst_path):
            self._quarantine(dst_path, f"a second copy of task {task_id} was in {dst}/ while the task moved there")
        os.rename(src_path, dst_path)

    def _event_logged(self, at: str, task_id: str) -> bool:
        needle = f'"at":{json.dumps(at)},"task":{json.dumps(task_id)}'.encode()
        try:
            with open(self.events_path, "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                handle.seek(max(0, size - (4 << 20)))
                return needle in handle.read()
        except FileNotFoundError:
            return False

    def _roll_forward(self, path: Path, doc: TaskDoc) -> None:
        """Finish a transition whose writer died after writing the new document."""
        # A hand-made document may have an empty or sparse history: what it lacks is not logged.
        entry = doc["history"][-1] if doc["history"] else {}
        at = str(entry.get("at") or now_iso())
        if not self._event_logged(at, doc["id"]):
            self._log.append(event(at, doc["id"], entry.get("from"), doc["status"], str(entry.get("by") or "board"),
                                   f"{entry.get('note') or ''} (completed after its writer was interrupted)".strip()))
        self._move_into_place(path, doc["status"], doc["id"])

    def _finish_interrupted(self, *, sweep: bool = True) -> None:
        """Roll forward transitions whose process died between their steps, drop reservations of
        dead claimers, and (with `sweep`) remove temp files of dead writers (under the lock). The
        sweep lists every status folder, done/ included, so frequent callers ask for it rarely."""
        try:
            entries = list(os.scandir(self.root / ".pending"))
        except FileNotFoundError:
            entries = []
        for entry in entries:
            if entry.name.startswith("."):
                continue
            marker = Path(entry.path)
            if self._marker_is_live(marker):
                continue  # a live claimer's reservation
            task_id = entry.name
            found = self._locate(task_id) if is_valid_id(task_id) else None
            if found is not None:
                folder, path = found
                try:
                    doc = self._read(path)
                except Damaged as exc:
                    self._quarantine(path, str(exc))
                    doc = None
                if doc is not None and doc["status"] != folder:
                    self._roll_forward(path, doc)
            self._remove_marker(marker)
        if not sweep:
            return
        self._last_sweep = time.monotonic()
        for status in STATUSES:
            with contextlib.suppress(FileNotFoundError):
                for item in os.scandir(self.root / status):
                    pid = tmp_writer_pid(item.name)
                    # Only files: a folder with a temp file's name was not written by the board.
                    if pid is not None and not item.is_dir(follow_symlinks=False) and \
                            _writer_gone(pid, Path(item.path)):
                        Path(item.path).unlink(missing_ok=True)

    def _adopt_hand_move(self, folder: str, doc: TaskDoc) -> TaskDoc:
        """A document whose status disagrees with its folder and has no pending marker was moved by
        a person (`mv todo/x.json done/`): the folder is their intent, so the document follows it."""
        if self._has_marker(doc["id"]):
            return doc
        new = rules.adopted(doc, folder, now=now_iso())
        write_json_atomic(self._path(folder, doc["id"]), new)
        entry = new["history"][-1]
        self._log.append(event(entry["at"], doc["id"], entry["from"], folder, "board", entry["note"]))
        return new

    def _set_aside(self, path: Path, name: str, note: str) -> Path:
        """Move `path` into rejected/ as `name` (made unique), beside `name`.error.txt holding `note`.
        Nothing planted in rejected/ is written through: the note is created exclusively and
        without following links, and the move takes a name at which nothing exists."""
        for _try in range(100):
            dest = unique_path(self.root / "rejected", name, (ERROR_SUFFIX,))
            with contextlib.suppress(FileExistsError):
                create_exclusive(dest.with_name(dest.name + ERROR_SUFFIX), note.encode("utf-8", "backslashreplace"))
                break
        else:
            raise BoardError(f"no free name for {name} in {self.root / 'rejected'}")
        os.rename(path, dest)
        return dest

    def _quarantine(self, path: Path, reason: str) -> Path:
        """Move a damaged file aside to rejected/ with a note; never delete it."""
        folder = path.parent.name
        name = safe_name(path.name)
        note = (f"{folder}/{name} was found damaged on {now_iso()}: {reason}\n"
                f"It was moved here untouched; every other task stayed where it was. Repair it and move it "
                f"back into {folder}/ if it is still wanted.\n")
        dest = self._set_aside(path, f"{folder}--{name}", note)
        self.problems.append(f"{folder}/{name} was damaged ({reason}); moved to rejected/{dest.name}")
        self._log.append(event(now_iso(), path.stem, folder, "rejected", "board", f"damaged: {reason}"))
        self._index.forget(path.stem)
        return dest

    def quarantine_damaged(self, damaged: Iterable[dict[str, str]]) -> list[str]:
        """Re-check, under the lock, files a lock-free listing found unreadable; move the damaged aside."""
        moved = []
        with self._locked():
            for item in damaged:
                path = self.root / item["path"]
                if path.parent.parent != self.root or path.parent.name not in STATUSES or not os.path.lexists(path):
                    continue
                try:
                    self._read(path)
                except Damaged as exc:
                    moved.append(str(self._quarantine(path, str(exc)).relative_to(self.root)))
                except (FileNotFoundError, OSError):
                    continue
        return moved

    # -- adding ---------------------------------------------------------------------------------

    def _deps_of(self, task_id: str) -> list[str]:
        try:
            return list(self.get(task_id).get("depends_on") or ())
        except BoardError:
            return []

    def _check_new(self, doc: TaskDoc) -> None:
        cycle = find_cycle(doc["id"], doc["depends_on"], self._deps_of)
        if cycle:
            raise TaskError(f"depends_on creates a cycle: {' -> '.join(cycle)}")

    def add(self, fields: dict[str, Any], *, by: str = "cli") -> TaskDoc:
        """Validate `fields` (as in a dropped file) and put the task on the board."""
        now = now_iso()
        title = fields.get("title") if isinstance(fields.get("title"), str) else "task"
        with self._locked():
            for _attempt in range(20):
                default_id = f"{slugify(title)}-{os.urandom(3).hex()}"
                doc = normalize(fields, default_id=default_id, now=now, by=by, note="added")
                if self._locate(doc["id"]) is None:
                    break
                if "id" in fields:
                    raise TaskError(f"a task with id '{doc['id']}' already exists")
            self._check_new(doc)
            write_json_atomic(self._path(doc["status"], doc["id"]), doc)
            self._log.append(event(now, doc["id"], None, doc["status"], by, "added"))
        return doc

    # -- the index ------------------------------------------------------------------------------

    def _load_todo(self, task_id: str) -> TaskDoc | None:
        try:
            return self._read(self._path("todo", task_id))
        except (FileNotFoundError, Damaged):
            return None

    def _documents(self, status: str) -> Iterator[tuple[Path, TaskDoc]]:
        """Every readable task document in a status folder (under the lock); a damaged one is
        moved aside as it is met."""
        try:
            entries = list(os.scandir(self.root / status))
        except FileNotFoundError:
            return
        for entry in entries:
            if not entry.name.endswith(".json") or entry.name.startswith("."):
                continue
            path = Path(entry.path)
            try:
                doc = self._read(path)
            except FileNotFoundError:
                continue
            except Damaged as exc:
                self._quarantine(path, str(exc))
                continue
            yield path, doc

    def _rescan(self) -> None:
        self._tail.seek_end()
        self._index.clear()
        for status in STATUSES:
            if status == "todo":
                continue
            with contextlib.suppress(FileNotFoundError):
                for entry in os.scandir(self.root / status):
                    if entry.name.endswith(".json") and not entry.name.startswith("."):
                        self._index.set_status(entry.name[:-5], status)
        for _path, doc in self._documents("todo"):
            if doc["status"] != "todo":
                doc = self._adopt_hand_move("todo", doc)
            if doc["status"] == "todo":
                self._index.put_todo(doc)
        self._indexed_at = time.monotonic()
        self.signal.full_rescan_due = False

    def _refresh_index(self) -> None:
        if self._indexed_at is None or self.signal.full_rescan_due:
            self._rescan()
        else:
            self._index.apply_events(self._tail.read_new(), self._load_todo)

    # -- claiming -------------------------------------------------------------------------------

    def _done_on_disk(self, task_id: str) -> bool:
        return self._path("done", task_id).exists()

    def claim(self, agent: str, *, roles: Iterable[str] = (), lease: float | None = None,
              pid: int | None = None, steps_only: bool = False, assigned_only: bool = False) -> TaskDoc | None:
        """Claim the best eligible task for `agent`, or None. The returned document's
        claim.token must be presented to renew, complete, fail, block or release it.

        The pick is reserved without the board lock (an exclusive create of its marker), then its
        new document is fsync'd, and only the commit takes the lock. When the fast path finds
        nothing, the locked path refreshes the index, adopts hand moves, moves damaged files
        aside, and rescans the folders if the index is stale. `steps_only` takes only tasks that
        carry `steps` (an agent with no LLM provider can do nothing else); `assigned_only` only
        tasks assigned to `agent` (a delegated child takes its own task and nothing else).
        """
        roles = tuple(roles)
        for _attempt in range(20):
            picked = None
            with self._tlock:
                if self._indexed_at is not None and not self.signal.full_rescan_due:
                    self._index.apply_events(self._tail.read_new(), self._load_todo)
                    picked = self._reserve(agent, roles, steps_only, assigned_only, locked=False)
            if picked is None:
                with self._locked():
                    self._refresh_index()
                    picked = self._reserve(agent, roles, steps_only, assigned_only, locked=True)
                    if picked is None and self._indexed_at is not None and \
                            time.monotonic() - self._indexed_at > RESYNC_AFTER:
                        self._rescan()
                        picked = self._reserve(agent, roles, steps_only, assigned_only, locked=True)
            if picked is None:
                return None
            raw, doc = picked
            prepared: Path | None = None
            keeper: Path | None = None
            committed: TaskDoc | None = None
            try:
                new = self._claimed(doc, agent, lease, pid)
                prepared = self._prepare("todo", new)
                keeper = self._keep_old("todo", doc["id"])
                fault("prepared")
                with self._locked():
                    # A person may have changed the task while it was reserved; then choose again.
                    if _read_or_none(self._path("todo", doc["id"])) == raw:
                        committed, prepared = self._commit("todo", new, prepared, reserved=True), None
            finally:
                _unlink_marker(self._marker(doc["id"]))
                for leftover in (prepared, keeper):
                    if leftover is not None:
                        leftover.unlink(missing_ok=True)
                _reservation_done(doc["id"])
            if committed is not None:
                return committed
        raise BoardError("could not claim a task: every pick was changed by hand before the claim finished")

    def _reserve(self, agent: str, roles: tuple[str, ...], steps_only: bool, assigned_only: bool, *,
                 locked: bool) -> tuple[bytes, TaskDoc] | None:
        """Pick the best eligible task and reserve it for this process. Without the lock
        (`locked=False`) a task that needs repair (moved by hand, damaged) is only skipped."""
        index = self._index

        def indexed_done(dep: str) -> bool:
            return index.status.get(dep) == "done"

        for meta in index.todo_in_order():
            task_id = meta["id"]
            if not rules.eligible(meta, agent, roles, indexed_done, steps_only=steps_only,
                                  assigned_only=assigned_only, has_steps=meta["has_steps"]):
                continue
            path = self._path("todo", task_id)
            try:
                raw = self._raw(path)
                doc = self._parse(raw, task_id)
            except FileNotFoundError:
                index.forget(task_id)
                continue
            except Damaged as exc:
                if locked:
                    self._quarantine(path, str(exc))
                continue
            if doc["status"] != "todo":
                if not locked:
                    continue
                doc = self._adopt_hand_move("todo", doc)
                if doc["status"] != "todo":
                    index.set_status(task_id, doc["status"])
                    continue
                raw = self._raw(path)
            if not rules.eligible(doc, agent, roles, self._done_on_disk, steps_only=steps_only,
                                  assigned_only=assigned_only):
                index.put_todo(doc)
                continue
            if not self._try_reserve(task_id, locked=locked):
                continue
            # Reserved; another claimer may have committed this task just before.
            if _read_or_none(path) != raw:
                _unlink_marker(self._marker(task_id))
                _reservation_done(task_id)
                continue
            # Out of this process's candidates now; the commit's event (or a rescan) settles it.
            index.set_status(task_id, "doing")
            return raw, doc
        return None

    def _try_reserve(self, task_id: str, *, locked: bool) -> bool:
        """Create the task's marker exclusively; False if someone else holds it. Under the lock, a
        marker over a second old whose writer is dead (a claimer killed after reserving) is cleared
        so it cannot hide the task until the next recover()."""
        marker = self._marker(task_id)
        for _try in range(2):
            _reservation_started(task_id)
            try:
                # A symlink is created with its target in one step, and exclusively: a marker
                # is never seen without the owner it names, even if its claimer is killed.
                os.symlink(_owner_text(), marker)
            except FileExistsError:
                _reservation_done(task_id)
                if not locked or not self._stale_marker(marker):
                    return False
                self._finish_interrupted(sweep=False)
                continue
            fault("marked")
            return True
        return False

    def _stale_marker(self, marker: Path) -> bool:
        try:
            age = time.time() - marker.lstat().st_mtime
        except FileNotFoundError:
            return True
        return age >= 1.0 and not self._marker_is_live(marker)

    def _claimed(self, doc: TaskDoc, agent: str, lease: float | None, pid: int | None) -> TaskDoc:
        pid = os.getpid() if pid is None else pid
        lease = self.lease if lease is None else lease
        now, at = time.time(), now_iso()
        claim = {"agent": agent, "pid": pid, "pid_started": start_time(pid), "host": HOST, "claimed_at": at,
                 "lease_until": _iso_at(now + lease), "lease_until_ts": now + lease}
        return rules.claimed(doc, claim, now=at)

    def _held(self, task_id: str, token: int) -> TaskDoc:
        """The document of a task held in doing/ by `token`, else ClaimLost."""
        path = self._path("doing", task_id)
        try:
            doc = self._read(path)
        except FileNotFoundError:
            found = self._locate(task_id)
            where = f"it is in {found[0]}/" if found else "it is no longer on the board"
            raise ClaimLost(f"task {task_id} is not held by token {token}: {where}") from None
        claim = doc.get("claim") or {}
        if not rules.held_by(doc, token):
            holder = f"held by {claim.get('agent')} with token {claim.get('token')}" if claim else "not held"
            raise ClaimLost(f"task {task_id} is not held by token {token}: it is {holder}")
        return doc

    def renew(self, task_id: str, token: int, lease: float | None = None) -> TaskDoc:
        lease = self.lease if lease is None else lease
        with self._locked():
            doc = self._held(task_id, token)
            now = time.time()
            claim = dict(doc["claim"], lease_until=_iso_at(now + lease), lease_until_ts=now + lease)
            new = dict(doc, claim=claim)
            # Not a transition: no event, and a lost renewal only shortens the lease, so no fsync.
            write_json_atomic(self._path("doing", task_id), new, fsync=False)
            return new

    def _finish(self, task_id: str, token: int, end: Callable[[TaskDoc], TaskDoc]) -> TaskDoc:
        """End the holder's claim with `end(held document)` (a pure rule). The new document is
        written and fsync'd before the lock is taken; under the lock it is committed if the task is
        still exactly as it was read, and built again from the current file if not (a renewal in
        between, say)."""
        path = self._path("doing", task_id)
        raw = _read_or_none(path)
        prepared: Path | None = None
        keeper: Path | None = None
        new: TaskDoc | None = None
        if raw is not None:
            with contextlib.suppress(Damaged):
                doc = self._parse(raw, task_id)
                if rules.held_by(doc, token):
                    new = end(doc)
                    prepared = self._prepare("doing", new)
                    keeper = self._keep_old("doing", task_id)
                    fault("prepared")
        try:
            with self._locked():
                if prepared is None or new is None or _read_or_none(path) != raw:
                    if prepared is not None:
                        prepared.unlink(missing_ok=True)
                        prepared = None
                    new = end(self._held(task_id, token))
                committed, prepared = self._commit("doing", new, prepared), None
                return committed
        finally:
            for leftover in (prepared, keeper):
                if leftover is not None:
                    leftover.unlink(missing_ok=True)

    def complete(self, task_id: str, token: int, result: Any = None) -> TaskDoc:
        return self._finish(task_id, token, lambda doc: rules.ended(doc, "done", "completed", now=now_iso(),
                                                                    result=result, error=None))

    def fail(self, task_id: str, token: int, error: str, *, permanent: bool = False) -> TaskDoc:
        """A failed attempt: back to todo, or to failed once max_attempts is reached. A `permanent`
        failure (one no further attempt can change) goes to failed at once."""
        if permanent:
            return self._finish(task_id, token, lambda doc: rules.ended(
                doc, "failed", f"cannot succeed, not retried: {error}", now=now_iso(), error=error))
        return self._finish(task_id, token, lambda doc: rules.failed_attempt(doc, error, now=now_iso()))

    def block(self, task_id: str, token: int, reason: str, *, question: str | None = None) -> TaskDoc:
        """The agent cannot finish without a person; `task retry` puts it back. A task blocked on
        a `question` waits for `answer`; asking is not a failed attempt, so the attempt is given back."""
        if question is None:
            return self._finish(task_id, token, lambda doc: rules.ended(doc, "blocked", reason, now=now_iso(),
                                                                        error=reason))
        return self._finish(task_id, token, lambda doc: rules.ended(
            doc, "blocked", reason, now=now_iso(), give_back_attempt=True, error=reason, question=question))

    def release(self, task_id: str, token: int, note: str = "released", *, count_attempt: bool = False) -> TaskDoc:
        """Give the task back to todo; an interrupted attempt (shutdown, restart) is not counted."""
        return self._finish(task_id, token, lambda doc: rules.ended(doc, "todo", note, now=now_iso(),
                                                                    give_back_attempt=not count_attempt))

    def mark_waiting(self, reason: str | None, *, needs_llm: bool = True, agent: str | None = None,
                     roles: Iterable[str] = ()) -> int:
        """Say on each todo task (without `steps`, when `needs_llm`) why it is not being worked, or
        clear that note with None. Not a transition: no event, no history entry. Candidates come
        from the in-memory index and this board remembers what it noted, so a call reads only the
        tasks new to it: agents call this after every task. With `agent` (and its `roles`), only the
        tasks it could claim now are noted: its provider is no reason for a task it could not take."""
        with self._locked():
            self._refresh_index()
        roles = tuple(roles)
        index = self._index

        def indexed_done(dep: str) -> bool:
            return index.status.get(dep) == "done"

        # A note stands for the task as it was: any transition changes updated_at, a note does not.
        candidates = [meta["id"] for meta in self._index.todo_in_order()
                      if not (needs_llm and meta["has_steps"])
                      and (agent is None or rules.can_claim(meta, agent, roles, indexed_done))
                      and self._noted.get(meta["id"]) != (reason, meta["updated_at"])]
        changed = 0
        for task_id in candidates:
            with self._locked():
                path = self._path("todo", task_id)
                try:
                    current = self._read(path)
                except (FileNotFoundError, Damaged):
                    continue
                if current["status"] != "todo" or self._has_marker(task_id):
                    continue
                if current.get("waiting") != reason:
                    noted = {k: v for k, v in current.items() if k != "waiting"}
                    write_json_atomic(path, {**noted, "waiting": reason} if reason else noted, fsync=False)
                    changed += 1
                self._noted[task_id] = (reason, current.get("updated_at"))
        return changed

    def comment(self, task_id: str, text: str, *, by: str = "cli", wait: float = 5.0) -> TaskDoc:
        """Add a comment to a task in any status. Not a transition: no event, the status and
        updated_at stay; the comment carries its own time and author. A claim or move in flight
        (its marker) is waited out, as a transition would overwrite the comment."""
        if not isinstance(text, str):
            raise TaskError(f"a comment is text, not {type(text).__name__}")
        size = len(text.encode("utf-8", "backslashreplace"))
        if size > MAX_BYTES:
            raise TaskError(f"the comment is {size} bytes; the limit for a comment is {MAX_BYTES} bytes (1 MiB)")
        deadline = time.monotonic() + wait
        while True:
            with self._locked():
                found = self._locate_or_raise(task_id)
                if not self._has_marker(task_id):
                    doc = self._read(found[1])
                    entry = {"at": now_iso(), "by": by, "text": text}
                    new = {**doc, "comments": [*(doc.get("comments") or []), entry]}
                    data = dumps(new)
                    if len(data) > MAX_DOCUMENT_BYTES - COMMENT_RESERVE:
                        raise TaskError(f"task {task_id} has no room for this comment: its comments may fill "
                                        f"{MAX_DOCUMENT_BYTES - COMMENT_RESERVE} bytes of its document, the rest is "
                                        "kept for its result")
                    write_atomic(found[1], data)
                    return new
            if time.monotonic() > deadline:
                raise InvalidTransition(f"task {task_id} is being moved; try the comment again")
            time.sleep(0.01)

    # -- recovery -------------------------------------------------------------------------------

    def recover(self, *, sweep: bool = True) -> list[dict[str, str]]:
        """Return tasks whose holder died or whose lease ran out to todo (attempts kept), or to
        failed once they used up max_attempts; finish interrupted transitions; sweep stale temp files."""
        recovered = []
        now = time.time()
        with self._locked():
            self._last_recover = time.monotonic()
            self._finish_interrupted(sweep=sweep)
            for path, doc in self._documents("doing"):
                if doc["status"] != "doing":
                    self._roll_forward(path, doc)
                    continue
                reason = stale_reason(doc.get("claim"), now)
                if reason is None:
                    continue
                new = self._commit("doing", rules.recovered(doc, reason, now=now_iso()))
                recovered.append({"task": doc["id"], "to": new["status"], "reason": reason})
        return recovered

    # -- changes by hand ------------------------------------------------------------------------

    def move(self, task_id: str, to: str, *, by: str = "cli", note: str = "") -> TaskDoc:
        rules.check_move_target(to)
        with self._locked():
            folder, path = self._locate_or_raise(task_id)
            return self._commit(folder, rules.moved(self._read(path), to, by=by, now=now_iso(), note=note))

    def answer(self, task_id: str, text: str, *, by: str = "cli") -> TaskDoc:
        """Answer the question a blocked task asked: it goes back to todo with the answer among its
        comments, marked as the answer to that question, for the agent that takes it next."""
        if not isinstance(text, str):
            raise TaskError(f"an answer is text, not {type(text).__name__}")
        if not text.strip():
            raise InvalidTransition("an answer must not be empty")
        size = len(text.encode("utf-8", "backslashreplace"))
        if size > MAX_BYTES:
            raise TaskError(f"the answer is {size} bytes; the limit for an answer is {MAX_BYTES} bytes (1 MiB)")
        with self._locked():
            folder, path = self._locate_or_raise(task_id)
            return self._commit(folder, rules.answered(self._read(path), text, by=by, now=now_iso()))

    def cancel(self, task_id: str, *, by: str = "cli") -> TaskDoc:
        rules.check_cancel(self.get(task_id))
        return self.move(task_id, "cancelled", by=by, note="cancelled")

    def retry(self, task_id: str, *, by: str = "cli") -> TaskDoc:
        rules.check_retry(self.get(task_id))
        return self.move(task_id, "todo", by=by, note="retry (attempts reset)")

    # -- waiting --------------------------------------------------------------------------------

    @property
    def watch_mode(self) -> str:
        return self.watcher.mode

    def health(self) -> list[tuple[str, str, str]]:
        """The filesystem and change-notification checks doctor prints."""
        if self.network_fs:
            fs = (self.fs_type, "warn", f": a network filesystem, allowed by {ALLOW_NETWORK_FS_ENV}; locks hold only "
                                        "within this machine")
        else:
            fs = (self.fs_type, "ok", "")
        checks = [("filesystem", fs[1], fs[0] + fs[2])]
        self.start_watching()
        if self.watcher.mode == "inotify":
            checks.append(("watcher", "ok", "inotify events (drops are picked up at once)"))
        else:
            checks.append(("watcher", "warn", f"polling every few seconds: {self.watcher.reason}"))
        return checks

    # -- the event log by cursor ----------------------------------------------------------------

    def events_since(self, cursor: int, *, max_events: int = 10_000, inode: int | None = None) -> CursorRead:
        return read_since(self.events_path, cursor, max_events, inode=inode)

    def events_end(self) -> int:
        return _log_end(self.events_path)

    def check_cursor(self, cursor: int) -> None:
        check_cursor(self.events_path, cursor)

    def start_watching(self) -> None:
        if self.watcher.mode == "off":
            self.watcher.start(force_polling=self.network_fs,
                               why=f"no change events on a network filesystem ({self.fs_type})")

    def wake(self) -> None:
        """Wake every thread of this process waiting in wait_for_work (to stop it, say)."""
        self.signal.bump()

    def wait_for_work(self, agent: str, *, roles: Iterable[str] = (), timeout: float | None = None,
                      lease: float | None = None, stop: threading.Event | None = None,
                      steps_only: bool = False, assigned_only: bool = False) -> TaskDoc | None:
        """Claim a task, waiting for one to become eligible; None on timeout or when `stop` is set.

        Drops are ingested and dead claims recovered while waiting, so a board needs no other
        process to make progress. Sleeps on watcher events, never a busy poll.
        """
        self.start_watching()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            seen = self.signal.generation
            self.ingest()
            if time.monotonic() - self._last_recover >= RECOVER_INTERVAL:
                self.recover(sweep=time.monotonic() - self._last_sweep >= SWEEP_INTERVAL)
            if stop is not None and stop.is_set():
                return None
            doc = self.claim(agent, roles=roles, lease=lease, steps_only=steps_only, assigned_only=assigned_only)
            if doc is not None:
                return doc
            if stop is not None and stop.is_set():
                return None
            nap = RESCAN_INTERVAL if self.watcher.mode == "inotify" else POLL_INTERVAL
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                nap = min(nap, remaining)
            self.signal.wait(seen, nap)


def _unlink_marker(marker: Path) -> None:
    # Outside the lock a marker that is not ours (a folder put there) is left for the next
    # locked pass to move aside.
    with contextlib.suppress(FileNotFoundError, IsADirectoryError):
        marker.unlink()


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


_START_TIME: list[tuple[int, float]] = []


def _own_start_time() -> float:
    pid = os.getpid()
    if not _START_TIME or _START_TIME[0][0] != pid:  # recomputed after a fork
        _START_TIME[:] = [(pid, start_time(pid) or 0.0)]
    return _START_TIME[0][1]


def _owner_text() -> str:
    """What a marker says of its owner: pid and process start time."""
    return f"{os.getpid()} {_own_start_time()!r}"


def _writer_gone(pid: int, path: Path) -> bool:
    """A temp file's writer is dead (or the file is too old to still be in use)."""
    if pid == os.getpid():
        return False
    try:
        age = time.time() - path.lstat().st_mtime
    except FileNotFoundError:
        return False
    return age > STALE_TMP_AGE or not psutil.pid_exists(pid)


def _iso_at(timestamp: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(timestamp)) + f".{int(timestamp % 1 * 1e6):06d}Z"



def _log_end(path: Path) -> int:
    """The offset just after the log's last complete line (a torn last line is not an event yet)."""
    try:
        with open(path, "rb") as handle:
            end = os.fstat(handle.fileno()).st_size
            while end > 0:
                start = max(0, end - 65536)
                block = os.pread(handle.fileno(), end - start, start)
                newline = block.rfind(b"\n")
                if newline >= 0:
                    return start + newline + 1
                end = start
    except FileNotFoundError:
        pass
    return 0
