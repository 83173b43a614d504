"""Ingest: finished files in inbox/ become tasks, what cannot be one goes to rejected/.

Every dropped file is hostile until parsed. Reading and parsing it (up to 1 MiB, of YAML say) is
done before the board lock is taken; under the lock the file is checked to be the one that was
read, and only the id's uniqueness, the dependency-cycle check and the writes remain. A crash
between writing the task and moving the file away is repaired by the next ingest: the same file
(its fingerprint) is never made into two tasks.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import drops
from .errors import Damaged
from .events import event
from .faults import fault
from .fsio import dumps, read_bytes_nofollow, safe_name, unique_path, write_json_atomic, write_temp_open
from .fsyncs import fsync_all
from .index import carried
from .ingestturn import SoleIngester
from .parse import parse_task_file
from .task import MAX_BYTES, TaskError, normalize, now_iso, slugify
from .watch import INGEST_LOCK

if TYPE_CHECKING:
    from .base import Folder
    from .txn import Transactions

TaskDoc = dict[str, Any]
# Drops read and written before their documents are made durable together and put in place: a
# batch's fsyncs overlap (fsyncs.py). Enough to fill the pool's threads a few times over, and few
# enough that the first of a burst is a task within milliseconds.
PREPARED_AT_ONCE = 32


@dataclass
class IngestReport:
    ingested: list[str] = field(default_factory=list)
    rejected: list[dict[str, str]] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)
    # Drops the board could not move this time (permissions, a full disk), with the reason.
    failed: list[dict[str, str]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"ingested": self.ingested, "rejected": self.rejected, "waiting": self.waiting, "failed": self.failed}


def fingerprint(name: str, st: os.stat_result, data: bytes) -> str:
    """Identity of one dropped file: the same file after a crash gives the same value, a new drop
    (even with the same name and bytes) a different one."""
    digest = hashlib.sha256()
    digest.update(f"{name}\0{st.st_ino}\0{st.st_mtime_ns}\0{st.st_size}\0".encode())
    digest.update(data)
    return digest.hexdigest()[:16]


def identity_of(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_mode, st.st_mtime_ns, st.st_size)


@dataclass
class DropRead:
    """A drop as read and parsed outside the lock: a task document, or the reason it is none."""

    identity: tuple[int, ...]
    doc: TaskDoc | None = None
    fp: str = ""
    reason: str | None = None


def read_drop(path: Path) -> DropRead | None:
    """Read and parse one drop (no board state needed); None if it is gone."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    read = DropRead(identity_of(st))
    problem = drops.name_problem(path.name)
    if problem is None and stat.S_ISLNK(st.st_mode):
        try:
            target = safe_name(os.readlink(path), 400)
        except OSError:
            target = "?"
        problem = f"is a symlink (to {target}); symlinks are refused, copy the file in instead"
    elif problem is None and stat.S_ISDIR(st.st_mode):
        problem = "is a folder; drop task files, not folders"
    elif problem is None and not stat.S_ISREG(st.st_mode):
        problem = "is not a regular file"
    elif problem is None and not drops.is_task_file(path.name):
        problem = f"unsupported file type; a task file ends in {', '.join(drops.EXTENSIONS)}"
    elif problem is None and st.st_size > MAX_BYTES:
        problem = f"file is {st.st_size} bytes; the limit for a task file is {MAX_BYTES} bytes (1 MiB)"
    if problem is not None:
        read.reason = problem
        return read
    try:
        data = read_bytes_nofollow(path, MAX_BYTES)
    except FileNotFoundError:
        return None
    except OSError as exc:
        read.reason = "is a symlink" if exc.errno == errno.ELOOP else f"cannot be read: {exc.strerror}"
        return read
    rel = f"inbox/{path.name}"
    read.fp = fingerprint(path.name, st, data)
    stem = path.name.rsplit(".", 1)[0]
    try:
        raw = parse_task_file(path.name, data)
        read.doc = normalize(raw, default_id=f"{slugify(stem, 57)}-{read.fp[:6]}", now=now_iso(), by="ingest",
                             note=f"ingested from {rel}")
    except TaskError as exc:
        read.reason = str(exc)
    except (ValueError, TypeError, RecursionError) as exc:
        # Whatever else a hostile file makes the parsers raise: it must not stop the ingest of
        # every later drop, which would meet it first again.
        read.reason = f"cannot be read as a task ({type(exc).__name__}: {str(exc)[:200]})"
    return read


