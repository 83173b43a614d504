"""What `hermes-sup board migrate --to postgres` copies, skips or refuses: pure decisions over plain data.

The command (cli/migrate.py) reads the file board and the PostgreSQL board's tasks with the same
ids; `plan_migration` says, without touching either, which tasks are copied, which are already
there with the same content (skipped: a second run is a no-op), and what refuses the whole copy
(an id with other content on the target, a task still held, a task file that cannot be read, a
value the database's columns cannot hold). The events are mapped row by row (`event_row`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ...kanban.pg.rules import document_part, row_to_doc, storable
from ...kanban.task import STATUSES, is_valid_id

TaskDoc = dict[str, Any]

# What the database's columns hold (kanban/pg/schema.py): bigint priority, integer counters.
INT64 = (-(1 << 63), (1 << 63) - 1)
INT32 = (-(1 << 31), (1 << 31) - 1)
# The one timestamp form the board writes (task.now_iso) and PostgreSQL gives back: only a value in
# it goes into a timestamptz column unchanged; any other is kept as text (see event_row).
CANONICAL_AT = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")
# The event that records a copy on the target: a second run copies only the events after it.
MARKER_EVENT = "board_migrated"
SHOWN = 20  # ids named in one message; the rest are counted


@dataclass
class Plan:
    copy: list[TaskDoc] = field(default_factory=list)      # each as the target will hold it
    skipped: list[str] = field(default_factory=list)       # on the target already, same content
    conflicts: list[str] = field(default_factory=list)     # on the target with other content: refuse
    refusals: list[str] = field(default_factory=list)      # what else refuses the whole copy
    altered: list[str] = field(default_factory=list)       # what the copy stores differently (said, not refused)
    events: list[dict[str, Any]] = field(default_factory=list)  # event_row()s, in the log's order
    events_already: int = 0                                 # copied by an earlier run (before its marker)

    @property
    def ok(self) -> bool:
        return not self.conflicts and not self.refusals

    def counts(self, docs: Iterable[Mapping[str, Any]]) -> dict[str, int]:
        found = {status: 0 for status in STATUSES}
        for doc in docs:
            found[doc["status"]] = found.get(doc["status"], 0) + 1
        return found


def is_moment(value: Any) -> bool:
    """Whether `value` is a time in the board's own form that a timestamptz column gives back unchanged
    (pure): "2026-13-45T..." has the form and no moment, and would fail the whole copy."""
    if not isinstance(value, str) or not CANONICAL_AT.fullmatch(value):
        return False
    try:
        datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ")
    except ValueError:
        return False
    return True


def stored_form(doc: Mapping[str, Any]) -> TaskDoc:
    """The document the PostgreSQL board gives back for `doc` once copied (its row: the columns, and
    the rest in `document`, through the same rules the store reads and writes with)."""
    return row_to_doc({
        "id": doc["id"], "status": doc["status"], "attempts": doc.get("attempts", 0), "claims": doc.get("claims", 0),
        "max_attempts": doc["max_attempts"], "priority": doc.get("priority", 0), "role": doc.get("role"),
        "assignee": doc.get("assignee"), "document": storable(document_part(doc)), "fence": None,
    })


def differing(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """The fields whose values differ between two documents, sorted (pure)."""
    return sorted(str(key) for key in set(a) | set(b) if a.get(key, _MISSING) != b.get(key, _MISSING))


_MISSING = object()


def _int_in(value: Any, bounds: tuple[int, int]) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and bounds[0] <= value <= bounds[1]


def unstorable(doc: Mapping[str, Any]) -> str | None:
    """Why the target's columns cannot hold `doc` as it is, or None (pure): the copy is refused rather
    than failing halfway or storing something else."""
    if not is_valid_id(doc.get("id")):
        return "its id is not a task id"
    if not _int_in(doc.get("priority", 0), INT64):
        return "its priority is outside the database's 64-bit range"
    for name in ("attempts", "claims", "max_attempts"):
        if not _int_in(doc.get(name, 0), INT32):
            return f"its {name} is outside the database's 32-bit range"
    if doc.get("max_attempts", 1) < 1:
        return "its max_attempts is below 1"
    if any(not isinstance(dep, str) for dep in doc.get("depends_on") or ()):
        return "its depends_on holds something other than task ids"
    return None


def _named(ids: list[str]) -> str:
    more = f" and {len(ids) - SHOWN} more" if len(ids) > SHOWN else ""
    return ", ".join(ids[:SHOWN]) + more


def plan_migration(tasks: Iterable[Mapping[str, Any]], damaged: Iterable[Mapping[str, str]],
                   existing: Mapping[str, Mapping[str, Any]], events: Iterable[tuple[int, Mapping[str, Any]]],
                   *, events_after: int = 0) -> Plan:
    """What copying `tasks` (the file board's documents) onto a target holding `existing` (its
    documents with the same ids) does. `events` are the file board's (cursor after each, event);
    those up to `events_after` (the cursor an earlier run's marker recorded) were copied then."""
    plan = Plan()
    doing: list[str] = []
    for doc in tasks:
        task_id = str(doc.get("id"))
        if doc.get("status") == "doing":
            doing.append(task_id)
            continue
        why = unstorable(doc)
        if why is not None:
            plan.refusals.append(f"task {task_id!r:.80} cannot be stored in PostgreSQL: {why}")
            continue
        stored = stored_form(doc)
        there = existing.get(task_id)
        if there is not None:
            if dict(there) == stored:
                plan.skipped.append(task_id)
            else:
                plan.conflicts.append(f"{task_id} (differs in {', '.join(differing(there, stored))})")
            continue
        changed = differing(doc, stored)
        if changed:
            plan.altered.append(f"task {task_id}: {', '.join(changed)} stored as PostgreSQL holds it (NUL characters "
                                "and secrets replaced, a missing field as null)")
        plan.copy.append(stored)
    if doing:
        plan.refusals.append(f"{len(doing)} task(s) are in doing: {_named(sorted(doing))}; `hermes-sup board` takes "
                             "back the claims of holders that are gone (to todo), then migrate again")
    bad = sorted(str(entry.get("file") or entry.get("id") or "?") for entry in damaged)
    if bad:
        plan.refusals.append(f"{len(bad)} task file(s) cannot be read: {_named(bad)}; `hermes-sup board` sets them "
                             "aside into kanban/rejected/ with the reason, then migrate again")
    for cursor, event in events:
        if cursor <= events_after:
            plan.events_already += 1
            continue
        plan.events.append(event_row(event))
    return plan


def event_row(event: Mapping[str, Any]) -> dict[str, Any]:
    """One file-board event as the target's events row (pure): a task's transition goes into the
    transition columns when each of them can hold its value unchanged; anything else (the
    supervisor's, an alert's, an agent's event, or a transition with an odd field) is kept whole as
    a record, which the target gives back as it was."""
    event = storable(dict(event))
    at = event.get("at") if is_moment(event.get("at")) else None
    transition = {key: value for key, value in event.items() if key != "kind"}
    if (event.get("kind", "board") == "board" and at is not None and set(transition) == {"at", "task", "from", "to",
                                                                                         "by", "note"}
            and isinstance(event["task"], str) and isinstance(event["by"], str) and isinstance(event["note"], str)
            and all(event[key] is None or isinstance(event[key], str) for key in ("from", "to"))):
        return {"record": None, "at": at, "task": event["task"], "src": event["from"], "dst": event["to"],
                "by": event["by"], "note": event["note"]}
    kind = str(event.get("kind") or "board")[:64]
    return {"record": event, "at": at, "task": "", "src": None, "dst": None, "by": kind, "note": ""}


def marker_record(*, at: str, source: str, inode: int | None, offset: int, tasks: int, events: int) -> dict[str, Any]:
    """The event a copy leaves on the target: which file board (folder and log inode), up to which
    offset of its log, so that a second run copies only later events (pure)."""
    return {"at": at, "kind": "supervisor", "event": MARKER_EVENT, "agent": None,
            "note": f"copied {tasks} task(s) and {events} event(s) from the file board in {source}",
            "source": source, "source_inode": inode, "source_offset": offset}


def marker_offset(marker: Mapping[str, Any] | None, *, source: str, inode: int | None) -> int:
    """Up to which offset of this file board's log an earlier copy took the events: 0 when no
    earlier copy came from this very log (another folder, or a log replaced since) (pure)."""
    if not marker or marker.get("source") != source or marker.get("source_inode") != inode:
        return 0
    offset = marker.get("source_offset")
    return offset if _int_in(offset, (0, INT64[1])) else 0


def switch_hint(dsn_env: str) -> str:
    """The `board:` line hermes.yaml names the PostgreSQL board with once the tasks are there (pure)."""
    return f"board: {{backend: postgres, dsn_env: {dsn_env}}}"
