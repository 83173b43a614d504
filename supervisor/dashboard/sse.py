"""Server-sent events from the board's event cursor: each event with `id:` = its cursor, a fresh
picture of the page after each burst, and resumption from `Last-Event-ID` that loses nothing.
Every read of the board goes through its protocol (events_since, events_marker, events_end,
check_cursor, watch_events), so the page works the same over the file board and PostgreSQL.

The wake-up, watched only while a client is connected: the board's own watch of its stream
(watch_events: inotify on the file board), or where it has none (PostgreSQL) a look at the stream's
end (its lock-free marker first: see StreamEnd) and the budget ledger's version every
POLL_INTERVAL, and at the other hosts' heartbeats every HOSTS_LOOK; and inotify on the workspace's
own files the page shows (runs/supervisor.json: every agent start, exit, restart; the budget
ledger; each agent's saved breakers). Wake-ups are not the truth: the picture's key (the stream's
end, the ledger's version, the hosts' heartbeats, those files' states) is looked at after each, and
once every SAFETY_RECHECK seconds on its own.

One publisher for all clients: at each look it builds and serializes the picture, only when its key
changed, and publishes it; each client then reads the log by cursor from where it is and is sent
the newest picture, the very bytes every other client is sent. A client slower than the changes is
kept nothing but its place: when it takes frames again it gets every event it missed and the
picture published last, never those in between.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...agents.ledger import LEDGER_FILE
from ...agents.providers import BREAKERS_FILE
from ...kanban import BoardError, BoardStore
from ...kanban.events import CursorError, parse_cursor
from ..readers import track_reader
from ..statefile import SUPERVISOR_FILE
from .picture import serialize

SAFETY_RECHECK = 10.0  # seconds: events are a wake-up; the key is looked at this often without one
HELD_RECHECK = 10.0  # seconds: how stale a picture with a held task may grow (its lease left)
POLL_INTERVAL = 0.1  # seconds between looks at the stream's end on a board that cannot watch it (PostgreSQL)
HOSTS_LOOK = 1.0  # seconds between looks at the other hosts' heartbeats (a shared board), while a page is open
KEEPALIVE = 15.0  # a comment line this often lets a dead connection be noticed and closed
MAX_AGENT_WATCHES = 256  # agents' folders watched for their breakers (each an inotify watch; the rest: rechecked)
WATCHED = frozenset({SUPERVISOR_FILE, LEDGER_FILE})  # in runs/ (the board is watched through its protocol)
RETRY_MS = 1000  # how soon a browser reconnects after the stream breaks
log = logging.getLogger("hermes_sup.dashboard")


def frame(event: str, data: Any, cursor: int | None = None) -> bytes:
    """One server-sent event (pure). JSON without indent has no raw newline, so `data` is one line."""
    lines = [] if cursor is None else [f"id: {cursor}"]
    lines += [f"event: {event}", "data: " + json.dumps(data, separators=(",", ":"), default=str)]
    return ("\n".join(lines) + "\n\n").encode()


def file_state(path: Path) -> tuple[int, int, int] | None:
    """What changes when a file is replaced or written (its inode, size, modification time)."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_ino, info.st_size, info.st_mtime_ns


def agent_folders(runs: Path) -> list[Path]:
    """The agents' folders in runs/ (not symlinks: a planted link leads the watch nowhere else)."""
    try:
        return sorted(path for path in runs.iterdir() if path.is_dir() and not path.is_symlink())
    except OSError:
        return []


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


def known_end(marker: Any, known: tuple[Any, int] | None) -> int | None:
    """The stream's end already read when the stream's marker is the one read before it, else None:
    read it again (pure). A marker that could not be read (None) matches nothing."""
    return known[1] if known is not None and marker is not None and known[0] == marker else None


