"""An in-process index of the board, so a claim does not list and read every file in todo/.

It is built by one scan of the folders, then kept current by tailing `events.jsonl` (every
transition is logged there under the board lock). It is only a hint: a claim re-reads the chosen
task's file before taking it, and the board rescans when the index finds nothing, so a file moved
by hand or an event lost to a crash costs a rescan, never a wrong claim.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from .rules import claim_order as sort_key
from .task import STATUSES, is_valid_id

Meta = dict[str, Any]
META_FIELDS = ("id", "status", "priority", "created_at", "updated_at", "assignee", "role", "depends_on")


def meta_of(doc: dict[str, Any]) -> Meta:
    meta = {key: doc.get(key) for key in META_FIELDS}
    meta["has_steps"] = bool(doc.get("steps"))
    # A note, not a transition: as of when this task was read, or added (a carried meta: a note
    # written since is learnt at the next rescan, or by the claim that reads the file).
    meta["waiting"] = doc.get("waiting")
    return meta


# What the event of a task added or ingested into todo carries of it (its meta but the id and status the event
# has), so that every claimer need not read the task's file to index it: with 16 agents draining
# a backlog, each new task was read and parsed by all 16. The kinds each must have (a hint checked
# as strictly as a file: anyone who can write the log can write any line, and it is then read).
CARRIED: dict[str, tuple[type, ...]] = {
    "priority": (int,), "created_at": (str,), "updated_at": (str,), "assignee": (str, type(None)),
    "role": (str, type(None)), "depends_on": (list,), "has_steps": (bool,), "waiting": (str, type(None)),
}


def carried(doc: dict[str, Any]) -> dict[str, Any]:
    """What the event of `doc` entering todo carries for the indexes (pure)."""
    meta = meta_of(doc)
    return {key: meta[key] for key in CARRIED}


def carried_meta(record: dict[str, Any], task_id: str) -> Meta | None:
    """The meta an event carries for `task_id`, or None if it carries none that is well formed (pure)."""
    values = record.get("index")
    if not isinstance(values, dict) or values.keys() != CARRIED.keys():
        return None
    for key, kinds in CARRIED.items():
        value = values[key]
        if not isinstance(value, kinds) or (key == "priority" and isinstance(value, bool)):
            return None
    if not all(is_valid_id(dep) for dep in values["depends_on"]):
        return None
    return {"id": task_id, "status": "todo", **values}


class BoardIndex:
    def __init__(self) -> None:
        self.status: dict[str, str] = {}
        self._todo: list[tuple[tuple[int, str, str], str]] = []
        self._meta: dict[str, Meta] = {}
        # What mark_waiting may change, so that it need not walk the whole backlog after every task.
        self.plain: set[str] = set()  # todo tasks without steps (the ones a provider is needed for)
        self.noted: set[str] = set()  # todo tasks that had a waiting note when read

    def clear(self) -> None:
        self.status.clear()
        self._todo.clear()
        self._meta.clear()
        self.plain.clear()
        self.noted.clear()

    def __len__(self) -> int:
        return len(self._todo)

    def set_status(self, task_id: str, status: str) -> None:
        self.status[task_id] = status
        if status != "todo":
            self._drop_todo(task_id)

    def put_todo(self, doc: dict[str, Any]) -> None:
        self.put_meta(meta_of(doc))

    def put_meta(self, meta: Meta) -> None:
        self._keep(meta)
        bisect.insort(self._todo, (sort_key(meta), meta["id"]))

    def put_todos(self, metas: Iterable[Meta]) -> None:
        """Add many todo tasks' metas (meta_of's) at once: one sort, not an insertion each."""
        for meta in metas:
            self._keep(meta)
        self._todo = sorted((sort_key(meta), task_id) for task_id, meta in self._meta.items())

    def _keep(self, meta: Meta) -> None:
        task_id = meta["id"]
        self._drop_todo(task_id)
        self._meta[task_id] = meta
        self.status[task_id] = "todo"
        if not meta["has_steps"]:
            self.plain.add(task_id)
        if meta["waiting"] is not None:
            self.noted.add(task_id)

    def meta(self, task_id: str) -> Meta | None:
        return self._meta.get(task_id)

    def todo_ids(self) -> set[str]:
        return set(self._meta)

    def _drop_todo(self, task_id: str) -> None:
        meta = self._meta.pop(task_id, None)
        self.plain.discard(task_id)
        self.noted.discard(task_id)
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
        """Apply logged transitions; `load_todo(id)` reads a task that entered todo (None if gone),
        unless its event carries its meta (the last such event's, for a task that entered twice)."""
        entered: dict[str, Meta | None] = {}
        for record in records:
            task_id, dst = record.get("task"), record.get("to")
            # Rejections are logged under the file's name, and anyone who can write the log can
            # write any line: only a task id is a task.
            if not is_valid_id(task_id) or dst not in STATUSES:
                continue
            self.set_status(task_id, dst)
            if dst == "todo":
                entered[task_id] = carried_meta(record, task_id)
        for task_id, meta in entered.items():
            if self.status.get(task_id) != "todo":
                continue
            if meta is not None:
                self.put_meta(meta)
                continue
            doc = load_todo(task_id)
            if doc is None or doc.get("status") != "todo":
                self.forget(task_id)
            else:
                self.put_todo(doc)
