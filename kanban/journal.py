"""A task's journal, what resuming it needs (`TaskJournal`), and its files: append-only JSONL in the agent's folder.

A transcript per task (OpenAI messages), the tool-call log and the LLM-call log. Each record is
one write(2) of one line, so a kill can tear at most the last line; reading drops such a line, and
a damaged line anywhere, sets the damage aside in `<file>.damaged` with a note, and never raises.
The agent loop and the steps runner use a task's journal only through `TaskJournal`, so that a
shared backend can keep it where another host resumes the task.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from .fsio import write_atomic
from .logindex import task_records
from .redact import scrub
from .task import now_iso


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
        os.write(self._fd, utf8_line(line))

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
        mine = task_records(self.path, task_id)
        have = {tuple(r.get(k) for k in key) for r in mine}
        for record in task_records(source, task_id):
            if tuple(record.get(k) for k in key) not in have:
                self.append(record)
                mine.append(record)
        return mine

    def repair(self) -> list[str]:
        """Before appending: move a torn last line out to `<file>.damaged` (with a note) so the next
        record starts on a line of its own. Returns the notes. Only the log's end is read: an
        agent's tool_calls.jsonl holds every task it worked, and reading it whole at each task's
        first record made a task's cost grow with the tasks done before it."""
        try:
            with open(self.path, "rb+") as handle:
                cut = _after_last_newline(handle)
                if cut is None:
                    return []
                handle.seek(cut)
                torn = handle.read()
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


def _after_last_newline(handle: BinaryIO, chunk: int = 1 << 16) -> int | None:
    """Where the torn last line of the open file starts: the byte after its last newline (0 if
    it has none); None if the file is empty or ends with a newline. Read from the end, a chunk at a time."""
    end = handle.seek(0, os.SEEK_END)
    if end == 0:
        return None
    handle.seek(end - 1)
    if handle.read(1) == b"\n":  # the usual case: one byte read
        return None
    at = end
    while at > 0:
        start = max(0, at - chunk)
        handle.seek(start)
        data = handle.read(at - start)
        newline = data.rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        at = start
    return 0


def holder_name(name: Any) -> bool:
    """Whether `name`, from a task's history (which a person may edit), can name an agent's folder
    beside ours: one folder name, which the file system can hold (no NUL, encodable, at most 255
    bytes); any other is nobody's (pure)."""
    if not isinstance(name, str) or not name or "/" in name or "\x00" in name or name in (".", ".."):
        return False
    try:
        return len(os.fsencode(name)) <= 255
    except UnicodeError:
        return False


def write_records(path: Path, records: list[dict[str, Any]]) -> None:
    """Replace a transcript whole (compression, a take-over), atomically."""
    write_atomic(path, b"".join(utf8_line(json.dumps(m, ensure_ascii=False)) for m in records))


def utf8_line(line: str) -> bytes:
    """A JSON line as UTF-8. A lone surrogate (a model's '\\ud800', read as JSON) has no UTF-8: it is
    written as its JSON escape, which reads back as the same character (it only occurs in strings)."""
    return (line + "\n").encode("utf-8", "backslashreplace")


def set_aside(path: Path) -> Path:
    """Move a file to the first free `<name>.N` beside it; returns where it went."""
    index = 1
    while path.with_name(f"{path.name}.{index}").exists():
        index += 1
    target = path.with_name(f"{path.name}.{index}")
    os.replace(path, target)
    return target


def attempt_transcript(task_id: str, attempt: int) -> str:
    """The name an attempt's transcript is kept under once a new conversation starts (see `task log`)."""
    return f"{task_id}.attempt-{attempt}.jsonl"


