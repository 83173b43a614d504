"""Real processes on one board: claimers racing for every task, and a process SIGKILLed at every
step of every transition followed by recovery."""

from __future__ import annotations

import json
import select
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from .backends import FAULT_POINTS, Backend, Store, all_events, fault_points, tasks
from .checks import check_invariants
from .worker import LIFE, SPARE

CLAIMERS, TASKS = 4, 300


@pytest.mark.slow
def test_claimer_processes_complete_every_task_exactly_once(backend, store, tmp_path, workers):
    ids = {store.add({"title": f"t{n}", "priority": n % 5})["id"] for n in range(TASKS)}
    go = tmp_path / "go"
    logs = [tmp_path / f"claims-{n}.jsonl" for n in range(CLAIMERS)]
    procs = [workers.start("claimer", backend.kind, str(tmp_path), str(log), f"c{n}", str(go))
             for n, log in enumerate(logs)]
    go.touch()
    # Meanwhile every look from outside sees each task once, in one status, at every moment.
    looks = 0
    deadline = time.monotonic() + 150
    while any(proc.poll() is None for proc in procs) and time.monotonic() < deadline:
        seen = tasks(store)
        assert sorted(doc["id"] for doc in seen) == sorted(ids), "a listing lost a task or showed one twice"
        assert sum(store.counts().values()) == TASKS
        looks += 1
    for proc in procs:
        assert proc.wait(timeout=150) == 0

    claims = [json.loads(line) for log in logs for line in log.read_text().splitlines()]
    per_task = Counter(claim["id"] for claim in claims)
    assert set(per_task) == ids, f"{len(ids - set(per_task))} tasks were never claimed"
    doubled = [task_id for task_id, n in per_task.items() if n > 1]
    assert doubled == [], f"{len(doubled)} tasks were claimed twice, e.g. {doubled[:3]}"
    # A token is the backend's (a per-task count on files, a sequence on PostgreSQL); within a task
    # each claim has its own, so a task claimed once has one.
    assert all(isinstance(claim["token"], int) for claim in claims)
    busy = [log for log in logs if log.read_text()]
    assert len(busy) >= 2, "the claimers did not overlap; the race was not run"
    assert looks >= 2, "the board was never looked at while it changed"
    docs = check_invariants(backend, store)
    assert {doc["status"] for doc in docs.values()} == {"done"} and set(docs) == ids
    assert {doc["claims"] for doc in docs.values()} == {1}, "a task was claimed more than once"
    claimed_by = {claim["id"]: n for n, log in enumerate(logs)
                  for claim in map(json.loads, log.read_text().splitlines())}
    for doc in docs.values():
        assert doc["result"] == {"by": f"c{claimed_by[doc['id']]}"}, "completed by the one who claimed it"
    completions = Counter(event["task"] for _cursor, event in all_events(backend, store)
                          if (event["from"], event["to"]) == ("doing", "done"))
    assert set(completions.values()) == {1} and set(completions) == ids


@pytest.mark.slow
def test_comments_from_many_processes_on_one_held_task_are_all_kept(backend, store, tmp_path, workers):
    """Each comment reads, changes and writes the whole task while its holder renews and then
    completes it: only mutual exclusion across processes keeps every write."""
    task = store.add({"title": "talked about"})
    held = store.claim("holder")
    go = tmp_path / "go"
    procs = [workers.start("commenter", backend.kind, str(tmp_path), task["id"], f"p{n}", "40", str(go))
             for n in range(CLAIMERS)]
    go.touch()
    deadline = time.monotonic() + 120
    while any(proc.poll() is None for proc in procs) and time.monotonic() < deadline:
        store.renew(task["id"], held["claim"]["token"])
    for proc in procs:
        assert proc.wait(timeout=120) == 0
    done = store.complete(task["id"], held["claim"]["token"], "ok")
    texts = [comment["text"] for comment in done["comments"]]
    expected = [f"p{n}-{i}" for n in range(CLAIMERS) for i in range(40)]
    assert sorted(texts) == sorted(expected), f"{len(set(expected) - set(texts))} of {len(expected)} comments were lost"
    for n in range(CLAIMERS):
        mine = [text for text in texts if text.startswith(f"p{n}-")]
        assert mine == [f"p{n}-{i}" for i in range(40)], "each process's comments stay in its order"
    check_invariants(backend, store)


