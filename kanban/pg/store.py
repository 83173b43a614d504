"""The board in PostgreSQL: the BoardStore verbs with the file board's semantics, shared by hosts.

Each store holds one connection for its verbs (serialized by a lock, so threads may share it) and,
once something waits for work, one LISTEN connection. Decisions about time use the database's
clock only; every write by a claim's holder is fenced by its token, so a holder whose lease went
elsewhere changes nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb, set_json_loads

from .. import rules
from ..base import COMMENT_RESERVE, MAX_DOCUMENT_BYTES
from ..drops import ready as ready_drops
from ..errors import BoardError, ClaimLost, InvalidTransition, TaskNotFound
from ..faults import fault
from ..fsio import safe_name
from ..ingest import IngestReport, identity_of, read_drop
from ..liveness import holder_alive, start_time
from ..reads import Listing, listed_fields
from ..task import MAX_BYTES, STATUSES, TaskError, find_cycle, is_valid_id, normalize, slugify
from ..waitloop import recover_due
from ..waitloop import wait_for_work as wait_loop
from ..watch import ChangeSignal
from . import drops, sql
from .ids import TaskIdsMixin
from .journal import PgTaskJournal
from .listen import CHANNEL, Listener
from .retry import ENDED_BY_SERVER, again
from .rules import document_part, landed_at, load_jsonb, row_to_doc, storable, unreadable
from .schema import check_schema_name, migrate
from .stream import StreamMixin

TaskDoc = dict[str, Any]

DEFAULT_LEASE = 60.0
DEFAULT_HOST_TIMEOUT = 30.0
POLL_INTERVAL = 1.0
SWEEPER = "sweeper"
MAX_PUBLISHED = 500  # agents of one host published with its heartbeat (a team is far smaller)
MAX_HOSTS = 200  # hosts host_agents reads
MAX_SET_ASIDE = 20  # unreadable rows one claim fails before it gives up until the next
# A host's published summary larger than this is read as none: MAX_PUBLISHED agents take a fraction
# of it, and anyone with the database could write one as big as jsonb holds for every page to read.
MAX_SUMMARY_BYTES = 1 << 20
# Any fixed number: serializes adds that name dependencies, so two cannot close a cycle together.
DEPENDENCY_LOCK = 0x68737570


class PgStore(StreamMixin, TaskIdsMixin):
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
        self.problems: list[str] = []
        self.signal = ChangeSignal()
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
        if migrate_schema:
            with self._locked() as conn:
                migrate(conn, self.schema)
        if self.drop_root is not None:
            drops.ensure_layout(self.drop_root)

    def __repr__(self) -> str:  # never the DSN
        return f"<PgStore schema={self.schema} host={self.host}>"

    # -- connections --------------------------------------------------------------------------

    def _redact(self, text: str) -> str:
        return redact_dsn(text, self._dsn)

    def _error(self, exc: Exception, what: str) -> BoardError:
        return BoardError(f"the board database ({self.dsn_env}) failed to {what}: "
                          f"{self._redact(str(exc)).strip()[:500] or type(exc).__name__}")

    def _connect(self, *, listen: bool = False) -> psycopg.Connection[Any]:
        try:
            conn = psycopg.connect(self._dsn, autocommit=True, row_factory=dict_row, connect_timeout=10,
                                   application_name="hermes-sup-listen" if listen else "hermes-sup")
        except Exception as exc:
            raise self._error(exc, "connect") from None
        set_json_loads(load_jsonb, conn)  # rows another host wrote may hold numbers no float holds
        conn.execute("SELECT set_config('search_path', %s, false)", (f'"{self.schema}"',))
        return conn

    @contextlib.contextmanager
    def _locked(self) -> Iterator[psycopg.Connection[Any]]:
        """The store's connection (reconnected if it broke), for one verb at a time."""
        with self._lock:
            if self._conn is None or self._conn.closed or self._conn.broken:
                if self._conn is not None:
                    with contextlib.suppress(Exception):
                        self._conn.close()
                self._conn = self._connect()
            try:
                yield self._conn
            except psycopg.Error as exc:
                error = self._error(exc, "answer")
                error.sqlstate = exc.sqlstate  # type: ignore[attr-defined]
                error.ended_by_server = exc.sqlstate in ENDED_BY_SERVER  # type: ignore[attr-defined]
                raise error from None

    @contextlib.contextmanager
    def _tx(self) -> Iterator[psycopg.Cursor[Any]]:
        # The fault points name the two sides of every commit, for the crash tests (kanban/faults.py):
        # killed before it, nothing of the transaction is left; after it, all of it is.
        with self._locked() as conn:
            with conn.transaction(), conn.cursor() as cur:
                yield cur
                fault("pg-before-commit")
            fault("pg-after-commit")

    def _connection_lost(self) -> bool:
        conn = self._conn
        return conn is None or conn.closed or conn.broken

    def close(self) -> None:
        self._closing.set()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if self._heartbeat is not None:
            self._heartbeat.join(timeout=5)
            self._heartbeat = None
        with self._lock:
            if self._conn is not None:
                with contextlib.suppress(Exception):
                    self._conn.close()
                self._conn = None

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
        return _readable(row)

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

    @again
    def journal(self, task_id: str) -> list[dict[str, Any]]:
        """Every journal entry of a task, of all its attempts, in the order written."""
        with self._locked() as conn:
            rows = conn.execute("SELECT seq, fence, entry FROM journal WHERE task_id = %s ORDER BY seq",
                                (task_id,)).fetchall()
        return [dict(row) for row in rows]

    # -- adding -------------------------------------------------------------------------------

    def _deps_of(self, cur: psycopg.Cursor[Any]) -> Callable[[str], list[str]]:
        def deps_of(task_id: str) -> list[str]:
            cur.execute("SELECT depends_on FROM dependencies WHERE task_id = %s", (task_id,))
            return [row["depends_on"] for row in cur.fetchall()]
        return deps_of

    def add(self, fields: dict[str, Any], *, by: str = "cli") -> TaskDoc:
        """Validate `fields` (as in a dropped file) and put the task on the board."""
        title = fields.get("title") if isinstance(fields.get("title"), str) else "task"
        with self._tx() as cur:
            now = cur.execute(f"SELECT {sql.NOW_ISO} AS now").fetchone()["now"]
            doc = normalize(fields, default_id=f"{slugify(title)}-{os.urandom(3).hex()}", now=now, by=by,
                            note="added")
            return self._insert(cur, doc, fixed_id="id" in fields, src=None, by=by, note="added")

    def _insert(self, cur: psycopg.Cursor[Any], doc: TaskDoc, *, fixed_id: bool, src: str | None, by: str,
                note: str) -> TaskDoc:
        """Insert a new task (checked for a dependency cycle) with its event; a generated id that is
        taken is drawn again, a given one is refused."""
        title = doc["title"]
        doc = storable(doc)
        if doc["depends_on"]:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (DEPENDENCY_LOCK,))
            cycle = find_cycle(doc["id"], doc["depends_on"], self._deps_of(cur))
            if cycle:
                raise TaskError(f"depends_on creates a cycle: {' -> '.join(cycle)}")
        for _attempt in range(20):
            cur.execute(sql.INSERT_TASK, row_params(doc))
            if cur.rowcount == 1:
                break
            if fixed_id:
                raise TaskError(f"a task with id '{doc['id']}' already exists")
            doc = {**doc, "id": f"{slugify(title)}-{os.urandom(3).hex()}"}
        else:
            raise BoardError("could not find a free task id")
        if doc["depends_on"]:
            cur.executemany("INSERT INTO dependencies (task_id, depends_on) VALUES (%s, %s)",
                            [(doc["id"], dep) for dep in doc["depends_on"]])
        self._event(cur, {"id": doc["id"], "src": src, "dst": doc["status"], "by": by, "note": note})
        if doc["status"] == "todo":
            cur.execute("SELECT pg_notify(%s, '')", (self.channel,))
        return doc

    # -- claiming and holding -----------------------------------------------------------------

    @again
    def claim(self, agent: str, *, roles: Iterable[str] = (), lease: float | None = None,
              pid: int | None = None, steps_only: bool = False, assigned_only: bool = False) -> TaskDoc | None:
        """Claim the best eligible task for `agent`, or None; its claim.token fences every later write."""
        pid = os.getpid() if pid is None else pid
        params = {"agent": agent, "roles": list(roles), "steps_only": steps_only, "assigned_only": assigned_only,
                  "host": self.host, "boot": self.boot_id, "pid": pid, "pid_started": start_time(pid),
                  "lease": self.lease if lease is None else float(lease)}
        for _ in range(MAX_SET_ASIDE):
            with self._tx() as cur:
                cur.execute(sql.EVENTS_LOCK_SHARED, {"lock": sql.EVENTS_LOCK})
                row = cur.execute(sql.CLAIM, params).fetchone()
                if row is None:
                    return None
                why = unreadable(row)
                if why is None:
                    return row_to_doc(row)
                # Written by hand (another host, anyone with the database): no agent can run it, and
                # left in todo it would be every claimer's first pick, failing each in turn.
                self._set_aside(cur, row, agent, f"set aside at its claim by {agent}: {why}")
        return None  # the rest waits for the next claim

    def _set_aside(self, cur: psycopg.Cursor[Any], row: dict[str, Any], by: str, note: str) -> None:
        """Fail a held row that is no task (rules.unreadable), its run ended, with its event."""
        cur.execute(sql.SET_ASIDE, {"id": row["id"], "why": note})
        self._event(cur, {"id": row["id"], "src": "doing", "dst": "failed", "by": by, "note": note})
        cur.execute(sql.END_RUN, {"outcome": "failed", "token": row["fence"]})

    def _event(self, cur: psycopg.Cursor[Any], values: dict[str, Any]) -> None:
        cur.execute(sql.EVENTS_LOCK_SHARED, {"lock": sql.EVENTS_LOCK})
        cur.execute(sql.EVENT, values)

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
        cur.execute(sql.WRITE, row_params(new))
        if cur.rowcount != 1:
            raise TaskNotFound(f"task {new['id']} is no longer on the board")
        entry = new["history"][-1]
        self._event(cur, {"id": new["id"], "src": entry["from"], "dst": entry["to"], "by": entry["by"],
                          "note": entry["note"]})
        if outcome_token is not None:
            cur.execute(sql.END_RUN, {"outcome": new["status"], "token": outcome_token})
        # Wake the claimers for a new todo, or a done task others depend on. Not for every done
        # task: a NOTIFY serializes commits (about half the commit rate), so it is sent only when
        # it can free work.
        if new["status"] == "todo":
            cur.execute("SELECT pg_notify(%s, '')", (self.channel,))
        elif new["status"] == "done":
            cur.execute("SELECT pg_notify(%s, '') WHERE EXISTS (SELECT 1 FROM dependencies WHERE depends_on = %s)",
                        (self.channel, new["id"]))
        return new

    @again
    def _end(self, task_id: str, token: int, end: Callable[[TaskDoc, str], TaskDoc]) -> TaskDoc:
        """End the claim `token` holds with the rule `end(doc, now)` (kanban/rules.py), now by the database's clock."""
        with self._tx() as cur:
            row = cur.execute(sql.HELD, {"id": task_id, "token": token}).fetchone()
            if row is None:
                raise self._lost(cur, task_id, token)
            return self._write(cur, end(_readable(row), row["now_iso"]), outcome_token=token)

    @again
    def renew(self, task_id: str, token: int, lease: float | None = None) -> TaskDoc:
        with self._tx() as cur:
            row = cur.execute(sql.RENEW, {"id": task_id, "token": token,
                                          "lease": self.lease if lease is None else float(lease)}).fetchone()
            if row is None:
                raise self._lost(cur, task_id, token)
        return _readable(row)

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

    def release(self, task_id: str, token: int, note: str = "released", *, count_attempt: bool = False) -> TaskDoc:
        return self._end(task_id, token, lambda doc, now: rules.ended(doc, "todo", note, now=now,
                                                                       give_back_attempt=not count_attempt))

    @again
    def journal_append(self, task_id: str, token: int, entry: Any) -> int:
        """Append to the task's journal while `token` holds it; ClaimLost once it does not."""
        with self._tx() as cur:
            row = cur.execute(sql.JOURNAL_APPEND, {"id": task_id, "token": token,
                                                   "entry": Jsonb(storable(entry))}).fetchone()
            if row is None:
                raise self._lost(cur, task_id, token)
        return int(row["seq"])

    @again
    def journal_rows(self, task_id: str | None, kind: str, *, agents: Iterable[str] | None = None,
                     name: str | None = None, after: int = 0) -> list[dict[str, Any]]:
        """A task's (None: every task's) journal rows of one kind (message, tool, llm), of `agents`
        (None: every agent's) and, for messages, of one transcript `name`, with a seq above `after`,
        in the order written. Reads are not fenced. Never None: this board keeps the journal."""
        statement = sql.JOURNAL_ROWS if task_id is not None else sql.JOURNAL_ROWS_ALL
        with self._locked() as conn:
            rows = conn.execute(statement, {"id": task_id, "kind": kind, "name": name, "after": int(after),
                                            "agents": None if agents is None else list(agents)}).fetchall()
        return [dict(row) for row in rows]

    @again
    def journal_marks(self, task_id: str) -> list[dict[str, Any]]:
        """Per kind, agent and name of the task's journal rows: {kind, agent, name, rows, last}, one
        statement, no entry read. Never None: this board keeps the journal."""
        with self._locked() as conn:
            return [dict(row) for row in conn.execute(sql.JOURNAL_MARKS, {"id": task_id}).fetchall()]

    @again
    def journal_write(self, task_id: str, token: int, *, kind: str, agent: str, name: str = "",
                      entries: Sequence[Any] = (), set_aside: Callable[[set[str]], str] | None = None) -> str | None:
        """In one transaction fenced by `token` (ClaimLost once it no longer holds the task): with
        `set_aside`, move `agent`'s rows of transcript `name` to the name it picks from the names
        this agent's transcripts of the task have (None if there were no such rows); then append
        `entries` (each scrubbed of secrets) under `name`. Returns the name the rows went to."""
        with self._tx() as cur:
            if cur.execute(sql.JOURNAL_FENCE, {"id": task_id, "token": token}).fetchone() is None:
                raise self._lost(cur, task_id, token)
            moved: str | None = None
            if set_aside is not None:
                names = {row["name"] for row in cur.execute(
                    "SELECT DISTINCT name FROM journal WHERE task_id = %s AND kind = %s AND agent = %s",
                    (task_id, kind, agent)).fetchall()}
                if name in names:
                    moved = set_aside(names)
                    cur.execute("UPDATE journal SET name = %s WHERE task_id = %s AND kind = %s AND agent = %s "
                                "AND name = %s", (moved, task_id, kind, agent, name))
            params = [{"id": task_id, "token": token, "kind": kind, "agent": agent, "name": name,
                       "entry": Jsonb(storable(entry))} for entry in entries]
            if params:
                cur.executemany(sql.JOURNAL_INSERT, params)
        return moved

    @again
    def journal_prune(self, task_ids: Iterable[str], *, dry_run: bool = False) -> dict[str, int]:
        """The finished tasks' journal rows but their model calls, removed in one transaction that
        holds those tasks finished (sql.JOURNAL_PRUNABLE); {tasks, rows, bytes}."""
        ids = [task_id for task_id in task_ids if isinstance(task_id, str)]
        with self._tx() as cur:
            finished = [row["id"] for row in cur.execute(sql.JOURNAL_PRUNABLE, {"ids": ids}).fetchall()]
            size = cur.execute(sql.JOURNAL_PRUNE_SIZE, {"ids": finished}).fetchone()
            if not dry_run and size["rows"]:
                cur.execute(sql.JOURNAL_PRUNE, {"ids": finished})
        return {"tasks": int(size["tasks"]), "rows": int(size["rows"]), "bytes": int(size["bytes"])}

    def task_journal(self, task_id: str, token: int, agent: str, workdir: Path) -> Any:
        """The task's journal in this database, fenced by `token` (kanban/pg/journal.py)."""
        return PgTaskJournal(self, task_id, token, agent, Path(workdir))

    # -- hosts and recovery -------------------------------------------------------------------

    def heartbeat(self) -> None:
        """Say this host is alive (by the database's clock), and what its supervisor says of its
        agents; written by the supervisor, never an agent."""
        self._beat(self._published())

    @again
    def _beat(self, agents: list[Any] | None) -> None:
        with self._locked() as conn:
            conn.execute(sql.HEARTBEAT, {"host": self.host, "boot": self.boot_id,
                                         "agents": None if agents is None else Jsonb(agents)})

    def _published(self) -> list[Any] | None:
        """What announce_host's `agents` says now, stored as jsonb takes it; None when it says
        nothing or fails: the heartbeat (which keeps this host's tasks) never waits on it."""
        source = self._agents
        if source is None:
            return None
        try:
            agents = source()
            return storable(agents[:MAX_PUBLISHED]) if isinstance(agents, list) else None
        except Exception:  # anything: a host that stops beating would lose its tasks
            return None

    def announce_host(self, agents: Callable[[], list[dict[str, Any]]] | None = None) -> None:
        self._agents = agents
        self.start_heartbeat()

    @again
    def host_agents(self) -> list[dict[str, Any]]:
        with self._locked() as conn:
            rows = conn.execute(sql.HOST_AGENTS, {"host_timeout": self.host_timeout, "limit": MAX_HOSTS,
                                                  "max_bytes": MAX_SUMMARY_BYTES}).fetchall()
        return [dict(row) for row in rows]

    def start_heartbeat(self, interval: float | None = None) -> None:
        """Heartbeat from a thread until close(), every `interval` (a sixth of host_timeout)."""
        interval = self.host_timeout / 6 if interval is None else interval
        self.heartbeat()

        def beat() -> None:
            while not self._closing.wait(interval):
                with contextlib.suppress(BoardError):
                    self.heartbeat()

        self._heartbeat = threading.Thread(target=beat, name="board-heartbeat", daemon=True)
        self._heartbeat.start()

    def _elected(self) -> bool:
        """Whether this store is the sweeper: a lease row, so a dead sweeper's turn passes on by itself."""
        holder = f"{self.host}/{self.boot_id}/{os.getpid()}/{id(self)}"
        with self._locked() as conn:
            row = conn.execute(sql.TAKE_LEASE, {"name": SWEEPER, "holder": holder,
                                                "secs": min(self.host_timeout, 10.0)}).fetchone()
        return row is not None

    def _take_back(self, task_id: str, token: int, reason: str, *, check_stale: bool) -> str | None:
        """Return a stale claim to todo (or failed), fenced and, for a sweep, re-checked under the row lock."""
        with self._tx() as cur:
            query = sql.STALE_HELD if check_stale else sql.HELD
            row = cur.execute(query, {"id": task_id, "token": token, "host_timeout": self.host_timeout}).fetchone()
            if row is None:
                return None
            why = unreadable(row)
            if why is not None:  # written by hand meanwhile: no retry can run it either
                self._set_aside(cur, row, "board", f"{reason}; set aside: {why}")
                return "failed"
            doc = row_to_doc(row)
            new = rules.recovered(doc, reason, now=row["now_iso"])
            self._write(cur, new, outcome_token=token)
        return new["status"]

    def recover(self, *, sweep: bool = True) -> list[dict[str, str]]:
        """Take back claims whose holder on this host died (at once), and, when this store is the
        elected sweeper, claims whose lease expired or whose host went silent for host_timeout."""
        self._last_recover = time.monotonic()
        recovered = []
        with self._locked() as conn:
            local = conn.execute(sql.LOCAL_HELD, {"host": self.host, "boot": self.boot_id}).fetchall()
        for row in local:
            pid = row["lease_pid"]
            if isinstance(pid, int) and holder_alive(pid, row["lease_pid_started"], None) is False:
                reason = f"holder {row['lease_owner']} (pid {pid}) is gone"
                to = self._take_back(row["id"], row["fence"], reason, check_stale=False)
                if to:
                    recovered.append({"task": row["id"], "to": to, "reason": reason})
        if sweep and self._elected():
            with self._locked() as conn:
                stale = conn.execute(sql.STALE, {"host_timeout": self.host_timeout}).fetchall()
            for row in stale:
                reason = _stale_reason(row, self.host_timeout)
                to = self._take_back(row["id"], row["fence"], reason, check_stale=True)
                if to:
                    recovered.append({"task": row["id"], "to": to, "reason": reason})
        return recovered

    # -- changes by hand ----------------------------------------------------------------------

    @again
    def move(self, task_id: str, to: str, *, by: str = "cli", note: str = "") -> TaskDoc:
        rules.check_move_target(to)
        with self._tx() as cur:
            row = cur.execute(sql.ANY_ROW_LOCKED, {"id": task_id}).fetchone()
            if row is None:
                raise TaskNotFound(f"no task '{task_id}' on the board")
            doc = _readable(row)
            new = rules.moved(doc, to, by=by, now=row["now_iso"], note=note)
            return self._write(cur, new, outcome_token=row["fence"] if doc.get("claim") else None)

    def cancel(self, task_id: str, *, by: str = "cli") -> TaskDoc:
        rules.check_cancel(self.get(task_id))
        return self.move(task_id, "cancelled", by=by, note="cancelled")

    def retry(self, task_id: str, *, by: str = "cli") -> TaskDoc:
        rules.check_retry(self.get(task_id))
        return self.move(task_id, "todo", by=by, note="retry (attempts reset)")

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
        return _readable(row), row["now_iso"]

    @again
    def mark_waiting(self, reason: str | None, *, needs_llm: bool = True, agent: str | None = None,
                     roles: Iterable[str] = ()) -> int:
        """Say on each todo task (without `steps`, when `needs_llm`) why it is not being worked, or
        clear that note with None; with `agent`, only on the tasks it could claim now. Not a
        transition: no event, no history entry; a note already there is not written again. The
        number of tasks changed."""
        params = {"reason": None if reason is None else storable(str(reason)), "needs_llm": needs_llm,
                  "agent": agent, "roles": list(roles)}
        with self._tx() as cur:
            cur.execute(sql.MARK_WAITING, params)
            return cur.rowcount

    # -- drops --------------------------------------------------------------------------------

    def ingest(self) -> IngestReport:
        """Turn finished files in this host's inbox/ into tasks on the shared board; reject what
        cannot be one into rejected/ with the reason (the file board's rules, kanban/ingest.py)."""
        report = IngestReport()
        if self.drop_root is None:
            return report  # a store without a host folder (a tool, a test) has no inbox
        drops.ensure_layout(self.drop_root)
        found, report.waiting = ready_drops(self.drop_root)
        for path in found:
            try:
                read = read_drop(path)
                if read is not None:
                    self._ingest_one(path, read, report)
            except OSError as exc:
                # A file that cannot be moved must not stop the drops after it; it is tried again next
                # time, and its task, if already written, is found by its fingerprint.
                report.failed.append({"file": f"inbox/{safe_name(path.name)}",
                                      "reason": f"could not be taken: {exc.strerror or exc}; it is tried again "
                                                "on the next ingest"})
        return report

    def _ingest_one(self, path: Path, read: Any, report: IngestReport) -> None:
        assert self.drop_root is not None
        try:
            if identity_of(os.lstat(path)) != read.identity:
                # Rewritten since it was read: what lands on the board is what the file holds now.
                read = read_drop(path)
        except FileNotFoundError:
            return None  # another process of this host took it
        if read is None:
            return None
        if read.reason is not None or read.doc is None:
            return self._reject(path, read.reason or "cannot be read as a task", report)
        rel = f"inbox/{path.name}"
        doc = {**read.doc, "source": {"file": rel, "fingerprint": read.fp}}
        try:
            with self._tx() as cur:
                # Two processes of this host taking the same drop: the second waits here, then sees the
                # first one's task with this file's fingerprint and only archives the file.
                cur.execute("SELECT pg_advisory_xact_lock(hashtext(current_schema()), hashtext(%s))", (doc["id"],))
                row = cur.execute("SELECT document->'source'->>'fingerprint' AS fp FROM tasks WHERE id = %s",
                                  (doc["id"],)).fetchone()
                if row is None:
                    now = cur.execute(f"SELECT {sql.NOW_ISO} AS now").fetchone()["now"]
                    self._insert(cur, landed_at(doc, now), fixed_id=True, src="inbox", by="ingest",
                                 note=f"ingested from {rel}")
                elif row["fp"] != read.fp:
                    raise TaskError(f"a task with id '{doc['id']}' already exists")
                # else: this very file was ingested by a process that died before moving it away
        except TaskError as exc:
            return self._reject(path, str(exc), report)
        drops.archive(self.drop_root, path, doc["id"])
        report.ingested.append(doc["id"])
        return None

    def _reject(self, path: Path, reason: str, report: IngestReport) -> None:
        assert self.drop_root is not None
        name = safe_name(path.name)
        try:
            dest = drops.set_aside(self.drop_root, path, reason)
        except FileNotFoundError:
            return  # another process of this host took it first
        with self._tx() as cur:
            self._event(cur, {"id": name, "src": "inbox", "dst": "rejected", "by": "ingest",
                              "note": storable(reason)})
        report.rejected.append({"file": f"inbox/{name}", "moved_to": f"rejected/{dest.name}", "reason": reason})

    # -- waiting ------------------------------------------------------------------------------

    def listener(self) -> Listener:
        """The store's LISTEN connection, started on first use."""
        with self._lock:
            if self._listener is None:
                self._listener = Listener(lambda: self._connect(listen=True), self.channel, signal=self.signal)
            return self._listener

    def wake(self) -> None:
        """Wake every thread of this process waiting in wait_for_work."""
        self.listener().bump()

    def wait_for_work(self, agent: str, *, roles: Iterable[str] = (), timeout: float | None = None,
                      lease: float | None = None, stop: threading.Event | None = None,
                      steps_only: bool = False, assigned_only: bool = False) -> TaskDoc | None:
        """Claim a task, waiting for one (ingesting this host's drops and recovering dead claims
        meanwhile); None on timeout or when `stop` is set. Woken by NOTIFY,
        and polling about once a second (jittered, so hosts do not poll in step) in case one is lost."""
        def look_after() -> None:
            # Drops into this host's inbox/ land on the shared board with no other process
            # needed (a listing of one folder per round; the file board does it per wake-up).
            self.ingest()
            if recover_due(self._last_recover, time.monotonic()):
                self.recover()

        # The server restarted or the connection dropped: a waiter waits on (the next round
        # reconnects); any other error is the caller's.
        return wait_loop(self.listener(), look_after=look_after,
                         claim=lambda: self.claim(agent, roles=roles, lease=lease, steps_only=steps_only,
                                                  assigned_only=assigned_only),
                         nap=lambda: POLL_INTERVAL * random.uniform(0.8, 1.2), timeout=timeout, stop=stop,
                         tolerate=lambda exc: self._connection_lost())


