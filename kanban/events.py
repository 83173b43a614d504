"""`events.jsonl`: the append-only log of the board's transitions and the supervisor's events, and its readers.

A board line is {at, task, from, to, by, note}, appended under the board lock; that of a task added
or ingested into todo also carries `index`, what the claimers' indexes keep of it (index.carried). The supervisor's
lines (an agent started, exited, restarted, ...; an alert sent) and the agents' own (a provider
down or up, a budget reached) carry a `kind` ("supervisor", "alert", "agent") and are appended
without the lock, each as one O_APPEND write(2) of a whole line (see append_record), so a slow
board never holds the supervisor up and a line is never interleaved.
Readers tail the file from an offset, take only complete lines, and skip (and report) a line that
is not an event. The `events` command reads it by cursor: the byte offset after a line (see read_since).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .fsio import append_line, open_log, read_complete_lines, record_line
from .index import carried_meta


def event(at: str, task: str, src: str | None, dst: str | None, by: str, note: str = "",
          index: dict[str, Any] | None = None) -> dict[str, Any]:
    """A board event; `index`: what a task entering todo carries for the claimers' indexes (index.carried)."""
    record: dict[str, Any] = {"at": at, "task": task, "from": src, "to": dst, "by": by, "note": note}
    if index is not None:
        record["index"] = index
    return record


@dataclass
class EventTail:
    """Reads the records appended since the last call."""

    path: Path
    offset: int = 0
    bad_lines: list[int] = field(default_factory=list)

    def seek_end(self) -> None:
        try:
            self.offset = self.path.stat().st_size
        except FileNotFoundError:
            self.offset = 0

    def read_new(self) -> list[dict[str, Any]]:
        lines, self.offset = read_complete_lines(self.path, self.offset)
        records = []
        for raw in lines:
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
            except (ValueError, RecursionError):  # anyone who can write the log can write this
                self.bad_lines.append(self.offset)
                continue
            if isinstance(record, dict):
                records.append(record)
        return records


def read_all(path: Path) -> tuple[list[dict[str, Any]], int]:
    """Every readable record and the number of unreadable lines."""
    tail = EventTail(path)
    records = tail.read_new()
    return records, len(tail.bad_lines)


# -- reading by cursor --------------------------------------------------------------------------
#
# A cursor is the byte offset in events.jsonl just after an event's line (0: before the first).
# It is derived from the log itself, so nobody keeps a counter in step with it: the log is only
# ever appended to (a torn last line is closed by the next append, see fsio.AppendLog), so an
# offset never changes meaning, grows with every event, and is found again with one seek.

MAX_EVENT_LINE = 1 << 20  # longer lines are no event the board wrote; skipped unparsed
READ_BLOCK = 1 << 16
EVENT_FIELDS = ("at", "task", "from", "to", "by", "note")
# The fields of the supervisor's and the alerts' events, text or null, and those that are numbers.
KINDS = ("board", "supervisor", "alert", "agent")
OTHER_TEXT = ("at", "kind", "agent", "event", "note", "code", "signal", "why", "reason", "alert", "for", "provider",
              "until", "start")
# What an agent reports beside its task transitions (its provider's circuit breaker, a budget cap),
# for the stream and the alerts: the names alerts know them by.
AGENT_EVENTS = ("provider_down", "provider_up", "budget_reached")
OTHER_NUMBERS = ("pid", "delay", "attempt", "status")


class CursorError(ValueError):
    """A cursor that names no place between two lines of the log."""


def parse_cursor(text: str) -> int:
    """The cursor a user typed, as an offset (pure)."""
    if not text.isascii() or not text.isdigit() or len(text) > 20:
        raise CursorError(f"cursor {text[:40]!r} is not a cursor: give a number printed as `cursor` by `events --json`")
    return int(text)


def check_cursor(path: Path, cursor: int) -> None:
    """Raise CursorError unless `cursor` is 0 or the end of a complete line of the log."""
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if cursor > size:
                raise CursorError(f"cursor {cursor} is past the end of {path.name} ({size} bytes): "
                                  f"it comes from another board or a log that was replaced")
            if cursor and os.pread(handle.fileno(), 1, cursor - 1) != b"\n":
                raise CursorError(f"cursor {cursor} is not at the end of a line of {path.name}")
    except FileNotFoundError:
        if cursor:
            raise CursorError(f"cursor {cursor} is past the end of {path.name} (there is no log yet)") from None


def decode_event(raw: bytes) -> dict[str, Any] | None:
    """The event on one line, its known fields only; None for a line that is not one (pure)."""
    if len(raw) > MAX_EVENT_LINE:
        return None
    try:
        record = json.loads(raw)
    except (ValueError, RecursionError):  # anyone who can write the log can write this
        return None
    return event_fields(record)


