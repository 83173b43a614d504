"""Append-only JSONL journals in the agent's working directory: a transcript per task (OpenAI
messages), the tool-call log, the LLM-call log. Each record is one write(2) of one line, so a kill
can tear at most the last line; reading drops such a line, and a damaged line anywhere, sets the
damage aside in `<file>.damaged` with a note, and never raises.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hermes_sup.kanban.redact import scrub
from hermes_sup.kanban.task import now_iso


@dataclass
class Read:
    records: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path
        # Transcripts and logs hold what the model and the tools saw: the agent's user's alone.
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._fd: int | None = None

    def append(self, record: dict[str, Any]) -> None:
        if self._fd is None:
            self.repair()
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        # A transcript holds what providers and tools said, an echoed key included: never on disk.
        line = scrub(json.dumps(record, ensure_ascii=False, separators=(",", ":")))
        os.write(self._fd, (line + "\n").encode("utf-8"))

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def read(self) -> Read:
        result = Read()
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return result
        lines = data.split(b"\n")
        torn = lines.pop()  # after the last newline: empty, or a line cut short
        if torn:
            result.notes.append(f"{self.path.name}: the last line was cut short ({len(torn)} bytes) and is ignored")
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):  # a line nested past the recursion limit is as unreadable
                result.notes.append(f"{self.path.name}: line {number} is not JSON and is ignored")
                continue
            if isinstance(record, dict):
                result.records.append(record)
        return result

    def take_task_records(self, source: Path, task_id: str, key: tuple[str, ...]) -> list[dict[str, Any]]:
        """A task's records here, after appending those of another agent's log (`source`) that are
        not here yet, telling records apart by the fields of `key`. The other log is only read."""
        mine = [r for r in self.read().records if r.get("task") == task_id]
        have = {tuple(r.get(k) for k in key) for r in mine}
        for record in Journal(source).read().records:
            if record.get("task") == task_id and tuple(record.get(k) for k in key) not in have:
                self.append(record)
                mine.append(record)
        return mine

    def repair(self) -> list[str]:
        """Before appending: move a torn last line out to `<file>.damaged` (with a note) so the next
        record starts on a line of its own. Returns the notes."""
        try:
            with open(self.path, "rb+") as handle:
                data = handle.read()
                cut = data.rfind(b"\n") + 1
                if cut == len(data):
                    return []
                torn = data[cut:]
                damaged_path = self.path.with_name(self.path.name + ".damaged")
                flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
                with os.fdopen(os.open(damaged_path, flags, 0o600), "ab") as damaged:
                    damaged.write(f"# {now_iso()}: torn last line of {self.path.name} set aside\n".encode())
                    damaged.write(torn + b"\n")
                handle.truncate(cut)
                return [f"{self.path.name}: a torn last line ({len(torn)} bytes) was set aside in "
                        f"{self.path.name}.damaged"]
        except FileNotFoundError:
            return []
