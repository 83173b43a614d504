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
import hashlib
import json
import os
import stat
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from . import drops, fsinfo
from .events import EventTail, event
from .faults import fault
from .fsio import (
    AppendLog,
    dumps,
    read_bytes_nofollow,
    tmp_path_for,
    tmp_writer_pid,
    unique_path,
    write_json_atomic,
    write_temp,
)
from .index import BoardIndex
from .liveness import HOST, holder_alive, stale_reason, start_time
from .lock import BoardLock, LockTimeout
from .parse import MAX_BYTES, parse_task_file
from .task import (
    STATUSES,
    TaskError,
    can_claim,
    check_document,
    find_cycle,
    is_valid_id,
    normalize,
    now_iso,
    slugify,
    sort_key,
    transition,
)
from .watch import BoardWatcher, ChangeSignal

TaskDoc = dict[str, Any]

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


class BoardError(Exception):
    """A board operation that cannot be done; the message says why."""


class TaskNotFound(BoardError):
    pass


class ClaimLost(BoardError):
    """The caller's claim token no longer holds the task (its lease expired and it was reclaimed)."""


class InvalidTransition(BoardError):
    pass


class Damaged(BoardError):
    pass


@dataclass
class IngestReport:
    ingested: list[str] = field(default_factory=list)
    rejected: list[dict[str, str]] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"ingested": self.ingested, "rejected": self.rejected, "waiting": self.waiting}


@dataclass
class Listing:
    tasks: list[TaskDoc]
    damaged: list[dict[str, str]]


def fingerprint(name: str, st: os.stat_result, data: bytes) -> str:
    """Identity of one dropped file: the same file after a crash gives the same value, a new drop
    (even with the same name and bytes) a different one."""
    digest = hashlib.sha256()
    digest.update(f"{name}\0{st.st_ino}\0{st.st_mtime_ns}\0{st.st_size}\0".encode())
    digest.update(data)
    return digest.hexdigest()[:16]


