"""The filesystem board: `Board` assembles the file backend and holds the verbs no part owns.

Those verbs: reads, add, recovery and hand moves.

Its parts, each a module: `base` (folder, lock, reading one file), `txn` (the transaction core, alone
moving a task between folders), `claims` (index, reservation, holder's verbs), `notes` (comments, answers,
waiting notes), `waiting` (watcher, wait_for_work, event cursor) and `ingest` (drops to tasks).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from . import reads, rules
from .base import (  # noqa: F401 (the board's settings, named here as before the split)
    ALLOW_NETWORK_FS_ENV,
    COMMENT_RESERVE,
    DEFAULT_LEASE,
    ERROR_SUFFIX,
    FOLDERS,
    MAX_DOCUMENT_BYTES,
    TaskDoc,
    _short_text,
)
from .claims import Claims
from .errors import BoardError, BoardLocked, Damaged, TaskNotFound
from .events import event
from .fsio import (
    write_json_atomic,
)
from .ingest import IngestMixin
from .journal import FileTaskJournal
from .liveness import stale_reason
from .notes import NotesMixin
from .reads import Listing
from .task import (
    STATUSES,
    TaskError,
    find_cycle,
    is_valid_id,
    normalize,
    now_iso,
    slugify,
)
from .waiting import WaitingMixin

_T = TypeVar("_T")


class Board(IngestMixin, NotesMixin, WaitingMixin, Claims):
    """A Kanban board in a folder. Safe to use from several processes and threads at once."""

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
            with self._locked():
                found = self._get_once(task_id)
                if found is not None and _misplaced(*found):
                    found = found[0], self._adopt_hand_move(*found)
        if found is None:
            raise self._missing(task_id)
        return found[1]

    def _get_once(self, task_id: str) -> tuple[str, TaskDoc] | None:
        """The task's folder and document, or None."""
        for _attempt in range(5):
            found = self._locate(task_id)
            if found is None:
                return None
            try:
                return found[0], self._read(found[1])
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
        listing = self._consistent(lambda: reads.scan(self.root, status, self._read, fields=fields))
        if listing.misplaced:
            # Files a person moved with `mv`: their folder is the intent (see _adopt_hand_move).
            with self._locked():
                for folder, task_id in listing.misplaced:
                    try:
                        doc = self._read(self._path(folder, task_id))
                    except (FileNotFoundError, Damaged):
                        continue
                    if _misplaced(folder, doc):
                        self._adopt_hand_move(folder, doc)
            listing = self._consistent(lambda: reads.scan(self.root, status, self._read, fields=fields))
        return listing

    def counts(self) -> dict[str, int]:
        """How many tasks each status folder holds, each task counted once."""
        return self._consistent(lambda: reads.count(self.root))

    def task_ids(self) -> list[str]:
        """The id of every task file in the status folders, sorted, as of one moment (names only)."""
        return sorted(self._consistent(lambda: reads.ids(self.root)))

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

    # -- recovery -------------------------------------------------------------------------------

    def recover(self, *, sweep: bool = True) -> list[dict[str, str]]:
        """Return tasks whose holder died or whose lease ran out to todo (attempts kept), or to
        failed once they used up max_attempts; finish interrupted transitions; sweep stale temp files."""
        recovered = []
        now = time.time()
        swept = self._last_sweep
        with self._locked():
            self._last_recover = time.monotonic()
            # A board's first locked section finishes and sweeps (see _locked): when this one was
            # it, a second pass would list every status folder again to find nothing new.
            if self._last_sweep == swept:
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

    def cancel(self, task_id: str, *, by: str = "cli") -> TaskDoc:
        rules.check_cancel(self.get(task_id))
        return self.move(task_id, "cancelled", by=by, note="cancelled")

    def retry(self, task_id: str, *, by: str = "cli") -> TaskDoc:
        rules.check_retry(self.get(task_id))
        return self.move(task_id, "todo", by=by, note="retry (attempts reset)")

    def task_journal(self, task_id: str, token: int, agent: str, workdir: Path) -> Any:
        """The task's journal in the agent's folder: one host's agents are the only readers, and a
        stale holder is stopped by the board's fenced verbs, so its files need no token."""
        return FileTaskJournal(Path(workdir), task_id)

    def journal_rows(self, task_id: str | None, kind: str, *, agents: Iterable[str] | None = None,
                     name: str | None = None, after: int = 0) -> list[dict[str, Any]] | None:
        """None: the file board keeps no journal rows; its journals are the agents' files."""
        return None

    def journal_marks(self, task_id: str) -> list[dict[str, Any]] | None:
        """None: no journal rows (a follower reads the agents' files by offset)."""
        return None

    def journal_prune(self, task_ids: Iterable[str], *, dry_run: bool = False) -> dict[str, int] | None:
        """None: no journal rows to remove (`prune` removes the agents' files)."""
        return None


def _misplaced(folder: str, doc: TaskDoc) -> bool:
    """A document whose status is not its folder's, outside doing/ (where that is a transition to
    roll forward, never a person's move: doing/ is reserved for claims)."""
    return folder != "doing" and doc["status"] != folder
