"""The board lock: flock(2) on `kanban/.lock`, through one descriptor each board keeps open.

Why not filelock here: filelock 4.x spends about 60 to 200 us of Python per acquire and release
(path resolution, a parent mkdir, fork bookkeeping, two open(2) calls per attempt), and the claim
path takes the lock three times per task. On tmpfs, where only that overhead counts, a kept
descriptor ran claim+complete 40 to 70% faster (bench/board_bench.py). The semantics are the ones
filelock's UnixFileLock gives: an flock on a file that is never deleted, so waiters can never be
split across two inodes (the bug of filelock 3.21.0 to 3.29.4, which deleted it on release).

Why a waiting thread, not polls: a waiter used to retry every 50 us to 20 ms. Each retry is a
wake-up (about 175 us of CPU on a 2-core VM), so 64 claimers of the board alone burned 105 s of
CPU for 2,000 tasks and 256 of them never finished; and a short wait slept past the release. A
blocked flock(2) is woken by the kernel when the holder lets go, and costs nothing before. flock
has no timeout, so the blocking call is made by a thread of the lock's own (`_Waiter`) while the
caller waits for it on a condition with the timeout.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from pathlib import Path

# A short wait is polled: a section takes well under a millisecond, and a retry 50 us after a
# failed try is cheaper than handing the wait to the waiting thread and back (two thread switches).
FIRST_RETRY = 50e-6
POLL_FOR = 2e-3


class LockTimeout(Exception):
    pass


class _Waiter:
    """A thread that waits in a blocking flock(2) on one descriptor for its lock's caller.

    One caller at a time (the board serialises its threads). States, under `cond`:
    - `wanted`: a caller waits for the lock now; the thread hands it over (`given`) when it has it;
    - `blocked`: the thread is inside flock. Meanwhile nobody else may flock this descriptor: a
      second request on the same open file would succeed at once as a no-op, and the thread's later
      unlock of a lock nobody wanted any more would drop the one the caller then held.
    A caller that times out withdraws `wanted`; the thread, once it has the lock, gives it to a
    caller that wants it by then or drops it."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.cond = threading.Condition(threading.Lock())
        self.wanted = self.given = self.blocked = self.closing = False
        self.error: OSError | None = None
        self.thread = threading.Thread(target=self._run, name="board-lock-waiter", daemon=True)
        self.thread.start()

    def take(self, timeout: float) -> bool:
        """Wait at most `timeout` s for the lock; whether it is now this descriptor's. Raises what
        flock raised in the thread (a descriptor it refuses), as a poll would have at once."""
        with self.cond:
            self.wanted, self.given, self.error = True, False, None
            self.cond.notify_all()
            try:
                self.cond.wait_for(lambda: self.given or self.error is not None, timeout)
            except BaseException:
                # Interrupted (Ctrl-C, a signal handler's exception): a lock handed over meanwhile
                # has no holder that knows it, so it is dropped, and the request withdrawn.
                if self.given:
                    fcntl.flock(self.fd, fcntl.LOCK_UN)
                self.wanted = self.given = False
                raise
            got, error = self.given, self.error
            self.wanted, self.given, self.error = False, False, None  # given: `wanted` was spent as it was
        if error is not None:
            raise error
        return got

    def busy(self) -> bool:
        with self.cond:
            return self.blocked

    def close(self) -> bool:
        """Stop the thread; whether the descriptor may be closed now (else the thread closes it
        when its flock returns: closed under it, the number could be reused by another file)."""
        with self.cond:
            self.closing = True
            self.cond.notify_all()
            return not self.blocked

    def _run(self) -> None:
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self.wanted or self.closing)
                if self.closing:
                    return
                self.blocked = True
            failed = False
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX)
            except OSError as exc:
                failed = True  # nothing is held: the caller is told
                with self.cond:
                    if self.wanted:
                        self.error = exc
                        self.cond.notify_all()
            with self.cond:
                self.blocked = False
                if not failed and self.wanted and not self.closing:
                    # The request is spent here, not by the caller when it wakes: meanwhile this
                    # loop would flock again (a no-op on a held lock) and, the caller gone by then,
                    # unlock what the caller holds.
                    self.wanted, self.given = False, True
                    self.cond.notify_all()
                    continue
                if not failed:
                    fcntl.flock(self.fd, fcntl.LOCK_UN)
                if self.closing:
                    os.close(self.fd)
                    return
                if failed:
                    return  # a descriptor flock refuses: the next caller makes a new waiter


class BoardLock:
    """Not reentrant and not thread-safe by itself: the board wraps it in a threading.RLock."""

    def __init__(self, path: Path, timeout: float) -> None:
        self.path = path
        self.timeout = timeout
        self._fd: int | None = None
        self._pid = 0
        self._waiter: _Waiter | None = None

    def _descriptor(self) -> int:
        # A forked child shares its parent's open file description, and with it the parent's lock:
        # it must open its own (and make its own waiter: threads do not survive a fork).
        if self._fd is None or self._pid != os.getpid():
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
            self._pid = os.getpid()
            self._waiter = None
        return self._fd

    def acquire(self) -> None:
        fd = self._descriptor()
        waiter = self._waiter
        if waiter is None or not waiter.busy():
            if self._try(fd):
                return
            deadline = time.monotonic() + min(POLL_FOR, self.timeout)
            delay = FIRST_RETRY
            while time.monotonic() < deadline:
                time.sleep(delay)
                if self._try(fd):
                    return
                delay *= 2
        if self.timeout > 0:
            if waiter is None or not waiter.thread.is_alive():
                waiter = self._waiter = _Waiter(fd)
            if waiter.take(self.timeout):
                return
        raise LockTimeout(f"{self.path} stayed locked for {self.timeout:g} s")

    def try_acquire(self) -> bool:
        """Take the lock only if it is free this instant; never waits."""
        fd = self._descriptor()
        if self._waiter is not None and self._waiter.busy():
            return False  # our own thread still waits in flock: the lock is someone else's
        return self._try(fd)

    @staticmethod
    def _try(fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def release(self) -> None:
        if self._fd is not None and self._pid == os.getpid():
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        fd, self._fd = self._fd, None
        waiter, self._waiter = self._waiter, None
        if fd is None or self._pid != os.getpid():
            return
        if waiter is None or waiter.close():
            os.close(fd)
