"""The board lock: flock(2) on `kanban/.lock`, through one descriptor each board keeps open.

Why not filelock here: filelock 4.x spends about 60 to 200 us of Python per acquire and release
(path resolution, a parent mkdir, fork bookkeeping, two open(2) calls per attempt), and the claim
path takes the lock three times per task. On tmpfs, where only that overhead counts, a kept
descriptor ran claim+complete 40 to 70% faster (bench/board_bench.py). The semantics are the ones
filelock's UnixFileLock gives: an flock on a file that is never deleted, so waiters can never be
split across two inodes (the bug of filelock 3.21.0 to 3.29.4, which deleted it on release).
"""

from __future__ import annotations

import fcntl
import os
import random
import time
from pathlib import Path

# A waiter retries quickly at first (a section takes well under a millisecond) and backs off.
FIRST_RETRY = 50e-6
LONGEST_RETRY = 2e-3
# One that has waited this long is in a queue of many (256 claimers building their index at once):
# it retries at most every PATIENT_RETRY, jittered, or the waiters' polls took the holder's CPU.
PATIENT_AFTER = 0.05
PATIENT_RETRY = 0.02


def retry_after(delay: float, waited: float) -> float:
    """The next pause between tries of a waiter that paused `delay` and has waited `waited` (pure,
    before jitter): doubling up to LONGEST_RETRY, then up to PATIENT_RETRY once it waited PATIENT_AFTER."""
    return min(delay * 2, LONGEST_RETRY if waited < PATIENT_AFTER else PATIENT_RETRY)


class LockTimeout(Exception):
    pass


class BoardLock:
    """Not reentrant and not thread-safe by itself: the board wraps it in a threading.RLock."""

    def __init__(self, path: Path, timeout: float) -> None:
        self.path = path
        self.timeout = timeout
        self._fd: int | None = None
        self._pid = 0

    def _descriptor(self) -> int:
        # A forked child shares its parent's open file description, and with it the parent's lock:
        # it must open its own.
        if self._fd is None or self._pid != os.getpid():
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
            self._pid = os.getpid()
        return self._fd

    def acquire(self) -> None:
        fd = self._descriptor()
        started = time.monotonic()
        deadline = started + self.timeout
        delay = FIRST_RETRY
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                now = time.monotonic()
                if now >= deadline:
                    raise LockTimeout(f"{self.path} stayed locked for {self.timeout:g} s") from None
                time.sleep(delay * random.uniform(0.5, 1.5) if delay > LONGEST_RETRY else delay)
                delay = retry_after(delay, now - started)

    def try_acquire(self) -> bool:
        """Take the lock only if it is free this instant; never waits."""
        try:
            fcntl.flock(self._descriptor(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def release(self) -> None:
        if self._fd is not None and self._pid == os.getpid():
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None and self._pid == os.getpid():
            os.close(fd)
