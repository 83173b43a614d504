"""PgStore's journal rows (mixed into PgStore): a task's journal in the database, appended fenced by its token."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from psycopg.types.json import Jsonb

from . import sql
from .journal import PgTaskJournal
from .retry import again
from .rows import one
from .rules import storable, storable_text
from .storebase import StoreBase


class JournalRowsMixin(StoreBase):
    """The BoardStore verbs of a task's journal (journal_*, task_journal), for PgStore."""

    @again
    def journal(self, task_id: str) -> list[dict[str, Any]]:
        """Every journal entry of a task, of all its attempts, in the order written."""
        with self._locked() as conn:
            rows = conn.execute("SELECT seq, fence, entry FROM journal WHERE task_id = %s ORDER BY seq",
                                (task_id,)).fetchall()
        return [dict(row) for row in rows]

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
        if set_aside is None and entries:  # what an agent writes as it works: one statement
            with self._one() as conn:
                written = conn.execute(sql.JOURNAL_WRITE, {
                    "id": task_id, "token": token, "kind": kind, "agent": agent, "name": name,
                    "entries": storable_text(list(entries))}).fetchall()
                if not written:
                    with conn.cursor() as cur:
                        raise self._lost(cur, task_id, token)
            return None
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
            size = one(cur.execute(sql.JOURNAL_PRUNE_SIZE, {"ids": finished}))
            if not dry_run and size["rows"]:
                cur.execute(sql.JOURNAL_PRUNE, {"ids": finished})
        return {"tasks": int(size["tasks"]), "rows": int(size["rows"]), "bytes": int(size["bytes"])}

    def task_journal(self, task_id: str, token: int, agent: str, workdir: Path) -> Any:
        """The task's journal in this database, fenced by `token` (kanban/pg/journal.py). The first
        one made for a claim that found the task without journal rows knows it starts empty."""
        empty = self._unjournaled == (task_id, token)
        if empty:
            self._unjournaled = None
        return PgTaskJournal(self, task_id, token, agent, Path(workdir), empty=empty)
