"""A whole board copied into the PostgreSQL board in one transaction (`hermes-sup board migrate`).

`importing(store)` opens the transaction and holds off every other writer of the board (every host)
until it ends: what the caller reads through it (`existing`, `marker`) is still so when it
`write`s, and a failure anywhere leaves nothing of the copy behind.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from psycopg.types.json import Jsonb

from ..errors import BoardError
from . import sql
from .rows import one, row_params
from .rules import row_to_doc

if TYPE_CHECKING:
    import psycopg

    from .store import PgStore

TaskDoc = dict[str, Any]
# The one form the board writes times in (task.now_iso): only such a text is cast to timestamptz;
# another would fail the cast (the copy with it) or be stored as some other moment.
CANONICAL_AT = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")

INSERT = """INSERT INTO tasks (id, status, role, assignee, priority, has_steps, has_deps, attempts, max_attempts,
        claims, created, document)
    VALUES (%(id)s, %(status)s, %(role)s, %(assignee)s, %(priority)s, %(has_steps)s, %(has_deps)s, %(attempts)s,
        %(max_attempts)s, %(claims)s, COALESCE(%(created)s::timestamptz, now()), %(document)s::jsonb)
    ON CONFLICT (id) DO NOTHING"""
EVENT = """INSERT INTO events (at, task, src, dst, by, note, record)
    VALUES (COALESCE(%(at)s::timestamptz, now()), %(task)s, %(src)s, %(dst)s, %(by)s, %(note)s, %(record)s)"""
MARKER = """SELECT record FROM events WHERE task = '' AND record->>'event' = %(event)s
    AND record->>'source' = %(source)s ORDER BY cursor DESC LIMIT 1"""


class Target:
    """The board's tables inside the copy's transaction."""

    def __init__(self, cur: psycopg.Cursor[Any], channel: str) -> None:
        self._cur = cur
        self._channel = channel

    def now(self) -> str:
        """The database's clock, as the board writes times."""
        return str(one(self._cur.execute(f"SELECT {sql.NOW_ISO} AS now"))["now"])

    def existing(self, ids: Sequence[str]) -> dict[str, TaskDoc]:
        """The documents of the tasks among `ids` the board already holds."""
        rows = self._cur.execute(f"SELECT {sql.ROW_SELECT} FROM tasks WHERE id = ANY(%s)", (list(ids),)).fetchall()
        return {row["id"]: row_to_doc(row) for row in rows}

    def marker(self, event: str, source: str) -> dict[str, Any] | None:
        """The newest record `event` a copy from `source` left, if any."""
        row = self._cur.execute(MARKER, {"event": event, "source": source}).fetchone()
        return None if row is None else dict(row["record"])

    def write(self, tasks: Sequence[Mapping[str, Any]], events: Sequence[Mapping[str, Any]],
              marker: Mapping[str, Any]) -> None:
        """Insert `tasks` (documents as the board holds them: no claim), their dependencies, `events`
        (rows of supervisor.migrate.event_row, in order) and `marker` last. An id taken meanwhile is a
        BoardError, and the caller's transaction leaves nothing."""
        cur = self._cur
        for doc in tasks:
            cur.execute(INSERT, _params(doc))
            if cur.rowcount != 1:
                raise BoardError(f"task {doc['id']} appeared on the PostgreSQL board during the copy; nothing "
                                 "was copied")
        cur.executemany("INSERT INTO dependencies (task_id, depends_on) VALUES (%s, %s)",
                        [(doc["id"], dep) for doc in tasks for dep in dict.fromkeys(doc.get("depends_on") or ())])
        # One statement for transitions and records alike: each row's cursor follows the log's order.
        cur.executemany(EVENT, [_event_params(event) for event in events])
        cur.execute(EVENT, _event_params({"record": dict(marker), "at": marker.get("at"), "task": "", "src": None,
                                          "dst": None, "by": "supervisor", "note": ""}))
        # A claim's token is new and larger than any earlier token of its task: the file board
        # counted them per task (claims), the database draws them from one sequence.
        highest = max((int(doc.get("claims") or 0) for doc in tasks), default=0)
        if highest > 0:
            cur.execute("SELECT setval('fence_seq', GREATEST((SELECT last_value FROM fence_seq), %s))", (highest,))
        if any(doc["status"] == "todo" for doc in tasks):
            cur.execute("SELECT pg_notify(%s, '')", (self._channel,))


def _at(value: Any) -> str | None:
    """`value` if it is a moment in the board's form, else None (the database's now()): a text of that
    form that is no moment ("2026-13-45T...") would fail the cast, and the whole copy with it."""
    if not isinstance(value, str) or not CANONICAL_AT.fullmatch(value):
        return None
    try:
        datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ")
    except ValueError:
        return None
    return value


def _event_params(event: Mapping[str, Any]) -> dict[str, Any]:
    return {"at": _at(event.get("at")), "task": event["task"],
            "src": event["src"], "dst": event["dst"], "by": event["by"], "note": event["note"],
            "record": None if event["record"] is None else Jsonb(event["record"])}


def _params(doc: Mapping[str, Any]) -> dict[str, Any]:
    return {**row_params(dict(doc)), "created": _at(doc.get("created_at"))}


@contextlib.contextmanager
def importing(store: PgStore) -> Iterator[Target]:
    """One transaction on `store`'s board, every other writer held off (EXCLUSIVE lets readers
    through), committed when the block ends and rolled back when it raises."""
    with store._tx() as cur:
        cur.execute("LOCK TABLE tasks IN EXCLUSIVE MODE")
        # Event cursors are taken under this lock, shared, as every writer of events does (sql.py).
        cur.execute(sql.EVENTS_LOCK_SHARED, {"lock": sql.EVENTS_LOCK})
        yield Target(cur, store.channel)