class StreamEnd:
    """The board stream's end for a reader that looks often (the follower, an open drawer): a look at
    the board's cheap `events_marker` (no lock), and `events_end` (on PostgreSQL the events lock,
    taken exclusively: writers queue behind it) only when the marker changed since the last end
    read, or that read failed. Raises what events_end raises."""

    def __init__(self, board: BoardStore) -> None:
        self.board = board
        self._known: tuple[Any, int] | None = None
        self._lock = threading.Lock()

    def __call__(self) -> int:
        try:
            marker = self.board.events_marker()  # before the end: an event after it changes it
        except (BoardError, OSError):
            marker = None
        with self._lock:
            end = known_end(marker, self._known)
        if end is not None:
            return end
        end = self.board.events_end()
        with self._lock:
            self._known = None if marker is None else (marker, end)
        return end


class Beacon:
    """A count that only grows, and waiting on the event loop until it moves past one seen."""

    def __init__(self) -> None:
        self.number = 0
        self._waiters: set[asyncio.Event] = set()

    def bump(self) -> None:
        self.number += 1
        for waiter in self._waiters:
            waiter.set()

    async def wait(self, seen: int, timeout: float) -> bool:
        """Until the number differs from `seen`; False on timeout."""
        if self.number != seen:
            return True
        waiter = asyncio.Event()
        self._waiters.add(waiter)
        try:
            await asyncio.wait_for(waiter.wait(), timeout)
            return True
        except TimeoutError:
            return False
        finally:
            self._waiters.discard(waiter)


@dataclass(frozen=True, eq=False)
class Picture:
    """One picture as built for a key: its JSON (sent to every client as it is, never copied per
    client) and what the next look needs of it; the picture's dict itself is not kept."""

    data: bytes
    key: Any
    held: bool  # a task is held: its lease left is shown, and a renewal is no event
    built_at: float


