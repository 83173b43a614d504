"""Claims: picking and reserving the best eligible task, the claim's commit, and the holder's fenced verbs."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from . import later, liveness, rules
from .base import Folder, TaskDoc, _read_or_none
from .claimindex import RESYNC_AFTER, ClaimIndex  # noqa: F401 (RESYNC_AFTER: named here as before)
from .errors import BoardError, ClaimLost, Damaged
from .faults import fault
from .fsio import write_json_atomic
from .liveness import start_time
from .markers import changed_at, own_start_time
from .task import now_iso
from .txn import Transactions

# A reservation marker this old may be a dead claimer's: the locked path looks at its owner.
STALE_MARKER_AGE = 1.0
# Walks of the index one pick may make (claims._reserve): the last walks on as picks always did.
PICK_ROUNDS = 8


def _older_than(marker: Path, seconds: float) -> bool:
    """The marker is at least `seconds` old, or gone (as good as stale: nothing holds the task)."""
    try:
        return time.time() - changed_at(marker) >= seconds
    except FileNotFoundError:
        return True


class Claims(ClaimIndex):
    """The pick and its reservation, the claim's commit and the holder's fenced verbs (the index: claimindex.py)."""

    def __init__(self, disk: Folder, txn: Transactions, lease: float) -> None:
        super().__init__(disk, txn)
        self.lease = lease
        self.needs_lock = False  # the lock-free pick skipped something only the locked path repairs

    # -- claiming -------------------------------------------------------------------------------

    def _done_on_disk(self, task_id: str) -> bool:
        return self.disk.path("done", task_id).exists()

    def claim(self, agent: str, *, roles: Iterable[str] = (), lease: float | None = None,
              pid: int | None = None, steps_only: bool = False, assigned_only: bool = False,
              lock_free: bool = False) -> TaskDoc | None:
        """Claim the best eligible task for `agent`, or None. The returned document's
        claim.token must be presented to renew, complete, fail, block or release it.

        The pick is reserved without the board lock (an exclusive create of its marker), then its
        new document is fsync'd, and only the commit takes the lock. When the fast path finds
        nothing, the locked path refreshes the index, adopts hand moves, moves damaged files
        aside, and rescans the folders if the index is stale. `steps_only` takes only tasks that
        carry `steps` (an agent with no LLM provider can do nothing else); `assigned_only` only
        tasks assigned to `agent` (a delegated child takes its own task and nothing else).
        `lock_free`: a look of a waiter without a watch slot (kanban/watchslots.py), which finds
        nothing without the lock unless the index asks for a repair: the watching ones rescan.
        """
        roles = tuple(roles)
        for _attempt in range(20):
            picked, settled = None, False
            with self.disk.tlock:
                if self.catch_up():
                    self.needs_lock = False
                    picked = self._reserve(agent, roles, steps_only, assigned_only, locked=False)
                    # Nothing here for us, and nothing the locked path would repair or find: a
                    # claimer woken for work another took returns without the board lock (16
                    # agents took it for every task, each to find nothing).
                    settled = picked is None and not self.needs_lock and (lock_free or not self.stale())
            if settled:
                return None
            if picked is None:
                with self.disk.locked():
                    self.refresh_index()
                    picked = self._reserve(agent, roles, steps_only, assigned_only, locked=True)
                    if picked is None and self.indexed_at is not None and self.stale():
                        self.rescan()
                        picked = self._reserve(agent, roles, steps_only, assigned_only, locked=True)
            if picked is None:
                return None
            raw, doc = picked
            prepared: Path | None = None
            keeper: Path | None = None
            committed: TaskDoc | None = None
            try:
                new = self._claimed(doc, agent, lease, pid)
                prepared = self.txn.prepare("todo", new)
                keeper = self.txn.keep_old("todo", doc["id"])
                fault("prepared")
                with self.disk.locked():
                    # A person may have changed the task while it was reserved; then choose again.
                    if _read_or_none(self.disk.path("todo", doc["id"])) == raw:
                        committed, prepared = self.txn.commit("todo", new, prepared, reserved=True), None
            finally:
                self.txn.owner.remove_own(self.txn.marker(doc["id"]))
                if prepared is not None:
                    prepared.unlink(missing_ok=True)
                if keeper is not None:
                    later.unlink(keeper)  # frees the old document's blocks: not waited for
                self.txn.reservations.done(doc["id"])
            if committed is not None:
                return committed
        raise BoardError("could not claim a task: every pick was changed by hand before the claim finished")

    def _reserve(self, agent: str, roles: tuple[str, ...], steps_only: bool, assigned_only: bool, *,
                 locked: bool) -> tuple[bytes, TaskDoc] | None:
        """Pick the best eligible task and reserve it for this process. Without the lock
        (`locked=False`) a task that needs repair (moved by hand, damaged) is only skipped."""
        index = self.disk.index

        def indexed_done(dep: str) -> bool:
            return index.status.get(dep) == "done"

        follow = True
        for _round in range(PICK_ROUNDS):
            picked, again = self._pick(agent, roles, steps_only, assigned_only, indexed_done, locked=locked,
                                       follow=follow)
            if not again:
                return picked
            # The pick's task was gone (taken by another since this index followed the log, or
            # moved by hand), or its file orders it elsewhere than the index did (a note on an
            # event, see index.carried, is a hint). Walking on past gone tasks, 16 claimers on 2
            # cores each went through hundreds in a pick (a link, a failed open and an unlink each,
            # seconds in all) while the others took more: the log's tail has what they took for
            # one read. Followed again only while it brings something, and a few times at most
            # (a task gone by hand, or a line naming a task with no file, is walked past).
            records = self.tail.read_new()
            index.apply_events(records, self.load_todo)
            follow = again == "reordered" or bool(records)
        return self._pick(agent, roles, steps_only, assigned_only, indexed_done, locked=locked, follow=False)[0]

    def _pick(self, agent: str, roles: tuple[str, ...], steps_only: bool, assigned_only: bool,
              indexed_done: Callable[[str], bool], *, locked: bool,
              follow: bool) -> tuple[tuple[bytes, TaskDoc] | None, str]:
        """One walk of the index for _reserve: (the pick or None, "" or why it stopped to be walked
        again: "gone", a task found gone without the lock, or "reordered", a task the index had
        in another place than its file puts it). With `follow` False, as it always did: walks on
        past a gone task, and takes a reordered one."""
        index = self.disk.index
        for meta in index.todo_in_order():
            task_id = meta["id"]
            if not rules.eligible(meta, agent, roles, indexed_done, steps_only=steps_only,
                                  assigned_only=assigned_only, has_steps=meta["has_steps"]):
                continue
            # Without the lock the reservation comes first: with 16 agents each claim read and
            # parsed the tasks the others had just reserved, only to find their markers.
            if not locked and not self._try_reserve(task_id, locked=False):
                continue
            found = self._reserved_doc(task_id, agent, roles, steps_only, assigned_only, locked=locked)
            if found is None:
                if not locked:
                    self._release(task_id)
                    if follow and task_id not in index.status:  # its file was gone (_reserved_doc forgot it)
                        return None, "gone"
                continue
            raw, doc = found
            if follow and rules.claim_order(doc) != rules.claim_order(meta):
                index.put_todo(doc)
                if not locked:
                    self._release(task_id)
                return None, "reordered"
            if locked:
                if not self._try_reserve(task_id, locked=True):
                    continue
                # Reserved; another claimer may have committed this task just before. Not a guard
                # (the check under the lock in claim() is): this only spares preparing in vain.
                if _read_or_none(self.disk.path("todo", task_id)) != raw:
                    self._release(task_id)
                    continue
            # Out of this process's candidates now; the commit's event (or a rescan) settles it.
            index.set_status(task_id, "doing")
            return (raw, doc), ""
        return None, ""

    def _reserved_doc(self, task_id: str, agent: str, roles: tuple[str, ...], steps_only: bool,
                      assigned_only: bool, *, locked: bool) -> tuple[bytes, TaskDoc] | None:
        """The task's bytes and document as todo/ has them, if it is there and `agent` may take it;
        None otherwise (the index is told, and under the lock a damaged file is moved aside)."""
        index = self.disk.index
        path = self.disk.path("todo", task_id)
        try:
            raw = self.disk.raw(path)
            doc = self.disk.parse(raw, task_id)
        except FileNotFoundError:
            index.forget(task_id)
            return None
        except Damaged as exc:
            if locked:
                self.txn.quarantine(path, str(exc))
            self.needs_lock = True
            return None
        if doc["status"] != "todo":
            if not locked:
                self.needs_lock = True
                return None
            doc = self.txn.adopt_hand_move("todo", doc)
            if doc["status"] != "todo":
                index.set_status(task_id, doc["status"])
                return None
            raw = self.disk.raw(path)
        if not rules.eligible(doc, agent, roles, self._done_on_disk, steps_only=steps_only,
                              assigned_only=assigned_only):
            index.put_todo(doc)
            return None
        return raw, doc

    def _release(self, task_id: str) -> None:
        self.txn.owner.remove_own(self.txn.marker(task_id))
        self.txn.reservations.done(task_id)

    def _try_reserve(self, task_id: str, *, locked: bool) -> bool:
        """Create the task's marker exclusively; False if someone else holds it. Under the lock, a
        marker over a second old whose writer is dead (a claimer killed after reserving) is cleared
        so it cannot hide the task until the next recover()."""
        marker = self.txn.marker(task_id)
        for _try in range(2):
            self.txn.reservations.started(task_id)
            try:
                # A hard link to our owner file is made with its text in one step, and
                # exclusively: a marker is never seen without the owner it names, even if its
                # claimer is killed (markers.py).
                self.txn.owner.place(marker)
            except FileExistsError:
                self.txn.reservations.done(task_id)
                if not locked:
                    self.needs_lock = self.needs_lock or _older_than(marker, STALE_MARKER_AGE)
                    return False
                if not self._stale_marker(marker):
                    return False
                self.txn.finish_interrupted(sweep=False)
                continue
            fault("marked")
            return True
        return False

    def _stale_marker(self, marker: Path) -> bool:
        if self.txn.owner.is_ours(marker):
            # Ours: the reservation count says exactly whether it is live. (The age is no help:
            # every marker of ours shares the owner file's change time, renewed by each claim.)
            return not self.txn.marker_is_live(marker)
        return _older_than(marker, STALE_MARKER_AGE) and not self.txn.marker_is_live(marker)

    def _claimed(self, doc: TaskDoc, agent: str, lease: float | None, pid: int | None) -> TaskDoc:
        pid = os.getpid() if pid is None else pid
        # Our own start time is known once (psutil read /proc at every claim: 2 % of a task).
        started = own_start_time() if pid == os.getpid() else start_time(pid)
        lease = self.lease if lease is None else lease
        now, at = time.time(), now_iso()
        claim = {"agent": agent, "pid": pid, "pid_started": started, "host": liveness.HOST, "claimed_at": at,
                 "lease_until": _iso_at(now + lease), "lease_until_ts": now + lease}
        return rules.claimed(doc, claim, now=at)

    def _held(self, task_id: str, token: int) -> TaskDoc:
        """The document of a task held in doing/ by `token`, else ClaimLost."""
        path = self.disk.path("doing", task_id)
        try:
            doc = self.disk.read(path)
        except FileNotFoundError:
            found = self.disk.locate(task_id)
            where = f"it is in {found[0]}/" if found else "it is no longer on the board"
            raise ClaimLost(f"task {task_id} is not held by token {token}: {where}") from None
        claim = doc.get("claim") or {}
        if not rules.held_by(doc, token):
            holder = f"held by {claim.get('agent')} with token {claim.get('token')}" if claim else "not held"
            raise ClaimLost(f"task {task_id} is not held by token {token}: it is {holder}")
        return doc

    def renew(self, task_id: str, token: int, lease: float | None = None) -> TaskDoc:
        lease = self.lease if lease is None else lease
        with self.disk.locked():
            doc = self._held(task_id, token)
            now = time.time()
            claim = dict(doc["claim"], lease_until=_iso_at(now + lease), lease_until_ts=now + lease)
            new = dict(doc, claim=claim)
            # Not a transition: no event, and a lost renewal only shortens the lease, so no fsync.
            write_json_atomic(self.disk.path("doing", task_id), new, fsync=False)
            return new

    def _finish(self, task_id: str, token: int, end: Callable[[TaskDoc], TaskDoc]) -> TaskDoc:
        """End the holder's claim with `end(held document)` (a pure rule). The new document is
        written and fsync'd before the lock is taken; under the lock it is committed if the task is
        still exactly as it was read, and built again from the current file if not (a renewal in
        between, say)."""
        path = self.disk.path("doing", task_id)
        raw = _read_or_none(path)
        prepared: Path | None = None
        keeper: Path | None = None
        new: TaskDoc | None = None
        if raw is not None:
            with contextlib.suppress(Damaged):
                doc = self.disk.parse(raw, task_id)
                if rules.held_by(doc, token):
                    new = end(doc)
                    prepared = self.txn.prepare("doing", new)
                    keeper = self.txn.keep_old("doing", task_id)
                    fault("prepared")
        try:
            with self.disk.locked():
                if prepared is None or new is None or _read_or_none(path) != raw:
                    if prepared is not None:
                        prepared.unlink(missing_ok=True)
                        prepared = None
                    new = end(self._held(task_id, token))
                committed, prepared = self.txn.commit("doing", new, prepared), None
                return committed
        finally:
            if prepared is not None:
                prepared.unlink(missing_ok=True)
            if keeper is not None:
                later.unlink(keeper)

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



def _iso_at(timestamp: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(timestamp)) + f".{int(timestamp % 1 * 1e6):06d}Z"
