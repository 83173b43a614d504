"""The agent's claim watcher: one thread for every task it works, halting a task whose claim is gone."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from hermes_sup.agents.claimwatch import ClaimWatch

from .conftest import wait_until


def test_a_task_whose_claim_is_gone_is_halted_and_the_next_one_is_watched_by_the_same_thread():
    gone: set[str] = set()
    asked: list[str] = []

    def lost(task_id: str, token: int) -> bool:
        asked.append(task_id)
        return task_id in gone

    watch = ClaimWatch(lost, lambda: 0.01, looks=2)
    threads = threading.active_count()
    try:
        for n in range(20):
            halt = threading.Event()
            with watch.watching(f"t{n}", 1, halt):
                wait_until(lambda n=n: asked.count(f"t{n}") >= 3, 5)  # looked at, and still held
                assert not halt.is_set()
                if n == 19:
                    gone.add("t19")
                    assert halt.wait(5), "a task whose claim is gone is halted"
            assert threading.active_count() <= threads + 1, "one watcher thread for every task"
        kept = threading.Event()
        with watch.watching("t20", 1, kept):
            wait_until(lambda: asked.count("t20") >= 3, 5)
        gone.add("t20")  # taken away after its work ended: nothing of it is looked at any more
        before = len(asked)
        with watch.watching("t21", 1, threading.Event()):
            wait_until(lambda: len(asked) >= before + 3, 5)
        assert "t20" not in asked[before:] and not kept.is_set()
    finally:
        watch.close()


def switches(thread: threading.Thread) -> int:
    """How many times the thread has gone to sleep (the kernel's count of its voluntary switches)."""
    status = Path(f"/proc/self/task/{thread.native_id}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("voluntary_ctxt_switches")).split()[1])


def test_tasks_shorter_than_a_look_neither_wake_the_watcher_nor_are_looked_at():
    """A drain's tasks take a few ms and the watcher looks every 0.15 s: waking it as each task
    began and ended was two hand-offs of the interpreter's lock a task."""
    asked: list[str] = []
    watch = ClaimWatch(lambda task_id, token: asked.append(task_id), lambda: 30.0, looks=2)
    try:
        with watch.watching("first", 1, threading.Event()):
            pass
        thread = watch._thread
        assert thread is not None
        wait_until(lambda: switches(thread) >= 1, 5)  # started, and asleep until its first look
        before = switches(thread)
        for n in range(200):
            with watch.watching(f"t{n}", 1, threading.Event()):
                time.sleep(0.002)  # the task's work, the interpreter's lock let go: a woken watcher would run
        assert switches(thread) - before <= 5, "the watcher was woken for tasks it would never look at"
        assert asked == []
    finally:
        watch.close()
