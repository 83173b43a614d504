"""The task drawer's log as it happens: a task's transcript, tool calls and model calls, streamed as
server-sent events the way `task log -f` prints them (same gatherer, same lines, same order).

The agents' journals are plain files they append to, and on a board that keeps the journal in its
database (PostgreSQL) its rows too (another host's agents write only there: a look at their marks,
and only the rows after the newest read when they grew), read again every FOLLOW_INTERVAL while a
drawer is open, as `task log -f` does; who held the task when is read from
the board (through its protocol) only when the end of the board's stream says it changed: every
claim, release and recovery is an event.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from ...kanban import BoardError, TaskError
from ..views import render, taskrecords, timeline
from .sse import KEEPALIVE, frame

FOLLOW_INTERVAL = 0.25  # as `task log -f`
UNREAD = object()  # the stream's end before the first look: unlike any end


async def task_log(runs: Path, task_id: str, claims: Callable[[], list[tuple[str, str]]],
                   stream_end: Callable[[], int], rows: taskrecords.JournalRows | None = None,
                   marks: taskrecords.JournalMarks | None = None) -> AsyncIterator[bytes]:
    """Every entry of the task's log so far, then each new one; `claims` reads who held it when,
    `stream_end` the board stream's end (whose change says the claims may have changed), `rows` the
    journal the board keeps in its database (PostgreSQL: every host's agents write there), if any,
    and `marks` what its rows are (only the new ones are read, when they changed)."""
    gatherer = taskrecords.Gatherer(runs, task_id, rows, marks)
    printed: set[timeline.Key] = set()
    held: list[tuple[str, str]] = []
    seen_end: Any = UNREAD
    first, quiet = True, 0.0
    while True:
        notes = await asyncio.to_thread(gatherer.poll)
        if first:
            gatherer.rewritten.clear()
            first = False
        for source in gatherer.rewritten:  # compressed since: what it holds now was shown already
            count = len(gatherer.raws[source].records)
            printed.update(("message", source.agent, index) for index in range(count))
        gatherer.rewritten.clear()
        try:
            end: Any = await asyncio.to_thread(stream_end)
        except (BoardError, OSError):
            end = seen_end  # the board unreadable just now: the journals go on, the claims as known
        if end != seen_end:
            seen_end = end
            # Removed or being rewritten: the log goes on with what was known.
            with contextlib.suppress(BoardError, TaskError):
                held = await asyncio.to_thread(claims)
        sent = False
        for key, entry in timeline.merge_keyed(gatherer.all(), held):
            if key in printed:
                continue
            printed.add(key)
            sent = True
            yield frame("entry", {"kind": entry.get("kind"), "lines": render.log_lines(entry)})
        for note in notes:
            sent = True
            yield frame("note", {"text": note})
        quiet = 0.0 if sent else quiet + FOLLOW_INTERVAL
        if quiet >= KEEPALIVE:  # lets a closed connection be noticed
            quiet = 0.0
            yield b": keepalive\n\n"
        await asyncio.sleep(FOLLOW_INTERVAL)
