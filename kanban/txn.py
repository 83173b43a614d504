"""The transaction core, the only code that moves a task between status folders (commit, roll-forward, set-aside).

Task documents are JSON files in status folders, changed under one lock.

Every transition follows the same steps, so a process killed at any point leaves a state that a
later locked operation finishes (roll forward) or discards:

1. the new document is written to a temp file beside the old one and fsync'd (before the lock
   when it can be: the slow part stays out of the critical section),
2. under the lock, a marker `.pending/<id>` names the task (a claim places it earlier, to reserve
   its pick; a task leaving doing/ needs none, see `commit`),
3. the temp file is renamed over the old document,
4. the transition is appended to `events.jsonl`,
5. the file is renamed into the folder of its new status, and the marker removed.

A task is thus always in exactly one folder; a document whose status differs from its folder is a
transition caught between steps 3 and 5, which its marker (or its being in doing/) says.

One guard per property, each with a test that fails when it alone is removed (tests/test_guards.py):
- the board lock (lock.py): one transition of a task at a time, across processes;
- the marker: a transition in flight is known as one, so a killed one is rolled forward, never
  taken for a hand move, and a pick is reserved by one claimer (tests/test_concurrency.py);
- the claim's check under the lock that the todo file is the one it reserved: a change made while
  the claim was prepared wins (claims.py);
- the claim token (`rules.held_by`): a stale holder's write is rejected.
The re-read right after a reservation (claims.py) is no guard: it only spares an fsync for a pick
another claimer just took, and the check under the lock decides.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import psutil

from . import doccache, liveness, markers, rules
from .base import ERROR_SUFFIX, Folder, TaskDoc, _bounded
from .errors import BoardError, Damaged
from .events import event
from .faults import fault
from .fsio import (
    create_exclusive,
    dumps,
    safe_name,
    tmp_path_for,
    tmp_writer_pid,
    unique_path,
    write_json_atomic,
    write_temp,
)
from .liveness import holder_alive
from .task import STATUSES, is_valid_id, now_iso

# A temp file whose writer is alive is left alone unless it is older than this.
STALE_TMP_AGE = 600.0


class Reservations:
    """The tasks this process has reserved (marked) and not yet committed or given up: a marker
    naming this process is live only while its task is in here.

    One per process (`PROCESS_RESERVATIONS`), shared by every board object in it: a marker names a
    process, not a board object, so a board must see as live the reservation another board of its
    process holds on the same folder, and as dead one that no board of its process holds."""

    def __init__(self) -> None:
        self._count: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def started(self, task_id: str) -> None:
        with self._lock:
            self._count[task_id] += 1

    def done(self, task_id: str) -> None:
        with self._lock:
            self._count[task_id] -= 1
            if self._count[task_id] <= 0:
                del self._count[task_id]

    def holds(self, task_id: str) -> bool:
        with self._lock:
            return self._count[task_id] > 0


PROCESS_RESERVATIONS = Reservations()


class Transactions:
    """The one transition path (prepare, mark, rename, log, move) and the repairs of what it leaves when killed."""

    def __init__(self, disk: Folder, reservations: Reservations = PROCESS_RESERVATIONS) -> None:
        self.disk = disk
        self.reservations = reservations
        self.last_sweep = 0.0  # monotonic time of the last sweep of dead writers' temp files
        # What writes a new document before its commit: `write_new`, or what the board stands in
        # for it (Board._prepare, which a test's board overrides to act between a pick and its commit).
        self.prepare: Callable[[str, TaskDoc], Path] = self.write_new
        self.owner = markers.owner_for(disk.root / ".pending")  # what this process's markers link to

    # -- writing: the one transition path -------------------------------------------------------
    #
    # The fsync, the slow part, happens before the lock is taken when it can (`prepare`): the
    # locked section then only checks that the task is still as the new document assumed and
    # renames. Concurrent fsyncs share journal commits, so claimers no longer queue behind each
    # other's disk flushes.

    def write_new(self, folder: str, new: TaskDoc) -> Path:
        """The new document, fsync'd to a temp file beside the task's current file."""
        return write_temp(self.disk.path(folder, new["id"]), _bounded(dumps(new), new["id"]))

    def keep_old(self, folder: str, task_id: str) -> Path | None:
        """A second link to the task's current file, made before the lock: the rename that
        replaces the file inside the lock then only drops a link count, and the old inode is
        freed (several journal updates) when the caller removes this link after the lock."""
        current = self.disk.path(folder, task_id)
        keeper = tmp_path_for(current)
        try:
            os.link(current, keeper, follow_symlinks=False)
        except FileNotFoundError:
            return None
        return keeper

    def marker(self, task_id: str) -> Path:
        return self.disk.root / ".pending" / task_id

    def mark(self, task_id: str) -> None:
        """Place the marker for a transition made under the lock (replacing any other)."""
        marker = self.marker(task_id)
        self.remove_marker(marker)
        self.owner.place(marker)

    def remove_marker(self, marker: Path) -> None:
        """Remove a marker (under the lock). The board's markers are files (markers.py); a folder
        in .pending/ was put there by hand and is moved aside, so it can neither hide its task nor
        stop every transition with an error."""
        try:
            marker.unlink(missing_ok=True)
        except IsADirectoryError:
            self.set_aside(marker, f"pending--{safe_name(marker.name)}",
                            f".pending/{safe_name(marker.name)} is a folder, not a marker of the board; it was "
                            f"moved here on {now_iso()} so the task it names can be worked again.\n")

    def has_marker(self, task_id: str) -> bool:
        return os.path.lexists(self.marker(task_id))

    def marker_is_live(self, path: Path) -> bool:
        """Whether the process a marker names is still running (a live claimer's reservation)."""
        try:
            owner = markers.owner_of(path)
        except OSError:
            return True  # not readable now (out of descriptors): its owner is not known dead
        if owner is None:
            return False
        pid, started = owner
        if pid == os.getpid() and abs(started - markers.own_start_time()) < 0.05:
            return self.reservations.holds(path.name)
        return holder_alive(pid, started, liveness.HOST) is not False

    def commit(self, folder: str, new: TaskDoc, prepared: Path | None = None, *, reserved: bool = False) -> TaskDoc:
        """Make `new` the task's state (under the lock). `prepared` is its fsync'd temp file, if
        already written; `reserved` says this process's marker is already in place."""
        task_id, dst = new["id"], new["status"]
        src_path = self.disk.path(folder, task_id)
        moving = dst != folder
        try:
            if prepared is None:
                prepared = self.prepare(folder, new)
            # Leaving doing/ needs no marker: recover() reads every document there, and nothing
            # enters doing/ by hand, so a document in doing/ with another status is always a
            # transition to finish.
            if moving and not reserved and folder != "doing":
                self.mark(task_id)
                fault("marked")
            os.rename(prepared, src_path)
        except BaseException:
            if prepared is not None:
                prepared.unlink(missing_ok=True)
            raise
        fault("written")
        entry = new["history"][-1]
        self.disk.log.append(event(entry["at"], task_id, entry["from"], entry["to"], entry["by"], entry["note"]))
        fault("logged")
        if moving:
            self.move_into_place(src_path, dst, task_id)
            fault("moved")
        if not reserved:
            # A claimer removes its own reservation after releasing the lock: one journaled
            # operation fewer inside it. Until then the marker names a live process, and the
            # task is in doing/, so nothing acts on it.
            _unlink_marker(self.marker(task_id))
        return new

    def move_into_place(self, src_path: Path, dst: str, task_id: str) -> None:
        dst_path = self.disk.path(dst, task_id)
        if os.path.lexists(dst_path):
            self.quarantine(dst_path, f"a second copy of task {task_id} was in {dst}/ while the task moved there")
        os.rename(src_path, dst_path)

    def event_logged(self, at: str, task_id: str) -> bool:
        needle = f'"at":{json.dumps(at)},"task":{json.dumps(task_id)}'.encode()
        try:
            with open(self.disk.events_path, "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                handle.seek(max(0, size - (4 << 20)))
                return needle in handle.read()
        except FileNotFoundError:
            return False

    def roll_forward(self, path: Path, doc: TaskDoc) -> None:
        """Finish a transition whose writer died after writing the new document."""
        # A hand-made document may have an empty or sparse history: what it lacks is not logged.
        entry = doc["history"][-1] if doc["history"] else {}
        at = str(entry.get("at") or now_iso())
        if not self.event_logged(at, doc["id"]):
            self.disk.log.append(event(at, doc["id"], entry.get("from"), doc["status"], str(entry.get("by") or "board"),
                                   f"{entry.get('note') or ''} (completed after its writer was interrupted)".strip()))
        self.move_into_place(path, doc["status"], doc["id"])

    def finish_interrupted(self, *, sweep: bool = True) -> None:
        """Roll forward transitions whose process died between their steps, drop reservations of
        dead claimers, and (with `sweep`) remove temp files of dead writers (under the lock). The
        sweep lists every status folder, done/ included, so frequent callers ask for it rarely."""
        try:
            entries = list(os.scandir(self.disk.root / ".pending"))
        except FileNotFoundError:
            entries = []
        for entry in entries:
            if entry.name.startswith("."):
                continue
            marker = Path(entry.path)
            if self.marker_is_live(marker):
                continue  # a live claimer's reservation
            task_id = entry.name
            found = self.disk.locate(task_id) if is_valid_id(task_id) else None
            if found is not None:
                folder, path = found
                try:
                    doc = self.disk.read(path)
                except Damaged as exc:
                    self.quarantine(path, str(exc))
                    doc = None
                if doc is not None and doc["status"] != folder:
                    self.roll_forward(path, doc)
            self.remove_marker(marker)
        if not sweep:
            return
        self.last_sweep = time.monotonic()
        markers.sweep_owners(self.disk.root / ".pending")
        for status in (*STATUSES, ""):
            with contextlib.suppress(FileNotFoundError):
                for item in os.scandir(self.disk.root / status):
                    if not status and not item.name.startswith(f".{doccache.NAME}."):
                        continue  # in the board's own folder, only the listing cache's temp files
                    pid = tmp_writer_pid(item.name)
                    # Only files: a folder with a temp file's name was not written by the board.
                    if pid is not None and not item.is_dir(follow_symlinks=False) and \
                            _writer_gone(pid, Path(item.path)):
                        Path(item.path).unlink(missing_ok=True)

    def adopt_hand_move(self, folder: str, doc: TaskDoc) -> TaskDoc:
        """A document whose status disagrees with its folder and has no pending marker was moved by
        a person (`mv todo/x.json done/`): the folder is their intent, so the document follows it."""
        if self.has_marker(doc["id"]):
            return doc
        new = rules.adopted(doc, folder, now=now_iso())
        write_json_atomic(self.disk.path(folder, doc["id"]), new)
        entry = new["history"][-1]
        self.disk.log.append(event(entry["at"], doc["id"], entry["from"], folder, "board", entry["note"]))
        return new

    def set_aside(self, path: Path, name: str, note: str) -> Path:
        """Move `path` into rejected/ as `name` (made unique), beside `name`.error.txt holding `note`.
        Nothing planted in rejected/ is written through: the note is created exclusively and
        without following links, and the move takes a name at which nothing exists."""
        for _try in range(100):
            dest = unique_path(self.disk.root / "rejected", name, (ERROR_SUFFIX,))
            with contextlib.suppress(FileExistsError):
                create_exclusive(dest.with_name(dest.name + ERROR_SUFFIX), note.encode("utf-8", "backslashreplace"))
                break
        else:
            raise BoardError(f"no free name for {name} in {self.disk.root / 'rejected'}")
        os.rename(path, dest)
        return dest

    def quarantine(self, path: Path, reason: str) -> Path:
        """Move a damaged file aside to rejected/ with a note; never delete it."""
        folder = path.parent.name
        name = safe_name(path.name)
        note = (f"{folder}/{name} was found damaged on {now_iso()}: {reason}\n"
                f"It was moved here untouched; every other task stayed where it was. Repair it and move it "
                f"back into {folder}/ if it is still wanted.\n")
        dest = self.set_aside(path, f"{folder}--{name}", note)
        self.disk.problems.append(f"{folder}/{name} was damaged ({reason}); moved to rejected/{dest.name}")
        self.disk.log.append(event(now_iso(), path.stem, folder, "rejected", "board", f"damaged: {reason}"))
        self.disk.index.forget(path.stem)
        return dest

    def quarantine_damaged(self, damaged: Iterable[dict[str, str]]) -> list[str]:
        """Re-check, under the lock, files a lock-free listing found unreadable; move the damaged aside."""
        moved = []
        with self.disk.locked():
            for item in damaged:
                path = self.disk.root / item["path"]
                if path.parent.parent != self.disk.root or path.parent.name not in STATUSES or \
                        not os.path.lexists(path):
                    continue
                try:
                    self.disk.read(path)
                except Damaged as exc:
                    moved.append(str(self.quarantine(path, str(exc)).relative_to(self.disk.root)))
                except (FileNotFoundError, OSError):
                    continue
        return moved

    def entries(self, status: str) -> Iterator[os.DirEntry[str]]:
        """The task files of a status folder, as listed (no temp, marker or hidden file)."""
        try:
            entries = list(os.scandir(self.disk.root / status))
        except FileNotFoundError:
            return
        for entry in entries:
            if entry.name.endswith(".json") and not entry.name.startswith("."):
                yield entry

    def document(self, path: Path) -> TaskDoc | None:
        """A task file's document (under the lock); None if it is gone or was damaged, which is
        moved aside as it is met."""
        try:
            return self.disk.read(path)
        except FileNotFoundError:
            return None
        except Damaged as exc:
            self.quarantine(path, str(exc))
            return None

    def documents(self, status: str) -> Iterator[tuple[Path, TaskDoc]]:
        """Every readable task document in a status folder (under the lock); a damaged one is
        moved aside as it is met."""
        for entry in self.entries(status):
            path = Path(entry.path)
            doc = self.document(path)
            if doc is not None:
                yield path, doc



def _unlink_marker(marker: Path) -> None:
    # Outside the lock a marker that is not ours (a folder put there) is left for the next
    # locked pass to move aside.
    with contextlib.suppress(FileNotFoundError, IsADirectoryError):
        marker.unlink()


def _writer_gone(pid: int, path: Path) -> bool:
    """A temp file's writer is dead (or the file is too old to still be in use)."""
    if pid == os.getpid():
        return False
    try:
        age = time.time() - path.lstat().st_mtime
    except FileNotFoundError:
        return False
    return age > STALE_TMP_AGE or not psutil.pid_exists(pid)
