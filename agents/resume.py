"""A task's conversation as its transcript keeps it: resumed after a restart, continued from the
agent that held the task before, or started afresh with the older one set aside."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..kanban.journal import Read, TaskJournal
from .conversation import ROLES, begun_since_restart, fresh_start, holders
from .translate import Message


class Transcript:
    """The messages of one task's conversation, each written to the journal before anything acts
    on it. `notes` gathers what the agent's log should say about how it was resumed."""

    def __init__(self, task: dict[str, Any], agent: str, journal: TaskJournal) -> None:
        self.task = task
        self.agent = agent
        self.journal = journal
        # Other agents' working directories sit beside ours: a task reclaimed from one of them
        # continues its conversation, and what they spent on it counts against the ceilings.
        self.earlier, self.others = holders(task, agent)
        self.notes: list[str] = []

    def append(self, messages: list[Message], message: Message) -> None:
        self.journal.append_message(message)
        messages.append(message)

    def _set_aside(self, what: str) -> None:
        # Named by the claim that made it (claims never reset, unlike attempts after a retry).
        kept = self.journal.set_aside_attempt(max(1, int(self.task.get("claims") or 1) - 1))
        if kept:
            self.notes.append(f"started afresh; {what} is kept as {kept}")

    def continue_conversation(self, refuse: Callable[[str, list[Message]], None]) -> None:
        """Continue the conversation this claim takes over: the transcript written last among those
        of the holders since the conversation last started afresh (a holder may have died before
        writing anything, however many in a row). Every one of those holders' tool-call records is
        taken in first, so a call completed by any of them is never run again here."""
        for holder in reversed(self.earlier):
            if holder != self.agent:
                self.journal.take_tool_calls(holder, ("turn", "call_id", "status"))
        for holder in self.journal.newest_transcripts(self.earlier):
            theirs = self.journal.holder_transcript(holder)
            if not theirs.records or not begun_since_restart(self.task, theirs.records):
                continue
            if holder == self.agent:
                return  # ours is the latest: it goes on
            self.take_over(holder, theirs, refuse)
            return
        mine = self.journal.transcript().records
        if mine and (self.agent not in self.earlier or not begun_since_restart(self.task, mine)):
            # None since the last fresh start: a transcript of ours predates it, and it ended badly.
            self._set_aside("an older conversation of ours")

    def take_over(self, previous: str, theirs: Read, refuse: Callable[[str, list[Message]], None]) -> None:
        """Continue the conversation of another agent: copy its transcript (ours, from an older
        attempt, is set aside); its journal is only read. The calls its model asked for and that did
        not run to the end there are answered by `refuse`, not run."""
        self.notes += [f"{previous}: {note}" for note in theirs.notes]
        self.journal.replace_transcript(theirs.records)
        refuse(previous, [r for r in theirs.records if r.get("role") in ROLES])
        self.notes.append(f"continued the conversation of {previous} ({len(theirs.records)} messages)")

    def resume(self, refuse: Callable[[str, list[Message]], None]) -> tuple[list[Message], str | None]:
        """The conversation so far, from the transcript, and why it starts afresh (None when it does
        not): empty if there is none, or if the previous attempt failed or a person retried the task
        (its conversation is set aside: replayed it would end the same way, at a growing price)."""
        why = fresh_start(self.task)
        if why is not None:
            self._set_aside("the previous conversation")
        elif self.earlier:
            self.continue_conversation(refuse)
        read = self.journal.transcript()
        self.notes += read.notes
        # A record that is no message (hand-edited, damaged) is left out, not sent on every call.
        messages = [record for record in read.records if record.get("role") in ROLES]
        if len(messages) != len(read.records):
            self.notes.append(f"transcript {self.journal.label}: skipped "
                              f"{len(read.records) - len(messages)} record(s) that are not messages")
        return messages, why


ATTEMPT_INFIX = ".attempt-"
TRANSCRIPT_SUFFIX = ".jsonl"


def set_aside_attempt(name: str, task_id: str | None = None) -> int | None:
    """The attempt whose conversation a transcript named `<task>.attempt-N.jsonl` holds (the name
    kanban/journal.attempt_transcript gives it when a new conversation starts), or None for any
    other name (pure); with `task_id`, only a transcript of that task."""
    if task_id is None:
        _, found, rest = name.partition(ATTEMPT_INFIX)
    else:
        found, rest = (ATTEMPT_INFIX, name[len(task_id) + len(ATTEMPT_INFIX):]) if name.startswith(
            task_id + ATTEMPT_INFIX) else ("", "")
    number = rest.removesuffix(TRANSCRIPT_SUFFIX)
    if not found or number == rest or not number.isdigit():
        return None
    try:
        return int(number)
    except ValueError:  # digits that int() does not read (superscripts): no name of ours
        return None
