"""fsync of several files at once, each on a thread of a small pool: a batch is durable in about the time of one.

The board makes a document durable before any name points to it (fsio.py). One after another, the
fsyncs of a batch of drops each waited a round trip to the disk (0.25-0.3 ms on the 2-core VM with a
virtio disk); issued together they overlap, and a batch of 32 took 0.1 ms a file. The threads only
wait in the kernel: fsync gives up the GIL.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

THREADS = 8

_lock = threading.Lock()
_pool: tuple[int, ThreadPoolExecutor] | None = None  # the pool and the pid that made it (a fork's is not its)


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), ThreadPoolExecutor(THREADS, thread_name_prefix="board-fsync"))
        return _pool[1]


def _fsync(path: Path) -> OSError | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        return exc
    try:
        os.fsync(fd)
    except OSError as exc:
        return exc
    finally:
        os.close(fd)
    return None


def fsync_all(paths: list[Path]) -> list[OSError | None]:
    """fsync each of `paths` (files this process wrote and no one else names yet: the board's temp
    files), together; per path, None once it is durable, else the error that says it may not be."""
    if len(paths) <= 1:
        return [_fsync(path) for path in paths]
    try:
        return list(_executor().map(_fsync, paths))
    except RuntimeError:  # at interpreter shutdown no thread can be started: one after another
        return [_fsync(path) for path in paths]
