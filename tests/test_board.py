"""The board's verbs against a real folder: claim order, tokens, leases, recovery, hand changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from hermes_sup.kanban import Board, BoardError, ClaimLost, InvalidTransition, TaskError, TaskNotFound
from hermes_sup.kanban.events import read_all

from .conftest import wait_until


def folder_of(board: Board, task_id: str) -> list[str]:
    return [s for s in ("todo", "doing", "blocked", "done", "failed", "cancelled")
            if (board.root / s / f"{task_id}.json").exists()]


def test_layout_is_created(board):
    for name in ("inbox", "todo", "doing", "blocked", "done", "failed", "cancelled", "rejected"):
        assert (board.root / name).is_dir()


def test_claim_takes_highest_priority_then_oldest(board):
    low = board.add({"title": "low"})
    high_old = board.add({"title": "high old", "priority": 5})
    high_new = board.add({"title": "high new", "priority": 5})
    order = [board.claim("w")["id"] for _ in range(3)]
    assert order == [high_old["id"], high_new["id"], low["id"]]
    assert board.claim("w") is None


def test_claim_sees_tasks_added_by_another_process(board, tmp_path):
    assert board.claim("w") is None
    code = f"from hermes_sup.kanban import Board; print(Board({str(board.root)!r}).add({{'title': 'elsewhere'}})['id'])"
    added = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}).stdout.strip()
    assert board.claim("w")["id"] == added


def test_claim_sees_a_file_moved_into_todo_by_hand(board):
    doc = board.add({"title": "parked", "status": "blocked"})
    assert board.claim("w") is None
    os.rename(board.root / "blocked" / f"{doc['id']}.json", board.root / "todo" / f"{doc['id']}.json")
    # The index learns of hand moves from a rescan, which a claim that finds nothing triggers
    # once the index is a couple of seconds old.
    claimed = wait_until(lambda: board.claim("w"), timeout=10, interval=0.1)
    assert claimed["id"] == doc["id"]
    assert claimed["history"][-2]["note"] == "moved into todo/ by hand"


def test_assignee_role_and_dependencies(board):
    first = board.add({"title": "first"})
    second = board.add({"title": "second", "depends_on": [first["id"]], "priority": 9})
    mine = board.add({"title": "for w2", "assignee": "w2", "priority": 8})
    review = board.add({"title": "review", "role": "review", "priority": 7})
    got = board.claim("w1")
    assert got["id"] == first["id"], "dependency not done yet, assignee and role exclude the rest"
    assert board.claim("w1") is None
    assert board.claim("w3", roles=["review"])["id"] == review["id"]
    assert board.claim("w2")["id"] == mine["id"]
    board.complete(first["id"], got["claim"]["token"], "done")
    assert board.claim("w1")["id"] == second["id"]


def test_complete_records_result_and_history(board):
    doc = board.add({"title": "x"})
    claimed = board.claim("w1", lease=30)
    claim = claimed["claim"]
    assert claim["agent"] == "w1" and claim["pid"] == os.getpid() and claim["token"] == 1
    assert claim["pid_started"] == pytest.approx(psutil.Process().create_time(), abs=0.05)
    assert claimed["attempts"] == 1 and folder_of(board, doc["id"]) == ["doing"]
    done = board.complete(doc["id"], 1, {"answer": 42})
    assert done["result"] == {"answer": 42} and done["claim"] is None
    assert folder_of(board, doc["id"]) == ["done"]
    assert [h["to"] for h in board.get(doc["id"])["history"]] == ["todo", "doing", "done"]
    events, bad = read_all(board.events_path)
    assert bad == 0
    assert [(e["from"], e["to"]) for e in events if e["task"] == doc["id"]] == [
        (None, "todo"), ("todo", "doing"), ("doing", "done")]


def test_fail_returns_to_todo_until_max_attempts(board):
    doc = board.add({"title": "flaky", "max_attempts": 2})
    first = board.claim("w")
    after_first = board.fail(doc["id"], first["claim"]["token"], "boom 1")
    assert after_first["status"] == "todo" and after_first["error"] == "boom 1"
    second = board.claim("w")
    assert second["claim"]["token"] == 2 and second["attempts"] == 2
    final = board.fail(doc["id"], 2, "boom 2")
    assert final["status"] == "failed" and final["error"] == "boom 2"
    assert "attempt 2 of 2 failed: boom 2" in final["history"][-1]["note"]
    retried = board.retry(doc["id"])
    assert retried["status"] == "todo" and retried["attempts"] == 0


def test_release_does_not_count_an_attempt(board):
    doc = board.add({"title": "x", "max_attempts": 1})
    claimed = board.claim("w")
    released = board.release(doc["id"], claimed["claim"]["token"], "shutting down")
    assert released["status"] == "todo" and released["attempts"] == 0
    assert board.claim("w")["attempts"] == 1


def test_block_and_retry(board):
    doc = board.add({"title": "needs a person"})
    claimed = board.claim("w")
    blocked = board.block(doc["id"], claimed["claim"]["token"], "which account should I use?")
    assert blocked["status"] == "blocked" and blocked["error"] == "which account should I use?"
    assert board.claim("w") is None
    assert board.retry(doc["id"])["status"] == "todo"
    with pytest.raises(InvalidTransition, match="retry takes a blocked, failed or cancelled task"):
        board.retry(doc["id"])


def test_a_stale_token_cannot_overwrite_the_new_holder(board):
    doc = board.add({"title": "x"})
    old = board.claim("slow", lease=0.05)
    time.sleep(0.1)
    assert board.recover() == [{"task": doc["id"], "to": "todo", "reason": "lease of slow expired"}]
    new = board.claim("fast")
    assert new["claim"]["token"] == old["claim"]["token"] + 1
    for call in (lambda: board.complete(doc["id"], 1, "stale"), lambda: board.renew(doc["id"], 1),
                 lambda: board.fail(doc["id"], 1, "x"), lambda: board.release(doc["id"], 1)):
        with pytest.raises(ClaimLost, match="held by fast with token 2"):
            call()
    assert board.complete(doc["id"], 2, "fresh")["result"] == "fresh"
    with pytest.raises(ClaimLost, match="it is in done/"):
        board.complete(doc["id"], 2, "again")


def test_renew_extends_the_lease(board):
    doc = board.add({"title": "x"})
    claimed = board.claim("w", lease=0.2)
    renewed = board.renew(doc["id"], claimed["claim"]["token"], lease=60)
    assert renewed["claim"]["lease_until_ts"] > time.time() + 50
    time.sleep(0.3)
    assert board.recover() == []


def test_recover_returns_a_dead_holders_task_with_attempts_kept(board, spawn):
    doc = board.add({"title": "x", "max_attempts": 2})
    holder = spawn("hold", str(board.root), "doomed", stdout=subprocess.PIPE)
    claim = json.loads(holder.stdout.readline())
    assert claim["pid"] == holder.pid
    assert board.recover() == [], "a live holder keeps its claim"
    holder.kill()
    holder.wait(timeout=10)
    recovered = board.recover()
    assert recovered == [{"task": doc["id"], "to": "todo", "reason": f"holder doomed (pid {holder.pid}) is gone"}]
    after = board.get(doc["id"])
    assert after["attempts"] == 1 and after["claim"] is None and "is gone" in after["error"]
    events, _ = read_all(board.events_path)
    assert events[-1]["to"] == "todo" and events[-1]["by"] == "board" and "is gone" in events[-1]["note"]


def test_a_reused_pid_is_not_mistaken_for_the_holder(board):
    doc = board.add({"title": "x"})
    claimed = board.claim("w")
    path = board.root / "doing" / f"{doc['id']}.json"
    forged = json.loads(path.read_text())
    # Same pid (this live process), but a start time that is not this process's: the holder died
    # and its pid was handed to someone else.
    forged["claim"]["pid_started"] = claimed["claim"]["pid_started"] - 1000
    path.write_text(json.dumps(forged))
    assert board.recover()[0]["reason"].endswith("is gone")


def test_recovery_past_max_attempts_fails_the_task(board):
    doc = board.add({"title": "x", "max_attempts": 1})
    board.claim("w", lease=0.01)
    time.sleep(0.05)
    assert board.recover()[0]["to"] == "failed"
    failed = board.get(doc["id"])
    assert failed["status"] == "failed" and "gave up after 1 attempts" in failed["error"]


def test_hand_changes(board):
    doc = board.add({"title": "x"})
    with pytest.raises(InvalidTransition, match="only when an agent claims it"):
        board.move(doc["id"], "doing")
    claimed = board.claim("w")
    cancelled = board.cancel(doc["id"])
    assert cancelled["status"] == "cancelled" and "claim of w revoked" in cancelled["history"][-1]["note"]
    with pytest.raises(ClaimLost):
        board.complete(doc["id"], claimed["claim"]["token"], "late")
    with pytest.raises(InvalidTransition, match="already cancelled"):
        board.cancel(doc["id"])
    assert board.move(doc["id"], "done", note="did it by hand")["status"] == "done"
    with pytest.raises(TaskNotFound):
        board.get("no-such-task")
    with pytest.raises(TaskNotFound):
        board.move("no-such-task", "todo")


def test_add_rejects_cycles_through_existing_tasks(board):
    a = board.add({"title": "a", "id": "a", "depends_on": ["b"]})
    with pytest.raises(TaskError, match="depends_on creates a cycle: b -> a -> b"):
        board.add({"title": "b", "id": "b", "depends_on": ["a"]})
    with pytest.raises(TaskError, match="already exists"):
        board.add({"title": "again", "id": a["id"]})


def test_lock_file_survives_release(board):
    board.add({"title": "x"})
    lock = board.root / ".lock"
    inode = lock.stat().st_ino
    board.claim("w")
    assert lock.exists() and lock.stat().st_ino == inode


def test_damaged_task_file_is_moved_aside_not_lost(board):
    keep = board.add({"title": "keep"})
    broken = board.add({"title": "broken"})
    path = board.root / "todo" / f"{broken['id']}.json"
    path.write_bytes(path.read_bytes()[:40])  # truncated on disk
    listing = board.list()
    assert [d["id"] for d in listing.tasks] == [keep["id"]]
    assert listing.damaged[0]["path"] == f"todo/{broken['id']}.json"
    assert "not valid JSON" in listing.damaged[0]["reason"]
    moved = board.quarantine_damaged(listing.damaged)
    assert moved == [f"rejected/todo--{broken['id']}.json"]
    note = (board.root / "rejected" / f"todo--{broken['id']}.json.error.txt").read_text()
    assert "found damaged" in note and "every other task stayed where it was" in note
    assert board.claim("w")["id"] == keep["id"]
    assert any("damaged" in p for p in board.problems)


def test_a_missing_status_folder_is_recreated_and_reported(tmp_path):
    root = tmp_path / "kanban"
    Board(root).add({"title": "x"})
    (root / "blocked").rmdir()
    reopened = Board(root)
    assert (root / "blocked").is_dir()
    assert reopened.problems == ["status folder blocked/ was missing and has been recreated empty"]
    events, _ = read_all(root / "events.jsonl")
    assert events[-1]["note"] == reopened.problems[0]


def test_torn_event_line_is_repaired_before_the_next_append(board):
    board.add({"title": "x"})
    with open(board.events_path, "ab") as handle:
        handle.write(b'{"at": "2026-01-01", "task": "half')  # a writer killed mid-line
    board.add({"title": "y"})
    events, bad = read_all(board.events_path)
    assert bad == 1 and [e["note"] for e in events] == ["added", "added"]


def test_network_filesystem_is_refused_unless_allowed(tmp_path, monkeypatch):
    from hermes_sup.kanban import fsinfo

    monkeypatch.setattr(fsinfo, "filesystem_of", lambda path: fsinfo.Mount(str(path), "nfs4", "srv:/x"))
    with pytest.raises(BoardError, match=r"network filesystem \(nfs4\).*HERMES_SUP_ALLOW_NETWORK_FS=1"):
        Board(tmp_path / "kanban")
    allowed = Board(tmp_path / "kanban", allow_network_fs=True)
    allowed.start_watching()
    assert allowed.watcher.mode == "polling" and "network filesystem" in allowed.watcher.reason
    monkeypatch.setenv("HERMES_SUP_ALLOW_NETWORK_FS", "1")
    assert Board(tmp_path / "kanban").network_fs


def test_the_lock_excludes_a_forked_child_using_the_same_board(board):
    from hermes_sup.kanban.lock import LockTimeout

    with board._locked():
        pid = os.fork()
        if pid == 0:  # the child: it must open its own descriptor, and so must wait
            board._flock.timeout = 0.2
            try:
                board._flock.acquire()
                os._exit(1)
            except LockTimeout:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "a forked child got the lock its parent holds"


def test_steps_only_claims_skip_tasks_that_need_an_llm(board):
    llm = board.add({"title": "think hard", "priority": 9})
    plan = board.add({"title": "deterministic", "steps": [{"tool": "wait", "args": {"seconds": 0}}]})
    got = board.claim("offline-agent", steps_only=True)
    assert got["id"] == plan["id"]
    assert board.claim("offline-agent", steps_only=True) is None
    assert board.get(llm["id"])["status"] == "todo"
    assert board.claim("llm-agent")["id"] == llm["id"]


def test_waiting_notes_are_set_cleared_and_dropped_on_claim(board):
    llm_task = board.add({"title": "needs a model"})
    steps_task = board.add({"title": "plan", "steps": [{"tool": "wait", "args": {}}]})
    events_before = len(read_all(board.events_path)[0])
    assert board.mark_waiting("no LLM provider available") == 1
    assert board.mark_waiting("no LLM provider available") == 0, "unchanged notes are not written again"
    assert board.get(llm_task["id"])["waiting"] == "no LLM provider available"
    assert "waiting" not in board.get(steps_task["id"])
    assert len(read_all(board.events_path)[0]) == events_before, "a note is not a transition"
    claimed = board.claim("w", steps_only=False)
    assert claimed["id"] == llm_task["id"] and "waiting" not in claimed
    board.release(claimed["id"], claimed["claim"]["token"])
    board.mark_waiting("no LLM provider available")
    assert board.mark_waiting(None) == 1 and "waiting" not in board.get(llm_task["id"])


class Interleaved(Board):
    """A board that lets a test act between a claim's pick and its commit: after the claimed
    document is written and fsync'd, before the lock is taken to commit it."""

    def __init__(self, root: Path, between) -> None:
        super().__init__(root)
        self.between = between

    def _prepare(self, folder: str, new: dict) -> Path:
        prepared = super()._prepare(folder, new)
        if new["status"] == "doing" and self.between is not None:
            between, self.between = self.between, None
            between(new["id"])
        return prepared


