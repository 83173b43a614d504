"""Reads of a task never miss it while another process moves it between folders."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time

import pytest
from hermes_sup.kanban import Board, TaskNotFound, doccache, reads
from hermes_sup.kanban.rules import claim_order
from hermes_sup.kanban.task import STATUSES

from .conftest import wait_until

READS = 4_000  # with the moves below: the reads last at least as long as 300 moves
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


LISTINGS = 800  # with the moves below: the listings last at least as long as 100 moves


def test_list_and_counts_never_miss_or_double_count_a_task_another_process_keeps_moving(board, spawn):
    moved = board.add({"title": "moved back and forth", "max_attempts": 1_000_000})
    still = board.add({"title": "stays put"})
    board.move(still["id"], "blocked")
    mover = spawn("churn", str(board.root), "mover")  # claim, then release or fail: todo <-> doing
    first = wait_until(lambda: board.get(moved["id"])["claims"] >= 3, timeout=60) and board.get(moved["id"])["claims"]
    listings = missed = doubled = 0
    claims = first
    deadline = time.monotonic() + 120
    while (listings < LISTINGS or claims - first < MOVES // 3) and time.monotonic() < deadline:
        listings += 1
        ids = [doc["id"] for doc in board.list().tasks]
        missed += moved["id"] not in ids
        doubled += len(ids) != len(set(ids))
        assert still["id"] in ids
        counts = board.counts()
        missed += sum(counts.values()) < 2
        doubled += sum(counts.values()) > 2
        assert counts["blocked"] == 1
        claims = board.get(moved["id"])["claims"]
    mover.kill()
    mover.wait(timeout=30)
    assert claims - first >= MOVES // 3, "the mover must really have been moving the task during the listings"
    assert (missed, doubled) == (0, 0), f"{listings} listings and counts: {missed} missed, {doubled} double-counted"


HOLD_LOCK = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(300)
"""


def test_a_listing_still_answers_while_a_stuck_process_holds_the_board_lock(tmp_path):
    with Board(tmp_path / "kanban", lock_timeout=0.5) as board:
        task = board.add({"title": "listed anyway"})
        holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(board.root / ".lock")],
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline().strip() == "held"
            assert [doc["id"] for doc in board.list().tasks] == [task["id"]]
            assert board.counts()["todo"] == 1
        finally:
            holder.kill()
            holder.wait(timeout=10)


def test_a_reader_who_may_not_open_the_lock_file_still_lists_the_board(board):
    task = board.add({"title": "seen by a reader without write access"})
    board.claim("w")
    lock = board.root / ".lock"
    # An immutable lock file refuses O_RDWR even to root, as another user's board refuses us.
    if subprocess.run(["chattr", "+i", str(lock)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here")
    try:
        with pytest.raises(PermissionError):
            os.open(lock, os.O_RDWR)
        with Board(board.root, create=False) as reader:
            assert [doc["id"] for doc in reader.list().tasks] == [task["id"]]
            assert reader.counts() == {**dict.fromkeys(STATUSES, 0), "doing": 1}
    finally:
        subprocess.run(["chattr", "-i", str(lock)], check=True)


def test_a_listing_is_in_status_order_then_claim_order_within_each(board):
    # Ids, priorities and ages that disagree, in every status, so that no order but the right one passes.
    for n in range(24):
        board.add({"id": f"t-{(n * 7) % 24:02d}", "title": f"task {n}", "priority": (n * 5) % 3})
    for n in range(12):
        claimed = board.claim("a")
        if n % 4 == 0:
            board.complete(claimed["id"], claimed["claim"]["token"], "ok")
        elif n % 4 == 1:
            board.fail(claimed["id"], claimed["claim"]["token"], "no", permanent=True)
        elif n % 4 == 2:
            board.block(claimed["id"], claimed["claim"]["token"], "why")
    board.cancel("t-23")
    for name in ("h-c", "h-a", "h-b", "h-0"):  # made by hand, all at once: only their ids tell them apart
        doc = {"id": name, "title": name, "status": "todo", "history": [], "created_at": "2026-01-01T00:00:00Z",
               "priority": 0 if name == "h-0" else 1}
        (board.root / "todo" / f"{name}.json").write_text(json.dumps(doc))
    tasks = board.list().tasks
    statuses = [doc["status"] for doc in tasks]
    assert set(statuses) == set(STATUSES)
    expected = sorted(tasks, key=lambda doc: (STATUSES.index(doc["status"]), -doc["priority"], doc["created_at"],
                                              doc["id"]))
    assert [doc["id"] for doc in tasks] == [doc["id"] for doc in expected]
    assert [doc["id"] for doc in board.list_fields().tasks] == [doc["id"] for doc in expected]
    assert [doc["id"] for doc in board.list("todo").tasks] == [doc["id"] for doc in expected
                                                               if doc["status"] == "todo"]


@pytest.mark.parametrize("fields", [False, True])
def test_a_task_caught_in_two_folders_mid_claim_is_listed_once_in_its_newer_state(board, fields, monkeypatch):
    monkeypatch.setattr(doccache, "RACY_NS", -10**15)  # files changed just now are cached too
    board.add({"id": "x", "title": "being claimed"})
    older = (board.root / "todo" / "x.json").read_bytes()
    claimed = board.claim("a")  # its document is now in doing/, one history entry longer
    (board.root / "todo" / "x.json").write_bytes(older)  # as a lock-free scan may meet it mid-move
    for _ in range(2):  # the second from the listing's cache
        listing = reads.scan(board.root, None, board._read, fields=fields)
        assert [(doc["id"], doc["status"]) for doc in listing.tasks] == [("x", "doing")]
        assert listing.tasks[0]["history"] == (len(claimed["history"]) if fields else claimed["history"])
    assert (board.root / (doccache.FIELDS_NAME if fields else doccache.NAME)).exists()


def test_the_listings_sort_is_claim_order_with_every_kind_of_tie():
    rng = random.Random(12)
    docs = [{"id": f"t-{rng.randrange(10**6)}-{n}", "priority": rng.randrange(-2, 3),
             "created_at": f"2026-01-0{rng.randrange(1, 4)}T00:00:00Z"} for n in range(500)]
    ordered = list(docs)
    reads.in_claim_order(ordered)
    assert ordered == sorted(docs, key=claim_order)