class TaskJournal(Protocol):
    """What resuming one task needs, wherever it is kept: its transcript, its tool calls (the
    steps' progress is their log) and its model calls, this agent's and those of the agents that
    held the task before (named by agent). Reads never raise for damaged records: they are left out,
    with a note."""

    @property
    def label(self) -> str:
        """How notes name the transcript."""
        ...

    def transcript(self) -> Read:
        """The task's messages so far, in order."""
        ...

    def append_message(self, message: dict[str, Any]) -> None:
        """Add one message; durable once it returns as far as one write makes it (a kill tears at most it)."""
        ...

    def replace_transcript(self, records: list[dict[str, Any]]) -> str | None:
        """Replace the transcript whole and atomically (compression, a take-over); the old one is kept,
        under the name returned (None if there was none)."""
        ...

    def set_aside_attempt(self, attempt: int) -> str | None:
        """End the transcript: keep it (for `task log`) under a name that says which attempt it was,
        so the next message starts a new conversation. Returns that name (None if there was none)."""
        ...

    def holder_transcript(self, holder: str) -> Read:
        """The transcript of this task kept by agent `holder` (only read)."""
        ...

    def newest_transcripts(self, holders: Sequence[str]) -> list[str]:
        """Those of `holders` (the latest claim's first) that keep a transcript of this task, the one
        written last first; a tie goes to the one named first. Only read."""
        ...

    def tool_calls(self) -> list[dict[str, Any]]:
        """This agent's tool-call records of the task (started and done), in order."""
        ...

    def append_tool_call(self, record: dict[str, Any]) -> None:
        ...

    def take_tool_calls(self, holder: str, key: tuple[str, ...]) -> list[dict[str, Any]]:
        """The task's tool-call records here, after adding those of `holder` not here yet (told apart
        by the fields of `key`); `holder`'s are only read."""
        ...

    def llm_calls(self, holders: Iterable[str] = ()) -> list[dict[str, Any]]:
        """The task's model-call records, this agent's and those of `holders`."""
        ...

    def append_llm_call(self, record: dict[str, Any]) -> None:
        ...

    def close(self) -> None:
        ...


class FileTaskJournal:
    """A task's journal in files: `transcripts/<task>.jsonl`, `tool_calls.jsonl` and `llm_calls.jsonl`
    in the agent's folder; another agent's are the same files in its folder beside this one."""

    def __init__(self, workdir: Path, task_id: str) -> None:
        self.workdir = workdir
        self.task_id = task_id
        self._name = f"{task_id}.jsonl"
        self._transcript = Journal(workdir / "transcripts" / self._name)
        self._tools = Journal(workdir / "tool_calls.jsonl")
        self._llm = Journal(workdir / "llm_calls.jsonl")

    @property
    def label(self) -> str:
        return self._name

    def _holder(self, holder: str) -> Path:
        if not holder_name(holder):
            raise ValueError(f"{holder!r} is not an agent name")
        return self.workdir.parent / holder

    def transcript(self) -> Read:
        return self._transcript.read()

    def append_message(self, message: dict[str, Any]) -> None:
        self._transcript.append(message)

    def replace_transcript(self, records: list[dict[str, Any]]) -> str | None:
        path = self._transcript.path
        self._transcript.close()
        kept = set_aside(path).name if path.exists() else None
        write_records(path, records)
        return kept

    def set_aside_attempt(self, attempt: int) -> str | None:
        path = self._transcript.path
        self._transcript.close()
        if not path.exists():
            return None
        target = path.with_name(attempt_transcript(self.task_id, attempt))
        if target.exists():  # the same attempt set aside twice (hand-edited history): never overwrite it
            target = set_aside(target)
        os.replace(path, target)
        return target.name

    def holder_transcript(self, holder: str) -> Read:
        return Journal(self._holder(holder) / "transcripts" / self._name).read()

    def newest_transcripts(self, holders: Sequence[str]) -> list[str]:
        found = []
        for rank, holder in enumerate(holders):
            try:
                stat = (self._holder(holder) / "transcripts" / self._name).stat()
            except (OSError, ValueError):
                continue
            if stat.st_size:
                found.append((stat.st_mtime_ns, -rank, holder))
        return [holder for *_order, holder in sorted(found, reverse=True)]

    def tool_calls(self) -> list[dict[str, Any]]:
        return task_records(self._tools.path, self.task_id)

    def append_tool_call(self, record: dict[str, Any]) -> None:
        self._tools.append(record)

    def take_tool_calls(self, holder: str, key: tuple[str, ...]) -> list[dict[str, Any]]:
        return self._tools.take_task_records(self._holder(holder) / "tool_calls.jsonl", self.task_id, key)

    def llm_calls(self, holders: Iterable[str] = ()) -> list[dict[str, Any]]:
        logs = [self._llm.path, *(self._holder(name) / "llm_calls.jsonl" for name in holders)]
        return [record for log in logs for record in task_records(log, self.task_id)]

    def append_llm_call(self, record: dict[str, Any]) -> None:
        self._llm.append(record)

    def close(self) -> None:
        for journal in (self._transcript, self._tools, self._llm):
            journal.close()