def _rewrite_assigned_elsewhere(root: Path, task_id: str) -> None:
    path = root / "todo" / f"{task_id}.json"
    doc = json.loads(path.read_text())
    tmp = path.with_name(".edit.tmp")
    tmp.write_text(json.dumps({**doc, "assignee": "someone-else"}))
    os.rename(tmp, path)


@pytest.mark.parametrize("change", ["cancelled", "edited by hand"])
def test_a_claim_never_commits_over_a_task_changed_after_its_pick(tmp_path, change):
    root = tmp_path / "kanban"
    with Board(root) as person:
        task = person.add({"title": "picked, then changed", "id": "picked"})

        def meanwhile(task_id: str) -> None:
            if change == "cancelled":
                person.cancel(task_id)  # its own lock descriptor: a second process, as far as flock goes
            else:
                _rewrite_assigned_elsewhere(root, task_id)

        with Interleaved(root, meanwhile) as claimer:
            assert claimer.claim("a") is None, "the claim re-checks the task at commit and gives it up"
            assert claimer.between is None, "the change was made between the pick and the commit"
        doc = person.get(task["id"])
        if change == "cancelled":
            assert doc["status"] == "cancelled" and folder_of(person, "picked") == ["cancelled"]
        else:
            assert doc["status"] == "todo" and doc["assignee"] == "someone-else" and doc["claim"] is None
            assert folder_of(person, "picked") == ["todo"]


