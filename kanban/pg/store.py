"""The board in PostgreSQL: the BoardStore verbs with the file board's semantics, shared by hosts.

Each store holds one connection for its verbs (serialized by a lock, so threads may share it) and,
once something waits for work, one LISTEN connection. Decisions about time use the database's
clock only; every write by a claim's holder is fenced by its token, so a holder whose lease went
elsewhere changes nothing.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from .. import handmoves, rules
from ..base import COMMENT_RESERVE, MAX_DOCUMENT_BYTES
from ..errors import BoardError, InvalidTransition, TaskNotFound
from ..faults import fault
from ..index import carried
from ..ingestturn import SoleIngester
from ..reads import Listing, listed_fields
from ..task import MAX_BYTES, STATUSES, TaskError, find_cycle, is_valid_id, normalize, slugify
from ..waitloop import recover_due
from ..waitloop import wait_for_work as wait_loop
from ..watch import BoardWatcher, ChangeSignal
from ..watchslots import WatchSlots, wait_in_turn
from . import drops, sql
from .claims import ClaimsMixin
from .conn import Connection, redact_dsn
from .hosts import MAX_SUMMARY_BYTES, HostsMixin
from .ids import TaskIdsMixin
from .ingest import IdTaken, IngestMixin
from .journalrows import JournalRowsMixin
from .listen import CHANNEL, Listener
from .retry import again
from .rows import one, row_params
from .rules import document_part, readable, row_to_doc, storable, storable_text, unreadable
from .schema import check_schema_name, migrate
from .stream import StreamMixin

TaskDoc = dict[str, Any]

DEFAULT_LEASE = 60.0
DEFAULT_HOST_TIMEOUT = 30.0
POLL_INTERVAL = 1.0
# Any fixed number: serializes adds that name dependencies, so two cannot close a cycle together.
DEPENDENCY_LOCK = 0x68737570
# Named here for the modules that import them from the store, as before its split.
__all__ = ["DEFAULT_HOST_TIMEOUT", "DEFAULT_LEASE", "MAX_SUMMARY_BYTES", "PgStore", "redact_dsn", "row_params"]


class PgStore(ClaimsMixin, IngestMixin, JournalRowsMixin, HostsMixin, StreamMixin, TaskIdsMixin, Connection):
    """A board in a PostgreSQL schema. `dsn` is never printed; errors name `dsn_env` instead."""

    def __init__(self, dsn: str, *, dsn_env: str = "the DSN", schema: str = "hermes_sup", host: str,
                 boot_id: str, lease: float = DEFAULT_LEASE, host_timeout: float = DEFAULT_HOST_TIMEOUT,
                 migrate_schema: bool = True, drop_root: str | os.PathLike[str] | None = None) -> None:
        self._dsn = dsn
        # This host's kanban folder: drops into its inbox/ land on the shared board (ingest).
        self.drop_root = None if drop_root is None else Path(drop_root).absolute()
        # The protocol's local folder (inbox/, rejected/); a store opened without one (a tool, a
        # test) has none, and its `root` is None.
        self.root: Path = self.drop_root  # type: ignore[assignment]
        self._turn = None if self.drop_root is None else SoleIngester(self.drop_root, 60.0)
        self.slots = None if self.drop_root is None else WatchSlots(self.drop_root)
        self.problems: list[str] = []
        self.signal = ChangeSignal()
        self._drop_signal = ChangeSignal()  # drops arriving, and wake(): what ends wait_for_drops
        self._drops_seen = -1  # its generation at wait_for_drops' last return
        self._drop_watch: BoardWatcher | None = None
        self._watching = False
        self.dsn_env = dsn_env
        self.schema = check_schema_name(schema)
        self.host = host
        self.boot_id = boot_id
        self.lease = float(lease)
        self.host_timeout = float(host_timeout)
        self.channel = f"{CHANNEL}_{self.schema}"
        self._lock = threading.RLock()
        self._conn: psycopg.Connection[Any] | None = None
        self._listener: Listener | None = None
        self._heartbeat: threading.Thread | None = None
        self._agents: Callable[[], list[dict[str, Any]]] | None = None  # published with each heartbeat
        self._closing = threading.Event()
        self._last_recover = 0.0
        self._done_in_tx: tuple[object, set[str]] = (None, set())
        self._unjournaled: tuple[str, int] | None = None
        if migrate_schema:
            with self._locked() as conn:
                migrate(conn, self.schema)
        if self.drop_root is not None:
            drops.ensure_layout(self.drop_root)

    def __repr__(self) -> str:  # never the DSN
        return f"<PgStore schema={self.schema} host={self.host}>"

    # Here, not with the connection (conn.py): the crash tests read a backend's fault points from
    # this file (tests/conformance/backends.py).
    @contextlib.contextmanager
    def _tx(self) -> Iterator[psycopg.Cursor[Any]]:
        # The fault points name the two sides of every commit, for the crash tests (kanban/faults.py):
        # killed before it, nothing of the transaction is left; after it, all of it is.
        with self._locked() as conn:
            with conn.transaction(), conn.cursor() as cur:
                yield cur
                fault("pg-before-commit")
            fault("pg-after-commit")

    @contextlib.contextmanager
    def _one(self) -> Iterator[psycopg.Connection[Any]]:
        # For a write that is one statement: its own transaction (the connection autocommits), so
        # one round trip to the server where BEGIN, the statement and COMMIT were three.
        with self._locked() as conn:
            fault("pg-before-commit")
            yield conn
        fault("pg-after-commit")

    def close(self) -> None:
        self._closing.set()
        if self.slots is not None:
            self.slots.close()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if self._heartbeat is not None:
            self._heartbeat.join(timeout=5)
            self._heartbeat = None
        self._disconnect()
        if self._turn is not None:
            self._turn.close()
        if self._drop_watch is not None:
            self._drop_watch.stop()

    def __enter__(self) -> PgStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading ------------------------------------------------------------------------------

    @again
    def get(self, task_id: str) -> TaskDoc:
        if not is_valid_id(task_id):
            raise TaskNotFound(f"{task_id!r:.80} is not a task id")
        with self._locked() as conn:
            row = conn.execute(sql.ANY_ROW, {"id": task_id}).fetchone()
        if row is None:
            raise TaskNotFound(f"no task '{task_id}' on the board")
        return readable(row)

    @again
    def list(self, status: str | None = None) -> Listing:
        """Every task (or those in one status), in claim order within each status."""
        if status is not None and status not in STATUSES:
            raise BoardError(f"unknown status '{status}'; statuses are {', '.join(STATUSES)}")
        with self._locked() as conn:
            rows = conn.execute(f"SELECT {sql.ROW_SELECT} FROM tasks WHERE %(status)s::text IS NULL OR status = "
                                "%(status)s::text ORDER BY array_position(%(order)s::text[], status), priority DESC, "
                                "created, id", {"status": status, "order": list(STATUSES)}).fetchall()
        damaged = {row["id"]: why for row in rows if (why := unreadable(row)) is not None}
        return Listing([row_to_doc(row) for row in rows if row["id"] not in damaged],
                       [{"path": f"task {task_id} (board database)", "reason": why}
                        for task_id, why in damaged.items()])

    def list_fields(self, status: str | None = None) -> Listing:
        """`list`, each task as its listing fields (the protocol's verb; the whole rows are read)."""
        listing = self.list(status)
        return Listing([listed_fields(doc) for doc in listing.tasks], listing.damaged)

    @again
    def counts(self) -> dict[str, int]:
        with self._locked() as conn:
            rows = conn.execute("SELECT status, count(*) AS n FROM tasks GROUP BY status").fetchall()
        found = {row["status"]: row["n"] for row in rows}
        return {status: found.get(status, 0) for status in STATUSES}
    # -- adding -------------------------------------------------------------------------------

    def _deps_of(self, cur: psycopg.Cursor[Any]) -> Callable[[str], builtins.list[str]]:
        def deps_of(task_id: str) -> list[str]:
            cur.execute("SELECT depends_on FROM dependencies WHERE task_id = %s", (task_id,))
            return [row["depends_on"] for row in cur.fetchall()]
        return deps_of

    def add(self, fields: dict[str, Any], *, by: str = "cli") -> TaskDoc:
        """Validate `fields` (as in a dropped file) and put the task on the board."""
        title = fields.get("title")
        title = title if isinstance(title, str) else "task"
        with self._tx() as cur:
            now = one(cur.execute(f"SELECT {sql.NOW_ISO} AS now"))["now"]
            doc = normalize(fields, default_id=f"{slugify(title)}-{os.urandom(3).hex()}", now=now, by=by,
                            note="added")
            return self._insert(cur, doc, fixed_id="id" in fields, src=None, by=by, note="added")

    def _insert(self, cur: psycopg.Cursor[Any], doc: TaskDoc, *, fixed_id: bool, src: str | None, by: str,
                note: str, at: str | None = None) -> TaskDoc:
        """Insert a new task (checked for a dependency cycle) with its event, made at `at` if given
        (else the transaction's time); a generated id that is taken is drawn again, a given one is refused."""
        title = doc["title"]
        doc = storable(doc)
        if doc["depends_on"]:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (DEPENDENCY_LOCK,))
            cycle = find_cycle(doc["id"], doc["depends_on"], self._deps_of(cur))
            if cycle:
                raise TaskError(f"depends_on creates a cycle: {' -> '.join(cycle)}")
        self._lock_events(cur)
        for _attempt in range(20):
            line = {"task": doc["id"], "from": src, "to": doc["status"], "by": by, "note": note,
                    "index": carried(doc)} if doc["status"] == "todo" else None
            made = cur.execute(sql.INSERT_TASK, {**row_params(doc), "created": at, "src": src, "by": by, "note": note,
                                                 "record": None if line is None else storable_text(line)}).fetchone()
            if made is not None:
                break
            if fixed_id:
                raise IdTaken(f"a task with id '{doc['id']}' already exists")
            doc = {**doc, "id": f"{slugify(title)}-{os.urandom(3).hex()}"}
        else:
            raise BoardError("could not find a free task id")
        if doc["depends_on"]:
            cur.executemany("INSERT INTO dependencies (task_id, depends_on) VALUES (%s, %s)",
                            [(doc["id"], dep) for dep in doc["depends_on"]])
        if doc["status"] == "todo":
            self._notify(cur)
        return doc
    # -- changes by hand ----------------------------------------------------------------------

    @again
    def move(self, task_id: str, to: str, *, by: str = "cli", note: str = "") -> TaskDoc:
        rules.check_move_target(to)
        with self._tx() as cur:
            row = cur.execute(sql.ANY_ROW_LOCKED, {"id": task_id}).fetchone()
            if row is None:
                raise TaskNotFound(f"no task '{task_id}' on the board")
            doc = readable(row)
            new = rules.moved(doc, to, by=by, now=row["now_iso"], note=note)
            return self._write(cur, new, outcome_token=row["fence"] if doc.get("claim") else None)

    def cancel(self, task_id: str, *, by: str = "cli") -> TaskDoc:
        return handmoves.cancel(self, task_id, by)

    def retry(self, task_id: str, *, by: str = "cli") -> TaskDoc:
        return handmoves.retry(self, task_id, by)

    @again
    def answer(self, task_id: str, text: str, *, by: str = "cli") -> TaskDoc:
        """Answer the question a blocked task asked: it goes back to todo with the answer among its
        comments, marked as the answer to that question (the file board's verb)."""
        _check_text(text, "an answer")
        if not text.strip():
            raise InvalidTransition("an answer must not be empty")
        with self._tx() as cur:
            doc, now = self._locked_doc(cur, task_id)
            return self._write(cur, rules.answered(doc, text, by=by, now=now), outcome_token=None)

    @again
    def comment(self, task_id: str, text: str, *, by: str = "cli", wait: float = 5.0) -> TaskDoc:
        """Add a comment to a task in any status. Not a transition: no event; status and updated_at
        stay. The row lock orders it with the holder's writes, so neither loses the other's
        (`wait` is the file board's, which waits out a move in flight; here the lock does)."""
        _check_text(text, "a comment")
        with self._tx() as cur:
            doc, now = self._locked_doc(cur, task_id)
            comments = [*(doc.get("comments") or []), storable({"at": now, "by": by, "text": text})]
            new = {**doc, "comments": comments}
            if len(json.dumps(document_part(new), ensure_ascii=False).encode()) > MAX_DOCUMENT_BYTES - COMMENT_RESERVE:
                raise TaskError(f"task {task_id} has no room for this comment: its comments may fill "
                                f"{MAX_DOCUMENT_BYTES - COMMENT_RESERVE} bytes of its document, the rest is "
                                "kept for its result")
            cur.execute("UPDATE tasks SET document = jsonb_set(document, '{comments}', %s) WHERE id = %s",
                        (Jsonb(comments), task_id))
        return new

    def _locked_doc(self, cur: psycopg.Cursor[Any], task_id: str) -> tuple[TaskDoc, str]:
        """A task's document, its row locked until the transaction ends, and the database's now."""
        if not is_valid_id(task_id):
            raise TaskNotFound(f"{task_id!r:.80} is not a task id")
        row = cur.execute(sql.ANY_ROW_LOCKED, {"id": task_id}).fetchone()
        if row is None:
            raise TaskNotFound(f"no task '{task_id}' on the board")
        return readable(row), row["now_iso"]

    @again
    def mark_waiting(self, reason: str | None, *, needs_llm: bool = True, agent: str | None = None,
                     roles: Iterable[str] = ()) -> int:
        """Say on each todo task (without `steps`, when `needs_llm`) why it is not being worked, or
        clear that note with None; with `agent`, only on the tasks it could claim now. Not a
        transition: no event, no history entry; a note already there is not written again. The
        number of tasks changed."""
        params = {"reason": None if reason is None else storable(str(reason)), "agent": agent, "roles": list(roles)}
        with self._one() as conn:
            return conn.execute(sql.MARK_WAITING_PLAIN if needs_llm else sql.MARK_WAITING, params).rowcount

    # -- waiting ------------------------------------------------------------------------------

    def listener(self) -> Listener:
        """The store's LISTEN connection, started on first use."""
        with self._lock:
            if self._listener is None:
                self._listener = Listener(lambda: self._connect(listen=True), self.channel, signal=self.signal)
            return self._listener

    def wake(self) -> None:
        """Wake every thread of this process waiting in wait_for_work or wait_for_drops."""
        self._drop_signal.bump()
        self.listener().bump()

    def wait_for_drops(self, timeout: float) -> None:
        # Woken by drops arriving in this host's inbox/ alone (the watcher's `arrivals`) and by
        # `wake`: the board's own changes come by NOTIFY, on `signal`.
        if self.drop_root is not None:
            with self._lock:
                if self._drop_watch is None:
                    self._drop_watch = BoardWatcher(self.drop_root, ChangeSignal(), arrivals=self._drop_signal)
                    self._drop_watch.start(drops_only=True)
            if self._drop_watch.mode != "inotify":
                timeout = min(timeout, POLL_INTERVAL)
        self._drop_signal.wait(self._drops_seen, timeout)
        self._drops_seen = self._drop_signal.generation

    def wait_for_work(self, agent: str, *, roles: Iterable[str] = (), timeout: float | None = None,
                      lease: float | None = None, stop: threading.Event | None = None,
                      steps_only: bool = False, assigned_only: bool = False, ingest: bool = True) -> TaskDoc | None:
        """Claim a task, waiting for one (ingesting this host's drops, unless not `ingest`, and
        recovering dead claims meanwhile); None on timeout or when `stop` is set. Woken by NOTIFY,
        and polling about once a second (jittered, so hosts do not poll in step) in case one is lost."""
        def look_after() -> None:
            # Drops into this host's inbox/ land on the shared board with no other process
            # needed (a listing of one folder per round; the file board does it per wake-up).
            if ingest:
                self.ingest(wait=False)  # while another process of this host ingests, it takes the drops
            if recover_due(self._last_recover, time.monotonic()):
                self.recover()

        def claim() -> TaskDoc | None:
            return self.claim(agent, roles=roles, lease=lease, steps_only=steps_only, assigned_only=assigned_only)

        # The server restarted or the connection dropped: a waiter waits on (the next round
        # reconnects); any other error is the caller's.
        def watching(left: float | None) -> TaskDoc | None:
            self.listener().resume()
            return wait_loop(self.listener(), look_after=look_after, claim=claim,
                             nap=lambda: POLL_INTERVAL * random.uniform(0.8, 1.2), timeout=left, stop=stop,
                             tolerate=lambda exc: self._connection_lost())

        def ingest_only() -> None:
            if ingest:
                self.ingest(wait=False)

        def looking() -> TaskDoc | None:  # without a slot: dead claims are the watchers' to take back
            return wait_loop(self.signal, look_after=ingest_only, claim=claim, nap=lambda: 0.0, timeout=0.0,
                             stop=stop, tolerate=lambda exc: self._connection_lost())

        # Only a few of this host's waiters listen (kanban/watchslots.py): 64 agents each woken by
        # every task's notification drained 21 tasks a second on 2 cores.
        def eager() -> TaskDoc | None:  # while a backlog lasts: no LISTEN and UNLISTEN a task
            return wait_loop(self.signal, look_after=look_after, claim=claim, nap=lambda: 0.0, timeout=0.0,
                             stop=stop, tolerate=lambda exc: self._connection_lost())

        doc = wait_in_turn(self.slots, watching=watching, looking=looking, unwatched=self._stop_listening,
                           timeout=timeout, stop=stop, eager=eager)
        if doc is not None:  # busy until it waits again: each task's notification need not wake it
            self._stop_listening()
        return doc

    def _stop_listening(self) -> None:
        with self._lock:
            listener = self._listener
        if listener is not None:
            listener.pause()

def _check_text(text: object, what: str) -> None:
    if not isinstance(text, str):
        raise TaskError(f"{what} is text, not {type(text).__name__}")
    size = len(text.encode("utf-8", "backslashreplace"))
    if size > MAX_BYTES:
        raise TaskError(f"{what} is {size} bytes; the limit is {MAX_BYTES} bytes (1 MiB)")
