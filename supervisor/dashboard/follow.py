"""The task drawer's log as it happens: a task's transcript, tool calls and model calls, streamed as
server-sent events the way `task log -f` prints them (same gatherer, same lines, same order).

The agents' journals are plain files they append to (not the board), read again every
FOLLOW_INTERVAL while a drawer is open, as `task log -f` does; who held the task when is read from
the board only when the board's generation says it changed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from hermes_sup.kanban import BoardError, TaskError
from hermes_sup.kanban.reads import generation

from .. import render, taskrecords
from .sse import KEEPALIVE, frame

FOLLOW_INTERVAL = 0.25  # as `task log -f`


async def task_log(runs: Path, board_root: Path, task_id: str,
                   claims: Callable[[], list[tuple[str, str]]]) -> AsyncIterator[bytes]:
    """Every entry of the task's log so far, then each new one; `claims` reads who held it when."""
    gatherer = taskrecords.Gatherer(runs, task_id)
    printed: set[taskrecords.Key] = set()
    held: list[tuple[str, str]] = []
    seen_generation: Any = None
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
        now_generation = await asyncio.to_thread(generation, board_root)
        if now_generation != seen_generation:
            seen_generation = now_generation
            # Removed or being rewritten: the log goes on with what was known.
            with contextlib.suppress(BoardError, TaskError):
                held = await asyncio.to_thread(claims)
        sent = False
        for key, entry in taskrecords.merge_keyed(gatherer.all(), held):
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
