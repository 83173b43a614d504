"""The claim index: this process's view of the waiting tasks, kept from the event log, rescanned at a shared rate."""

from __future__ import annotations

import os
import time
from pathlib import Path

from .base import Folder, TaskDoc
from .errors import Damaged
from .events import EventTail
from .index import Meta, meta_of
from .task import STATUSES
from .txn import Transactions

# A claim that finds nothing rescans the folders if the index is older than this.
RESYNC_AFTER = 2.0
# A rescan the watcher asks for waits until this many times its last one's duration has passed,
# times the claimers the board has at work (rescan_interval). A fiftieth: at a twentieth, with one
# agent draining, rescans (done/ listed again, a stat per waiting task) were a tenth of its Python.
RESCAN_SHARE = 50
# What only a rescan finds (a task moved by hand, what a lost inotify queue held) waits no longer.
RESCAN_MAX_INTERVAL = 20.0
Signature = tuple[int, int, int, int]  # inode, size, mtime and ctime (ns)


def rescan_interval(took: float, claimers: int, share: float | None = None) -> float:
    """Seconds between one process's rescans when the watcher keeps asking for them (pure): a
    rescan holds the board lock, and with 16 agents each rescanning a twentieth of its time the
    lock was held for rescans most of the time; the share is the board's, split among claimers."""
    return min(RESCAN_MAX_INTERVAL, (RESCAN_SHARE if share is None else share) * took * max(1, claimers))


wall_ns = time.time_ns  # the clock the kernel stamps files with (a test moves it on)


def _settled(ctime_ns: int, seen_at_ns: int) -> bool:
    """Whether what was seen of a file at `seen_at_ns` still holds while its ctime stays `ctime_ns`:
    only if it was seen a second after that change. The kernel stamps files with a coarse clock,
    so two changes within one of its ticks can leave the same times (the listing cache's rule)."""
    return seen_at_ns - ctime_ns >= 1_000_000_000



