"""A task's journal (kanban/journal.py's `TaskJournal`) in the shared board's PostgreSQL database, so
that an agent on any host resuming the task continues its conversation and never runs a completed
tool call again.

Rows of the board's `journal` table, each an agent's message, tool-call or model-call record of the
task. Every write is fenced by the claim's token in the same transaction (ClaimLost once the task is
held by another claim, or by nobody): a holder whose host was judged dead writes nothing after the
task moved on. The rows are scrubbed of every known key value before they are stored.

Model calls are written twice: to the agent's own `llm_calls.jsonl`, which keeps what was spent
even when the claim is lost meanwhile, and here, best effort, so a task's token and cost ceilings
count the spending of every host, and `task log` and `usage` show it from any host (`usage` reads
both, each call once). `prune` keeps these rows, as it keeps the files.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

from ..errors import BoardError
from ..journal import Journal, Read, attempt_transcript


class JournalRows(Protocol):
    """The two verbs of the PostgreSQL board this journal is kept with (kanban/pg/store.py)."""

    def journal_rows(self, task_id: str, kind: str, *, agents: Iterable[str] | None = None,
                     name: str | None = None) -> list[dict[str, Any]]: ...

    def journal_write(self, task_id: str, token: int, *, kind: str, agent: str, name: str = "",
                      entries: Any = (), set_aside: Any = None) -> str | None: ...

    def journal_marks(self, task_id: str) -> list[dict[str, Any]]: ...


def next_free(base: str, names: set[str]) -> str:
    """The first `<base>.N` not among `names` (pure): where a replaced transcript is kept."""
    index = 1
    while f"{base}.{index}" in names:
        index += 1
    return f"{base}.{index}"


def attempt_name(task_id: str, attempt: int, names: set[str]) -> str:
    """The name an attempt's transcript is set aside under; never one already used (pure)."""
    name = attempt_transcript(task_id, attempt)
    return name if name not in names else next_free(name, names)


def records(rows: list[dict[str, Any]], label: str) -> Read:
    """Rows as journal records; a row that is no record (written by hand) is left out, with a note (pure)."""
    read = Read()
    for row in rows:
        if isinstance(row.get("entry"), dict):
            read.records.append(row["entry"])
        else:
            read.notes.append(f"{label}: journal row {row.get('seq')} is not a record and is ignored")
    return read


def tool_record(record: dict[str, Any]) -> bool:
    """Whether a tool row's record has the shape the loop reads (pure): a text call id, and a turn,
    status and time that are text or numbers (they are keys of sets and dicts). Another host, or
    anyone with the database, may have written any other, which would end every resuming agent."""
    scalar = (str, int, float, type(None))
    return isinstance(record.get("call_id"), str) and all(
        isinstance(record.get(name), scalar) for name in ("turn", "status", "at"))


ROLES = ("system", "user", "assistant", "tool")


def _call(call: Any) -> bool:
    function = call.get("function") if isinstance(call, dict) else None
    return (isinstance(call.get("id") if isinstance(call, dict) else None, str) and isinstance(function, dict)
            and isinstance(function.get("name"), str) and isinstance(function.get("arguments", ""), str))


def message_record(record: dict[str, Any]) -> bool:
    """Whether a message row's record has the shape the loop reads (pure): a known role, tool calls
    (if any) each with a text id and a function's text name and arguments, a result naming its call
    by text. Another host may have written any other, which would end every resuming agent."""
    calls = record.get("tool_calls")
    return (record.get("role") in ROLES and isinstance(record.get("tool_call_id"), str | None)
            and (calls is None or (isinstance(calls, list) and all(_call(call) for call in calls))))


class PgTaskJournal:
    def __init__(self, store: JournalRows, task_id: str, token: int, agent: str, workdir: Path, *,
                 empty: bool = False) -> None:
        self.store = store
        self.task_id = task_id
        self.token = token
        self.agent = agent
        self._name = f"{task_id}.jsonl"
        self._llm = Journal(workdir / "llm_calls.jsonl")
        # Known to have no row (the claim saw none, and only this claim's token can write one): read
        # nothing back until this journal writes. A task's first read cost a statement each time.
        self._empty = empty

    def _rows(self, kind: str, agents: list[str], name: str | None = None) -> list[dict[str, Any]]:
        return [] if self._empty else self.store.journal_rows(self.task_id, kind, agents=agents, name=name)

    @property
    def label(self) -> str:
        return f"{self._name} (board database)"

    def _write(self, kind: str, entries: list[dict[str, Any]], name: str = "", set_aside: Any = None) -> str | None:
        self._empty = False  # before it is sent: a write that fails may still have landed
        return self.store.journal_write(self.task_id, self.token, kind=kind, agent=self.agent, name=name,
                                        entries=entries, set_aside=set_aside)

    def _messages(self, agent: str) -> Read:
        read = records(self._rows("message", [agent], self._name), self.label)
        kept = [record for record in read.records if message_record(record)]
        if len(kept) < len(read.records):
            read.notes.append(f"{self.label}: {len(read.records) - len(kept)} message(s) of {agent} are not "
                              "messages of ours and are left out")
        read.records = kept
        return read

    def transcript(self) -> Read:
        return self._messages(self.agent)

    def append_message(self, message: dict[str, Any]) -> None:
        self._write("message", [message], self._name)

    def replace_transcript(self, records: list[dict[str, Any]]) -> str | None:
        return self._write("message", list(records), self._name,
                           lambda names: next_free(self._name, names))

    def set_aside_attempt(self, attempt: int) -> str | None:
        return self._write("message", [], self._name, lambda names: attempt_name(self.task_id, attempt, names))

    def holder_transcript(self, holder: str) -> Read:
        return self._messages(holder)

    def newest_transcripts(self, holders: Sequence[str]) -> list[str]:
        # The rows' seq orders the writes of every host: the transcript written last has the highest.
        marks = [] if self._empty else self.store.journal_marks(self.task_id)
        last = {mark["agent"]: mark["last"] for mark in marks
                if mark["kind"] == "message" and mark["name"] == self._name and mark["rows"]}
        found = [(last[holder], -rank, holder) for rank, holder in enumerate(holders) if holder in last]
        return [holder for *_order, holder in sorted(found, reverse=True)]

    def _tools(self, agent: str) -> list[dict[str, Any]]:
        return [record for record in records(self._rows("tool", [agent]),
                                             self.label).records if tool_record(record)]

    def tool_calls(self) -> list[dict[str, Any]]:
        return self._tools(self.agent)

    def append_tool_call(self, record: dict[str, Any]) -> None:
        self._write("tool", [record])

    def take_tool_calls(self, holder: str, key: tuple[str, ...]) -> list[dict[str, Any]]:
        mine = self.tool_calls()
        have = {tuple(r.get(k) for k in key) for r in mine}
        taken = [r for r in self._tools(holder) if tuple(r.get(k) for k in key) not in have]
        if taken:
            self._write("tool", taken)
        return mine + taken

    def llm_calls(self, holders: Iterable[str] = ()) -> list[dict[str, Any]]:
        try:
            rows = self._rows("llm", [self.agent, *holders])
        except BoardError:  # the database away: what this host logged still counts
            return [r for r in self._llm.read().records if r.get("task") == self.task_id]
        return records(rows, self.label).records

    def append_llm_call(self, record: dict[str, Any]) -> None:
        self._llm.append(record)
        # Best effort: the local log has it, and a lost claim is noticed at the next message or
        # tool record, never on the model call's own thread.
        with contextlib.suppress(BoardError):
            self._write("llm", [record])

    def close(self) -> None:
        self._llm.close()