class Hub:
    """The clients' shared wake-up and picture. `build` makes the picture (reads the board), given
    what `hosts` read of the other hosts for the key."""

    def __init__(self, board: BoardStore, runs: Path, build: Callable[[Any], dict[str, Any]],
                 spend: Callable[[], Any] = lambda: None,
                 hosts: Callable[[], tuple[Any, Any]] = lambda: (None, None)) -> None:
        self.board = board  # read through the protocol alone, from worker threads
        self.runs = runs
        self.build = build
        self.end = StreamEnd(board)
        self.spend = spend  # the budget ledger's version where no file shows it (PostgreSQL), else None
        # Other hosts' heartbeats (their agents come with them), on a shared board: what the key
        # compares, and the rows themselves for the build.
        self.hosts = hosts
        self.clients = 0
        self.builds = 0  # how many pictures were built: the "reads only when changed" test reads it
        self.turns = 0  # how many times the publisher looked for news (woken, or on its own)
        self.touched = 0  # changes no key shows (a comment made here): each one builds the picture again
        self.latest: Picture | None = None  # the one published last, while a client is connected
        self._woken = Beacon()  # something the page shows may have changed
        self._published = Beacon()  # `latest` is a new picture
        self._loop: asyncio.AbstractEventLoop | None = None
        self._observer: Any = None
        self._follower: threading.Event | None = None  # set to end the thread that follows the stream
        self._publisher: asyncio.Task[None] | None = None
        self._picture: Picture | None = None
        self._lock = threading.Lock()

    # -- the wake-up ------------------------------------------------------------------------------

    @property
    def generation(self) -> int:
        """How many times the hub was woken."""
        return self._woken.number

    def _bump(self) -> None:
        self._woken.bump()

    def _wake(self) -> None:
        """Called from a watcher's thread: something the page shows may have changed."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # closed just now: the server is stopping
                loop.call_soon_threadsafe(self._bump)

    def changed(self) -> None:
        """Called after this process changed the board (an action): the picture is built again even
        when the change is one the stream does not show (a comment)."""
        self.touched += 1  # on the event loop, never blocked by a picture being built (under _lock)
        self._wake()

    async def wait(self, seen: int, timeout: float) -> bool:
        """Until the generation differs from `seen`; False on timeout."""
        return await self._woken.wait(seen, timeout)

    def _stream_end(self) -> Any:
        """The board stream's end through the protocol; a marker when it cannot be had just now."""
        try:
            return self.end()
        except (BoardError, OSError) as exc:
            return ("unreadable", type(exc).__name__)

    def _follow_board(self, halt: threading.Event, watched: bool) -> None:
        """Wake the streams whenever the board's stream grows (or, on a board whose budget ledger is in
        its database, the spend changes): at the board's own signal where it watches its stream, else
        at each look every POLL_INTERVAL; and when another host's heartbeat (its agents) changed, at a
        look every HOSTS_LOOK. Runs in a thread of its own until `halt` is set."""
        signal = self.board.signal
        last = self._stream_end(), self.spend()
        hosts, hosts_at = self.hosts()[0], time.monotonic()
        while not halt.is_set():
            seen = signal.generation
            end = self._stream_end(), self.spend()
            if time.monotonic() - hosts_at >= HOSTS_LOOK:  # they beat every few seconds: no need for more
                now = self.hosts()[0]
                hosts_at = time.monotonic()
                if now != hosts:
                    hosts = now
                    self._wake()
            if end != last:
                last = end
                self._wake()
            signal.wait(seen, SAFETY_RECHECK if watched else POLL_INTERVAL)

    def _start_watching(self) -> None:
        from watchdog.events import FileCreatedEvent, FileModifiedEvent, FileMovedEvent, FileSystemEventHandler
        from watchdog.observers import Observer

        hub = self

        class Handler(FileSystemEventHandler):
            def __init__(self, names: frozenset[str]) -> None:
                self.names = names

            def on_any_event(self, event: Any) -> None:
                path = getattr(event, "dest_path", "") or event.src_path
                if os.path.basename(os.fsdecode(path)) in self.names:
                    hub._wake()

        observer = Observer()
        if self.runs.is_dir():
            observer.schedule(Handler(WATCHED), str(self.runs), recursive=False,
                              event_filter=[FileCreatedEvent, FileModifiedEvent, FileMovedEvent])
            # Each agent saves its breakers by a rename: its folder is watched for that alone (its
            # journals, appended all the time, wake nothing). An agent's folder made later is seen at
            # the next safety recheck.
            for folder in agent_folders(self.runs)[:MAX_AGENT_WATCHES]:
                observer.schedule(Handler(frozenset({BREAKERS_FILE})), str(folder), recursive=False,
                                  event_filter=[FileCreatedEvent, FileMovedEvent])
        observer.daemon = True
        try:
            observer.start()
            self._observer = observer
        except OSError as exc:  # the user's inotify watches or instances used up: the rechecks see it all
            observer.stop()
            log.warning("dashboard: runs/ is not watched (%s); changes there show within %g s", exc, SAFETY_RECHECK)
        stop = self.board.watch_events()
        halt = threading.Event()
        self._follower = halt

        def follow() -> None:
            try:
                self._follow_board(halt, stop is not None)
            except Exception as exc:  # the board closed under it (the server stopping), say: rechecks go on
                log.warning("dashboard: stopped following the board's stream (%s: %s)", type(exc).__name__, exc)
            finally:
                if stop is not None:
                    stop()

        threading.Thread(target=follow, name="dashboard-board-follower", daemon=True).start()

    def _stop_watching(self) -> None:
        observer, self._observer = self._observer, None
        if observer is not None:
            observer.stop()  # its thread ends on its own (a daemon): nothing here waits for it
        halt, self._follower = self._follower, None
        if halt is not None:
            halt.set()
            self.board.signal.bump()  # the follower wakes, sees `halt`, stops the board's watch and ends

    # Both run on the event loop without awaiting anything: a client's stream is cancelled when it
    # disconnects, and an await in its `finally` would be cancelled too, leaving the watcher running.
    def join(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.clients += 1
        if self.clients == 1:
            self._start_watching()
            self._publisher = self._loop.create_task(self._publish(), name="dashboard-publisher")

    def leave(self) -> None:
        self.clients -= 1
        if self.clients == 0:
            self._stop_watching()
            publisher, self._publisher = self._publisher, None
            if publisher is not None:
                publisher.cancel()
            self.latest = None  # unwatched from now on: the next client waits for a fresh look

    @property
    def watching(self) -> bool:
        return self._observer is not None or self._follower is not None

    # -- the picture ------------------------------------------------------------------------------

    def _key(self) -> tuple[Any, Any]:
        """What changes when anything the picture shows changes, read without reading the board: the
        stream's end, the budget ledger's version and the other hosts' heartbeats (PostgreSQL), the
        states of the workspace's files the page shows, the changes made here; and the other hosts'
        rows, read for the key, for the build."""
        files = [self.runs / SUPERVISOR_FILE, self.runs / LEDGER_FILE,
                 *(folder / BREAKERS_FILE for folder in agent_folders(self.runs))]
        hosts, rows = self.hosts()
        return (self._stream_end(), self.spend(), hosts, self.touched, tuple(map(file_state, files))), rows

    def picture(self) -> Picture:
        """The page's picture, built and serialized again only when its key changed, or once a
        HELD_RECHECK while a task is held (a lease renewed is no event, and the page shows the lease
        left). Called from a worker thread: it reads the board."""
        with self._lock:
            key, hosts = self._key()
            last = self._picture
            stale = last is not None and last.held and time.monotonic() - last.built_at >= HELD_RECHECK
            if last is None or last.key != key or stale:
                self.builds += 1
                picture = self.build(hosts)
                last = self._picture = Picture(serialize(picture), key, bool(picture.get("held")), time.monotonic())
            return last

    async def _publish(self) -> None:
        """The one look for news for every client, while any is connected: at each wake-up (and every
        SAFETY_RECHECK, or sooner while a task is held), the picture for the key then, published
        when it is not the one published last."""
        while True:
            seen = self.generation
            self.turns += 1
            try:
                picture = await asyncio.to_thread(self.picture)
            except Exception as exc:  # the board away just now, say: the clients keep the last, and it is tried again
                log.warning("dashboard: the picture could not be built (%s: %s)", type(exc).__name__, exc)
                picture = None
            if picture is not None and picture is not self.latest:
                self.latest = picture
                self._published.bump()
            timeout = SAFETY_RECHECK
            if picture is not None and picture.held:
                timeout = min(timeout, max(0.0, picture.built_at + HELD_RECHECK - time.monotonic()))
            await self.wait(seen, timeout)

    # -- one client's stream ----------------------------------------------------------------------

    async def stream(self, last_event_id: str | None) -> AsyncIterator[bytes]:
        """One client's frames: the events after its Last-Event-ID (if this log gave it), then the
        picture, then each new event and picture as they come, until the client goes."""
        self.join()
        at: list[tuple[int, int | None]] = []  # where this stream has read to, for /metrics (readers.py)
        untrack = track_reader("dashboard-streams", lambda: at[0] if at else None)
        try:
            yield f"retry: {RETRY_MS}\n\n".encode()
            cursor = await asyncio.to_thread(resume_cursor, last_event_id, self.board)
            inode = None
            if cursor is None:
                if last_event_id:
                    yield frame("reset", {"reason": "unknown Last-Event-ID: starting afresh"})
                cursor = await asyncio.to_thread(self.board.events_end)
            else:
                at[:] = [(cursor, inode)]
                cursor, inode = await self._events_since(cursor, inode, out := [])
                for chunk in out:
                    yield chunk
            shown: Picture | None = None
            while True:
                at[:] = [(cursor, inode)]  # read and sent: a client slow to take its frames holds it here
                seen = self._published.number
                out = []
                cursor, inode = await self._events_since(cursor, inode, out)
                for chunk in out:
                    yield chunk
                picture = self.latest  # None until the publisher's first look since the hub was idle
                if picture is not None and picture is not shown:
                    shown = picture
                    # The shared JSON as its own chunk: only this client's cursor is made for it.
                    yield f"id: {cursor}\nevent: snapshot\ndata: ".encode()
                    yield picture.data
                    yield b"\n\n"
                if not await self._published.wait(seen, KEEPALIVE):
                    yield b": keepalive\n\n"
        finally:
            untrack()
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
