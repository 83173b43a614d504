"""Pure rules of the PostgreSQL board: a task row to its document and back, and the text
PostgreSQL's jsonb can hold. The board's own rules (a claim's end, recovery, moves) are kanban/rules.py's."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from ..errors import BoardError
from ..redact import scrub
from ..task import TaskError, check_document

TaskDoc = dict[str, Any]
# Held in columns (the claim, the lease, the counters the claim statement changes); the row's
# `document` holds every other field of the task document.
COLUMN_FIELDS = ("status", "attempts", "claims", "claim", "max_attempts", "priority", "role", "assignee")
ROW_COLUMNS = ("id", "status", "attempts", "claims", "max_attempts", "priority", "role", "assignee", "document",
               "lease_owner", "lease_host", "lease_boot", "lease_pid", "lease_pid_started", "claimed_iso",
               "until_iso", "until_ts", "fence")
_BAD_CHARS = re.compile("[\x00\ud800-\udfff]")


def row_to_doc(row: Mapping[str, Any]) -> TaskDoc:
    """The task document of a row (as selected with ROW_SELECT)."""
    doc = dict(row["document"])
    doc.update(id=row["id"], status=row["status"], attempts=row["attempts"], claims=row["claims"],
               max_attempts=row["max_attempts"], priority=row["priority"], role=row["role"],
               assignee=row["assignee"])
    if row["status"] == "doing" and row["fence"] is not None:
        doc["claim"] = {
            "agent": row["lease_owner"], "pid": row["lease_pid"], "pid_started": row["lease_pid_started"],
            "host": row["lease_host"], "boot": row["lease_boot"], "token": row["fence"],
            "claimed_at": row["claimed_iso"], "lease_until": row["until_iso"], "lease_until_ts": row["until_ts"],
        }
    else:
        doc["claim"] = None
    return doc


def document_part(doc: Mapping[str, Any]) -> TaskDoc:
    """What goes in the `document` column: every field the columns do not hold."""
    return {key: value for key, value in doc.items() if key not in COLUMN_FIELDS and key != "id"}


def landed_at(doc: TaskDoc, now: str) -> TaskDoc:
    """A new task's document stamped with the database's `now` (pure): a drop was read, and its
    times set, by a host whose clock may be off; its event is stamped by the database."""
    read_at = doc.get("created_at")
    history = [{**entry, "at": now} if entry.get("at") == read_at else entry for entry in doc.get("history") or []]
    return {**doc, "created_at": now, "updated_at": now, "history": history}


def _clean_text(text: str) -> str:
    return _BAD_CHARS.sub("\ufffd", text)


def _finite(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None


def load_jsonb(data: str | bytes) -> Any:
    """A json/jsonb value as read from the database (pure): a number no float holds (1e400 with a
    fraction: only a row written by hand holds one) is null, never infinity, which no JSON reader
    (a page's JSON.parse) takes and the file board refuses."""
    try:
        return json.loads(data, parse_float=_finite)
    except RecursionError:  # nested deeper than Python reads (the database takes it): no value of ours
        return None


def unreadable(row: Mapping[str, Any]) -> str | None:
    """Why a tasks row cannot be read as a task (pure), or None: its document is no object with a
    title and a history (written by hand, or nested too deep to read), or the task it makes with the
    columns is not one the file board's check_document reads (a depends_on that is a number, a
    history of numbers: any host with the credentials can write them, and every reader of every
    host would fail on them further on); a listing sets it aside as damaged, as the file board does
    a task file it cannot read, rather than fail whole."""
    document = row.get("document")
    if not isinstance(document, dict):
        return "its document in the board database is not an object (written by hand, or nested too deeply)"
    if not isinstance(document.get("title"), str) or not isinstance(document.get("history"), list):
        return "its document in the board database has no title or no history"
    try:
        check_document(row_to_doc(row), file_id=row["id"])
    except TaskError as exc:
        return f"its document in the board database is no task: {exc}"
    return None


def storable_text(value: Any) -> str:
    """storable(value) as JSON text, for a jsonb parameter: one encoding, where storable() and the
    driver's Jsonb took two and a decoding (a journal row, twice a step)."""
    text = scrub(json.dumps(value, ensure_ascii=False))
    if "\\u0000" not in text and not _BAD_CHARS.search(text):
        return text
    return json.dumps(storable(value), ensure_ascii=False)


def storable(value: Any) -> Any:
    """`value` with what jsonb refuses (NUL characters, unpaired surrogates) replaced by U+FFFD,
    and every known secret scrubbed: a task the file board accepts is stored, never refused."""
    text = json.dumps(value, ensure_ascii=False)
    text = scrub(text)
    if "\\u0000" not in text and not _BAD_CHARS.search(text):
        return json.loads(text)

    # Rare: rebuild with the offending characters replaced, without recursion.
    def clean(item: Any) -> Any:
        return _clean_text(item) if isinstance(item, str) else item

    root = json.loads(text)
    stack: list[Any] = [root]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key in list(item):
                child = item.pop(key)
                item[_clean_text(key)] = clean(child)
                if isinstance(child, (dict, list)):
                    stack.append(child)
        elif isinstance(item, list):
            for index, child in enumerate(item):
                item[index] = clean(child)
                if isinstance(child, (dict, list)):
                    stack.append(child)
    return clean(root)


def readable(row: dict[str, Any]) -> TaskDoc:
    """The task document of a row; a BoardError naming the task when it is no task (written by hand:
    rules.unreadable), never a TypeError from the depths of a verb."""
    why = unreadable(row)
    if why is not None:
        raise BoardError(f"task {row['id']}: {why}")
    return row_to_doc(row)
