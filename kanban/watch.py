"""Watching the board folder: a watchdog observer that wakes waiting claimers and the ingester.

Events are a wake-up, never the truth: watchdog drops the kernel's queue-overflow signal and can
miss files created in a brand-new folder, so every wake-up is followed by a rescan, one more
rescan runs shortly after each burst, and waiters also wake every few seconds on their own. If
inotify cannot be had (its watch or instance limit reached) the watcher says so and waiters poll.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from watchdog.events import (
    DirCreatedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)

if TYPE_CHECKING:  # imported where it starts, as the inotify observer is
    from watchdog.observers.api import BaseObserver

BURST_RESCAN_DELAY = 0.25
# Only what says a task file arrived or left. Directory-modified events are left out: they repeat
# the file events, and one fires each time any process closes the lock file after taking it, which
# would wake every waiter on every lock.
EVENT_KINDS: list[type[FileSystemEvent]] = [
    FileCreatedEvent, FileMovedEvent, FileClosedEvent, FileDeletedEvent, DirCreatedEvent, DirMovedEvent,
]
# watchdog logs this at ERROR when an observer is stopped while its emitter reads one last event: a
# race in its shutdown, harmless (the watch is going away). With no logging set up, Python printed
# it on a command's stderr; its other records (a queue overflow, say) still get through.
SHUTDOWN_RACE = "InotifyEmitter.queue_events() called when the thread is inactive"


def _not_the_shutdown_race(record: logging.LogRecord) -> bool:
    return record.msg != SHUTDOWN_RACE


logging.getLogger("watchdog.observers.inotify").addFilter(_not_the_shutdown_race)

# Bookkeeping the board writes for itself; never a reason to wake anyone.
QUIET_NAMES = frozenset({".lock", ".pending", ".ingested", "events.jsonl", ".doccache", ".doccache.fields"})


def quiet(relative: str) -> bool:
    """Whether a change at `relative` (to the board's folder) is the board's own bookkeeping (pure).
    The listing cache's temp files too: a listing that wrote it would otherwise wake every waiter,
    whose listings would write it again."""
    top = relative.split(os.sep, 1)[0]
    return top in QUIET_NAMES or top.startswith("..doccache.")


class ChangeSignal:
    """A generation counter that threads can wait on for a change."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.generation = 0
        self.full_rescan_due = False

    def bump(self, *, full: bool = False) -> None:
        with self._cond:
            self.generation += 1
            self.full_rescan_due = self.full_rescan_due or full
            self._cond.notify_all()

    def wait(self, seen: int, timeout: float) -> bool:
        """Wait until the generation differs from `seen`; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self.generation != seen, timeout=max(0.0, timeout))


class _Handler(FileSystemEventHandler):
    def __init__(self, watcher: BoardWatcher) -> None:
        self.watcher = watcher

    def on_any_event(self, event: FileSystemEvent) -> None:
        if not isinstance(event, tuple(EVENT_KINDS)):
            return
        path = os.fsdecode(event.dest_path if isinstance(event, FileMovedEvent) and event.dest_path
                           else event.src_path)
        if quiet(os.path.relpath(path, self.watcher.root)):
            return
        # A file renamed into place, or closed after writing, is complete: the ingester need not
        # wait for it to settle.
        if isinstance(event, (FileMovedEvent, FileClosedEvent)) and not event.is_directory:
            self.watcher.mark_complete(Path(path))
        self.watcher.changed()


class BoardWatcher:
    def __init__(self, root: Path, signal: ChangeSignal) -> None:
        self.root = root
        self.signal = signal
        self.mode = "off"
        self.reason = ""
        self._observer: BaseObserver | None = None
        self._complete: dict[str, int] = {}
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None

    def start(self, *, force_polling: bool = False, why: str = "") -> None:
        if force_polling:
            self.mode, self.reason = "polling", why
            return
        try:
            from watchdog.observers.inotify import InotifyObserver

            observer = InotifyObserver(generate_full_events=True)
            observer.schedule(_Handler(self), str(self.root), recursive=True, event_filter=EVENT_KINDS)
            observer.daemon = True
            observer.start()
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EMFILE):
                limit = "watches" if exc.errno == errno.ENOSPC else "instances"
                self.mode = "polling"
                self.reason = (f"inotify {limit} exhausted ({exc.strerror}); raise "
                               f"fs.inotify.max_user_{limit} to get events back")
                return
            raise
        except ImportError as exc:  # not Linux: watchdog's inotify backend is unavailable
            self.mode, self.reason = "polling", f"no inotify on this platform ({exc})"
            return
        self._observer = observer
        self.mode, self.reason = "inotify", ""

    def stop(self) -> None:
        observer, self._observer = self._observer, None
        if self._timer is not None:
            self._timer.cancel()
        if observer is not None:
            observer.stop()
            observer.join(timeout=5)
        self.mode = "off"

    def changed(self) -> None:
        self.signal.bump()
        with self._lock:
            if self._timer is None:
                self._timer = threading.Timer(BURST_RESCAN_DELAY, self._burst_over)
                self._timer.daemon = True
                self._timer.start()

    def _burst_over(self) -> None:
        with self._lock:
            self._timer = None
        self.signal.bump(full=True)

    def mark_complete(self, path: Path) -> None:
        try:
            mtime = os.stat(path, follow_symlinks=False).st_mtime_ns
        except OSError:
            return
        with self._lock:
            if len(self._complete) > 10_000:
                self._complete.clear()
            self._complete[str(path)] = mtime

    def is_complete(self, path: Path, mtime_ns: int) -> bool:
        """Seen complete by an event, and not modified since."""
        with self._lock:
            return self._complete.get(str(path)) == mtime_ns

    def forget(self, path: Path) -> None:
        with self._lock:
            self._complete.pop(str(path), None)

