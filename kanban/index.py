"""An in-process index of the board, so a claim does not list and read every file in todo/.

It is built by one scan of the folders, then kept current by tailing `events.jsonl` (every
transition is logged there under the board lock). It is only a hint: a claim re-reads the chosen
task's file before taking it, and the board rescans when the index finds nothing, so a file moved
by hand or an event lost to a crash costs a rescan, never a wrong claim.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from typing import Any

from .rules import claim_order as sort_key
from .task import STATUSES, is_valid_id

Meta = dict[str, Any]
META_FIELDS = ("id", "status", "priority", "created_at", "updated_at", "assignee", "role", "depends_on")


def meta_of(doc: dict[str, Any]) -> Meta:
    meta = {key: doc.get(key) for key in META_FIELDS}
    meta["has_steps"] = bool(doc.get("steps"))
    return meta


class BoardIndex:
    def __init__(self) -> None:
        self.status: dict[str, str] = {}
        self._todo: list[tuple[tuple[int, str, str], str]] = []
        self._meta: dict[str, Meta] = {}

    def clear(self) -> None:
        self.status.clear()
        self._todo.clear()
        self._meta.clear()

    def __len__(self) -> int:
        return len(self._todo)

    def set_status(self, task_id: str, status: str) -> None:
        self.status[task_id] = status
        if status != "todo":
            self._drop_todo(task_id)

    def put_todo(self, doc: dict[str, Any]) -> None:
        task_id = doc["id"]
        self._drop_todo(task_id)
        meta = meta_of(doc)
        self._meta[task_id] = meta
        self.status[task_id] = "todo"
        bisect.insort(self._todo, (sort_key(meta), task_id))

    def _drop_todo(self, task_id: str) -> None:
        meta = self._meta.pop(task_id, None)
        if meta is None:
            return
        entry = (sort_key(meta), task_id)
        at = bisect.bisect_left(self._todo, entry)
        if at < len(self._todo) and self._todo[at] == entry:
            del self._todo[at]

    def forget(self, task_id: str) -> None:
        self._drop_todo(task_id)
        self.status.pop(task_id, None)

    def todo_in_order(self) -> Iterator[Meta]:
        # A snapshot: callers may change the index while iterating.
        for _key, task_id in list(self._todo):
            meta = self._meta.get(task_id)
            if meta is not None:
                yield meta

    def apply_events(self, records: list[dict[str, Any]], load_todo: Callable[[str], dict[str, Any] | None]) -> None:
        """Apply logged transitions; `load_todo(id)` reads a task that entered todo (None if gone)."""
        entered: list[str] = []
        for record in records:
            task_id, dst = record.get("task"), record.get("to")
            # Rejections are logged under the file's name, and anyone who can write the log can
            # write any line: only a task id is a task.
            if not is_valid_id(task_id) or dst not in STATUSES:
                continue
            self.set_status(task_id, dst)
            if dst == "todo":
                entered.append(task_id)
        for task_id in entered:
            if self.status.get(task_id) != "todo":
                continue
            doc = load_todo(task_id)
            if doc is None or doc.get("status") != "todo":
                self.forget(task_id)
            else:
                self.put_todo(doc)
