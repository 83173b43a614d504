"""PgStore's hosts and recovery (mixed into PgStore): heartbeats, the elected sweeper, and stale claims taken back."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from psycopg.types.json import Jsonb

from .. import rules
from ..errors import BoardError
from ..liveness import holder_alive
from . import sql
from .retry import again
from .rules import row_to_doc, storable, unreadable
from .storebase import StoreBase

SWEEPER = "sweeper"
MAX_PUBLISHED = 500  # agents of one host published with its heartbeat (a team is far smaller)
MAX_HOSTS = 200  # hosts host_agents reads
# A host's published summary larger than this is read as none: MAX_PUBLISHED agents take a fraction
# of it, and anyone with the database could write one as big as jsonb holds for every page to read.
MAX_SUMMARY_BYTES = 1 << 20


class HostsMixin(StoreBase):
    """The BoardStore verbs heartbeat, announce_host, host_agents and recover, for PgStore."""

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


def _stale_reason(row: dict[str, Any], host_timeout: float) -> str:
    if row["why"] == "lease expired":
        return f"lease of {row['lease_owner']} expired"
    if row["why"] == "host restarted":
        return f"host {row['lease_host']} of {row['lease_owner']} restarted"
    return f"host {row['lease_host']} of {row['lease_owner']} sent no heartbeat for {host_timeout:g} s"
