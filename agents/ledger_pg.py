"""The budget ledger in PostgreSQL (agents/ledger.py's `Ledger`), for teams whose hosts share a
board there: a table of holds, the check against the caps and the insert in one transaction that
holds the table's lock, so agents on every host reserve one at a time and never both take the
last dollar.

A hold whose process died on this host is deleted by the next reservation made here; a hold of
another host is trusted until it is older than STALE_HOLD by the database's clock (no call runs that
long), since no host can see another's processes.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from hermes_sup.kanban.liveness import HOST, holder_alive, start_time
from hermes_sup.kanban.pg.schema import check_schema_name

from .budget import Entry, Refusal, utc_day
from .ledger import Hold

STALE_HOLD = 3600.0  # seconds: a reservation of another host older than this is taken as abandoned
SETUP_LOCK = 0x6865726D  # an advisory lock key: hosts creating the tables at once take turns


class PgLedger:
    def __init__(self, dsn: str, *, schema: str = "hermes_sup", host: str = HOST,
                 clock: Callable[[], float] = time.time,
                 alive: Callable[[int, float | None, str | None], bool | None] = holder_alive) -> None:
        self.schema = check_schema_name(schema)
        self.host, self.clock, self.alive = host, clock, alive
        self.pid = os.getpid()
        self.started = start_time(self.pid)
        self._lock = threading.Lock()  # one connection, shared by the agent's threads in turn
        self._conn = psycopg.connect(dsn, autocommit=True, connect_timeout=10)
        table = f'"{self.schema}".budget_holds'
        self._holds, self._said = table, f'"{self.schema}".budget_said'
        with self._conn.transaction():
            self._conn.execute("SELECT pg_advisory_xact_lock(%s)", (SETUP_LOCK,))
            self._conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
            self._conn.execute(f"CREATE TABLE IF NOT EXISTS {table} (id text PRIMARY KEY, agent text NOT NULL, "
                               "task text NOT NULL, day text NOT NULL, amount double precision NOT NULL, "
                               "settled boolean NOT NULL DEFAULT false, host text NOT NULL, pid integer, "
                               "started double precision, at timestamptz NOT NULL DEFAULT now())")
            self._conn.execute(f"CREATE TABLE IF NOT EXISTS {self._said} (key text PRIMARY KEY)")

    def close(self) -> None:
        self._conn.close()

    def _rows(self) -> list[tuple[Any, ...]]:
        return self._conn.execute(
            f"SELECT id, agent, task, day, amount, settled, host, pid, started, "
            f"extract(epoch FROM now() - at) FROM {self._holds}").fetchall()

    def _gone(self, row: tuple[Any, ...]) -> bool:
        _id, _agent, _task, _day, _amount, settled, host, pid, started, age = row
        if settled:
            return False
        if host != self.host:
            return float(age) > STALE_HOLD
        return isinstance(pid, int) and self.alive(pid, started, None) is False

    def reserve(self, *, agent: str, task: str, amount: float,
                check: Callable[[list[Entry]], Refusal | None]) -> Hold | Refusal:
        with self._lock, self._conn.transaction():
            # SHARE ROW EXCLUSIVE conflicts with itself and with writes, not with plain reads: one
            # reserver at a time across hosts, `usage` never waits.
            self._conn.execute(f"LOCK TABLE {self._holds} IN SHARE ROW EXCLUSIVE MODE")
            rows = self._rows()
            gone = [row[0] for row in rows if self._gone(row)]
            if gone:
                self._conn.execute(f"DELETE FROM {self._holds} WHERE id = ANY(%s) AND NOT settled", (gone,))
            entries = [Entry(row[1], row[2], row[3], float(row[4])) for row in rows if row[0] not in gone]
            refusal = check(entries)
            if refusal is not None:
                return refusal
            hold = Hold(uuid.uuid4().hex, agent, task, amount)
            self._conn.execute(f"INSERT INTO {self._holds} (id, agent, task, day, amount, host, pid, started) "
                               "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                               (hold.id, agent, task, utc_day(self.clock()), amount, self.host, self.pid,
                                self.started))
            return hold

    def settle(self, hold: Hold, amount: float) -> None:
        with self._lock:
            self._conn.execute(f"UPDATE {self._holds} SET amount = %s, settled = true WHERE id = %s AND NOT settled",
                               (max(0.0, amount), hold.id))

    def release(self, hold: Hold) -> None:
        with self._lock:
            self._conn.execute(f"DELETE FROM {self._holds} WHERE id = %s AND NOT settled", (hold.id,))

    def entries(self) -> list[Entry]:
        with self._lock:
            rows = self._rows()
        return [Entry(row[1], row[2], row[3], float(row[4])) for row in rows if not self._gone(row)]

    def first_time(self, key: str) -> bool:
        with self._lock:
            cur = self._conn.execute(f"INSERT INTO {self._said} (key) VALUES (%s) ON CONFLICT DO NOTHING", (key,))
            return cur.rowcount == 1
