"""fsync of several open files at once, each on a thread of a small pool: a batch is durable in about the time of one.

The board makes a document durable before any name points to it (fsio.py). One after another, the
fsyncs of a batch of drops each waited a round trip to the disk (0.25-0.3 ms on the 2-core VM with a
virtio disk); issued together they overlap, and a batch of 32 took 0.1 ms a file. The threads only
wait in the kernel: fsync gives up the GIL. They are given descriptors, never names: a name in the
board's folders may have been replaced (by a FIFO, whose open would never return) since it was written.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

THREADS = 8

_lock = threading.Lock()
_pool: tuple[int, ThreadPoolExecutor] | None = None  # the pool and the pid that made it (a fork's is not its)


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), ThreadPoolExecutor(THREADS, thread_name_prefix="board-fsync"))
        return _pool[1]


def _fsync(fd: int) -> OSError | None:
    try:
        os.fsync(fd)
    except OSError as exc:
        return exc
    return None


def fsync_all(fds: list[int]) -> list[OSError | None]:
    """fsync each of `fds`, together; per descriptor, None once its file is durable, else the error
    that says it may not be. The descriptors stay open (the caller's)."""
    if len(fds) <= 1:
        return [_fsync(fd) for fd in fds]
    try:
        return list(_executor().map(_fsync, fds))
    except RuntimeError:  # at interpreter shutdown no thread can be started: one after another
        return [_fsync(fd) for fd in fds]
