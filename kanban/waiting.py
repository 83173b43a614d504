"""What the file board's waiting needs of its folder: the watcher started, the log watched, the nap, health."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

from .base import ALLOW_NETWORK_FS_ENV, Folder
from .inotify import IN_CREATE, IN_MODIFY, IN_MOVED_TO, Inotify
from .watch import ChangeSignal

# How long a waiting claimer sleeps between rescans when no event wakes it.
RESCAN_INTERVAL = 2.0
POLL_INTERVAL = 1.0
# A waiting claimer sweeps dead writers' temp files (a listing of every status folder) this rarely.
SWEEP_INTERVAL = 60.0
# What a follower of the log is woken by: an append, or a new log renamed or created in its place.
LOG_CHANGES = IN_MODIFY | IN_CREATE | IN_MOVED_TO
# After waking a follower, the watch lets appends gather this long (the kernel merges a file's
# repeated IN_MODIFY): each task appends three lines, and a wake-up for each took the supervisor's
# follower and watchdog's two threads through every one of them.
LOG_SETTLE = 0.02


def watch_log(events_path: Path, signal: ChangeSignal) -> Callable[[], None] | None:
    """Bump `signal` whenever the event log is written; the watch's stop, or None where inotify is missing.

    The board's own watcher leaves the log out (its wake-ups are task files moving, which happens
    before the event is appended, and events that move no file would wake every waiting claimer
    for nothing), so a follower of the stream gets a watch of its own: a thread on an inotify
    instance of the log's folder, which bumps the signal for the log's own changes (and a lost
    queue) at most once every LOG_SETTLE seconds."""
    try:
        inotify = Inotify()
    except (OSError, AttributeError):  # AttributeError: a libc without inotify
        return None
    try:
        if not inotify.watch_folder(str(events_path.parent), LOG_CHANGES):
            inotify.close()
            return None
    except OSError:
        inotify.close()
        return None
    stopped = threading.Event()

    def follow() -> None:
        while not stopped.is_set():
            # An overflow (folder "") may have lost the log's change: a bump costs a read.
            if any(event.name == events_path.name or not event.folder for event in inotify.events(None)):
                signal.bump()
                stopped.wait(LOG_SETTLE)

    thread = threading.Thread(target=follow, name="event-log-watch", daemon=True)
    thread.start()

    def stop() -> None:
        stopped.set()
        inotify.shutdown()
        if thread is not threading.current_thread():
            thread.join(timeout=5)
        if not thread.is_alive():
            inotify.close()

    return stop


def health(disk: Folder) -> list[tuple[str, str, str]]:
    """The filesystem and change-notification checks doctor prints (the watcher started first)."""
    if disk.network_fs:
        fs = (disk.fs_type, "warn", (f": a network filesystem, allowed by {ALLOW_NETWORK_FS_ENV}; locks hold "
                                     "only within this machine"))
    else:
        fs = (disk.fs_type, "ok", "")
    checks = [("filesystem", fs[1], fs[0] + fs[2])]
    start_watching(disk)
    if disk.watcher.mode == "inotify":
        checks.append(("watcher", "ok", "inotify events (drops are picked up at once)"))
    else:
        checks.append(("watcher", "warn", f"polling every few seconds: {disk.watcher.reason}"))
    return checks


def start_watching(disk: Folder, *, claims_only: bool = False, drops_only: bool = False, inbox: bool = True) -> None:
    """Start the watcher: with `claims_only` (a waiting claimer) only work arriving wakes it, and
    drops only if `inbox` (it ingests them); with `drops_only` (an ingester) only drops arriving.
    A watcher started for one of these and asked for another watches every change."""
    if disk.watcher.mode == "off":
        disk.watcher.start(force_polling=disk.network_fs, claims_only=claims_only, drops_only=drops_only,
                           inbox=inbox, why=f"no change events on a network filesystem ({disk.fs_type})")
    elif (not claims_only and not drops_only) or (claims_only and disk.watcher.drops_only) or \
            ((drops_only or (claims_only and inbox)) and disk.watcher.claims_only and not disk.watcher.inbox):
        disk.watcher.widen()


def wait_for_drops(disk: Folder, seen: int, timeout: float) -> int:
    """An ingester's sleep: until drops arriving in inbox/ (or a wake) bumped the watcher's
    `arrivals` past generation `seen`, or `timeout` (at most POLL_INTERVAL when polling); the
    generation then."""
    start_watching(disk, drops_only=True)
    arrivals = disk.watcher.arrivals
    arrivals.wait(seen, timeout if disk.watcher.mode == "inotify" else min(timeout, POLL_INTERVAL))
    return arrivals.generation


def nap(disk: Folder) -> float:
    """How long a waiting claimer sleeps when nothing wakes it: events may be lost only when polling."""
    return RESCAN_INTERVAL if disk.watcher.mode == "inotify" else POLL_INTERVAL


def log_end(path: Path) -> int:
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