HAND_MADE = {"id": "hand", "title": "written by hand", "status": "todo", "history": [],
             "created_at": "2026-01-01T00:00:00.000000Z"}
HOSTILE_DOCS = {
    "a claim that is text": {"claim": "mine"},
    "a title that is a number": {"title": 5},
    "an assignee that is a list": {"assignee": ["a"]},
    "a role that is an object": {"role": {"r": 1}},
    "dependencies that are numbers": {"depends_on": [1, 2]},
    "steps that are text": {"steps": "rm -rf /"},
    "a step that is text": {"steps": ["rm -rf /"]},
    "history entries that are numbers": {"history": [1, 2]},
    "a claim whose holder start is text": {"claim": {"agent": "a", "pid": 1, "pid_started": "x", "token": 1,
                                                     "lease_until_ts": 1.0}},
    "a claim with an impossible pid": {"claim": {"agent": "a", "pid": 10**30, "token": 1}},
    "an id that is not its file name": {"id": "other"},
}


@pytest.mark.parametrize("folder", ["todo", "doing"])
@pytest.mark.parametrize("what", list(HOSTILE_DOCS))
def test_a_hostile_hand_made_document_is_moved_aside_and_never_crashes_the_board(board, folder, what):
    doc = {**HAND_MADE, "status": folder, **HOSTILE_DOCS[what]}
    (board.root / folder / "hand.json").write_text(json.dumps(doc))
    good = board.add({"title": "a good task"})
    listing = board.list()
    assert [t["id"] for t in listing.tasks] == [good["id"]] and listing.damaged[0]["path"] == f"{folder}/hand.json"
    board.recover()
    board.mark_waiting("no model")
    assert board.claim("a", roles=("r",))["id"] == good["id"]
    assert os.path.exists(board.root / "rejected" / f"{folder}--hand.json")
    assert not os.path.exists(board.root / folder / "hand.json")


