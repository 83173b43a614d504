"""Watching the board folder: inotify on it and its top folders, waking waiting claimers and the ingester.

Events are a wake-up, never the truth: the kernel's queue can overflow and a folder made anew
can fill before it is watched, so both ask for a rescan, one more rescan runs shortly after each
burst, and waiters also wake every few seconds on their own. The board's temp files, its
bookkeeping and drops that ingest skips wake no one. If inotify cannot be had (its watch or
instance limit reached) the watcher says so and waiters poll.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from .drops import skipped_name
from .fsio import tmp_writer_pid
from .inotify import (
    IN_CLOSE_WRITE,
    IN_CREATE,
    IN_DELETE,
    IN_DELETE_SELF,
    IN_ISDIR,
    IN_MOVED_FROM,
    IN_MOVED_TO,
    Inotify,
)

BURST_RESCAN_DELAY = 0.25
# watchdog (still watching for the dashboard's streams) logs this at ERROR when an observer
# is stopped while its emitter reads one last event: a
# race in its shutdown, harmless (the watch is going away). With no logging set up, Python printed
# it on a command's stderr; its other records (a queue overflow, say) still get through.
SHUTDOWN_RACE = "InotifyEmitter.queue_events() called when the thread is inactive"


def _not_the_shutdown_race(record: logging.LogRecord) -> bool:
    return record.msg != SHUTDOWN_RACE


logging.getLogger("watchdog.observers.inotify").addFilter(_not_the_shutdown_race)

# Bookkeeping the board writes for itself; never a reason to wake anyone.
INGEST_LOCK = ".ingest.lock"  # kanban/ingest.py's: one process ingests at a time
QUIET_NAMES = frozenset({".lock", INGEST_LOCK, ".pending", ".ingested", ".waiting", "events.jsonl", ".doccache",
                         ".doccache.fields"})


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


# What wakes a waiter: an entry that arrived (created, written and closed, renamed in) or left.
FILE_EVENTS = IN_CREATE | IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE
COMPLETE = IN_CLOSE_WRITE | IN_MOVED_TO  # a file renamed into place, or closed after writing
# A claimer waits for work to arrive: a drop, a task in todo, a dependency done. What leaves a
# folder, and what arrives in the others (a claim into doing, a failure), never gives it work; with
# 16 agents each task's moves woke all 16 about ten times.
ARRIVALS = IN_CREATE | IN_CLOSE_WRITE | IN_MOVED_TO
CLAIM_FOLDERS = ("inbox", "todo", "done")
# Tasks reach todo/ and done/ only by a rename. An event a folder's files can raise themselves
# (IN_CLOSE_WRITE) makes the kernel flag every entry it has cached for the folder each time a
# paused watch resumes: done/'s thousands of files and todo/'s removed temp files, walked once a
# task by every claimer (3.5 % of an agent's CPU after 1,000 tasks, growing with the board).
MOVED_IN = IN_CREATE | IN_MOVED_TO
# A claimer busy with a task keeps its watches (their numbers too) but on an event that does not
# happen to a board in use. Drops that arrive meanwhile have no event saying they are complete:
# ingest then asks /proc whether anyone still writes them, once for all of them.
PAUSED_MASK = IN_DELETE_SELF
ROOT_ARRIVALS = IN_CREATE | IN_MOVED_TO  # a claimer's watch on the board's own folder: new top folders


def wakes(folder: str, name: str) -> bool:
    """Whether a change to `name` in the board's top folder `folder` ("" for the board's own) can
    matter to a waiter (pure): not the board's bookkeeping, nor a temp file the board writes before
    renaming it into place, nor a drop that ingest skips (an editor's swap file, a partial download)."""
    if folder == "":
        return not quiet(name)
    if folder == "inbox":
        return not skipped_name(name)
    return tmp_writer_pid(name) is None


class BoardWatcher:
    def __init__(self, root: Path, signal: ChangeSignal, arrivals: ChangeSignal | None = None) -> None:
        self.root = root
        self.signal = signal
        self.mode = "off"
        self.reason = ""
        self._inotify: Inotify | None = None
        self._thread: threading.Thread | None = None
        self._complete: dict[str, int] = {}
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self.claims_only = False
        self.drops_only = False  # an ingester's watch: drops arriving in inbox/, nothing else
        # Bumped for drops arriving (and a lost queue) alone: an ingester sleeps on it, not on
        # `signal`, which the event log's own watch bumps too (kanban/waiting.py, watch_log).
        self.arrivals = arrivals or ChangeSignal()
        self.inbox = True  # a claimer that ingests watches inbox/ too; one whose supervisor ingests does not
        self.paused = False
        self._give: Callable[[int], object] | None = None

    def hand_over(self, give: Callable[[int], object]) -> None:
        """Give the descriptor of each inotify instance this watcher makes (the current one at once)
        to `give`: an agent passes it to its supervisor, so that its death is not slowed by the
        kernel's teardown of it (supervisor/held.py)."""
        self._give = give
        if self._inotify is not None:
            give(self._inotify.fd)

    def _mask(self, name: str) -> int | None:
        """The events watched in top folder `name` (None: not watched)."""
        if quiet(name):
            return None
        if self.drops_only:
            return ARRIVALS if name == "inbox" else None
        if not self.claims_only:
            return FILE_EVENTS
        if name not in CLAIM_FOLDERS or (name == "inbox" and not self.inbox):
            return None
        return ARRIVALS if name == "inbox" else MOVED_IN

    def _watch_folders(self, inotify: Inotify) -> None:
        quiet_root = self.claims_only or self.drops_only
        inotify.watch_folder(str(self.root), ROOT_ARRIVALS if quiet_root else FILE_EVENTS)
        for entry in os.scandir(self.root):
            mask = self._mask(entry.name)
            if mask is not None and entry.is_dir(follow_symlinks=False):
                inotify.watch_folder(entry.path, mask)

    def widen(self) -> None:
        """Watch every change, not only arrivals of work (a claimer's board asked for by a view)."""
        if not self.claims_only and not self.drops_only:
            return
        self.claims_only = self.drops_only = self.paused = False
        if self._inotify is not None:
            with contextlib.suppress(OSError):
                self._watch_folders(self._inotify)

    def pause(self) -> None:
        """A claimer took a task: until `resume`, work arriving wakes it no more (with 16 agents, each
        task's ingest and completion woke all 16, each reading the events, while they were busy; with
        64, each drop woke all 64 three times)."""
        if self._inotify is not None and self.claims_only and not self.paused:
            self.paused = True
            self._remask(self._inotify)

    def resume(self) -> None:
        """A claimer waits again: watched as before, and a rescan asked for, since what arrived
        meanwhile (a task moved in by hand) woke no one; the log's transitions are caught up anyway."""
        if self._inotify is not None and self.paused:
            self.paused = False
            self._remask(self._inotify)
            self.signal.bump(full=True)

    def _remask(self, inotify: Inotify) -> None:
        root = str(self.root)
        for folder in list(inotify.folders()):
            name = "" if folder == root else os.path.basename(folder)
            mask = ROOT_ARRIVALS if name == "" else self._mask(name)
            if mask is not None:
                with contextlib.suppress(OSError):  # a folder gone meanwhile: its watch went with it
                    inotify.add(folder, PAUSED_MASK if self.paused else mask)

    def start(self, *, force_polling: bool = False, why: str = "", claims_only: bool = False,
              drops_only: bool = False, inbox: bool = True) -> None:
        if force_polling:
            self.mode, self.reason = "polling", why
            return
        try:
            inotify = Inotify()
        except OSError as exc:
            if exc.errno == errno.EMFILE:
                self.mode = "polling"
                self.reason = (f"inotify instances exhausted ({exc.strerror}); raise "
                               "fs.inotify.max_user_instances to get events back")
                return
            if exc.errno in (errno.ENOSYS, errno.EINVAL):
                self.mode, self.reason = "polling", f"no inotify here ({exc.strerror})"
                return
            raise
        except AttributeError as exc:  # a libc without inotify (not Linux)
            self.mode, self.reason = "polling", f"no inotify on this platform ({exc})"
            return
        self.claims_only, self.drops_only, self.inbox = claims_only, drops_only, inbox
        try:
            self._watch_folders(inotify)
        except OSError as exc:
            inotify.close()
            if exc.errno == errno.ENOSPC:
                self.mode = "polling"
                self.reason = (f"inotify watches exhausted ({exc.strerror}); raise "
                               "fs.inotify.max_user_watches to get events back")
                return
            raise
        self._inotify = inotify
        if self._give is not None:
            self._give(inotify.fd)
        self._thread = threading.Thread(target=self._read, args=(inotify,), name="board-watch", daemon=True)
        self._thread.start()
        self.mode, self.reason = "inotify", ""

    def _read(self, inotify: Inotify) -> None:
        root = str(self.root)
        while not inotify.closed:
            woke = full = arrived = False
            try:
                for event in inotify.events(None):
                    if not event.folder:  # the kernel's queue overflowed: events were lost
                        woke = full = True
                        continue
                    top = "" if event.folder == root else os.path.basename(event.folder)
                    if not event.name or not wakes(top, event.name):
                        continue
                    if top == "" and event.mask & IN_ISDIR and event.mask & (IN_CREATE | IN_MOVED_TO):
                        # A folder made (or put back) after the start: watched from now on, and what
                        # arrived in it before the watch is found by a rescan.
                        mask = self._mask(event.name)
                        if mask is not None:
                            with contextlib.suppress(OSError):
                                inotify.watch_folder(os.path.join(root, event.name), mask)
                        full = True
                    elif top == "inbox" and event.mask & COMPLETE and not event.mask & IN_ISDIR:
                        self.mark_complete(Path(event.folder, event.name))
                    arrived = arrived or top == "inbox"
                    woke = True
            except OSError:
                if inotify.closed:
                    return
                raise
            if full:
                self.signal.bump(full=True)
            if full or arrived:
                self.arrivals.bump()
            if woke:
                self.changed()

    def stop(self) -> None:
        inotify, self._inotify = self._inotify, None
        thread, self._thread = self._thread, None
        if self._timer is not None:
            self._timer.cancel()
        if inotify is not None:
            inotify.shutdown()
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=5)
            if thread is None or not thread.is_alive():
                inotify.close()
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

