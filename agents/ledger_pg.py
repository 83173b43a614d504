"""The budget ledger in PostgreSQL (agents/ledger.py's `Ledger`), for teams whose hosts share a
board there: a table of holds, the check against the caps and the insert in one transaction that
holds the table's lock, so agents on every host reserve one at a time and never both take the
last dollar.

A hold is dated, and checked against the per-day caps, by the database's clock: hosts' clocks
differ, and near midnight UTC they would put one day's spend on two days.

A hold whose process died on this host is deleted by the next reservation made here. No host can
see another's processes: a hold of another host is deleted once the board's `hosts` row says that
host is gone (silent for host_timeout, or booted since the hold was made, by the database's clock,
as the board takes its tasks back), or else once it is older than STALE_HOLD (no call runs that
long). A call whose hold was deleted meanwhile still settles: its real cost is written all the same.

A reader (`create=False`: `usage`) creates no table: a ledger nobody reserved in yet has none, and
reads as no spend (`missing`). The connection is made at first use and made again when the
server ended it (a restart): a database that is gone fails the one call, never the agent. Errors
never carry the DSN or its password.
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg

from ..kanban import liveness
from ..kanban.liveness import holder_alive, start_time
from ..kanban.pg import boot_id
from ..kanban.pg.schema import check_schema_name
from ..kanban.pg.store import redact_dsn
from .budget import Entry, Refusal, utc_day
from .ledger import Check, Hold, LedgerError

STALE_HOLD = 3600.0  # seconds: a reservation of another host older than this is taken as abandoned
SETUP_LOCK = 0x6865726D  # an advisory lock key: hosts creating the tables at once take turns
# A row's amount as counted: another host (or anyone with the database) may have written a negative
# one, or NaN (greater than every number to PostgreSQL, false in every comparison with a cap to
# Python): either would free budget, so it counts as nothing, as runs/budget.jsonl's reader skips it.
# One near the largest float counts MAX_AMOUNT (past every cap, never low): a few of those would sum
# past it, failing the database's sum (every reservation) or making the spend infinity in Python.
MAX_AMOUNT = 1e15
AMOUNT = f"CASE WHEN amount >= 0 AND amount < 'Infinity'::float8 THEN LEAST(amount, {MAX_AMOUNT:.0f}) ELSE 0 END"
DB_DAY = "to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD')"  # today by the database's clock, as utc_day
_T = TypeVar("_T")


class PgLedger:
    def __init__(self, dsn: str, *, schema: str = "hermes_sup", host: str | None = None, dsn_env: str = "the DSN",
                 host_timeout: float = 30.0, boot: str | None = None,
                 alive: Callable[[int, float | None, str | None], bool | None] = holder_alive,
                 create: bool = True) -> None:
        self.schema = check_schema_name(schema)
        # A reader (`usage`) creates nothing: without the tables nobody has reserved, and it says so.
        self.create = create
        self.missing = False  # (a reader) the ledger's tables are not in the database yet
        self.host, self.alive = host or liveness.HOST, alive  # read now: a forked agent sets its own
        self.host_timeout = float(host_timeout)
        self.boot = boot_id() if boot is None else boot
        self._hosts: str | None = None  # the board's hosts table, once seen (a ledger may have no board)
        self.pid = os.getpid()
        self.started = start_time(self.pid)
        self._dsn, self._dsn_env = dsn, dsn_env
        self._lock = threading.RLock()  # one connection, shared by the agent's threads in turn
        self._conn: psycopg.Connection[Any] | None = None
        self._holds, self._said = f'"{self.schema}".budget_holds', f'"{self.schema}".budget_said'
        self._changes = f'"{self.schema}".budget_changes'

    def __repr__(self) -> str:  # never the DSN
        return f"<PgLedger schema={self.schema} host={self.host}>"

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                with contextlib.suppress(Exception):
                    self._conn.close()
                self._conn = None

    def _setup(self, conn: psycopg.Connection[Any]) -> None:
        hosts = f'"{self.schema}".hosts'
        if not self.create:
            found = conn.execute("SELECT to_regclass(%s) IS NOT NULL, to_regclass(%s) IS NOT NULL",
                                 (self._holds, hosts)).fetchone()
            self.missing = not (found and found[0])
            self._hosts = hosts if found and found[1] else None
            return
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (SETUP_LOCK,))
            conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
            # Drawn by every write of the holds: a reader (the dashboard, ten times a second while a
            # page is open) learns that spend changed from one row, not a scan of a table kept for good.
            conn.execute(f"CREATE SEQUENCE IF NOT EXISTS {self._changes}")
            conn.execute(f"CREATE TABLE IF NOT EXISTS {self._holds} (id text PRIMARY KEY, agent text NOT NULL, "
                         "task text NOT NULL, day text NOT NULL, amount double precision NOT NULL, "
                         "settled boolean NOT NULL DEFAULT false, host text NOT NULL, pid integer, "
                         "started double precision, at timestamptz NOT NULL DEFAULT now())")
            conn.execute(f"ALTER TABLE {self._holds} ADD COLUMN IF NOT EXISTS boot text")
            conn.execute(f"CREATE TABLE IF NOT EXISTS {self._said} (key text PRIMARY KEY)")
            found = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (hosts,)).fetchone()
            self._hosts = hosts if found and found[0] else None

    def _open(self) -> psycopg.Connection[Any]:
        """The ledger's connection, made (and its tables) if there is none or the old one broke."""
        if self._conn is None or self._conn.closed or self._conn.broken:
            self.close()
            conn = psycopg.connect(self._dsn, autocommit=True, connect_timeout=10,
                                   application_name="hermes-sup-ledger")
            try:
                self._setup(conn)
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def _run(self, work: Callable[[psycopg.Connection[Any], list[bool]], _T]) -> _T:
        """`work` on the connection, one thread at a time. A connection the server had ended (a
        restart, a terminated backend) is found broken at the first statement: the work is done once
        more on a new one, unless it had marked (`sent[0] = True`) a write whose outcome is unknown.
        A driver error comes out as LedgerError naming the DSN's variable, never the DSN."""
        with self._lock:
            for last in (False, True):
                sent = [False]
                conn = None
                try:
                    conn = self._open()
                    return work(conn, sent)
                except psycopg.Error as exc:
                    if not last and conn is not None and conn.broken and not sent[0]:
                        continue
                    text = redact_dsn(str(exc), self._dsn).strip()[:300] or type(exc).__name__
                    raise LedgerError(f"the budget ledger's database ({self._dsn_env}) failed: {text}") from None
        raise AssertionError("unreachable")  # the loop returns or raises

    def _rows(self, conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
        """Every open hold, and the settled spend summed per agent, task and day: the caps need no
        more, and a reservation reads a row per task a day, not one per call ever made (the table
        grows with every call and is kept: a total cap counts it for good)."""
        # A host is gone by the board's own test (kanban/pg/sql.py STALE): silent, or a new boot.
        host_gone = (f"COALESCE((SELECT h.heartbeat < now() - make_interval(secs => %(timeout)s::float8) "
                     f"OR h.boot_id IS DISTINCT FROM b.boot FROM {self._hosts} h WHERE h.host_id = b.host), false)"
                     if self._hosts else "false")
        # A hold's age as a difference of epochs, not `now() - at`, which fails the whole statement
        # (every reservation of every host) on an `at` any host may write as 'infinity' or
        # '-infinity': the one is as new as can be, the other as old (freed as abandoned).
        return conn.execute(
            f"SELECT id, agent, task, day, {AMOUNT}, settled, host, pid, started, "
            f"(extract(epoch FROM now()) - extract(epoch FROM at))::float8, {host_gone} FROM {self._holds} b "
            "WHERE NOT settled "
            f"UNION ALL SELECT NULL, agent, task, day, sum({AMOUNT}), true, NULL, NULL, NULL, 0, false "
            f"FROM {self._holds} WHERE settled GROUP BY agent, task, day", {"timeout": self.host_timeout}).fetchall()

    def _gone(self, row: tuple[Any, ...]) -> bool:
        _id, _agent, _task, _day, _amount, settled, host, pid, started, age, host_gone = row
        if settled:
            return False
        if host != self.host:
            return bool(host_gone) or float(age) > STALE_HOLD
        return isinstance(pid, int) and self.alive(pid, started, None) is False

    def reserve(self, *, agent: str, task: str, amount: float, check: Check) -> Hold | Refusal:
        def work(conn: psycopg.Connection[Any], sent: list[bool]) -> Hold | Refusal:
            with conn.transaction():
                # SHARE ROW EXCLUSIVE conflicts with itself and with writes, not with plain reads: one
                # reserver at a time across hosts, `usage` never waits.
                conn.execute(f"LOCK TABLE {self._holds} IN SHARE ROW EXCLUSIVE MODE")
                rows = self._rows(conn)
                gone = [row[0] for row in rows if self._gone(row)]
                if gone:
                    conn.execute(f"DELETE FROM {self._holds} WHERE id = ANY(%s) AND NOT settled", (gone,))
                    self._changed(conn)
                entries = [Entry(row[1], row[2], row[3], float(row[4])) for row in rows if row[0] not in gone]
                # The database's clock dates the hold and the check: every host's clock may be off,
                # and a day's cap split by hosts' clocks near midnight would count a call on two days.
                now = float(conn.execute("SELECT extract(epoch FROM now())::float8").fetchone()[0])
                refusal = check(entries, now)
                if refusal is not None:
                    return refusal
                hold = Hold(uuid.uuid4().hex, agent, task, amount)
                # From here a lost connection may or may not have committed the hold: not done again
                # (a second hold), and the caller makes no call; one that did commit counts high
                # until this process ends, never low.
                sent[0] = True
                conn.execute(f"INSERT INTO {self._holds} (id, agent, task, day, amount, host, pid, started, boot) "
                             "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                             (hold.id, agent, task, utc_day(now), amount, self.host, self.pid,
                              self.started, self.boot))
                self._changed(conn)
                return hold

        return self._run(work)

    def settle(self, hold: Hold, amount: float) -> None:
        """The hold becomes the call's real cost; a hold another host took for abandoned (this host
        silent meanwhile) is written again, settled: money spent is never dropped. Done twice it is
        done once."""
        def work(conn: psycopg.Connection[Any], sent: list[bool]) -> None:
            with conn.transaction():
                cost = max(0.0, amount)
                cur = conn.execute(f"UPDATE {self._holds} SET amount = %s, settled = true WHERE id = %s "
                                   "AND NOT settled", (cost, hold.id))
                if cur.rowcount == 0:
                    conn.execute(f"INSERT INTO {self._holds} (id, agent, task, day, amount, settled, host, pid, "
                                 f"started, boot) VALUES (%s, %s, %s, {DB_DAY}, %s, true, %s, %s, %s, %s) "
                                 "ON CONFLICT (id) DO NOTHING",
                                 (hold.id, hold.agent, hold.task, cost, self.host, self.pid,
                                  self.started, self.boot))
                self._changed(conn)

        self._run(work)

    def release(self, hold: Hold) -> None:
        def work(conn: psycopg.Connection[Any], sent: list[bool]) -> None:
            with conn.transaction():
                conn.execute(f"DELETE FROM {self._holds} WHERE id = %s AND NOT settled", (hold.id,))
                self._changed(conn)

        self._run(work)

    def _changed(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute(f"SELECT nextval('{self._changes}')")

    def version(self) -> int:
        """A number that changes whenever a hold is written, settled, released or freed: one row read
        (0 while no hold was ever written, or no agent made the ledger yet: a read creates nothing)."""
        def work(conn: psycopg.Connection[Any], sent: list[bool]) -> int:
            row = conn.execute("SELECT pg_sequence_last_value(to_regclass(%s))", (self._changes,)).fetchone()
            return int(row[0]) if row and row[0] is not None else 0

        return self._run(work)

    def entries(self) -> list[Entry]:
        rows = self._run(lambda conn, sent: [] if self.missing else self._rows(conn))
        return [Entry(row[1], row[2], row[3], float(row[4])) for row in rows if not self._gone(row)]

    def now(self) -> float:
        """The database's time: hosts' clocks differ, the team's days are the database's."""
        return self._run(lambda conn, sent: float(conn.execute("SELECT extract(epoch FROM now())::float8")
                                                  .fetchone()[0]))

    def first_time(self, key: str) -> bool:
        def work(conn: psycopg.Connection[Any], sent: list[bool]) -> bool:
            sent[0] = True  # a key inserted by a lost first try would read as said: not tried again
            cur = conn.execute(f"INSERT INTO {self._said} (key) VALUES (%s) ON CONFLICT DO NOTHING", (key,))
            return cur.rowcount == 1

        return self._run(work)
