"""PgStore's claims and the holder's fenced verbs (mixed into PgStore), and the one write of a transition.

A transition's row, its event and the end of its run are written in one transaction (`_write`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

import psycopg

from .. import rules
from ..errors import ClaimLost, TaskNotFound
from ..liveness import start_time
from ..markers import own_start_time
from . import sql
from .retry import again
from .rows import row_params
from .rules import readable, row_to_doc, storable, unreadable
from .storebase import StoreBase

TaskDoc = dict[str, Any]

MAX_SET_ASIDE = 20  # unreadable rows one claim fails before it gives up until the next


class ClaimsMixin(StoreBase):
    """The BoardStore verbs claim, renew, complete, fail, block and release, for PgStore."""

    @again
    def claim(self, agent: str, *, roles: Iterable[str] = (), lease: float | None = None,
              pid: int | None = None, steps_only: bool = False, assigned_only: bool = False) -> TaskDoc | None:
        """Claim the best eligible task for `agent`, or None; its claim.token fences every later write."""
        pid = os.getpid() if pid is None else pid
        statement = sql.CLAIMS[bool(steps_only), bool(assigned_only)]
        params = {"agent": agent, "roles": list(roles),
                  "host": self.host, "boot": self.boot_id, "pid": pid,
                  "pid_started": own_start_time() if pid == os.getpid() else start_time(pid),
                  "lease": self.lease if lease is None else float(lease)}
        for _ in range(MAX_SET_ASIDE):
            # One statement, its own transaction: the pick, the claim, its run and its event.
            with self._one() as conn:
                row = conn.execute(statement, params).fetchone()
            if row is None:
                return None
            why = unreadable(row)
            if why is None:
                # No journal row can exist yet (sql.CLAIMS, `unjournaled`): the task's journal has
                # nothing to read back until this claim writes (PgTaskJournal).
                self._unjournaled = (row["id"], row["fence"]) if row["unjournaled"] else None
                return row_to_doc(row)
            # Written by hand (another host, anyone with the database): no agent can run it, and
            # left in todo it would be every claimer's first pick, failing each in turn.
            with self._tx() as cur:
                if cur.execute(sql.HELD, {"id": row["id"], "token": row["fence"]}).fetchone() is not None:
                    self._set_aside(cur, row, agent, f"set aside at its claim by {agent}: {why}")
        return None  # the rest waits for the next claim

    def _set_aside(self, cur: psycopg.Cursor[Any], row: dict[str, Any], by: str, note: str) -> None:
        """Fail a held row that is no task (rules.unreadable), its run ended, with its event."""
        cur.execute(sql.SET_ASIDE, {"id": row["id"], "why": note})
        self._event(cur, {"id": row["id"], "src": "doing", "dst": "failed", "by": by, "note": note})
        cur.execute(sql.END_RUN, {"outcome": "failed", "token": row["fence"]})

    def _once(self, cur: psycopg.Cursor[Any], what: str, statement: str, params: Any) -> None:
        """Run `statement` unless `what` was done already in `cur`'s transaction: a lock held to its
        end, a NOTIFY (sent once at commit however often it is asked for). An ingest batch writes
        64 tasks and their events in one transaction, each asking for both."""
        if self._done_in_tx[0] is not cur:
            self._done_in_tx = (cur, set())  # `cur` is held there, so no later cursor is that object
        if what not in self._done_in_tx[1]:
            cur.execute(statement, params)
            self._done_in_tx[1].add(what)

    def _lock_events(self, cur: psycopg.Cursor[Any]) -> None:
        """Hold the events lock, shared, to the end of `cur`'s transaction (sql.EVENTS_LOCK_SHARED)."""
        self._once(cur, "events lock", sql.EVENTS_LOCK_SHARED, {"lock": sql.EVENTS_LOCK})

    def _notify(self, cur: psycopg.Cursor[Any]) -> None:
        """Wake the board's waiting claimers, on every host, when `cur`'s transaction commits."""
        self._once(cur, "notify", "SELECT pg_notify(%s, '')", (self.channel,))

    def _event(self, cur: psycopg.Cursor[Any], values: dict[str, Any]) -> None:
        self._lock_events(cur)
        cur.execute(sql.EVENT_AT if "at" in values else sql.EVENT, values)

    def _lost(self, cur: psycopg.Cursor[Any], task_id: str, token: int) -> ClaimLost:
        row = cur.execute("SELECT status, lease_owner, fence FROM tasks WHERE id = %s", (task_id,)).fetchone()
        if row is None:
            return ClaimLost(f"task {task_id} is not held by token {token}: it is no longer on the board")
        if row["status"] == "doing":
            return ClaimLost(f"task {task_id} is not held by token {token}: it is held by {row['lease_owner']} "
                             f"with token {row['fence']}")
        return ClaimLost(f"task {task_id} is not held by token {token}: it is {row['status']}")

    def _write(self, cur: psycopg.Cursor[Any], new: TaskDoc, *, outcome_token: int | None) -> TaskDoc:
        """Store `new` (a document leaving or outside doing) with its event, on a row the caller
        locked in this transaction after checking its fence; the document as stored."""
        new = storable(new)
        entry = new["history"][-1]
        self._lock_events(cur)
        row = cur.execute(sql.WRITE, {**row_params(new), "token": outcome_token, "src": entry["from"],
                                      "dst": entry["to"], "by": entry["by"], "note": entry["note"]}).fetchone()
        if row is None:
            raise TaskNotFound(f"task {new['id']} is no longer on the board")
        # Wake the claimers for a new todo, or a done task others depend on. Not for every done
        # task: a NOTIFY serializes commits (about half the commit rate), so it is sent only when
        # it can free work.
        if new["status"] == "todo" or (new["status"] == "done" and row["frees"]):
            self._notify(cur)
        return new

    @again
    def _end(self, task_id: str, token: int, end: Callable[[TaskDoc, str], TaskDoc]) -> TaskDoc:
        """End the claim `token` holds with the rule `end(doc, now)` (kanban/rules.py), now by the database's clock."""
        with self._tx() as cur:
            row = cur.execute(sql.HELD_ENDING, {"id": task_id, "token": token}).fetchone()
            if row is None:
                raise self._lost(cur, task_id, token)
            self._done_in_tx = (cur, {"events lock"})  # taken with the row
            return self._write(cur, end(readable(row), row["now_iso"]), outcome_token=token)

    @again
    def renew(self, task_id: str, token: int, lease: float | None = None) -> TaskDoc:
        with self._tx() as cur:
            row = cur.execute(sql.RENEW, {"id": task_id, "token": token,
                                          "lease": self.lease if lease is None else float(lease)}).fetchone()
            if row is None:
                raise self._lost(cur, task_id, token)
        return readable(row)

    def complete(self, task_id: str, token: int, result: Any = None) -> TaskDoc:
        return self._end(task_id, token, lambda doc, now: rules.ended(doc, "done", "completed", now=now, result=result,
                                                                       error=None))

    def fail(self, task_id: str, token: int, error: str, *, permanent: bool = False) -> TaskDoc:
        if permanent:
            return self._end(task_id, token, lambda doc, now: rules.ended(
                doc, "failed", f"cannot succeed, not retried: {error}", now=now, error=error))
        return self._end(task_id, token, lambda doc, now: rules.failed_attempt(doc, error, now=now))

    def block(self, task_id: str, token: int, reason: str, *, question: str | None = None) -> TaskDoc:
        if question is None:
            return self._end(task_id, token, lambda doc, now: rules.ended(doc, "blocked", reason, now=now,
                                                                           error=reason))
        return self._end(task_id, token, lambda doc, now: rules.ended(
            doc, "blocked", reason, now=now, give_back_attempt=True, error=reason, question=question))

    def release(self, task_id: str, token: int, note: str = "released", *,
                count_attempt: bool = False) -> TaskDoc:
        return self._end(task_id, token, lambda doc, now: rules.ended(doc, "todo", note, now=now,
                                                                       give_back_attempt=not count_attempt))
