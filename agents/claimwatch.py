"""One thread per agent that looks whether it still holds the task it works, and halts the task once it does not.

A task can be taken away while it is worked (a cancel, a move by hand, a reclaim after the agent
was judged dead): then no further step, tool call or model call may be made for it. A thread
started for each task to look cost about 0.3 ms of CPU a task on a 2-core VM (a drain's task is
10 ms); this one is started once and given each task in turn. Nor is it woken for each task: it
wakes at its next look, finds the task it holds then (or none: it sleeps until one comes), and
looks at a task only once it has been held `every()` seconds. Two wake-ups a task, each a hand-off
of the interpreter's lock, were a drain's largest share of futex calls.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator


class ClaimWatch:
    """Looks every `every()` seconds (read at each look: tests change it) whether `lost(task_id,
    token)` says the claim is gone; `looks` such answers in a row set the task's halt."""

    def __init__(self, lost: Callable[[str, int], object], every: Callable[[], float], looks: int) -> None:
        self.lost, self.every, self.looks = lost, every, looks
        self._cond = threading.Condition(threading.Lock())
        self._job: tuple[str, int, threading.Event, float] | None = None
        self._closed = False
        self._asleep = False  # waiting with no time set: only a new task (or close) wakes it
        self._thread: threading.Thread | None = None
        self._pid = 0

    @contextlib.contextmanager
    def watching(self, task_id: str, token: int, halt: threading.Event) -> Iterator[None]:
        """Watch this task's claim for the block (one task at a time)."""
        job = (task_id, token, halt, time.monotonic())
        with self._cond:
            self._job = job
            if self._asleep:
                self._cond.notify_all()
            if self._thread is None or self._pid != os.getpid():  # none yet, or a forked child's
                self._thread = threading.Thread(target=self._run, name="claim", daemon=True)
                self._pid = os.getpid()
                self._thread.start()
        try:
            yield
        finally:
            with self._cond:
                if self._job is job:
                    self._job = None  # seen at the thread's next wake-up: none is made for it

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _run(self) -> None:
        counted: tuple[str, int, threading.Event, float] | None = None
        looks, due = 0, 0.0
        while True:
            with self._cond:
                if self._closed:
                    return
                job = self._job
                if job is not None and job is not counted:
                    counted, looks, due = job, 0, job[3] + self.every()
                # No task, or one halted (by us or by a stop): nothing to look for until the next.
                wait = None if job is None or job[2].is_set() else due - time.monotonic()
                if wait is None or wait > 0:
                    self._asleep = wait is None
                    self._cond.wait(wait)
                    self._asleep = False
                    continue
            task_id, token, halt, _ = job
            looks = looks + 1 if self.lost(task_id, token) else 0
            due = time.monotonic() + self.every()
            if looks >= self.looks:
                halt.set()
