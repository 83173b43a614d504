"""Watch slots: at most a few of a board's waiting claimers on this machine watch it; the others look every 2 s.

Every waiting claimer woken by every task that arrives cost a team of 64 agents on 2 cores most of
its time, and one of 256 nearly all of it (1 task a second). A claimer that starts waiting takes
one of SLOTS slots (an flock on `kanban/.waiting/<n>`, freed by the kernel if it dies); holding
one, it watches and looks at each change as before. Without one it watches nothing and looks
every PASSIVE_NAP seconds, trying for a slot each time: any agent still finds work meant only for
it within seconds (a task of its role, one assigned to it), and a team no larger than the slots
behaves as if there were none. A board that cannot have the slots' folder lets every claimer watch.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SLOTS_DIR = ".waiting"
PASSIVE_NAP = 2.0


def slot_count(cores: int | None) -> int:
    """How many of a board's waiters on one machine watch it at once (pure): two a core, at least 4."""
    return max(4, 2 * (cores or 1))


SLOTS = slot_count(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())


class WatchSlots:
    """This process's hold on one of the board's watch slots. Not thread-safe: one waiter a board."""

    def __init__(self, root: Path, count: int | None = None) -> None:
        self.folder = root / SLOTS_DIR
        self.count = SLOTS if count is None else count
        self._fds: dict[int, int] = {}
        self._pid = os.getpid()
        self.held: int | None = None
        self.working = False  # the last turn found work (see wait_in_turn's `eager`)

    def take(self) -> bool:
        """Hold a free slot; False if every one is held by another waiter. True also when the slots
        cannot be had at all (their folder refused): then this waiter watches, as all did before."""
        if self._pid != os.getpid():  # a forked child shares its parent's descriptors, and their locks
            self._fds, self.held, self._pid = {}, None, os.getpid()
        if self.held is not None:
            return True
        try:
            self.folder.mkdir(mode=0o755, exist_ok=True)
            for n in random.sample(range(self.count), self.count):
                fd = self._fds.get(n)
                if fd is None:
                    fd = self._fds[n] = os.open(self.folder / str(n), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
                                                | os.O_NOFOLLOW, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                self.held = n
                return True
        except OSError:
            return True
        return False

    def give(self) -> None:
        """Free the slot held, if any: the next waiter to look takes it."""
        if self.held is not None and self._pid == os.getpid():
            with contextlib.suppress(OSError):
                fcntl.flock(self._fds[self.held], fcntl.LOCK_UN)
        self.held = None

    def close(self) -> None:
        self.give()
        if self._pid == os.getpid():
            for fd in self._fds.values():
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._fds = {}


def wait_in_turn(slots: WatchSlots | None, *, watching: Callable[[float | None], Any],
                 looking: Callable[[], Any], unwatched: Callable[[], None], timeout: float | None,
                 stop: threading.Event | None, nap: float | None = None,
                 eager: Callable[[], Any] | None = None) -> Any:
    """A waiter's turn at the board (both backends): with a slot (or without slots at all),
    `watching(seconds left)` waits as a watcher does and its answer is returned; without one,
    `unwatched()`, then `looking()` now and every `nap` seconds (PASSIVE_NAP), trying for a slot
    before each look, until it finds something, `stop` is set or `timeout` passes (None then).
    While the turns find work, `eager()` looks first, with no slot taken and no watch resumed: a
    claimer working through a backlog resumed and paused its watch for every task (six
    inotify_add_watch calls, and its own claim's files woke its watcher's thread three times)."""
    found = _turn(slots, watching, looking, unwatched, timeout, stop, nap, eager)
    if slots is not None:
        slots.working = found is not None
    return found


def _turn(slots: WatchSlots | None, watching: Callable[[float | None], Any], looking: Callable[[], Any],
          unwatched: Callable[[], None], timeout: float | None, stop: threading.Event | None,
          nap: float | None, eager: Callable[[], Any] | None) -> Any:
    if eager is not None and slots is not None and slots.working:
        found = eager()
        if found is not None:
            return found
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if slots is None or slots.take():
            try:
                return watching(left)
            finally:
                if slots is not None:
                    slots.give()
        unwatched()
        found = looking()
        if found is not None or (stop is not None and stop.is_set()) or left == 0.0:
            return found
        pause = PASSIVE_NAP if nap is None else nap
        pause = pause if left is None else min(pause, left)
        if stop is not None:
            stop.wait(pause)
        else:
            time.sleep(pause)