class Ingester:
    """The board's ingest: drops in its folder's inbox/ made into tasks through its transaction core."""

    def __init__(self, disk: Folder, txn: Transactions, check_new: Callable[[TaskDoc], None]) -> None:
        self.disk = disk
        self.txn = txn
        # The board's check of a new task against the others (a dependency cycle, say).
        self.check_new = check_new
        self.turn = SoleIngester(disk.root, disk.flock.timeout)

    def ingest(self, *, wait: bool = True) -> IngestReport:
        """Turn finished files in inbox/ into tasks; reject what cannot be one. With `wait=False`
        (a waiting claimer's round) nothing is done while another process ingests (ingestturn.py)."""
        report = IngestReport()
        self.disk.check_links(("inbox", "rejected", ".ingested", INGEST_LOCK))
        self.turn.run(lambda: self._ingest_ready(report), wait=wait)
        return report

    def _ingest_ready(self, report: IngestReport) -> set[str]:
        """Ingest the drops that are ready; the names of those looked at."""
        found, waiting = drops.ready(self.disk.root, self.disk.watcher.is_complete)
        report.waiting.extend(waiting)
        for start in range(0, len(found), PREPARED_AT_ONCE):
            self._ingest_batch(found[start:start + PREPARED_AT_ONCE], report)
        return {path.name for path in found} | {name.removeprefix("inbox/") for name in waiting}

    def _ingest_batch(self, paths: list[Path], report: IngestReport) -> None:
        # Each new task's document is written and made durable before the lock, as a transition's
        # is (txn.py): the lock is then held for renames alone, and the claimers and closers of the
        # other agents are not kept waiting a flush per drop. The batch's flushes are issued
        # together (fsyncs.py): one after another, they were the ingest's longest wait.
        prepared: dict[Path, tuple[DropRead, Path | None]] = {}
        try:
            fds: dict[Path, int] = {}
            try:
                for path in paths:
                    try:
                        read = read_drop(path)
                        made = None if read is None else self._prepare(path, read)
                    except OSError as exc:
                        self._failed(path, exc, report)
                        continue
                    if read is not None:
                        prepared[path] = (read, None if made is None else made[0])
                    if made is not None:
                        fds[path] = made[1]
                for path, error in zip(list(fds), fsync_all(list(fds.values())), strict=True):
                    if error is not None:  # not known durable: not put in place, the drop stays
                        _unlink(prepared.pop(path)[1])
                        self._failed(path, error, report)
            finally:
                for fd in fds.values():
                    os.close(fd)
            for path, (read, temp) in list(prepared.items()):
                try:
                    with self.disk.locked():
                        if self._ingest_one(path, read, report, temp):
                            prepared[path] = (read, None)  # taken
                except OSError as exc:
                    self._failed(path, exc, report)
        finally:
            # Not taken (rejected, changed, ingested before, or the batch cut short: the board lock
            # not had, say): no temp file outlives the pass, whatever stopped it.
            for _read, temp in prepared.values():
                _unlink(temp)

    def _failed(self, path: Path, exc: OSError, report: IngestReport) -> None:
        # A file the board cannot move must not stop the drops after it: they are taken oldest
        # first, so it would fail first on every pass. It is tried again next time (a task already
        # written for it is found by its fingerprint, never made twice).
        name = f"inbox/{safe_name(path.name)}"
        reason = f"could not be taken: {exc.strerror or exc}; it is tried again on the next ingest"
        report.failed.append({"file": name, "reason": reason})
        note = f"{name} {reason}"
        if note not in self.disk.problems:
            self.disk.problems.append(note)

    def _reject(self, path: Path, reason: str, report: IngestReport) -> None:
        # The dropped file's name may be anything but "/" and NUL: it is shown and reused only
        # made safe (UTF-8, no control characters, short enough for ".error.txt").
        name = safe_name(path.name)
        rel = f"inbox/{name}"
        dest = self.txn.set_aside(path, name, f"{rel} was rejected on {now_iso()}: {reason}\n"
                                           "Fix the file and drop it into inbox/ again.\n")
        self.disk.watcher.forget(path)
        self.disk.log.append(event(now_iso(), name, "inbox", "rejected", "ingest", reason))
        report.rejected.append({"file": rel, "moved_to": f"rejected/{dest.name}", "reason": reason})

    def _prepare(self, path: Path, read: DropRead) -> tuple[Path, int] | None:
        """The task `read` would make, written (not yet fsync'd) to a temp file beside its place,
        with the file's open descriptor; None for a drop that makes no task."""
        if read.reason is not None or read.doc is None:
            return None
        read.doc["source"] = {"file": f"inbox/{path.name}", "fingerprint": read.fp}
        return write_temp_open(self.disk.path(read.doc["status"], read.doc["id"]), dumps(read.doc))

    def _ingest_one(self, path: Path, read: DropRead, report: IngestReport, prepared: Path | None = None) -> bool:
        """Under the lock: make the task `read` holds (from `prepared`, its document written for
        it, while the file is still the one read), or reject the file with its reason. Whether
        `prepared` was taken."""
        try:
            now_identity = identity_of(os.lstat(path))
        except FileNotFoundError:
            return False  # another process ingested it first
        if now_identity != read.identity:
            # Replaced or rewritten since it was read: read it again (under the lock this time).
            again = read_drop(path)
            if again is None:
                return False
            read, prepared = again, None
        if read.reason is not None or read.doc is None:
            self._reject(path, read.reason or "cannot be read as a task", report)
            return False
        doc, rel = read.doc, f"inbox/{path.name}"
        try:
            found = self.disk.locate(doc["id"])
            if found is not None:
                existing = self.disk.read(found[1])
                if (existing.get("source") or {}).get("fingerprint") == read.fp:
                    # This very file was ingested by a process that died before moving it away.
                    first = existing["history"][0] if existing["history"] else {}
                    at = str(first.get("at"))  # looked for as it is written
                    if first and not self.txn.event_logged(at, existing["id"]):
                        self.disk.log.append(event(at, existing["id"], "inbox", first.get("to"),
                                               "ingest", str(first.get("note") or "")))
                    self._archive(path, existing["id"])
                    report.ingested.append(existing["id"])
                    return False
                raise TaskError(f"a task with id '{doc['id']}' already exists (in {found[0]}/)")
            self.check_new(doc)
        except (TaskError, Damaged) as exc:
            self._reject(path, str(exc), report)
            return False
        doc["source"] = {"file": rel, "fingerprint": read.fp}
        dest = self.disk.path(doc["status"], doc["id"])
        if prepared is not None:
            os.rename(prepared, dest)
        else:
            write_json_atomic(dest, doc)
        fault("ingest-written")
        self.disk.log.append(event(doc["created_at"], doc["id"], "inbox", doc["status"], "ingest",
                                   f"ingested from {rel}", carried(doc) if doc["status"] == "todo" else None))
        self._archive(path, doc["id"])
        report.ingested.append(doc["id"])
        return prepared is not None

    def _archive(self, path: Path, task_id: str) -> None:
        # The user's file is kept, not deleted: the task's `source` names it.
        os.rename(path, unique_path(self.disk.root / ".ingested", f"{task_id}--{safe_name(path.name)}"))
        self.disk.watcher.forget(path)


def _unlink(temp: Path | None) -> None:
    if temp is not None:
        with contextlib.suppress(OSError):  # a folder put in its place: the sweep's, not this pass's
            temp.unlink(missing_ok=True)
