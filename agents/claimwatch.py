"""One thread per agent that looks whether it still holds the task it works, and halts the task once it does not.

A task can be taken away while it is worked (a cancel, a move by hand, a reclaim after the agent
was judged dead): then no further step, tool call or model call may be made for it. A thread
started for each task to look cost about 0.3 ms of CPU a task on a 2-core VM (a drain's task is
10 ms); this one is started once and given each task in turn.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator


class ClaimWatch:
    """Looks every `every()` seconds (read at each look: tests change it) whether `lost(task_id,
    token)` says the claim is gone; `looks` such answers in a row set the task's halt."""

    def __init__(self, lost: Callable[[str, int], object], every: Callable[[], float], looks: int) -> None:
        self.lost, self.every, self.looks = lost, every, looks
        self._cond = threading.Condition(threading.Lock())
        self._job: tuple[str, int, threading.Event] | None = None
        self._closed = False
        self._thread: threading.Thread | None = None
        self._pid = 0

    @contextlib.contextmanager
    def watching(self, task_id: str, token: int, halt: threading.Event) -> Iterator[None]:
        """Watch this task's claim for the block (one task at a time)."""
        job = (task_id, token, halt)
        with self._cond:
            self._job = job
            self._cond.notify_all()
            if self._thread is None or self._pid != os.getpid():  # none yet, or a forked child's
                self._thread = threading.Thread(target=self._run, name="claim", daemon=True)
                self._pid = os.getpid()
                self._thread.start()
        try:
            yield
        finally:
            with self._cond:
                self._job = None
                self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._job is not None or self._closed)
                if self._closed:
                    return
                job = self._job
            assert job is not None
            task_id, token, halt = job
            looks = 0
            while True:
                with self._cond:
                    # Halted (by us or by a stop): nothing more to look for until the task ends.
                    if self._cond.wait_for(lambda j=job: self._job is not j or self._closed,
                                           None if halt.is_set() else self.every()):
                        break
                looks = looks + 1 if self.lost(task_id, token) else 0
                if looks >= self.looks:
                    halt.set()