def test_a_minimal_hand_made_document_gets_its_counters_and_is_claimed(board):
    (board.root / "todo" / "hand.json").write_text(json.dumps(HAND_MADE))
    board.mark_waiting("no model")
    doc = board.claim("a")
    assert doc["id"] == "hand" and doc["attempts"] == 1 and doc["max_attempts"] == 3
    assert board.complete("hand", doc["claim"]["token"], "ok")["status"] == "done"


def test_the_lock_is_held_to_the_end_of_a_section_that_nests_another(tmp_path):
    """add() looks up the dependencies of a new task under the lock, and a look-up that misses
    takes the lock again: leaving that inner section must not release the outer one's lock."""
    from hermes_sup.kanban.lock import BoardLock, LockTimeout

    class Probe(Board):
        def _check_new(self, doc: dict) -> None:
            super()._check_new(doc)
            other = BoardLock(self.root / ".lock", timeout=0)  # its own descriptor: like another process
            try:
                other.acquire()
                self.outsider_got_in = True
                other.release()
            except LockTimeout:
                self.outsider_got_in = False
            finally:
                other.close()

    with Probe(tmp_path / "kanban") as board:
        board.add({"title": "waits for a task not yet on the board", "depends_on": ["later"]})
        assert board.outsider_got_in is False


