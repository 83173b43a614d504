"""Waiting, mixed into Board: the change watcher, wait_for_work, health checks, the event log by cursor
and its appends."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from watchdog.events import FileCreatedEvent, FileModifiedEvent, FileMovedEvent, FileSystemEvent, FileSystemEventHandler

from .base import ALLOW_NETWORK_FS_ENV, TaskDoc
from .events import CursorRead, append_record, check_cursor, log_marker, read_since
from .waitloop import recover_due
from .waitloop import wait_for_work as wait_loop
from .watch import ChangeSignal

# How long a waiting claimer sleeps between rescans when no event wakes it.
RESCAN_INTERVAL = 2.0
POLL_INTERVAL = 1.0
# A waiting claimer sweeps dead writers' temp files (a listing of every status folder) this rarely.
SWEEP_INTERVAL = 60.0
LOG_EVENTS = (FileModifiedEvent, FileCreatedEvent, FileMovedEvent)


class _LogWritten(FileSystemEventHandler):
    """Bumps the signal when the event log (and nothing else of its folder) is written."""

    def __init__(self, name: str, signal: ChangeSignal) -> None:
        self.name = name
        self.signal = signal

    def on_any_event(self, event: FileSystemEvent) -> None:
        path = event.dest_path if isinstance(event, FileMovedEvent) and event.dest_path else event.src_path
        if os.path.basename(os.fsdecode(path)) == self.name:
            self.signal.bump()


class WaitingMixin:
    """Board's verbs for waiting: on the watcher, for work, and on the event log by cursor."""

    # -- waiting --------------------------------------------------------------------------------

    @property
    def watch_mode(self) -> str:
        return self.watcher.mode

    def health(self) -> list[tuple[str, str, str]]:
        """The filesystem and change-notification checks doctor prints."""
        if self.network_fs:
            fs = (self.fs_type, "warn", f": a network filesystem, allowed by {ALLOW_NETWORK_FS_ENV}; locks hold only "
                                        "within this machine")
        else:
            fs = (self.fs_type, "ok", "")
        checks = [("filesystem", fs[1], fs[0] + fs[2])]
        self.start_watching()
        if self.watcher.mode == "inotify":
            checks.append(("watcher", "ok", "inotify events (drops are picked up at once)"))
        else:
            checks.append(("watcher", "warn", f"polling every few seconds: {self.watcher.reason}"))
        return checks

    # -- the event log by cursor ----------------------------------------------------------------

    def events_since(self, cursor: int, *, max_events: int = 10_000, inode: int | None = None) -> CursorRead:
        return read_since(self.events_path, cursor, max_events, inode=inode)

    def events_end(self) -> int:
        return _log_end(self.events_path)

    def events_marker(self) -> Any:
        return log_marker(self.events_path)

    def check_cursor(self, cursor: int) -> None:
        check_cursor(self.events_path, cursor)

    def exclusive(self) -> AbstractContextManager[None]:
        return self._locked()

    def announce_host(self, agents: Callable[[], list[dict[str, Any]]] | None = None) -> None:
        pass  # one host's board: a dead supervisor's agents are seen by pid, not by heartbeat

    def host_agents(self) -> list[dict[str, Any]]:
        return []  # one host's board: its agents are the workspace's (runs/supervisor.json)

    def append_event(self, record: dict[str, Any]) -> None:
        append_record(self.events_path, record)

    def watch_events(self) -> Callable[[], None] | None:
        # The board's own watcher leaves the log out (its wake-ups are task files moving, which
        # happens before the event is appended, and events that move no file would wake every
        # waiting claimer for nothing), so a follower of the stream gets a watch of its own.
        try:
            from watchdog.observers.inotify import InotifyObserver

            observer = InotifyObserver()
            observer.schedule(_LogWritten(self.events_path.name, self.signal), str(self.events_path.parent),
                              recursive=False, event_filter=list(LOG_EVENTS))
            observer.daemon = True
            observer.start()
        except (OSError, ImportError):
            return None
        return observer.stop

    def start_watching(self) -> None:
        if self.watcher.mode == "off":
            self.watcher.start(force_polling=self.network_fs,
                               why=f"no change events on a network filesystem ({self.fs_type})")

    def wake(self) -> None:
        """Wake every thread of this process waiting in wait_for_work (to stop it, say)."""
        self.signal.bump()

    def wait_for_work(self, agent: str, *, roles: Iterable[str] = (), timeout: float | None = None,
                      lease: float | None = None, stop: threading.Event | None = None,
                      steps_only: bool = False, assigned_only: bool = False) -> TaskDoc | None:
        """Claim a task, waiting for one to become eligible; None on timeout or when `stop` is set.

        Drops are ingested and dead claims recovered while waiting, so a board needs no other
        process to make progress. Sleeps on watcher events, never a busy poll.
        """
        self.start_watching()

        def look_after() -> None:
            self.ingest()
            now = time.monotonic()
            if recover_due(self._last_recover, now):
                self.recover(sweep=recover_due(self._last_sweep, now, SWEEP_INTERVAL))

        return wait_loop(self.signal, look_after=look_after,
                         claim=lambda: self.claim(agent, roles=roles, lease=lease, steps_only=steps_only,
                                                  assigned_only=assigned_only),
                         nap=lambda: RESCAN_INTERVAL if self.watcher.mode == "inotify" else POLL_INTERVAL,
                         timeout=timeout, stop=stop)


def _log_end(path: Path) -> int:
    """The offset just after the log's last complete line (a torn last line is not an event yet)."""
    try:
        with open(path, "rb") as handle:
            end = os.fstat(handle.fileno()).st_size
            while end > 0:
                start = max(0, end - 65536)
                block = os.pread(handle.fileno(), end - start, start)
                newline = block.rfind(b"\n")
                if newline >= 0:
                    return start + newline + 1
                end = start
    except FileNotFoundError:
        pass
    return 0
