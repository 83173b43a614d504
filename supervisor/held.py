"""The agents' inotify instances the supervisor holds, so that a killed agent's exit is not held up by
the kernel's teardown of them; what it lets go of is closed on a thread of its own.

Why: a process's exit closes its descriptors before its parent can know it has exited (its pidfd
becomes readable only after), and the close of an inotify instance that still watches folders
waits for the kernel's fsnotify grace period (synchronize_srcu). On a 2-core VM that made the
time from an agent's SIGKILL to its exit seen 11 ms (median; up to 24) against 5 ms (at most 6)
with the instance still referenced elsewhere. An agent therefore names its board watch's
descriptor in a notify message (`HOLD=<number>`), and the supervisor, once the kernel has said the
message came from that agent's process, copies it out of the agent with pidfd_getfd(2): nothing is
ever passed to the supervisor (its notify socket refuses descriptors, see control.py). The agent's
death then drops a reference only, and the copy is closed after the exit was seen, on the closer
thread: the wait is paid there, off the restart path and off the loop.

One is taken per agent process, and only an inotify instance. A watch an agent closed itself
watches nothing (`Inotify.close` removes its watches first), so a held copy never queues events
for nobody. Holding is a speed-up only: where the copy is refused (ptrace restricted, past half
the open-file limit) or the message dropped on a full queue, or for an agent a new supervisor
adopted, the next restart costs its milliseconds, nothing else.
"""

from __future__ import annotations

import contextlib
import os
import queue
import resource
import threading

INOTIFY = "anon_inode:inotify"


def is_inotify(fd: int) -> bool:
    """Whether our descriptor `fd` is an inotify instance (what the kernel names its file)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == INOTIFY
    except OSError:
        return False


class Held:
    """One held inotify instance per agent; what is let go of is closed by the closer thread."""

    def __init__(self) -> None:
        # A descriptor's number is the lowest free one: past half the open-file limit, what the
        # supervisor needs per agent (pidfds, logs, cgroups: doctor's count) comes first.
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self.room = soft // 2 if soft != resource.RLIM_INFINITY else 1 << 30
        self._held: dict[str, tuple[int, int]] = {}  # agent name: (its pid, our copy)
        self._closing: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def __len__(self) -> int:
        return len(self._held)

    def holding(self, name: str) -> int | None:
        """Our copy of agent `name`'s watch, if one is held."""
        held = self._held.get(name)
        return held[1] if held is not None else None

    def take(self, name: str, pid: int, pidfd: int, number: str) -> bool:
        """Copy descriptor `number` of agent `name`'s process `pid` (its pidfd `pidfd`) and hold it, in
        place of what was held for the agent. Once per process: a later message of the same one is
        ignored (a stream of them copies nothing). Only an inotify instance is kept."""
        held = self._held.get(name)
        if held is not None and held[0] == pid:
            return False
        try:
            fd_number = int(number)
            if not 0 <= fd_number < 1 << 20 or os.readlink(f"/proc/{pid}/fd/{fd_number}") != INOTIFY:
                return False
            fd = _pidfd_getfd(pidfd, fd_number)
        except (ValueError, OSError):
            return False
        if fd >= self.room or not is_inotify(fd):  # what the agent swapped in meanwhile is not kept
            self.drop(fd)
            return False
        self.release(name)
        self._held[name] = (pid, fd)
        return True

    def release(self, name: str) -> None:
        """The agent `name` has exited (its exit seen): what was held for it is closed."""
        held = self._held.pop(name, None)
        if held is not None:
            self.drop(held[1])

    def drop(self, fd: int) -> None:
        """Close `fd` on the closer thread: an inotify instance's close waits for the kernel, and the
        loop never does."""
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


_SYS_PIDFD_GETFD = 438  # the same on every architecture (the syscall table's common numbers)


def _pidfd_getfd(pidfd: int, number: int) -> int:
    """Our own copy (close-on-exec) of descriptor `number` of the process behind `pidfd`; OSError
    when refused (EPERM: ptrace access denied; EBADF: no such descriptor)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.syscall(_SYS_PIDFD_GETFD, pidfd, number, 0)
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(fd)
