"""PgStore's `task_ids` (mixed into PgStore): the id of every task, read from the tasks table's
primary key alone, for naming a task by a prefix of its id (kanban/prefix.py). The host's kanban/
folder is never looked at: on this board it holds drops, and perhaps the tasks of a file board the
workspace was migrated from, which are not this board's."""

from __future__ import annotations

from .retry import again
from .storebase import StoreBase


class TaskIdsMixin(StoreBase):
    """The BoardStore verb `task_ids`, for PgStore."""

    @again
    def task_ids(self) -> list[str]:
        # One statement, one snapshot: every task in every status, as of one moment. Sorted here, by
        # code point as the file board sorts, whatever the database's collation.
        with self._locked() as conn:
            rows = conn.execute("SELECT id FROM tasks").fetchall()
        return sorted(str(row["id"]) for row in rows)
