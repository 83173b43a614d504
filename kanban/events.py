"""`events.jsonl`: the append-only audit log of every board transition, and a tailing reader.

Each line is {at, task, from, to, by, note}. Writers append under the board lock; readers tail the
file from an offset, take only complete lines, and skip (and report) a line that is not JSON.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .fsio import read_complete_lines


def event(at: str, task: str, src: str | None, dst: str | None, by: str, note: str = "") -> dict[str, Any]:
    return {"at": at, "task": task, "from": src, "to": dst, "by": by, "note": note}


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