def _blocked_with_a_question(board: Board) -> dict:
    task = board.add({"title": "asks"})
    claimed = board.claim("w")
    return board.block(task["id"], claimed["claim"]["token"], "asked a human", question="which colour?")


def test_an_answer_over_the_task_size_cap_is_refused_and_the_question_still_waits(board):
    task = _blocked_with_a_question(board)
    with pytest.raises(TaskError, match="limit for an answer is 1048576 bytes"):
        board.answer(task["id"], "x" * (1024 * 1024 + 1))
    kept = board.get(task["id"])
    assert (kept["status"], kept["question"]) == ("blocked", "which colour?")
    answered = board.answer(task["id"], "blue " * 1000)
    assert answered["status"] == "todo" and answered["comments"][-1]["answers"] == "which colour?"


def test_a_task_document_whose_question_is_not_text_is_damaged_not_read(board):
    task = _blocked_with_a_question(board)
    path = board.root / "blocked" / f"{task['id']}.json"
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "question": {"nested": ["not", "text"]}}))
    listing = board.list()
    assert listing.tasks == []
    assert listing.damaged == [{"path": f"blocked/{task['id']}.json", "reason": "task document's 'question' is object"}]


def test_comments_cannot_fill_a_task_so_that_its_result_no_longer_fits(tmp_path, monkeypatch):
    """Any agent with `kanban` may comment on any task: comments up to the document's cap made the
    holder's complete() fail (its result lost, an attempt spent, again at every attempt)."""
    from hermes_sup.kanban import base as board_module

    # The real cap is 64 MiB; a smaller one keeps the test quick, the proportions are the same.
    monkeypatch.setattr(board_module, "MAX_DOCUMENT_BYTES", 12 * board_module.MAX_BYTES)
    board = Board(tmp_path / "kanban")
    victim = board.add({"title": "victim"})
    comment = "x" * (board_module.MAX_BYTES - 200)
    refused = None
    for _ in range(16):
        try:
            board.comment(victim["id"], comment, by="mallory")
        except (TaskError, BoardError) as exc:
            refused = str(exc)
            break
    assert refused is not None, "comments stop somewhere"
    doc = board.claim("worker")
    assert doc["id"] == victim["id"]
    done = board.complete(victim["id"], doc["claim"]["token"], {"answer": "y" * (board_module.MAX_BYTES - 200)})
    assert done["status"] == "done" and len(done["result"]["answer"]) == board_module.MAX_BYTES - 200
    assert "no room for this comment" in refused and "kept for its result" in refused


def test_recover_on_a_fresh_board_lists_each_status_folder_once_and_still_sweeps(board, monkeypatch):
    board.add({"title": "a task", "id": "x"})  # this board's first locked section is behind it
    dead = subprocess.Popen([sys.executable, "-c", "pass"])  # a pid that no longer runs
    dead.wait(timeout=30)
    left = board.root / "done" / f".x.json.{dead.pid}.abcdef.tmp"
    left.write_text("half a task")
    board.recover()  # a board that already swept once sweeps again when asked
    assert not left.exists()
    left.write_text("half a task")
    listed: list[str] = []
    real = os.scandir

    def counting(path: str | os.PathLike[str] = ".") -> object:
        listed.append(Path(path).name)
        return real(path)

    monkeypatch.setattr(os, "scandir", counting)
    with Board(board.root) as fresh:
        fresh.recover()  # its lock's first taking sweeps: the recovery itself need not sweep again
    assert listed.count("done") == 1, listed
    assert not left.exists()
