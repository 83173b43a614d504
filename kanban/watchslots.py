"""Watch slots: at most a few of a board's waiting claimers on this machine watch it; the others look every 2 s.

Every waiting claimer woken by every task that arrives cost a team of 64 agents on 2 cores most of
its time, and one of 256 nearly all of it (1 task a second). A claimer that starts waiting takes
one of SLOTS slots (an flock on `kanban/.waiting/<n>`, freed by the kernel if it dies); holding
one, it watches and looks at each change as before. Without one it watches nothing and looks
every PASSIVE_NAP seconds, trying for a slot each time: any agent still finds work meant only for
it within seconds (a task of its role, one assigned to it), and a team no larger than the slots
behaves as if there were none. A board that cannot have the slots' folder lets every claimer watch.

A waiter that found work (watching, looking or eager) rings the bell (the FIFO
`kanban/.waiting/bell`) as it leaves: a slot may be free and more work may be waiting. A napping
waiter wakes (epoll's EPOLLEXCLUSIVE: the kernel wakes one of those asleep on it, or a few, never
all), takes a free slot and looks; if it finds work it rings in turn. So a backlog dropped on an
idle team of 16 has all 16 working within milliseconds, not after up to PASSIVE_NAP (4 of 16
agents worked the first 2 s of such a drain), and 256 idle agents wake one at a time, not all for
each task.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import select
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SLOTS_DIR = ".waiting"
BELL = "bell"
PASSIVE_NAP = 2.0
DRAIN_READS = 4  # reads of 4 KiB at most to empty the bell after a nap


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
        self._bell: int | None = None  # the FIFO, read and written; -1 once it could not be had
        self._poll: Any = None  # an epoll on the bell (one waker) and on _waker (this process's wake)
        self._waker: int | None = None  # an eventfd: wake() ends a nap from another thread
        self.working = False  # the last turn found work (see wait_in_turn's `eager`)
        self._guard = threading.Lock()  # wake() from another thread against close()

    def take(self) -> bool:
        """Hold a free slot; False if every one is held by another waiter. True also when the slots
        cannot be had at all (their folder refused): then this waiter watches, as all did before."""
        self._own()
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

    def ring(self) -> None:
        """Wake one napping waiter of this board on this machine, if any (the next to nap otherwise)."""
        bell = self._bell_fd()
        if bell is not None:
            with contextlib.suppress(OSError):  # full (64 KiB of rings nobody took): waiters will wake
                os.write(bell, b"\0")

    def nap(self, seconds: float, stop: threading.Event | None = None) -> bool:
        """A passive waiter's sleep: until the bell rings for it, wake() is called, `stop` is found
        set or `seconds` pass. A stop is seen at once when wake() follows it (Board.wake does).
        Whether it took a ring (which it is then to pass on if it does not look)."""
        bell = self._bell_fd()
        if bell is None:
            if stop is not None:
                stop.wait(seconds)
            else:
                time.sleep(seconds)
            return False
        if stop is not None and stop.is_set():  # set before the waker was made
            return False
        try:
            ready = [fd for fd, _events in self._poll.poll(seconds)]
        except OSError:
            return False
        rung = False
        for fd in ready:  # rings that came together are one: the one woken rings on if it finds work
            for _ in range(DRAIN_READS):  # bounded: a writer that keeps the FIFO full holds no one here
                try:
                    data = os.read(fd, 4096)
                except OSError:
                    break
                rung = rung or (fd == bell and bool(data))
                if len(data) < 4096:
                    break
        return rung

    def wake(self) -> None:
        """End this process's nap at once (a stop); from any thread. One made before the first
        nap is not needed: the nap looks at `stop` first."""
        with self._guard:
            if self._waker is not None and self._pid == os.getpid():
                with contextlib.suppress(OSError):
                    os.eventfd_write(self._waker, 1)

    def close(self) -> None:
        self.give()
        with self._guard:
            if self._pid == os.getpid():
                extra = [fd for fd in (self._bell, self._waker) if fd is not None and fd >= 0]
                for fd in [*self._fds.values(), *extra]:
                    with contextlib.suppress(OSError):
                        os.close(fd)
                if self._poll is not None:
                    self._poll.close()
            self._fds, self._bell, self._waker, self._poll = {}, None, None, None

    def _own(self) -> None:
        if self._pid != os.getpid():  # a forked child shares its parent's descriptors, and their locks
            self._fds, self.held, self._pid = {}, None, os.getpid()
            self._bell = self._waker = self._poll = None
            self._guard = threading.Lock()

    def _bell_fd(self) -> int | None:
        """The bell, opened (and made) once: read-write, so opening never blocks nor fails for want
        of a reader. Only a FIFO of this user's that no one else may write is used; anything else
        under its name (a file, a symlink, another user's FIFO), or a kernel without epoll's
        EPOLLEXCLUSIVE, means no bell: the waiters nap their PASSIVE_NAP as before."""
        self._own()
        if self._bell is None:
            self._bell = -1
            fd = waker = -1
            poll: Any = None
            try:
                self.folder.mkdir(mode=0o755, exist_ok=True)
                with contextlib.suppress(FileExistsError):
                    os.mkfifo(self.folder / BELL, 0o600)
                fd = os.open(self.folder / BELL, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
                info = os.fstat(fd)
                if not stat.S_ISFIFO(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
                    raise OSError("not this user's FIFO")
                waker = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
                poll = select.epoll()
                poll.register(fd, select.EPOLLIN | select.EPOLLEXCLUSIVE)
                poll.register(waker, select.EPOLLIN)
            except (OSError, AttributeError, ValueError):
                for made in (fd, waker):
                    if made >= 0:
                        os.close(made)
                if poll is not None:
                    poll.close()
                return None
            with self._guard:
                self._bell, self._waker, self._poll = fd, waker, poll
        return self._bell if self._bell >= 0 else None

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
            slots.ring()
            return found
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if slots is None or slots.take():
            try:
                found = watching(left)
            finally:
                if slots is not None:
                    slots.give()
            if found is not None and slots is not None:
                slots.ring()
            return found
        unwatched()
        found = looking()
        if found is not None:
            slots.ring()
            return found
        if (stop is not None and stop.is_set()) or left == 0.0:
            return None
        pause = PASSIVE_NAP if nap is None else nap
        pause = pause if left is None else min(pause, left)
        if slots.nap(pause, stop) and stop is not None and stop.is_set():
            slots.ring()  # woken for work it will not look for: the next napper is