def _check_text(text: object, what: str) -> None:
    if not isinstance(text, str):
        raise TaskError(f"{what} is text, not {type(text).__name__}")
    size = len(text.encode("utf-8", "backslashreplace"))
    if size > MAX_BYTES:
        raise TaskError(f"{what} is {size} bytes; the limit is {MAX_BYTES} bytes (1 MiB)")


def _stale_reason(row: dict[str, Any], host_timeout: float) -> str:
    if row["why"] == "lease expired":
        return f"lease of {row['lease_owner']} expired"
    if row["why"] == "host restarted":
        return f"host {row['lease_host']} of {row['lease_owner']} restarted"
    return f"host {row['lease_host']} of {row['lease_owner']} sent no heartbeat for {host_timeout:g} s"


def _readable(row: dict[str, Any]) -> TaskDoc:
    """The task document of a row; a BoardError naming the task when it is no task (written by hand:
    rules.unreadable), never a TypeError from the depths of a verb."""
    why = unreadable(row)
    if why is not None:
        raise BoardError(f"task {row['id']}: {why}")
    return row_to_doc(row)


def row_params(doc: TaskDoc) -> dict[str, Any]:
    """A task document as the parameters of its row: the columns, and the rest in `document`."""
    return {"id": doc["id"], "status": doc["status"], "role": doc.get("role"), "assignee": doc.get("assignee"),
            "priority": doc.get("priority", 0), "has_steps": bool(doc.get("steps")),
            "has_deps": bool(doc.get("depends_on")), "attempts": doc.get("attempts", 0),
            "max_attempts": doc["max_attempts"], "claims": doc.get("claims", 0),
            "document": Jsonb(document_part(doc))}


def redact_dsn(text: str, dsn: str) -> str:
    """`text` without the DSN or any password in it (pure): a driver error may quote either."""
    secrets = [dsn]
    try:
        password = conninfo_to_dict(dsn).get("password")
        if password:
            secrets.append(str(password))
    except Exception:
        # Unparsable (open_store refuses such a DSN): no telling which part is the password, so
        # every word of it, and every value after an "=", goes.
        words = dsn.replace("'", " ").split()
        secrets += words + [word.split("=", 1)[1] for word in words if "=" in word]
    if "://" in dsn and "@" in dsn:
        secrets.append(dsn.split("://", 1)[1].rsplit("@", 1)[0])  # user:password of a URL
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, "[redacted]")
    return text