class Board:
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

    def _ensure_layout(self) -> None:
        existing = self.events_path.exists()
        for name in (*STATUSES, "inbox", "rejected", ".pending", ".ingested"):
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
            try:
                self._flock.acquire()
            except LockTimeout as exc:
                raise BoardError(f"the board lock {exc}; is a board process stopped while holding it?") from None
            self._depth += 1
            try:
                if self._depth == 1 and not self._finished_once:
                    self._finished_once = True
                    self._finish_interrupted()
                yield
            finally:
                self._depth -= 1
                self._flock.release()

    def _path(self, status: str, task_id: str) -> Path:
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

    def _read(self, path: Path) -> TaskDoc:
        return self._parse(path.read_bytes())

    def _parse(self, data: bytes) -> TaskDoc:
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise Damaged(f"not valid JSON ({exc})") from exc
        try:
            return check_document(doc)
        except TaskError as exc:
            raise Damaged(str(exc)) from exc

    def _locate(self, task_id: str) -> tuple[str, Path] | None:
        hint = self._index.status.get(task_id)
        order = [hint] if hint else []
        order += [status for status in STATUSES if status != hint]
        for status in order:
            path = self._path(status, task_id)
            if path.exists():
                return status, path
        return None

    def get(self, task_id: str) -> TaskDoc:
        """The task's current document (a lock-free read: files are only ever replaced whole)."""
        if not is_valid_id(task_id):
            raise TaskNotFound(f"'{task_id}' is not a task id")
        for _attempt in range(5):
            found = self._locate(task_id)
            if found is None:
                break
            try:
                return self._read(found[1])
            except FileNotFoundError:
                continue  # moved between the look-up and the read
            except Damaged as exc:
                raise BoardError(f"task {task_id} in {found[0]}/ is damaged: {exc}") from exc
        raise TaskNotFound(f"no task '{task_id}' on the board {self.root}")

    def list(self, status: str | None = None) -> Listing:
        """Every task (or those in one status), in claim order within each status."""
        if status is not None and status not in STATUSES:
            raise BoardError(f"unknown status '{status}'; statuses are {', '.join(STATUSES)}")
        found: dict[str, TaskDoc] = {}
        damaged: list[dict[str, str]] = []
        for folder in [status] if status else STATUSES:
            try:
                entries = list(os.scandir(self.root / folder))
            except FileNotFoundError:
                damaged.append({"path": f"{folder}/", "reason": "status folder is missing"})
                continue
            for entry in entries:
                if not entry.name.endswith(".json") or entry.name.startswith("."):
                    continue
                try:
                    doc = self._read(Path(entry.path))
                except FileNotFoundError:
                    continue
                except Damaged as exc:
                    damaged.append({"path": f"{folder}/{entry.name}", "reason": str(exc)})
                    continue
                except OSError as exc:
                    damaged.append({"path": f"{folder}/{entry.name}", "reason": f"unreadable: {exc.strerror}"})
                    continue
                seen = found.get(doc["id"])
                # A transition caught between its write and its rename shows up twice; the longer
                # history is the newer state.
                if seen is None or len(doc["history"]) > len(seen["history"]):
                    found[doc["id"]] = doc
        tasks = [doc for doc in found.values() if status is None or doc["status"] == status]
        order = {name: index for index, name in enumerate(STATUSES)}
        tasks.sort(key=lambda doc: (order[doc["status"]], sort_key(doc)))
        return Listing(tasks, damaged)

    def counts(self) -> dict[str, int]:
        counts = {}
        for status in STATUSES:
            try:
                counts[status] = sum(
                    1 for entry in os.scandir(self.root / status)
                    if entry.name.endswith(".json") and not entry.name.startswith(".")
                )
            except FileNotFoundError:
                counts[status] = 0
        return counts

    # -- writing: the one transition path -------------------------------------------------------
    #
    # The fsync, the slow part, happens before the lock is taken when it can (`_prepare`): the
    # locked section then only checks that the task is still as the new document assumed and
    # renames. Concurrent fsyncs share journal commits, so claimers no longer queue behind each
    # other's disk flushes.

    def _prepare(self, folder: str, new: TaskDoc) -> Path:
        """The new document, fsync'd to a temp file beside the task's current file."""
        return write_temp(self._path(folder, new["id"]), dumps(new))

    def _keep_old(self, folder: str, task_id: str) -> Path | None:
        """A second link to the task's current file, made before the lock: the rename that
        replaces the file inside the lock then only drops a link count, and the old inode is
        freed (several journal updates) when the caller removes this link after the lock."""
        current = self._path(folder, task_id)
        keeper = tmp_path_for(current)
        try:
            os.link(current, keeper)
        except FileNotFoundError:
            return None
        return keeper

    def _marker(self, task_id: str) -> Path:
        return self.root / ".pending" / task_id

    def _mark(self, task_id: str) -> None:
        """Place the marker for a transition made under the lock (replacing any other)."""
        marker = self._marker(task_id)
        marker.unlink(missing_ok=True)
        os.symlink(_owner_text(), marker)

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
            self._marker(task_id).unlink(missing_ok=True)
        return new

    def _move_into_place(self, src_path: Path, dst: str, task_id: str) -> None:
        dst_path = self._path(dst, task_id)
        if dst_path.exists():
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
        entry = doc["history"][-1]
        if not self._event_logged(entry["at"], doc["id"]):
            self._log.append(event(entry["at"], doc["id"], entry["from"], entry["to"], entry["by"],
                                   f"{entry['note']} (completed after its writer was interrupted)".strip()))
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
            marker.unlink(missing_ok=True)
        if not sweep:
            return
        self._last_sweep = time.monotonic()
        for status in STATUSES:
            with contextlib.suppress(FileNotFoundError):
                for item in os.scandir(self.root / status):
                    pid = tmp_writer_pid(item.name)
                    if pid is not None and _writer_gone(pid, Path(item.path)):
                        Path(item.path).unlink(missing_ok=True)

    def _adopt_hand_move(self, folder: str, doc: TaskDoc) -> TaskDoc:
        """A document whose status disagrees with its folder and has no pending marker was moved by
        a person (`mv todo/x.json done/`): the folder is their intent, so the document follows it."""
        if self._has_marker(doc["id"]):
            return doc
        changes: dict[str, Any] = {}
        if folder != "doing":
            changes["claim"] = None
        new = transition(doc, folder, by="board", now=now_iso(), note=f"moved into {folder}/ by hand", **changes)
        write_json_atomic(self._path(folder, doc["id"]), new)
        entry = new["history"][-1]
        self._log.append(event(entry["at"], doc["id"], entry["from"], folder, "board", entry["note"]))
        return new

    def _quarantine(self, path: Path, reason: str) -> Path:
        """Move a damaged file aside to rejected/ with a note; never delete it."""
        folder = path.parent.name
        dest = unique_path(self.root / "rejected", f"{folder}--{path.name}")
        note = (f"{folder}/{path.name} was found damaged on {now_iso()}: {reason}\n"
                f"It was moved here untouched; every other task stayed where it was. Repair it and move it "
                f"back into {folder}/ if it is still wanted.\n")
        (dest.parent / f"{dest.name}.error.txt").write_text(note)
        os.rename(path, dest)
        self.problems.append(f"{folder}/{path.name} was damaged ({reason}); moved to rejected/{dest.name}")
        self._log.append(event(now_iso(), path.stem, folder, "rejected", "board", f"damaged: {reason}"))
        self._index.forget(path.stem)
        return dest

    def quarantine_damaged(self, damaged: Iterable[dict[str, str]]) -> list[str]:
        """Re-check, under the lock, files a lock-free listing found unreadable; move the damaged aside."""
        moved = []
        with self._locked():
            for item in damaged:
                path = self.root / item["path"]
                if not path.is_file():
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

    # -- ingest ---------------------------------------------------------------------------------

    def ingest(self) -> IngestReport:
        """Turn finished files in the drop zones into tasks; reject what cannot be one."""
        report = IngestReport()
        candidates = drops.scan(self.root)
        if not candidates:
            return report
        writers: set[tuple[int, int]] | None = None
        writers_read = False
        ready: list[drops.Drop] = []
        now = time.time()
        for drop in candidates:
            try:
                st = os.lstat(drop.path)
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(st.st_mode):
                ready.append(drop)  # symlinks, folders, devices: rejected at once
                continue
            hinted = self.watcher.is_complete(drop.path, st.st_mtime_ns)
            is_task = drops.is_task_file(drop.path.name)
            has_writer: bool | None = False
            if is_task and not hinted:
                if not writers_read:
                    writers, writers_read = drops.open_writers(self.root), True
                has_writer = None if writers is None else (st.st_dev, st.st_ino) in writers
            state = drops.decide(is_task_type=is_task, hinted_complete=hinted, has_writer=has_writer,
                                 quiet_for=now - st.st_mtime)
            if state == "wait":
                report.waiting.append(str(drop.path.relative_to(self.root)))
            else:
                ready.append(drop)
        if not ready:
            return report
        with self._locked():
            for drop in ready:
                self._ingest_one(drop, report)
        return report

    def _reject(self, path: Path, reason: str, report: IngestReport) -> None:
        rel = str(path.relative_to(self.root))
        dest = unique_path(self.root / "rejected", path.name)
        (dest.parent / f"{dest.name}.error.txt").write_text(
            f"{rel} was rejected on {now_iso()}: {reason}\nFix the file and drop it into inbox/ again.\n"
        )
        os.rename(path, dest)
        self.watcher.forget(path)
        self._log.append(event(now_iso(), path.name, "inbox", "rejected", "ingest", reason))
        report.rejected.append({"file": rel, "moved_to": f"rejected/{dest.name}", "reason": reason})

    def _ingest_one(self, drop: drops.Drop, report: IngestReport) -> None:
        path = drop.path
        rel = str(path.relative_to(self.root))
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return  # another process ingested it first
        if stat.S_ISLNK(st.st_mode):
            return self._reject(path, f"is a symlink (to {os.readlink(path)}); symlinks are refused, "
                                      "copy the file in instead", report)
        if stat.S_ISDIR(st.st_mode):
            return self._reject(path, "is a folder; drop task files, not folders", report)
        if not stat.S_ISREG(st.st_mode):
            return self._reject(path, "is not a regular file", report)
        if not drops.is_task_file(path.name):
            return self._reject(path, f"unsupported file type; a task file ends in {', '.join(drops.EXTENSIONS)}",
                                report)
        if st.st_size > MAX_BYTES:
            return self._reject(path, f"file is {st.st_size} bytes; the limit for a task file is "
                                      f"{MAX_BYTES} bytes (1 MiB)", report)
        try:
            data = read_bytes_nofollow(path, MAX_BYTES)
        except FileNotFoundError:
            return
        except OSError as exc:
            return self._reject(path, f"cannot be read: {exc.strerror}", report)
        fp = fingerprint(path.name, st, data)
        now = now_iso()
        stem = path.name.rsplit(".", 1)[0]
        try:
            raw = parse_task_file(path.name, data)
            doc = normalize(raw, default_id=f"{slugify(stem, 57)}-{fp[:6]}", now=now, by="ingest",
                            note=f"ingested from {rel}")
            found = self._locate(doc["id"])
            if found is not None:
                existing = self._read(found[1])
                if (existing.get("source") or {}).get("fingerprint") == fp:
                    # This very file was ingested by a process that died before moving it away.
                    first = existing["history"][0]
                    if not self._event_logged(first["at"], existing["id"]):
                        self._log.append(event(first["at"], existing["id"], "inbox",
                                                             first["to"], "ingest", first["note"]))
                    self._archive(path, existing["id"])
                    report.ingested.append(existing["id"])
                    return None
                raise TaskError(f"a task with id '{doc['id']}' already exists (in {found[0]}/)")
            self._check_new(doc)
        except (TaskError, Damaged) as exc:
            return self._reject(path, str(exc), report)
        doc["source"] = {"file": rel, "fingerprint": fp}
        write_json_atomic(self._path(doc["status"], doc["id"]), doc)
        fault("ingest-written")
        self._log.append(event(now, doc["id"], "inbox", doc["status"], "ingest",
                                             f"ingested from {rel}"))
        self._archive(path, doc["id"])
        report.ingested.append(doc["id"])
        return None

    def _archive(self, path: Path, task_id: str) -> None:
        # The user's file is kept, not deleted: the task's `source` names it.
        os.rename(path, unique_path(self.root / ".ingested", f"{task_id}--{path.name}"))
        self.watcher.forget(path)

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
                self._marker(doc["id"]).unlink(missing_ok=True)
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
            if ((steps_only and not meta["has_steps"]) or (assigned_only and meta.get("assignee") != agent)
                    or not can_claim(meta, agent, roles, indexed_done)):
                continue
            path = self._path("todo", task_id)
            try:
                raw = path.read_bytes()
                doc = self._parse(raw)
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
                raw = path.read_bytes()
            if ((steps_only and not doc.get("steps")) or (assigned_only and doc.get("assignee") != agent)
                    or not can_claim(doc, agent, roles, self._done_on_disk)):
                index.put_todo(doc)
                continue
            if not self._try_reserve(task_id, locked=locked):
                continue
            # Reserved; another claimer may have committed this task just before.
            if _read_or_none(path) != raw:
                self._marker(task_id).unlink(missing_ok=True)
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
        token = int(doc.get("claims") or 0) + 1
        attempt = int(doc.get("attempts") or 0) + 1
        now = time.time()
        claim = {
            "agent": agent, "pid": pid, "pid_started": start_time(pid), "host": HOST, "token": token,
            "claimed_at": now_iso(), "lease_until": _iso_at(now + lease), "lease_until_ts": now + lease,
        }
        return transition(doc, "doing", by=agent, now=claim["claimed_at"],
                          note=f"claimed by {agent} (attempt {attempt} of {doc['max_attempts']})",
                          claim=claim, attempts=attempt, claims=token)

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
        if doc["status"] != "doing" or claim.get("token") != token:
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

    def _finish(self, task_id: str, token: int, to: str, note: str, **changes: Any) -> TaskDoc:
        """End the holder's claim. The new document is written and fsync'd before the lock is
        taken; under the lock it is committed if the task is still exactly as it was read, and
        built again from the current file if not (a renewal in between, say)."""
        path = self._path("doing", task_id)
        raw = _read_or_none(path)
        prepared: Path | None = None
        keeper: Path | None = None
        new: TaskDoc | None = None
        if raw is not None:
            with contextlib.suppress(Damaged):
                doc = self._parse(raw)
                if doc["status"] == "doing" and (doc.get("claim") or {}).get("token") == token:
                    new = _finished(doc, to, note, changes)
                    prepared = self._prepare("doing", new)
                    keeper = self._keep_old("doing", task_id)
                    fault("prepared")
        try:
            with self._locked():
                if prepared is None or new is None or _read_or_none(path) != raw:
                    if prepared is not None:
                        prepared.unlink(missing_ok=True)
                        prepared = None
                    new = _finished(self._held(task_id, token), to, note, changes)
                committed, prepared = self._commit("doing", new, prepared), None
                return committed
        finally:
            for leftover in (prepared, keeper):
                if leftover is not None:
                    leftover.unlink(missing_ok=True)

    def complete(self, task_id: str, token: int, result: Any = None) -> TaskDoc:
        return self._finish(task_id, token, "done", "completed", result=result, error=None)

    def fail(self, task_id: str, token: int, error: str) -> TaskDoc:
        """A failed attempt: back to todo, or to failed once max_attempts is reached."""
        return self._finish(task_id, token, "todo?", error, error=error)

    def block(self, task_id: str, token: int, reason: str) -> TaskDoc:
        """The agent cannot finish without a person; `task retry` puts it back."""
        return self._finish(task_id, token, "blocked", reason, error=reason)

    def release(self, task_id: str, token: int, note: str = "released", *, count_attempt: bool = False) -> TaskDoc:
        """Give the task back to todo; an interrupted attempt (shutdown, restart) is not counted."""
        return self._finish(task_id, token, "todo", note, _return_attempt=not count_attempt)

    def mark_waiting(self, reason: str | None, *, needs_llm: bool = True) -> int:
        """Say on each todo task (without `steps`, when `needs_llm`) why it is not being worked, or
        clear that note with None. Not a transition: no event, no history entry. Candidates come
        from the in-memory index and this board remembers what it noted, so a call reads only the
        tasks new to it: agents call this after every task."""
        with self._locked():
            self._refresh_index()
        # A note stands for the task as it was: any transition changes updated_at, a note does not.
        candidates = [meta["id"] for meta in self._index.todo_in_order()
                      if not (needs_llm and meta["has_steps"])
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
        deadline = time.monotonic() + wait
        while True:
            with self._locked():
                found = self._locate(task_id)
                if found is None:
                    raise TaskNotFound(f"no task '{task_id}' on the board {self.root}")
                if not self._has_marker(task_id):
                    doc = self._read(found[1])
                    entry = {"at": now_iso(), "by": by, "text": text}
                    new = {**doc, "comments": [*(doc.get("comments") or []), entry]}
                    write_json_atomic(found[1], new)
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
                exhausted = doc["attempts"] >= doc["max_attempts"]
                to = "failed" if exhausted else "todo"
                note = f"recovered: {reason}" + (f"; gave up after {doc['attempts']} attempts" if exhausted else "")
                self._commit("doing", transition(doc, to, by="board", now=now_iso(), note=note,
                                                 claim=None, error=note))
                recovered.append({"task": doc["id"], "to": to, "reason": reason})
        return recovered

    # -- changes by hand ------------------------------------------------------------------------

    def move(self, task_id: str, to: str, *, by: str = "cli", note: str = "") -> TaskDoc:
        if to not in STATUSES:
            raise InvalidTransition(f"unknown status '{to}'; statuses are {', '.join(STATUSES)}")
        if to == "doing":
            raise InvalidTransition("a task enters doing/ only when an agent claims it")
        with self._locked():
            found = self._locate(task_id)
            if found is None:
                raise TaskNotFound(f"no task '{task_id}' on the board {self.root}")
            folder, path = found
            doc = self._read(path)
            if doc["status"] == to:
                raise InvalidTransition(f"task {task_id} is already {to}")
            changes: dict[str, Any] = {"claim": None}
            if doc.get("claim"):
                note = f"{note}; " if note else ""
                note += f"claim of {doc['claim'].get('agent')} revoked"
            if to == "todo":
                changes["attempts"] = 0
            return self._commit(folder, transition(doc, to, by=by, now=now_iso(), note=note or f"moved to {to}",
                                                   **changes))

    def cancel(self, task_id: str, *, by: str = "cli") -> TaskDoc:
        doc = self.get(task_id)
        if doc["status"] in ("done", "cancelled"):
            raise InvalidTransition(f"task {task_id} is already {doc['status']}")
        return self.move(task_id, "cancelled", by=by, note="cancelled")

    def retry(self, task_id: str, *, by: str = "cli") -> TaskDoc:
        doc = self.get(task_id)
        if doc["status"] not in ("blocked", "failed", "cancelled"):
            raise InvalidTransition(f"task {task_id} is {doc['status']}; retry takes a blocked, failed or "
                                    "cancelled task")
        return self.move(task_id, "todo", by=by, note="retry (attempts reset)")

    # -- waiting --------------------------------------------------------------------------------

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


def _finished(doc: TaskDoc, to: str, note: str, changes: dict[str, Any]) -> TaskDoc:
    """The document of a held task after its holder ends the claim (pure)."""
    changes = dict(changes)
    if to == "todo?":
        to = "failed" if doc["attempts"] >= doc["max_attempts"] else "todo"
        note = f"attempt {doc['attempts']} of {doc['max_attempts']} failed: {note}"
    if changes.pop("_return_attempt", False):
        changes["attempts"] = max(0, doc["attempts"] - 1)
    return transition(doc, to, by=doc["claim"]["agent"], now=now_iso(), note=note, claim=None, **changes)


def _read_or_none(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


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
        age = time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return False
    return age > STALE_TMP_AGE or not psutil.pid_exists(pid)


def _iso_at(timestamp: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(timestamp)) + f".{int(timestamp % 1 * 1e6):06d}Z"

