"""The filesystem board: `Board` composes the file backend's parts and holds the verbs no part owns.

Those verbs: reads, add, recovery, hand moves and waiting for work.

Its parts, each an object with the state it owns, each a module: `base.Folder` (the folder, its
lock and event log, reading one file), `txn.Transactions` (the transaction core, alone moving a task
between folders), `claims.Claims` (index kept current, reservation, holder's verbs), `notes.Notes`
(comments, answers, waiting notes) and `ingest.Ingester` (drops to tasks); `waiting` holds what
waiting needs of the folder (watcher, the log's own watch, health).
"""

from __future__ import annotations

import builtins
import os
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Self

from . import claimturn, handmoves, later, reads, rules, waiting
from .base import (  # noqa: F401 (the board's settings, named here as before the split)
    ALLOW_NETWORK_FS_ENV,
    COMMENT_RESERVE,
    DEFAULT_LEASE,
    ERROR_SUFFIX,
    FOLDERS,
    MAX_DOCUMENT_BYTES,
    Folder,
    TaskDoc,
    _short_text,
)
from .claims import Claims
from .errors import BoardError, Damaged, TaskNotFound
from .events import CursorRead, append_record, check_cursor, event, log_marker, read_since
from .fsio import write_json_atomic
from .index import carried
from .ingest import Ingester, IngestReport
from .journal import FileTaskJournal
from .liveness import stale_reason
from .lock import BoardLock
from .notes import Notes
from .reads import Listing
from .task import STATUSES, TaskError, find_cycle, is_valid_id, normalize, now_iso, slugify
from .txn import Transactions
from .watchslots import WatchSlots


