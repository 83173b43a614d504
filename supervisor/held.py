"""The agents' inotify instances the supervisor holds, so that a killed agent's exit is not held up by
the kernel's teardown of them, and every descriptor it is passed closed on a thread of its own.

Why: a process's exit closes its descriptors before its parent can know it has exited (its pidfd
becomes readable only after), and the close of an inotify instance that still watches folders
waits for the kernel's fsnotify grace period (synchronize_srcu). On a 2-core VM that made the
time from an agent's SIGKILL to its exit seen 11 ms (median; up to 24) against 5 ms (at most 6)
with the instance still referenced elsewhere. An agent therefore passes its board watch's instance
to the supervisor (`HOLD=inotify` with the descriptor, over the notify socket); its death then
drops a reference only, and the supervisor closes its copy after the exit was seen, on the
closer thread: the wait is paid there, off the restart path and off the loop.

A held instance an agent closed itself watches nothing (`Inotify.close` removes its watches
first), so a held copy never queues events for nobody. Holding is a speed-up only: a message
dropped on a full queue, one past half the open-file limit, or an agent adopted by a new
supervisor (until its watch is made again) costs the next restart its milliseconds, nothing else.
"""

from __future__ import annotations

import contextlib
import os
import queue
import resource
import threading
from collections.abc import Iterator

INOTIFY = "anon_inode:inotify"


def is_inotify(fd: int) -> bool:
    """Whether our descriptor `fd` is an inotify instance (what the kernel names its file)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == INOTIFY
    except OSError:
        return False


class Held:
    """One held inotify instance per agent name; what is dropped is closed by the closer thread."""

    def __init__(self) -> None:
        # A descriptor's number is the lowest free one: past half the open-file limit, what the
        # supervisor needs per agent (pidfds, logs, cgroups: doctor's count) comes first.
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self.room = soft // 2 if soft != resource.RLIM_INFINITY else 1 << 30
        self._held: dict[str, int] = {}
        self._closing: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def __len__(self) -> int:
        return len(self._held)

    @contextlib.contextmanager
    def passed(self, fds: list[int]) -> Iterator[Passed]:
        """The descriptors one datagram brought: whatever the caller does not `keep` is dropped."""
        passing = Passed(self, fds)
        try:
            yield passing
        finally:
            for fd in passing.fds:
                self.drop(fd)

    def hold(self, name: str, fd: int) -> None:
        """Hold `fd` for agent `name`, in place of what was held for it; refused (dropped) unless
        it is an inotify instance (an agent passes nothing else, and no other file is kept open),
        and while descriptors run short."""
        if fd >= self.room or not is_inotify(fd):
            self.drop(fd)
            return
        old = self._held.pop(name, None)
        self._held[name] = fd
        if old is not None:
            self.drop(old)

    def release(self, name: str) -> None:
        """The agent `name` has exited (its exit seen): what was held for it is closed."""
        fd = self._held.pop(name, None)
        if fd is not None:
            self.drop(fd)

    def drop(self, fd: int) -> None:
        """Close `fd` on the closer thread: a close may wait (an inotify instance's grace period, a
        file whose filesystem flushes), and the loop never does."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._close_each, name="closer", daemon=True)
            self._thread.start()
        self._closing.put(fd)

    def close_all(self, timeout: float = 2.0) -> None:
        """At the supervisor's end: every held instance closed, waiting at most `timeout` seconds."""
        for name in list(self._held):
            self.release(name)
        if self._thread is not None:
            self._closing.put(None)
            self._thread.join(timeout)
            self._thread = None

    def _close_each(self) -> None:
        while (fd := self._closing.get()) is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


class Passed:
    """The descriptors of one datagram not yet kept (see `Held.passed`)."""

    def __init__(self, held: Held, fds: list[int]) -> None:
        self.held = held
        self.fds = fds

    def keep(self, name: str) -> None:
        """Hold the datagram's one descriptor for agent `name` (more than one: none is kept)."""
        if len(self.fds) == 1:
            self.held.hold(name, self.fds.pop())
