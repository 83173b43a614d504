"""Reads of a task never miss it while another process moves it between folders."""

from __future__ import annotations

import time

from hermes_sup.kanban import TaskNotFound

from .conftest import wait_until

READS = 12_000
MOVES = 300


def test_get_never_misses_a_task_that_another_process_keeps_moving(board, spawn):
    task = board.add({"title": "moved back and forth", "max_attempts": 1_000_000})
    mover = spawn("churn", str(board.root), "mover")  # claim, then release or fail: todo <-> doing
    first = wait_until(lambda: board.get(task["id"])["claims"] >= 3, timeout=60) and board.get(task["id"])["claims"]
    reads = misses = claims = 0
    deadline = time.monotonic() + 120
    # Read until both enough reads were made and the mover moved the task enough times meanwhile.
    while (reads < READS or claims - first < MOVES) and time.monotonic() < deadline:
        reads += 1
        try:
            doc = board.get(task["id"])
        except TaskNotFound:
            misses += 1
            continue
        assert doc["id"] == task["id"]
        claims = doc["claims"]
    mover.kill()
    mover.wait(timeout=30)
    assert claims - first >= MOVES, "the mover must really have been moving the task during the reads"
    assert misses == 0, f"{misses} of {reads} reads missed a task that exists"
