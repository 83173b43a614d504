"""Where each task's lines are in an append-only JSONL log, kept current by reading only what was appended.

An agent's `tool_calls.jsonl` and `llm_calls.jsonl` hold every task it ever worked on, and a task
asks for its own records at every step and every start: reading the whole log each time made a
task's cost grow with the number done before it (2,000 tasks read 2 million lines). The index
remembers, per task, the byte spans of its lines, and on each look reads only the bytes appended
since the last one; a log that shrank or was replaced (another inode) is indexed again from the
start. What it returns is what `Journal.read` would return filtered by task: the same lines parsed
the same way, a torn or damaged line skipped. The records themselves stay on disk (a task's spans
are read again with pread), so the index costs two integers a line, not the records.
"""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

MAX_LOGS = 32  # indexes kept per process (an agent looks at its own two logs, a take-over at a few more)
CHUNK = 1 << 20  # bytes read at a time while catching up


class TaskLineIndex:
    """The spans of one log's lines by their `task` field; `records(task)` catches up first."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._identity: tuple[int, int] | None = None
        self._offset = 0  # everything before this byte is indexed (it ends after a newline)
        self._spans: dict[str, list[tuple[int, int]]] = {}

    def records(self, task_id: str) -> list[dict[str, Any]]:
        """The task's records in the log, in order (none if the log does not exist)."""
        with self._lock:
            try:
                fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                self._reset(None)
                return []
            try:
                self._catch_up(fd)
                return [record for start, length in self._spans.get(task_id, ())
                        if (record := _parse(os.pread(fd, length, start))) is not None]
            finally:
                os.close(fd)

    def _reset(self, identity: tuple[int, int] | None) -> None:
        self._identity, self._offset, self._spans = identity, 0, {}

    def _catch_up(self, fd: int) -> None:
        stat = os.fstat(fd)
        identity = (stat.st_dev, stat.st_ino)
        if identity != self._identity or stat.st_size < self._offset:
            self._reset(identity)
        while self._offset < stat.st_size:
            data = os.pread(fd, min(CHUNK, stat.st_size - self._offset), self._offset)
            end = data.rfind(b"\n") + 1
            if not end:
                if len(data) < CHUNK:  # no newline yet: a torn last line, or one still being written
                    return
                data = _whole_line(fd, self._offset, stat.st_size)
                if not data:
                    return
                end = len(data)
            self._index(data[:end], self._offset)
            self._offset += end

    def _index(self, data: bytes, base: int) -> None:
        start = 0
        while start < len(data):
            stop = data.index(b"\n", start)
            line = data[start:stop]
            if line.strip():
                record = _parse(line)
                task = record.get("task") if record is not None else None
                if isinstance(task, str):
                    self._spans.setdefault(task, []).append((base + start, stop - start))
            start = stop + 1


def _whole_line(fd: int, offset: int, size: int) -> bytes:
    """One line longer than CHUNK, with its newline (or what there is, torn lines included, if none)."""
    parts, at = [], offset
    while at < size:
        part = os.pread(fd, min(CHUNK, size - at), at)
        cut = part.find(b"\n")
        if cut >= 0:
            parts.append(part[:cut + 1])
            return b"".join(parts)
        parts.append(part)
        at += len(part)
    return b""  # torn at the end: nothing to index until a newline follows


def _parse(line: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):  # as Journal.read: a damaged line is skipped
        return None
    return record if isinstance(record, dict) else None


_indexes: OrderedDict[str, TaskLineIndex] = OrderedDict()
_registry_lock = threading.Lock()


def task_records(path: Path, task_id: str) -> list[dict[str, Any]]:
    """A task's records in the JSONL log at `path`, through this process's index of it."""
    key = os.fspath(path)
    with _registry_lock:
        index = _indexes.get(key)
        if index is None:
            index = _indexes[key] = TaskLineIndex(path)
            while len(_indexes) > MAX_LOGS:
                _indexes.popitem(last=False)
        else:
            _indexes.move_to_end(key)
    return index.records(task_id)