def recover_and_finish(backend: Backend, store: Store) -> None:
    """After a killed lifecycle: recovery leaves a consistent board with no task lost and nothing
    held by the dead process, and the work then finishes with LIFE completed exactly once."""
    store.recover()
    store.ingest()  # a drop whose ingest was killed part-way is finished, never made twice
    docs = check_invariants(backend, store)
    assert LIFE in docs, "the dropped task was lost"
    assert list(backend.inbox(store).iterdir()) == [], "a drop was left behind, or ingested twice"
    assert list(backend.rejected(store).iterdir()) == [], "a drop ingested before the kill was rejected after it"
    assert SPARE in docs
    assert [d["id"] for d in tasks(store, "doing")] == [], "a dead holder's claim was not recovered"
    if docs.get(LIFE, {}).get("question"):
        store.answer(LIFE, "answered after the crash", by="lead")  # killed once it had asked
    for _ in range(10):
        doc = store.claim("rescuer")
        if doc is None:
            break
        store.complete(doc["id"], doc["claim"]["token"], "rescued")
    docs = check_invariants(backend, store)
    life = docs[LIFE]
    assert life["status"] == "done"
    assert sum(1 for h in life["history"] if (h["from"], h["to"]) == ("doing", "done")) == 1
    assert docs[SPARE]["status"] in ("done", "cancelled")


@pytest.mark.slow
@pytest.mark.requires(FAULT_POINTS)
def test_sigkill_at_every_step_of_every_transition_then_recovery(backend, tmp_path, workers):
    points = fault_points(backend)
    assert points, "the backend declares no fault points"
    kills: Counter[str] = Counter()
    errors = tmp_path / "lifecycles.err"
    with errors.open("wb") as sink:
        # Each lifecycle is forked from one process that imported the board's code (worker.lifecycles).
        forks = workers.start("lifecycles", backend.kind, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=sink)
    for point in points:
        for nth in range(1, 40):
            board_dir = tmp_path / f"{point}-{nth}"
            store = backend.build(board_dir)
            try:
                store.add({"id": SPARE, "title": "spare", "priority": -1, "max_attempts": 20})
                drop = backend.inbox(store) / f"{LIFE}.json"
                drop.write_text(json.dumps({"id": LIFE, "title": "a life", "max_attempts": 20}))
                code = run_lifecycle(forks, board_dir, f"{point}:{nth}")
                if code == 0:
                    # Past the last time the lifecycle reaches this point: it ran to the end.
                    docs = check_invariants(backend, store)
                    assert (docs[LIFE]["status"], docs[SPARE]["status"]) == ("done", "cancelled")
                    break
                assert code == -signal.SIGKILL, errors.read_text(errors="replace")[-2000:]
                kills[point] += 1
                recover_and_finish(backend, store)
            finally:
                store.close()
        else:
            pytest.fail(f"the lifecycle reached {point} more than 40 times")
    never = [point for point in points if not kills[point]]
    assert never == [], f"the lifecycle never reaches the declared fault points {never}: extend worker.lifecycle"


def run_lifecycle(forks: subprocess.Popen[bytes], board_dir: Path, fault: str, timeout: float = 60) -> int:
    """How a lifecycle forked by `forks` on `board_dir` with the fault armed ended (a returncode)."""
    assert forks.stdin is not None and forks.stdout is not None
    forks.stdin.write(json.dumps([str(board_dir), fault]).encode() + b"\n")
    forks.stdin.flush()
    ready, _, _ = select.select([forks.stdout], [], [], timeout)
    assert ready, f"the lifecycle with {fault} did not end within {timeout} s"
    answer = forks.stdout.readline().split()
    assert len(answer) == 2, f"the lifecycles process ended: {forks.poll()}"
    return int(answer[1])


def test_the_fault_point_scan_reads_every_literal_point_once():
    """The kill test is only as wide as this scan: the points are read from the code, never listed by hand."""
    from .backends import FAULT_CALL

    code = 'fault("marked")\n    fault( \'written\' )\nfault("marked")\nfault(point)\ndefault("x")\n'
    assert FAULT_CALL.findall(code) == ["marked", "written", "marked"]
