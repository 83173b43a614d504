"""Server-sent events from the board's event cursor: each event with `id:` = its cursor, a fresh
picture of the page after each burst, and resumption from `Last-Event-ID` that loses nothing.
Events are read through the board protocol (events_since, events_end, check_cursor).

The wake-up is inotify on the two files that change when anything the page shows changes
(events.jsonl: every transition; supervisor.json: every agent start, exit, restart), watched only
while a client is connected. Events are a wake-up, not the truth: the log is read by cursor after
each, and once every SAFETY_RECHECK seconds on its own. The picture is built once per change of
the board's generation and shared by every client.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from hermes_sup.kanban import BoardStore
from hermes_sup.kanban.events import CursorError, parse_cursor
from hermes_sup.kanban.reads import generation

SAFETY_RECHECK = 10.0  # seconds: events are a wake-up; the log is read this often without one
KEEPALIVE = 15.0  # a comment line this often lets a dead connection be noticed and closed
WATCHED = frozenset({"events.jsonl", "supervisor.json"})
RETRY_MS = 1000  # how soon a browser reconnects after the stream breaks


def frame(event: str, data: Any, cursor: int | None = None) -> bytes:
    """One server-sent event (pure). JSON without indent has no raw newline, so `data` is one line."""
    lines = [] if cursor is None else [f"id: {cursor}"]
    lines += [f"event: {event}", "data: " + json.dumps(data, separators=(",", ":"), default=str)]
    return ("\n".join(lines) + "\n\n").encode()


def resume_cursor(last_event_id: str | None, board: BoardStore) -> int | None:
    """The cursor a reconnecting client resumes after, or None for a fresh start (no id, or one
    this log never gave: from another board, or the log was replaced)."""
    if not last_event_id:
        return None
    try:
        cursor = parse_cursor(last_event_id.strip())
        board.check_cursor(cursor)
    except CursorError:
        return None
    return cursor


class Hub:
    """The clients' shared wake-up and picture. `build` makes the picture (reads the board)."""

    def __init__(self, board: BoardStore, runs: Path, build: Callable[[], dict[str, Any]]) -> None:
        self.board = board  # read by cursor through the protocol (events_since), from worker threads
        self.board_root = Path(board.root)
        self.runs = runs
        self.build = build
        self.generation = 0
        self.clients = 0
        self.builds = 0  # how many pictures were built: the "reads only when changed" test reads it
        self.turns = 0  # how many times a stream looked for news (woken, or on its own)
        self._events: set[asyncio.Event] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._observer: Any = None
        self._picture: tuple[Any, dict[str, Any]] | None = None
        self._lock = threading.Lock()

    # -- the wake-up ------------------------------------------------------------------------------

    def _bump(self) -> None:
        self.generation += 1
        for event in self._events:
            event.set()

    def changed(self) -> None:
        """Called from the watcher's thread."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._bump)

    async def wait(self, seen: int, timeout: float) -> bool:
        """Until the generation differs from `seen`; False on timeout."""
        if self.generation != seen:
            return True
        event = asyncio.Event()
        self._events.add(event)
        try:
            await asyncio.wait_for(event.wait(), timeout)
            return True
        except TimeoutError:
            return False
        finally:
            self._events.discard(event)

    def _start_watching(self) -> None:
        from watchdog.events import FileCreatedEvent, FileModifiedEvent, FileMovedEvent, FileSystemEventHandler
        from watchdog.observers import Observer

        hub = self

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event: Any) -> None:
                path = getattr(event, "dest_path", "") or event.src_path
                if os.path.basename(os.fsdecode(path)) in WATCHED:
                    hub.changed()

        observer = Observer()
        kinds = [FileCreatedEvent, FileModifiedEvent, FileMovedEvent]
        for folder in (self.board_root, self.runs):
            if folder.is_dir():
                observer.schedule(Handler(), str(folder), recursive=False, event_filter=kinds)
        observer.daemon = True
        observer.start()
        self._observer = observer

    def _stop_watching(self) -> None:
        observer, self._observer = self._observer, None
        if observer is not None:
            observer.stop()  # its thread ends on its own (a daemon): nothing here waits for it

    # Both run on the event loop without awaiting anything: a client's stream is cancelled when it
    # disconnects, and an await in its `finally` would be cancelled too, leaving the watcher running.
    def join(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.clients += 1
        if self.clients == 1:
            self._start_watching()

    def leave(self) -> None:
        self.clients -= 1
        if self.clients == 0:
            self._stop_watching()

    # -- the picture ------------------------------------------------------------------------------

    def _key(self) -> Any:
        try:
            info = os.stat(self.runs / "supervisor.json")
            state = (info.st_ino, info.st_size, info.st_mtime_ns)
        except OSError:
            state = None
        return generation(self.board_root), state

    def picture(self) -> dict[str, Any]:
        """The page's picture, built again only when the board or the supervisor's state changed."""
        with self._lock:
            key = self._key()
            if self._picture is None or self._picture[0] != key:
                self.builds += 1
                self._picture = (key, self.build())
            return self._picture[1]

    # -- one client's stream ----------------------------------------------------------------------

    async def stream(self, last_event_id: str | None) -> AsyncIterator[bytes]:
        """One client's frames: the events after its Last-Event-ID (if this log gave it), then the
        picture, then each new event and picture as they come, until the client goes."""
        self.join()
        try:
            yield f"retry: {RETRY_MS}\n\n".encode()
            cursor = await asyncio.to_thread(resume_cursor, last_event_id, self.board)
            inode = None
            if cursor is None:
                if last_event_id:
                    yield frame("reset", {"reason": "unknown Last-Event-ID: starting afresh"})
                cursor = await asyncio.to_thread(self.board.events_end)
            else:
                cursor, inode = await self._events_since(cursor, inode, out := [])
                for chunk in out:
                    yield chunk
            shown: Any = None
            while True:
                self.turns += 1
                seen = self.generation
                out = []
                cursor, inode = await self._events_since(cursor, inode, out)
                for chunk in out:
                    yield chunk
                picture = await asyncio.to_thread(self.picture)
                if picture is not shown:
                    shown = picture
                    yield frame("snapshot", picture, cursor)
                if not await self.wait(seen, min(SAFETY_RECHECK, KEEPALIVE)):
                    yield b": keepalive\n\n"
        finally:
            self.leave()

    async def _events_since(self, cursor: int, inode: int | None, out: list[bytes]) -> tuple[int, int | None]:
        """Every event after `cursor` as frames into `out`; the new cursor and the log's inode."""
        while True:
            batch = await asyncio.to_thread(functools.partial(self.board.events_since, cursor, max_events=1000,
                                                              inode=inode))
            if batch.restarted:  # in the backend's words: a file board names its log, PostgreSQL its database
                why = batch.why or "the event log was replaced"
                out.append(frame("reset", {"reason": f"{why}; reading it from its start"}))
            inode = batch.inode
            for end, record in batch.events:
                out.append(frame("event", {"cursor": end, **record}, end))
            if batch.cursor == cursor:
                return cursor, inode
            cursor = batch.cursor
