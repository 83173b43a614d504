"""The hand moves every backend derives from its own `move`: cancel and retry, each checked by the rules
(kanban/rules.py) first, so that both backends refuse and record them alike."""

from __future__ import annotations

from typing import Any

from . import rules

TaskDoc = dict[str, Any]


def cancel(store: Any, task_id: str, by: str) -> TaskDoc:
    rules.check_cancel(store.get(task_id))
    return store.move(task_id, "cancelled", by=by, note="cancelled")


def retry(store: Any, task_id: str, by: str) -> TaskDoc:
    rules.check_retry(store.get(task_id))
    return store.move(task_id, "todo", by=by, note="retry (attempts reset)")
