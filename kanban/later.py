"""Unlinks of files the board no longer needs, done on a thread of their own so a transition does not wait for them.

Removing the last link to a file whose data reached the disk frees its blocks, and on ext4 without
a journal but with `discard` (common on cloud VMs) the kernel sends the discard to the disk and
waits for it inside unlink(): about 0.2 ms on a quiet machine, 1 to 2 ms while agents fsync. A
claim and a completion each free the task's previous document (the keeper link, txn.keep_old), so
an agent spent a tenth of its time in those two unlinks. They need not be waited for: a keeper is a
temp file of write_temp's naming, hidden from every listing, and one left behind by a process that
dies first is removed by the board's sweep of dead writers' temp files (txn.finish_interrupted).

One thread per process, started on first use; a child forked from the process starts its own. At
exit what is queued is unlinked before the process ends (bounded: the sweep takes what is left).
The thread is woken for the first unlink after a quiet spell and gathers for GATHER seconds: a
drain's two unlinks a task each woke it, two hand-offs of the interpreter's lock a task.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import os
import threading
from pathlib import Path

# Past this many waiting unlinks the caller unlinks itself: the queue never holds more than a
# moment's worth, whatever the disk's pace.
MOST_WAITING = 64
EXIT_WAIT = 2.0  # seconds the exit waits for the queue to empty
GATHER = 0.05  # seconds the thread gathers unlinks once woken, unless half the bound is reached first


class _Unlinker:
    def __init__(self) -> None:
        self.pending: collections.deque[Path] = collections.deque()
        self.busy = 0  # queued and not yet removed
        self.changed = threading.Condition()
        self.thread: threading.Thread | None = None
        self.asleep = False  # waiting for a first unlink: the next one wakes it
        self.hurry = 0  # flushes waiting: the gathering ends now

    def unlink(self, path: Path) -> None:
        with self.changed:
            if self.busy < MOST_WAITING and self._running():
                self.pending.append(path)
                self.busy += 1
                if self.asleep or self.busy >= MOST_WAITING // 2:
                    self.changed.notify_all()
                return
        _remove(path)

    def _running(self) -> bool:
        if self.thread is None:
            thread = threading.Thread(target=self._run, name="board-unlink", daemon=True)
            try:
                thread.start()
            except RuntimeError:  # at interpreter shutdown: no new thread
                return False
            self.thread = thread
        return True

    def _run(self) -> None:
        while True:
            with self.changed:
                self.asleep = True
                self.changed.wait_for(lambda: self.pending)
                self.asleep = False
                self.changed.wait_for(lambda: self.hurry > 0 or len(self.pending) >= MOST_WAITING // 2, GATHER)
                batch = list(self.pending)
                self.pending.clear()
            for path in batch:
                _remove(path)
            with self.changed:
                self.busy -= len(batch)
                self.changed.notify_all()

    def flush(self, timeout: float) -> bool:
        with self.changed:
            self.hurry += 1
            self.changed.notify_all()
            try:
                return self.changed.wait_for(lambda: self.busy == 0, timeout)
            finally:
                self.hurry -= 1


def _remove(path: Path) -> None:
    # A keeper is ours and hidden; one that cannot be removed now is the sweep's.
    with contextlib.suppress(OSError):
        os.unlink(path)


_UNLINKER = _Unlinker()


def unlink(path: Path) -> None:
    """Remove `path` soon, off the caller's path (now, if the queue is long or no thread can start)."""
    _UNLINKER.unlink(path)


def flush(timeout: float = EXIT_WAIT) -> bool:
    """Wait (at most `timeout` seconds) until every unlink queued so far is done; whether it is."""
    return _UNLINKER.flush(timeout)


def _forked() -> None:
    # The parent's thread is not in the child and its queue is the parent's to finish.
    global _UNLINKER
    _UNLINKER = _Unlinker()


os.register_at_fork(after_in_child=_forked)
atexit.register(flush)