class Board:
    """A Kanban board in a folder. Safe to use from several processes and threads at once."""

    def __init__(self, root: str | os.PathLike[str], *, create: bool = True, allow_network_fs: bool | None = None,
                 lease: float = DEFAULT_LEASE, lock_timeout: float = 60.0) -> None:
        self.disk = Folder(root, create=create, allow_network_fs=allow_network_fs, lock_timeout=lock_timeout)
        self.txn = Transactions(self.disk)
        # Before anything takes the lock: the first locked section finishes what a killed process left.
        self.disk.on_first_lock = self.txn.finish_interrupted
        self.txn.prepare = self._prepare
        self.claims = Claims(self.disk, self.txn, lease)
        self.notes = Notes(self.disk, self.txn, self.claims)
        self.ingester = Ingester(self.disk, self.txn, self._check_new)
        self.slots = WatchSlots(self.disk.root)
        self.root = self.disk.root
        self.fs_type = self.disk.fs_type
        self.network_fs = self.disk.network_fs
        self.lease = lease
        self.events_path = self.disk.events_path
        self.problems = self.disk.problems
        self.signal, self.watcher = self.disk.signal, self.disk.watcher
        self.last_recover = 0.0  # monotonic time of the last recover
        self._drops_seen = -1  # the signal's generation at wait_for_drops' last return
        self.disk.ensure_layout()

    def close(self) -> None:
        self.disk.close()
        self.ingester.turn.close()
        self.slots.close()
        # What this process's transitions left to unlink is done too: a closed board has nothing in
        # flight (a listing of its folders right after shows no old document's temp file).
        later.flush()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # The parts' own verbs, as the protocol (kanban/store.py) names them.

    def claim(self, agent: str, *, roles: Iterable[str] = (), lease: float | None = None,
              pid: int | None = None, steps_only: bool = False, assigned_only: bool = False) -> TaskDoc | None:
        return self.claims.claim(agent, roles=roles, lease=lease, pid=pid, steps_only=steps_only,
                                 assigned_only=assigned_only)

    def renew(self, task_id: str, token: int, lease: float | None = None) -> TaskDoc:
        return self.claims.renew(task_id, token, lease)

    def complete(self, task_id: str, token: int, result: Any = None) -> TaskDoc:
        return self.claims.complete(task_id, token, result)

    def fail(self, task_id: str, token: int, error: str, *, permanent: bool = False) -> TaskDoc:
        return self.claims.fail(task_id, token, error, permanent=permanent)

    def block(self, task_id: str, token: int, reason: str, *, question: str | None = None) -> TaskDoc:
        return self.claims.block(task_id, token, reason, question=question)

    def release(self, task_id: str, token: int, note: str = "released", *, count_attempt: bool = False) -> TaskDoc:
        return self.claims.release(task_id, token, note, count_attempt=count_attempt)

    def mark_waiting(self, reason: str | None, *, needs_llm: bool = True, agent: str | None = None,
                     roles: Iterable[str] = ()) -> int:
        return self.notes.mark_waiting(reason, needs_llm=needs_llm, agent=agent, roles=roles)

    def comment(self, task_id: str, text: str, *, by: str = "cli", wait: float = 5.0) -> TaskDoc:
        return self.notes.comment(task_id, text, by=by, wait=wait)

    def answer(self, task_id: str, text: str, *, by: str = "cli") -> TaskDoc:
        return self.notes.answer(task_id, text, by=by)

    def ingest(self, *, wait: bool = True) -> IngestReport:
        return self.ingester.ingest(wait=wait)

    def wait_for_drops(self, timeout: float) -> None:
        self._drops_seen = waiting.wait_for_drops(self.disk, self._drops_seen, timeout)

    def quarantine_damaged(self, damaged: Iterable[dict[str, str]]) -> list[str]:
        return self.txn.quarantine_damaged(damaged)

    # Reached into by tests and bench/board_bench.py, under the names they had before the parts.

    def _locked(self) -> AbstractContextManager[None]:
        return self.disk.locked()

    @property
    def _flock(self) -> BoardLock:
        return self.disk.flock

    def _read(self, path: Path) -> TaskDoc:
        return self.disk.read(path)

    def _refresh_index(self) -> None:
        self.claims.refresh_index()

    def _prepare(self, folder: str, new: TaskDoc) -> Path:
        return self.txn.write_new(folder, new)

    def get(self, task_id: str) -> TaskDoc:
        """The task's current document: a lock-free read (files are only ever replaced whole), and
        if that misses, a read under the lock. A task being moved is, for an instant, in neither
        folder a lock-free look-up visits in turn (it left doing/ after doing/ was looked at, and
        todo/ was looked at before it arrived); every move is made under the lock, so a look-up
        holding it finds a task that exists."""
        if not is_valid_id(task_id):
            raise TaskNotFound(f"{_short_text(task_id)} is not a task id")
        found = self._get_once(task_id)
        if found is None or _misplaced(*found):
            with self.disk.locked():
                found = self._get_once(task_id)
                if found is not None and _misplaced(*found):
                    found = found[0], self.txn.adopt_hand_move(*found)
        if found is None:
            raise self.disk.missing(task_id)
        return found[1]

    def _get_once(self, task_id: str) -> tuple[str, TaskDoc] | None:
        """The task's folder and document, or None."""
        for _attempt in range(5):
            found = self.disk.locate(task_id)
            if found is None:
                return None
            try:
                return found[0], self.disk.read(found[1])
            except FileNotFoundError:
                continue  # moved between the look-up and the read
            except Damaged as exc:
                raise BoardError(f"task {task_id} in {found[0]}/ is damaged: {exc}") from exc
        return None

    def list(self, status: str | None = None) -> Listing:
        """Every task (or those in one status), in claim order within each status, each once."""
        return self._list(status, fields=False)

    def list_fields(self, status: str | None = None) -> Listing:
        """`list`, each task as the fields a board listing shows and judges (reads.listed_fields)
        only, kept in a cache of those alone: a fraction of the documents' bytes to read."""
        return self._list(status, fields=True)

    def _list(self, status: str | None, *, fields: bool) -> Listing:
        if status is not None and status not in STATUSES:
            raise BoardError(f"unknown status '{status}'; statuses are {', '.join(STATUSES)}")
        listing = self.disk.consistent(lambda: reads.scan(self.root, status, self.disk.read, fields=fields))
        if listing.misplaced:
            # Files a person moved with `mv`: their folder is the intent (see Transactions.adopt_hand_move).
            with self.disk.locked():
                for folder, task_id in listing.misplaced:
                    try:
                        doc = self.disk.read(self.disk.path(folder, task_id))
                    except (FileNotFoundError, Damaged):
                        continue
                    if _misplaced(folder, doc):
                        self.txn.adopt_hand_move(folder, doc)
            listing = self.disk.consistent(lambda: reads.scan(self.root, status, self.disk.read, fields=fields))
        return listing

    def counts(self) -> dict[str, int]:
        """How many tasks each status folder holds, each task counted once."""
        return self.disk.consistent(lambda: reads.count(self.root))

    def task_ids(self) -> builtins.list[str]:
        """The id of every task file in the status folders, sorted, as of one moment (names only)."""
        return sorted(self.disk.consistent(lambda: reads.ids(self.root)))

    # -- adding ---------------------------------------------------------------------------------

    def _deps_of(self, task_id: str) -> builtins.list[str]:
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
        title = fields.get("title")
        title = title if isinstance(title, str) else "task"
        with self.disk.locked():
            for _attempt in range(20):
                default_id = f"{slugify(title)}-{os.urandom(3).hex()}"
                doc = normalize(fields, default_id=default_id, now=now, by=by, note="added")
                if self.disk.locate(doc["id"]) is None:
                    break
                if "id" in fields:
                    raise TaskError(f"a task with id '{doc['id']}' already exists")
            self._check_new(doc)
            write_json_atomic(self.disk.path(doc["status"], doc["id"]), doc)
            self.disk.log.append(event(now, doc["id"], None, doc["status"], by, "added",
                                       carried(doc) if doc["status"] == "todo" else None))
        return doc

    # -- recovery -------------------------------------------------------------------------------

    def recover(self, *, sweep: bool = True) -> builtins.list[dict[str, str]]:
        """Return tasks whose holder died or whose lease ran out to todo (attempts kept), or to
        failed once they used up max_attempts; finish interrupted transitions; sweep stale temp files."""
        recovered = []
        now = time.time()
        swept = self.txn.last_sweep
        with self.disk.locked():
            self.last_recover = time.monotonic()
            # A board's first locked section finishes and sweeps (see Folder.locked): when this one was
            # it, a second pass would list every status folder again to find nothing new.
            if self.txn.last_sweep == swept:
                self.txn.finish_interrupted(sweep=sweep)
            for path, doc in self.txn.documents("doing"):
                if doc["status"] != "doing":
                    self.txn.roll_forward(path, doc)
                    continue
                reason = stale_reason(doc.get("claim"), now)
                if reason is None:
                    continue
                new = self.txn.commit("doing", rules.recovered(doc, reason, now=now_iso()))
                recovered.append({"task": doc["id"], "to": new["status"], "reason": reason})
        return recovered

    # -- changes by hand ------------------------------------------------------------------------

    def move(self, task_id: str, to: str, *, by: str = "cli", note: str = "") -> TaskDoc:
        rules.check_move_target(to)
        with self.disk.locked():
            folder, path = self.disk.locate_or_raise(task_id)
            return self.txn.commit(folder, rules.moved(self.disk.read(path), to, by=by, now=now_iso(), note=note))

    def cancel(self, task_id: str, *, by: str = "cli") -> TaskDoc:
        return handmoves.cancel(self, task_id, by)

    def retry(self, task_id: str, *, by: str = "cli") -> TaskDoc:
        return handmoves.retry(self, task_id, by)

    # -- waiting and the event log ---------------------------------------------------------------

    @property
    def watch_mode(self) -> str:
        return self.watcher.mode

    def health(self) -> builtins.list[tuple[str, str, str]]:
        """The filesystem and change-notification checks doctor prints."""
        return waiting.health(self.disk)

    def start_watching(self) -> None:
        waiting.start_watching(self.disk)

    def hand_over_watch(self, give: Callable[[int], object]) -> None:
        self.watcher.hand_over(give)

    def watch_events(self) -> Callable[[], None] | None:
        return waiting.watch_log(self.events_path, self.signal)

    def wake(self) -> None:
        """Wake every thread of this process waiting in wait_for_work or wait_for_drops (to stop it)."""
        self.signal.bump()
        self.disk.watcher.arrivals.bump()

    def wait_for_work(self, agent: str, *, roles: Iterable[str] = (), timeout: float | None = None,
                      lease: float | None = None, stop: threading.Event | None = None,
                      steps_only: bool = False, assigned_only: bool = False, ingest: bool = True) -> TaskDoc | None:
        """Claim a task, waiting for one to become eligible; None on timeout or when `stop` is set.
        Drops are ingested (unless not `ingest`) and dead claims recovered while waiting, so a board
        needs no other process to make progress. Sleeps on watcher events, never a busy poll."""
        return claimturn.wait_for_work(self, agent, roles=roles, timeout=timeout, lease=lease, stop=stop,
                                       steps_only=steps_only, assigned_only=assigned_only, ingest=ingest)

    def events_since(self, cursor: int, *, max_events: int = 10_000, inode: int | None = None) -> CursorRead:
        return read_since(self.events_path, cursor, max_events, inode=inode)

    def events_end(self) -> int:
        return waiting.log_end(self.events_path)

    def events_marker(self) -> Any:
        return log_marker(self.events_path)

    def check_cursor(self, cursor: int) -> None:
        check_cursor(self.events_path, cursor)

    def append_event(self, record: dict[str, Any]) -> None:
        append_record(self.events_path, record)

    def exclusive(self) -> AbstractContextManager[None]:
        return self.disk.locked()

    def announce_host(self, agents: Callable[[], builtins.list[dict[str, Any]]] | None = None) -> None:
        pass  # one host's board: a dead supervisor's agents are seen by pid, not by heartbeat

    def host_agents(self) -> builtins.list[dict[str, Any]]:
        return []  # one host's board: its agents are the workspace's (runs/supervisor.json)

    # -- journals --------------------------------------------------------------------------------

    def task_journal(self, task_id: str, token: int, agent: str, workdir: Path) -> Any:
        """The task's journal in the agent's folder: one host's agents are the only readers, and a
        stale holder is stopped by the board's fenced verbs, so its files need no token."""
        return FileTaskJournal(Path(workdir), task_id)

    def journal_rows(self, task_id: str | None, kind: str, *, agents: Iterable[str] | None = None,
                     name: str | None = None, after: int = 0) -> builtins.list[dict[str, Any]] | None:
        """None: the file board keeps no journal rows; its journals are the agents' files."""
        return None

    def journal_marks(self, task_id: str) -> builtins.list[dict[str, Any]] | None:
        """None: no journal rows (a follower reads the agents' files by offset)."""
        return None

    def journal_prune(self, task_ids: Iterable[str], *, dry_run: bool = False) -> dict[str, int] | None:
        """None: no journal rows to remove (`prune` removes the agents' files)."""
        return None


def _misplaced(folder: str, doc: TaskDoc) -> bool:
    """A document whose status is not its folder's, outside doing/ (where that is a transition to
    roll forward, never a person's move: doing/ is reserved for claims)."""
    return folder != "doing" and doc["status"] != folder
