"""PgStore's event stream by cursor, its appends, its watching and its doctor checks (mixed into PgStore).

The cursor is the events table's bigserial: a reader passes each read's `cursor` to the next and
misses or doubles no event, also one committed late with a smaller cursor (sql.EVENTS_BOUND).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any

from psycopg.types.json import Jsonb

from ..errors import BoardError
from ..events import MAX_EVENT_LINE, CursorError, CursorRead, event_fields
from . import sql
from .rows import one
from .rules import storable
from .storebase import StoreBase

# How long an events reader waits for the transitions in flight to end.
EVENTS_WAIT = 5.0
# A writer silent in its transaction for longer than this is stuck (its host frozen, cut off): a
# reader does not queue behind it, holding up every writer after it. Transitions take milliseconds.
STUCK_AFTER = 5.0
LOCK_NOT_AVAILABLE = "55P03"
# An appended record larger than this is refused (OSError), as a disk that cannot take it would.
MAX_RECORD_BYTES = 256 * 1024
LISTEN_READY_WAIT = 5.0
# What events_since's `bad` counts, in the note a reader prints ("N unreadable ... skipped").
BAD_ROWS = "row(s) of the board database's events table"


class StreamMixin(StoreBase):
    """The BoardStore verbs of the event stream, watching and health, for PgStore."""

    # -- the event stream ------------------------------------------------------------------------

    def _events_bound(self) -> int | None:
        """The newest cursor the sequence gave, once its transaction and every smaller one's ended:
        everything up to it that will ever be readable is readable now. None while a writer stuck
        before its commit holds the reader off for longer than EVENTS_WAIT, or has been silent in its
        transaction for longer than STUCK_AFTER."""
        lock = {"lock": sql.EVENTS_LOCK}
        try:
            with self._tx() as cur:
                if one(cur.execute(sql.EVENTS_TRY, lock))["got"]:  # no writer in flight: the usual case
                    return int(one(cur.execute(sql.EVENTS_NEWEST))["newest"])
                # Writers that come after a queued reader queue behind it: none may wait on a stuck one.
                if one(cur.execute(sql.EVENTS_STUCK, {**lock, "secs": STUCK_AFTER}))["stuck"]:
                    return None
                cur.execute(f"SET LOCAL lock_timeout = '{int(EVENTS_WAIT * 1000)}ms'")
                return int(one(cur.execute(sql.EVENTS_BOUND, lock))["bound"])
        except BoardError as exc:
            if getattr(exc, "sqlstate", None) == LOCK_NOT_AVAILABLE:
                return None
            raise

    def events_since(self, cursor: int, *, max_events: int = 10_000, inode: int | None = None) -> CursorRead:
        """The events after `cursor`, oldest first, each with its own cursor (the one to resume from).
        A cursor the sequence never gave (another board's, or one from before the schema was
        recreated) is read from the start (`restarted`); any other waits, however far it is ahead
        of what is readable yet. `inode` is the file board's; it has no meaning here."""
        bound = self._events_bound()
        if bound is None:
            return CursorRead([], cursor, 0)  # nothing that can be delivered yet; the reader asks again
        restarted = not resumable(cursor, bound)
        start = 0 if restarted else int(cursor)
        with self._locked() as conn:  # a new snapshot, taken after every writer below `bound` ended
            rows = conn.execute(sql.EVENTS_SINCE, {"cursor": start, "bound": bound, "max_bytes": MAX_EVENT_LINE,
                                                   "limit": max(1, int(max_events))}).fetchall()
        read = [(int(r["cursor"]), event_fields(_event_of(r))) for r in rows]
        # A row that is no event (another host, or anyone with the database, wrote it) is passed over
        # and counted, as the file board does a bad line, its cursor still spent: the reader resumes
        # after it.
        found = [(at, event) for at, event in read if event is not None]
        end = read[-1][0] if read else start
        why = (f"cursor {cursor} is past the newest event of the board database ({self.dsn_env}): it comes from "
               "another board or one that was recreated" if restarted else "")
        return CursorRead(found, end, len(read) - len(found), restarted=restarted, why=why,
                          bad_what=BAD_ROWS)

    def events_end(self) -> int:
        """The newest committed event's cursor. Not the sequence's: that may be a rolled-back writer's,
        and a crash of the server can give it again to an event a reader resuming there would skip."""
        bound = self._events_bound()
        if bound is None:
            raise BoardError(f"the board database ({self.dsn_env}) has a transition that has not ended for "
                             f"{EVENTS_WAIT:g} s; try again")
        with self._locked() as conn:  # a new snapshot, taken after every writer below `bound` ended
            return int(one(conn.execute(sql.EVENTS_LAST, {"bound": bound}))["last"])

    def events_marker(self) -> Any:
        """The cursor sequence's last value, one statement and no lock (events_end takes the events
        lock exclusively, which writers queue behind): what a reader looking often looks at first."""
        with self._locked() as conn:
            row = one(conn.execute(sql.EVENTS_MARKER))
        return row["seq"], row["last"], row["started"]

    def check_cursor(self, cursor: int) -> None:
        # No wait for the writers in flight: a cursor one of them took is one to resume from.
        with self._locked() as conn:
            newest = int(one(conn.execute(sql.EVENTS_NEWEST))["newest"])
        if not resumable(cursor, newest):
            raise CursorError(f"cursor {cursor} is past the newest event of this board ({newest}): it "
                              "comes from another board or one that was recreated")

    def append_event(self, record: dict[str, Any]) -> None:
        """Store the record whole (jsonb) with the next cursor. A record that cannot be stored is
        an OSError, as a full disk is for the file board: the caller decides what that costs."""
        if not isinstance(record, dict):
            raise OSError(f"an event is a mapping, not {type(record).__name__}")
        clean = storable(record)
        size = len(json.dumps(clean, ensure_ascii=False).encode())
        if size > MAX_RECORD_BYTES:
            raise OSError(f"an event of {size} bytes is larger than the board takes ({MAX_RECORD_BYTES})")
        kind = str(clean.get("kind") or "event")[:64]
        try:
            with self._tx() as cur:
                cur.execute(sql.EVENTS_LOCK_SHARED, {"lock": sql.EVENTS_LOCK})
                cur.execute(sql.RECORD, {"kind": kind, "record": Jsonb(clean)})
        except BoardError as exc:
            raise OSError(str(exc)) from None

    def watch_events(self) -> Callable[[], None] | None:
        # Transitions notify only when they can free work (a NOTIFY per event would halve the
        # commit rate): a follower of the stream reads it on a timer instead.
        return None

    # -- watching and health ---------------------------------------------------------------------

    @property
    def watch_mode(self) -> str:
        # LISTEN wakes claimers at once, but only for work: other changes are seen by polling.
        return "polling" if self._watching else "off"

    def start_watching(self) -> None:
        self.listener()
        self._watching = True

    def hand_over_watch(self, give: Callable[[int], object]) -> None:
        """LISTEN is a socket, closed at once at exit: nothing to give."""

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        # EXCLUSIVE mode lets readers through and holds off every write of every host; this
        # process's own verbs run inside the transaction (a savepoint each) on the same connection.
        with self._tx() as cur:
            cur.execute("LOCK TABLE tasks IN EXCLUSIVE MODE")
            yield

    def exclusive(self) -> contextlib.AbstractContextManager[None]:
        return self._exclusive()

    def quarantine_damaged(self, damaged: Any) -> list[str]:
        # A damaged row (written by hand: rules.unreadable) stays where it is, listed as damaged each
        # time: there is no rejected/ folder to move it to, and another host may still mean to mend it.
        return []

    def health(self) -> list[tuple[str, str, str]]:
        """The database and wake-up checks doctor prints; never the DSN."""
        try:
            with self._locked() as conn:
                version = one(conn.execute("SHOW server_version"))["server_version"]
                # Compared, not subtracted: `now() - heartbeat` fails on a heartbeat written as infinity.
                hosts = conn.execute("SELECT host_id, heartbeat < now() - make_interval(secs => %s::float8) "
                                     "AS silent FROM hosts ORDER BY host_id", (self.host_timeout,)).fetchall()
        except BoardError as exc:
            return [("database", "error", str(exc))]
        checks = [("database", "ok", f"PostgreSQL {version}, schema {self.schema} (DSN from {self.dsn_env})")]
        silent = [row["host_id"] for row in hosts if row["silent"]]
        live = len(hosts) - len(silent)
        if silent:
            checks.append(("hosts", "warn", f"this host is {self.host}; {live} heartbeating, silent for over "
                                            f"{self.host_timeout:g} s: {', '.join(silent)}"))
        else:
            checks.append(("hosts", "ok", f"this host is {self.host}; {live} heartbeating"))
        self.start_watching()
        listener = self.listener()
        if listener.wait_ready(LISTEN_READY_WAIT):
            checks.append(("watcher", "ok", "LISTEN/NOTIFY wakes claimers at once; polling about every second "
                                            "as a fallback"))
        else:
            checks.append(("watcher", "warn", f"no LISTEN connection ({listener.last_error or 'not ready'}): "
                                              "claimers poll about every second"))
        return checks


def resumable(cursor: int, newest: int) -> bool:
    """Whether the events after `cursor` are read on from there, given the newest cursor the sequence
    gave, committed, in flight or rolled back (pure). check_cursor and events_since both ask it, so
    a cursor the one accepts is never read from the start by the other, however far it is ahead of
    what is readable yet."""
    return 0 <= cursor <= newest


def _event_of(row: dict[str, Any]) -> dict[str, Any] | None:
    """An events row as the file board's log line: a transition, or the record appended whole; None
    for a row that is neither (pure): too large, or a record that is no object (an array, a string,
    JSON null, one nested deeper than Python reads), which any host with the credentials can write."""
    if row["oversized"]:
        return None
    if row["has_record"]:
        record = row["record"]
        if not isinstance(record, dict):
            return None
        return {"at": row["at"], **record}
    return {"at": row["at"], "task": row["task"], "from": row["src"], "to": row["dst"], "by": row["by"],
            "note": row["note"]}