class ClaimIndex:
    """The index of one process's claims: what is waiting, in claim order, and when it was last rebuilt."""

    def __init__(self, disk: Folder, txn: Transactions) -> None:
        self.disk = disk
        self.txn = txn
        # The event log read so far: the index follows the transitions appended since.
        self.tail = EventTail(disk.events_path)
        self.indexed_at: float | None = None  # monotonic time of the last full rescan
        self.rescan_seconds = 0.0  # how long it took
        self.claimers = 1  # tasks in doing at the last rescan: each a claimer rescanning too
        self.repair_due = False  # a lock-free rescan skipped what only a locked one repairs
        # todo file name -> what it was, its meta, when it was read (wall clock, ns)
        self._todo_seen: dict[str, tuple[Signature, Meta, int]] = {}
        # status folder -> what it was, the task ids in it, when it was listed (wall clock, ns)
        self._listed: dict[str, tuple[Signature, list[str], int]] = {}

    def load_todo(self, task_id: str) -> TaskDoc | None:
        try:
            return self.disk.read(self.disk.path("todo", task_id))
        except (FileNotFoundError, Damaged):
            return None

    def rescan(self, *, locked: bool = True) -> None:
        """Rebuild the index from the folders. A todo file whose inode, size, mtime and ctime are
        those it had at the last rescan is not read again (a write of any kind changes its ctime,
        which no one can set), so a rescan costs a stat per waiting task, not a read and a parse.
        Without the lock (`locked=False`: a process's first build) what needs a repair (a task
        moved by hand, a damaged file) is only skipped, and the next locked look rescans."""
        started, wall = time.monotonic(), wall_ns()
        self.tail.seek_end()
        self.disk.index.clear()
        for status in STATUSES:
            if status != "todo":
                for task_id in self._listing(status, wall):
                    self.disk.index.set_status(task_id, status)
        seen: dict[str, tuple[Signature, Meta, int]] = {}
        for entry in self.txn.entries("todo"):
            try:
                stat = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            signature = (stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
            known = self._todo_seen.get(entry.name)
            if known is not None and known[0] == signature and _settled(signature[3], known[2]):
                seen[entry.name] = known
                continue
            doc = self.txn.document(Path(entry.path)) if locked else self._read_lock_free(Path(entry.path))
            if doc is None:
                continue
            if doc["status"] != "todo":
                if not locked:
                    self.repair_due = True
                    continue
                doc = self.txn.adopt_hand_move("todo", doc)
                if doc["status"] == "todo":  # rewritten in place: read again at the next rescan
                    self.disk.index.put_todo(doc)
                continue
            seen[entry.name] = (signature, meta_of(doc), wall)
        self.disk.index.put_todos(entry[1] for entry in seen.values())
        self._todo_seen = seen
        self.indexed_at = time.monotonic()
        self.rescan_seconds = self.indexed_at - started
        self.claimers = max(1, sum(1 for state in self.disk.index.status.values() if state == "doing"))
        self.disk.signal.full_rescan_due = False
        if locked:
            self.repair_due = False

    def _read_lock_free(self, path: Path) -> TaskDoc | None:
        try:
            return self.disk.read(path)
        except FileNotFoundError:
            return None
        except Damaged:  # moved aside by the next locked rescan
            self.repair_due = True
            return None

    def _listing(self, status: str, wall: int) -> list[str]:
        """The task ids in a status folder; listed again only if the folder changed since (an entry
        added, removed or renamed changes its mtime and ctime): done/ grows with every task, and
        every waiting agent rescans every few seconds."""
        folder = self.disk.root / status
        try:
            stat = os.stat(folder, follow_symlinks=False)
        except OSError:
            self._listed.pop(status, None)
            return []
        signature = (stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
        known = self._listed.get(status)
        if known is not None and known[0] == signature and _settled(signature[3], known[2]):
            return known[1]
        try:
            ids = [entry.name[:-5] for entry in os.scandir(folder)
                   if entry.name.endswith(".json") and not entry.name.startswith(".")]
        except OSError:
            ids = []
        self._listed[status] = (signature, ids, wall)
        return ids

    def rescan_due(self) -> bool:
        """The index was never built, or the watcher asked for a rescan and the last one is far
        enough behind: rescans take at most 1/RESCAN_SHARE of the board's time however long the
        backlog and however many agents, each rescanning under the board lock
        (every 0.25 s of a busy board, each agent read every waiting task: 2,000 of them made a
        task's board work 5 times that of 200)."""
        if self.indexed_at is None or self.repair_due:
            return True
        return self.disk.signal.full_rescan_due and \
            time.monotonic() - self.indexed_at >= rescan_interval(self.rescan_seconds, self.claimers)

    def stale(self) -> bool:
        """Whether a claim that finds nothing rescans (what polling may have missed: a task moved by
        hand): the index is older than RESYNC_AFTER and than the board's share of rescans allows.
        With 64 agents waiting, each fruitless look rescanned the backlog under the board lock."""
        return self.indexed_at is None or time.monotonic() - self.indexed_at > max(
            RESYNC_AFTER, rescan_interval(self.rescan_seconds, self.claimers))

    def catch_up(self) -> bool:
        """Follow the event log without the board lock (the index is this process's own); False,
        doing nothing, when a rescan is due, which needs the lock."""
        with self.disk.tlock:
            if self.indexed_at is None:
                # The first build, without the lock: 256 agents starting on a backlog each built
                # it under the lock, one after another, and some gave up waiting after 60 s. The
                # first look still takes the lock once (a board's first locked call finishes the
                # transitions a killed process left), now a short hold.
                self.rescan(locked=False)
                return False
            if self.rescan_due():
                return False
            self.disk.index.apply_events(self.tail.read_new(), self.load_todo)
            return True

    def refresh_index(self) -> None:
        if self.rescan_due():
            self.rescan()
        else:
            self.disk.index.apply_events(self.tail.read_new(), self.load_todo)
