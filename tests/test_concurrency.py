"""Many real processes on one board: contention, SIGKILL at every step of a transition, and
claimers woken by a drop."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from hermes_sup.kanban import Board
from hermes_sup.kanban.events import read_all
from hermes_sup.kanban.task import STATUSES

from .conftest import wait_until


def where(root: Path) -> dict[str, list[str]]:
    """task id -> every status folder holding a file for it."""
    found: dict[str, list[str]] = {}
    for status in STATUSES:
        for name in os.listdir(root / status):
            if name.endswith(".json") and not name.startswith("."):
                found.setdefault(name[:-5], []).append(status)
    return found


def assert_consistent(root: Path) -> dict[str, list[str]]:
    """Every task in exactly one folder, every file parses and agrees with its folder."""
    found = where(root)
    for task_id, folders in found.items():
        assert len(folders) == 1, f"{task_id} is in {folders}"
        doc = json.loads((root / folders[0] / f"{task_id}.json").read_text())
        assert doc["status"] == folders[0], f"{task_id}: status {doc['status']} in {folders[0]}/"
    assert [name for name in os.listdir(root / ".pending") if not name.startswith(".")] == []  # no marker
    return found


@pytest.mark.slow
def test_eight_processes_claim_two_thousand_tasks_each_exactly_once(board, spawn, tmp_path):
    ids = [board.add({"title": f"t{i}", "priority": i % 7})["id"] for i in range(2000)]
    logs = [tmp_path / f"claims-{n}.jsonl" for n in range(8)]
    procs = [spawn("contend", str(board.root), str(log), f"w{n}") for n, log in enumerate(logs)]
    for proc in procs:
        assert proc.wait(timeout=150) == 0

    claims = [json.loads(line) for log in logs for line in log.read_text().splitlines()]
    per_task = Counter(c["id"] for c in claims)
    assert set(per_task) == set(ids)
    assert max(per_task.values()) == 1, "no task was claimed twice"
    found = assert_consistent(board.root)
    assert all(folders == ["done"] for folders in found.values()) and len(found) == 2000
    assert os.listdir(board.root / "doing") == []
    events, bad = read_all(board.events_path)
    assert bad == 0
    transitions = Counter((e["from"], e["to"]) for e in events)
    assert transitions[("todo", "doing")] == 2000 and transitions[("doing", "done")] == 2000
    assert all(c["token"] == 1 for c in claims)


def test_a_claim_held_by_a_killed_process_goes_back_to_todo(board, spawn):
    doc = board.add({"title": "x"})
    holder = spawn("hold", str(board.root), "victim", stdout=subprocess.PIPE)
    assert json.loads(holder.stdout.readline())["pid"] == holder.pid
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=10)
    assert [r["task"] for r in board.recover()] == [doc["id"]]
    assert assert_consistent(board.root) == {doc["id"]: ["todo"]}
    again = board.claim("survivor")
    assert again["attempts"] == 2 and again["claim"]["token"] == 2


@pytest.mark.parametrize(("action", "point"), [
    *[("claim", point) for point in ("marked", "prepared", "written", "logged", "moved")],
    # Leaving doing/ takes no marker: recover() finds such a document by reading doing/.
    *[("complete", point) for point in ("prepared", "written", "logged", "moved")],
])
def test_sigkill_between_the_steps_of_a_transition_rolls_forward(board, spawn, point, action):
    doc = board.add({"title": "x"})
    if action == "complete":
        token = board.claim("w", pid=os.getpid())["claim"]["token"]
        args = ["complete", doc["id"], str(token)]
    else:
        args = ["claim", "w"]
    proc = spawn("step", str(board.root), *args, env={"HERMES_SUP_FAULT": point})
    assert proc.wait(timeout=30) == -signal.SIGKILL
    # Killed after the marker or the fsync'd temp file, the transition never happened; once the new
    # document is renamed into place ("written"), it did.
    happened = point not in ("marked", "prepared")

    # Any locked operation finishes (or discards) the interrupted transition first; recover() then
    # also finds the killed claimer's claim dead.
    board.recover()

    after = board.get(doc["id"])
    events, bad = read_all(board.events_path)
    assert bad == 0
    moves = [(e["from"], e["to"]) for e in events if e["task"] == doc["id"]]
    assert len(moves) == len(after["history"]), "events.jsonl accounts for every transition, once"
    assert [(h["from"], h["to"]) for h in after["history"]] == moves
    if action == "complete":
        expected_moves = [(None, "todo"), ("todo", "doing")] + ([("doing", "done")] if happened else [])
        final = "done" if happened else "doing"
    else:
        expected_moves = [(None, "todo")] + ([("todo", "doing"), ("doing", "todo")] if happened else [])
        final = "todo"
        if happened:
            assert "recovered: holder w" in after["history"][-1]["note"]
    assert moves == expected_moves
    assert assert_consistent(board.root) == {doc["id"]: [final]}
    leftovers = [n for s in STATUSES for n in os.listdir(board.root / s) if n.startswith(".")]
    assert leftovers == [], "a dead writer's temp files are swept"


@pytest.mark.slow
def test_random_sigkills_never_leave_a_task_in_two_places_or_a_torn_file(board, spawn):
    for i in range(40):
        board.add({"title": f"t{i}", "max_attempts": 1000})
    rng = random.Random(7)
    kills = 0
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:
        procs = [spawn("churn", str(board.root), f"c{n}") for n in range(3)]
        time.sleep(rng.uniform(0.2, 0.5))  # let them get into the middle of things; the kill is the test
        for proc in procs:
            proc.kill()
            proc.wait(timeout=10)
            kills += 1
    assert kills >= 9
    board.recover()
    found = assert_consistent(board.root)
    assert len(found) == 40
    assert os.listdir(board.root / "doing") == [], "every killed claim was recovered"
    for name in os.listdir(board.root / "todo"):
        if name.startswith("."):
            continue
        json.loads((board.root / "todo" / name).read_text())
    _events, bad = read_all(board.events_path)
    assert bad <= kills, "at most one torn line per kill, each skipped by readers"


def test_a_waiting_claimer_wakes_on_a_drop(board, spawn):
    waiter = spawn("wait", str(board.root), "w1", "60", stdout=subprocess.PIPE)
    assert waiter.stdout.readline().strip() == b"waiting"  # its watcher is running
    dropped_at = time.time()
    tmp = board.root / ".drop.tmp"
    tmp.write_text('{"title": "wake up"}')
    os.rename(tmp, board.root / "inbox" / "wake.json")
    result = json.loads(waiter.stdout.readline())
    assert waiter.wait(timeout=10) == 0
    assert result["mode"] == "inotify"
    assert board.get(result["id"])["title"] == "wake up"
    # Generous: the event path takes milliseconds; the rescan fallback would take 2 s or more.
    assert result["at"] - dropped_at < 1.5


def test_waiting_falls_back_to_polling_when_inotify_instances_run_out(board):
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    held = []
    try:
        while len(held) < 4096:
            fd = libc.inotify_init1(os.O_CLOEXEC)
            if fd < 0:
                break
            held.append(fd)
        board.start_watching()
    finally:
        for fd in held:
            os.close(fd)
    assert board.watcher.mode == "polling"
    assert "max_user_instances" in board.watcher.reason
    board.add({"title": "found by polling"})
    got = board.wait_for_work("w", timeout=10)
    assert got is not None and got["title"] == "found by polling"


def test_a_waiter_does_not_busy_poll(board):
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.monotonic()
    assert board.wait_for_work("idle", timeout=3) is None
    elapsed = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert elapsed >= 2.9
    assert cpu < 0.5, f"waiting 3 s used {cpu:.2f} s of CPU"


def test_wait_for_work_recovers_dead_claims_on_its_own(board, spawn):
    doc = board.add({"title": "x"})
    holder = spawn("hold", str(board.root), "victim", stdout=subprocess.PIPE)
    holder.stdout.readline()
    holder.kill()
    holder.wait(timeout=10)
    got = Board(board.root).wait_for_work("rescuer", timeout=15)
    assert got is not None and got["id"] == doc["id"] and got["attempts"] == 2


def test_drop_while_a_claimer_waits_in_a_thread_of_the_same_process(board):
    import threading

    results = []
    thread = threading.Thread(target=lambda: results.append(board.wait_for_work("t", timeout=20)))
    thread.start()
    wait_until(lambda: board.watcher.mode == "inotify", timeout=10)
    (board.root / "inbox" / "t.txt").write_text("thread task\n")
    thread.join(timeout=20)
    assert results and results[0]["title"] == "thread task"


def test_a_reservation_of_a_killed_claimer_does_not_hide_the_task(board, spawn):
    doc = board.add({"title": "x"})
    proc = spawn("step", str(board.root), "claim", "doomed", env={"HERMES_SUP_FAULT": "marked"})
    assert proc.wait(timeout=30) == -signal.SIGKILL
    assert os.path.lexists(board.root / ".pending" / doc["id"])
    # No recover() here: a plain claim loop must get past the dead reservation by itself.
    got = wait_until(lambda: board.claim("rescuer"), timeout=10, interval=0.1)
    assert got["id"] == doc["id"] and got["attempts"] == 1
    assert not os.path.lexists(board.root / ".pending" / doc["id"])


COMMENTER = """
import sys, time
from pathlib import Path
from hermes_sup.kanban import Board
root, task_id, name, count, go = sys.argv[1:]
board = Board(root)
while not Path(go).exists():
    time.sleep(0.001)