def event_fields(record: Any) -> dict[str, Any] | None:
    """A stored record as the event it is, its kind's known fields only; None for one that is no
    event of ours (pure). Every backend hands its events out through this, so they have one shape."""
    if not isinstance(record, dict):
        return None
    kind = record.get("kind", "board")
    if kind == "board":
        if not isinstance(record.get("task"), str):
            return None
        fields = {name: record.get(name) for name in EVENT_FIELDS}
        numbers: dict[str, Any] = {}
    elif kind in KINDS:
        fields = {name: record.get(name) for name in OTHER_TEXT if name in record}
        numbers = {name: record[name] for name in OTHER_NUMBERS if name in record}
        if not isinstance(fields.get("event"), str):
            return None
    else:
        return None
    # Each is written as text or null (a count as a number); anything else (a deep structure, say) is
    # no event of ours, and passing it on would hand a script shapes the stream never promised.
    if not all(value is None or isinstance(value, str) for value in fields.values()):
        return None
    if not all(value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))
               for value in numbers.values()):
        return None
    event = {"kind": kind, **fields, **numbers}
    # A task entering todo: what the claimers' indexes keep of it, when it is well formed (anyone who
    # can write the log can write a line). The supervisor's look at each ingested task reads it.
    if kind == "board" and record.get("index") is not None and carried_meta(record, event["task"]) is not None:
        event["index"] = record["index"]
    return event


def agent_event(at: str, agent: str, name: str, note: str, *, provider: str | None = None,
                until: str | None = None) -> dict[str, Any]:
    """An agent's event (AGENT_EVENTS) for append_record: its provider down (until when) or up again,
    a budget reached (pure)."""
    if name not in AGENT_EVENTS:
        raise ValueError(f"unknown agent event {name!r}; they are {', '.join(AGENT_EVENTS)}")
    return {"at": at, "kind": "agent", "event": name, "agent": agent, "provider": provider, "until": until,
            "note": note}


def append_record(path: Path, record: dict[str, Any]) -> None:
    """Append one event as one write(2) of a whole line to the log's end (O_APPEND), without the board
    lock: the kernel serialises appends to a local file, so it lands whole between the board's lines,
    and the cursor (an offset) stays monotonic. A torn last line (its writer killed mid-write) is
    closed first, as the board's own appends do; racing one of those at worst adds a blank line,
    which readers skip. Raises OSError (a full disk): the caller decides what that costs."""
    line = record_line(record)
    fd = open_log(path)
    try:
        append_line(fd, path.parent, line)
    finally:
        os.close(fd)


@dataclass
class CursorRead:
    events: list[tuple[int, dict[str, Any]]]  # each with the cursor after it
    cursor: int  # where the next read starts
    bad: int  # lines skipped: not JSON, not an event, or too long
    restarted: bool = False  # the log was replaced (by hand) since the cursor: read from 0
    inode: int | None = None  # of the file read, to tell a replaced log on the next call
    why: str = ""  # when restarted, what happened, in the backend's words (a file's path, or none)
    bad_what: str = ""  # what `bad` counts, in the backend's words ("line(s) in events.jsonl"), for a note


def log_marker(path: Path) -> tuple[int, int, int, int] | None:
    """What changes whenever the log at `path` is appended to or replaced: its device, inode, size
    and modification time (one stat, no lock); None while there is no log."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns


def read_since(path: Path, cursor: int, max_events: int = 10_000, inode: int | None = None) -> CursorRead:
    """The complete events after `cursor` (at most `max_events`, so a long log streams in parts);
    a last line still being written is left for the next call. A line too long is skipped without
    holding it in memory. A log shorter than the cursor, or not the file `inode` names (one that was
    read before), was replaced: it is read from its start."""
    found: list[tuple[int, dict[str, Any]]] = []
    bad = 0
    restarted, asked = False, cursor
    try:
        handle = open(path, "rb")  # noqa: SIM115 (closed by the with below; a missing log is no error)
    except FileNotFoundError:
        return CursorRead([], cursor, 0, inode=inode)
    with handle:
        info = os.fstat(handle.fileno())
        size = info.st_size
        if size < cursor or (inode is not None and info.st_ino != inode):
            cursor, restarted = 0, True
        handle.seek(cursor)
        position = cursor
        while position < size and len(found) < max_events:
            raw = handle.readline(min(MAX_EVENT_LINE + 1, size - position))
            if not raw.endswith(b"\n"):
                if position + len(raw) >= size:
                    break  # being written: not an event until its newline arrives
                # Too long: skip to its end without keeping it (if it has one yet).
                end = _skip_line(handle, size)
                if end is None:
                    break
                position, bad = end, bad + 1
                continue
            position += len(raw)
            record = decode_event(raw) if raw.strip() else None
            if record is not None:
                found.append((position, record))
            elif raw.strip():
                bad += 1
    why = f"{path} was replaced (by hand?) since cursor {asked}" if restarted else ""
    return CursorRead(found, position, bad, restarted, info.st_ino, why, f"line(s) in {path.name}")


def _skip_line(handle: Any, size: int) -> int | None:
    """Read on to the end of the current line; its end's offset, or None if it has none yet."""
    while handle.tell() < size:
        block = handle.read(min(READ_BLOCK, size - handle.tell()))
        newline = block.find(b"\n")
        if newline >= 0:
            end = handle.tell() - len(block) + newline + 1
            handle.seek(end)
            return end
    return None