for index in range(int(count)):
    board.comment(task_id, f"{name}-{index}", by=name)
"""


def test_the_board_lock_excludes_other_processes_no_comment_is_lost(board, tmp_path):
    """Four processes read, change and write one task at once: only the cross-process lock keeps
    each from writing over a comment another has just added."""
    task = board.add({"title": "talked about"})
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    procs = [subprocess.Popen([sys.executable, "-c", COMMENTER, str(board.root), task["id"], f"p{n}", "40", str(go)],
                              env=env) for n in range(4)]
    try:
        go.touch()
        for proc in procs:
            assert proc.wait(timeout=120) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    texts = [c["text"] for c in board.get(task["id"])["comments"]]
    assert sorted(texts) == sorted(f"p{n}-{i}" for n in range(4) for i in range(40)), \
        f"{160 - len(texts)} of 160 comments were lost"


def test_a_long_wait_for_the_board_lock_sleeps_until_the_holder_lets_go(tmp_path):
    """256 claimers each retried the lock every 2 to 20 ms: their polls took the holder's CPU, 64
    claimers of the board alone burned 105 s of CPU for 2,000 tasks and 256 never finished. A
    waiter now polls only its first 2 ms, then sleeps in flock(2) until the kernel wakes it.
    Counted flock calls of a real waiting process over a 1.5 s hold."""
    from hermes_sup.kanban.lock import BoardLock

    held = BoardLock(tmp_path / ".lock", timeout=5)
    held.acquire()
    waiter = subprocess.Popen([sys.executable, "-c", """
import fcntl, sys, time
from pathlib import Path
from hermes_sup.kanban.lock import BoardLock
calls = []
real = fcntl.flock
fcntl.flock = lambda *args: calls.append(1) or real(*args)
lock = BoardLock(Path(sys.argv[1]), timeout=30)
print("waiting", flush=True)
lock.acquire()
print(len(calls), flush=True)
""", str(tmp_path / ".lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert waiter.stdout.readline().strip() == "waiting"
        time.sleep(1.5)  # the holder's section: long, as at the back of a queue of 256
        held.release()
        calls = int(waiter.stdout.readline())
        assert waiter.wait(timeout=10) == 0
    finally:
        waiter.kill()
        held.close()
    # Polls in the first 2 ms (50 us doubling: about 6), then one blocking call. Every 20 ms would be 75.
    assert calls <= 10, calls


def test_a_waiter_that_timed_out_holds_nothing_and_waits_again_as_before(tmp_path):
    """The waiting thread stays in flock after its caller gave up: when it gets the lock nobody
    wants, it lets go at once; a caller that wants it again by then is given it, and keeps it."""
    from hermes_sup.kanban.lock import BoardLock, LockTimeout

    holder, gave_up, third = (BoardLock(tmp_path / ".lock", timeout=t) for t in (5, 0.3, 0))
    try:
        holder.acquire()
        with pytest.raises(LockTimeout):
            gave_up.acquire()
        holder.release()
        # The abandoned wait ends with the lock dropped: another descriptor gets it.
        assert wait_until(third.try_acquire, 5)
        assert not gave_up.try_acquire()
        gave_up.timeout = 10
        got = []
        thread = threading.Thread(target=lambda: got.append(gave_up.acquire() or True))
        thread.start()
        wait_until(lambda: gave_up._waiter is not None and gave_up._waiter.busy(), 5)
        third.release()
        thread.join(10)
        assert got == [True]
        assert not third.try_acquire()  # given, and not dropped behind the caller's back
        gave_up.release()
        assert third.try_acquire()
        third.release()
    finally:
        for lock in (holder, gave_up, third):
            lock.close()


def test_a_wait_for_the_board_lock_interrupted_by_a_signal_leaves_it_to_the_others(tmp_path):
    """Ctrl-C in a long wait (a signal handler that raises) left the request standing: the waiting
    thread then took the lock for a caller that had given up, and every other process was locked
    out until this one exited. The request is withdrawn and a lock handed over meanwhile dropped."""
    from hermes_sup.kanban.lock import BoardLock

    class Interrupted(Exception):
        pass

    def interrupt(*_args: object) -> None:
        raise Interrupted

    holder, victim, third = (BoardLock(tmp_path / ".lock", timeout=10) for _ in range(3))
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        holder.acquire()
        signal.setitimer(signal.ITIMER_REAL, 0.2)  # well past the first 2 ms of polls: in the thread's hands
        with pytest.raises(Interrupted):
            victim.acquire()
        holder.release()
        assert wait_until(third.try_acquire, 5), "the lock stayed with a caller that gave up"
        third.release()
        victim.acquire()  # and the interrupted one waits again as before
        assert not third.try_acquire()
        victim.release()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        for lock in (holder, victim, third):
            lock.close()
