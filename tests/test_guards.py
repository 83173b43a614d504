"""One guard per property of the file board, each test failing when its guard alone is removed.

- the board lock (flock, kanban/lock.py): one transition of a task at a time, across processes;
- the claim's check under the lock that the todo file is still the one it reserved (claims.py):
  a change made while a claim was being prepared wins, and the task stays in one folder;
- the reservation marker (.pending/<id>, claims.py and txn.py): a transition in flight is known as
  one, so a claimer killed part-way is rolled forward, never taken for a hand move
  (tests/test_concurrency.py, kill at every step);
- the claim token (rules.held_by): a stale holder's write is rejected
  (tests/test_board.py::test_a_stale_token_cannot_overwrite_the_new_holder).

Two Board objects in two threads stand for two processes: each has its own lock descriptor, and
flock(2) excludes between descriptors as between processes. A step is held open by the board's
fault hook, so each interleaving happens for certain, not by chance.
"""

from __future__ import annotations

import fcntl
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hermes_sup.kanban import claims, lock, txn
from hermes_sup.kanban.board import Board
from hermes_sup.kanban.errors import BoardError
from hermes_sup.kanban.task import STATUSES

from .conftest import wait_until

WAIT = 10.0  # bound on every wait for the other thread to reach its step


class LockSpy:
    """`fcntl` as kanban/lock.py sees it, reporting when thread `name` is refused the board lock:
    the proof that it tried to take the lock while another held it (a timed window would pass
    under load without the thread ever having tried)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.refused = threading.Event()

    def __getattr__(self, attr: str) -> Any:
        return getattr(fcntl, attr)

    def flock(self, fd: int, operation: int) -> None:
        try:
            fcntl.flock(fd, operation)
        except BlockingIOError:
            if threading.current_thread().name == self.name:
                self.refused.set()
            raise


@contextmanager
def held_at(monkeypatch: pytest.MonkeyPatch, module: Any, point: str, thread: str) -> Iterator[
        tuple[threading.Event, threading.Event]]:
    """Hold thread `thread` at fault point `point` of `module` until `go` is set."""
    reached, go = threading.Event(), threading.Event()

    def hook(name: str) -> None:
        if name == point and threading.current_thread().name == thread and not reached.is_set():
            reached.set()
            go.wait(WAIT)

    monkeypatch.setattr(module, "fault", hook)
    try:
        yield reached, go
    finally:
        go.set()


def run(name: str, call: Any) -> tuple[threading.Thread, dict[str, Any]]:
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    return thread, outcome


def where(root: Path, task_id: str) -> list[tuple[str, str]]:
    """Each folder holding the task, with the status its document there says."""
    found = []
    for status in STATUSES:
        path = root / status / f"{task_id}.json"
        if path.exists():
            found.append((status, json.loads(path.read_text())["status"]))
    return found


def last_event(root: Path, task_id: str) -> dict[str, Any]:
    events = [json.loads(line) for line in (root / "events.jsonl").read_text().splitlines() if line.strip()]
    return [e for e in events if e["task"] == task_id][-1]


def test_the_board_lock_keeps_a_hand_move_out_of_a_holders_transition(tmp_path, monkeypatch):
    holder_board, person_board = Board(tmp_path / "kanban"), Board(tmp_path / "kanban")
    try:
        task = holder_board.add({"title": "raced"})
        doc = holder_board.claim("w1")
        assert doc is not None and doc["id"] == task["id"]
        with held_at(monkeypatch, txn, "written", "holder") as (reached, go):
            holder, done = run("holder", lambda: holder_board.complete(task["id"], doc["claim"]["token"], "ok"))
            assert reached.wait(WAIT)
            # The holder is between renaming its new document into place and moving it to done/.
            spy = LockSpy("person")
            monkeypatch.setattr(lock, "fcntl", spy)
            person, moved = run("person", lambda: person_board.move(task["id"], "failed", by="person"))
            # With the lock the person is refused it (and waits for the holder); without, it runs
            # through now, while the holder is held: either is seen before the holder goes on.
            wait_until(lambda: spy.refused.is_set() or not person.is_alive(), timeout=WAIT)
            go.set()
            holder.join(WAIT)
            person.join(WAIT)
        assert not holder.is_alive() and not person.is_alive()
        assert "error" not in done, done
        assert "error" not in moved or isinstance(moved["error"], BoardError), moved
        found = where(tmp_path / "kanban", task["id"])
        assert len(found) == 1 and found[0][0] == found[0][1], found
        assert last_event(tmp_path / "kanban", task["id"])["to"] == found[0][0]
        assert found[0][0] == "failed"  # the person came second, and their move stands
    finally:
        holder_board.close()
        person_board.close()


def test_a_change_made_while_a_claim_is_prepared_wins(tmp_path, monkeypatch):
    claimer_board, person_board = Board(tmp_path / "kanban"), Board(tmp_path / "kanban")
    try:
        task = person_board.add({"title": "changed meanwhile"})
        with held_at(monkeypatch, claims, "prepared", "claimer") as (reached, go):
            claimer, claimed = run("claimer", lambda: claimer_board.claim("w1"))
            assert reached.wait(WAIT)
            # Reserved and its new document written, not yet committed: a person cancels the task.
            person_board.cancel(task["id"], by="person")
            go.set()
            claimer.join(WAIT)
        assert not claimer.is_alive()
        assert claimed == {"value": None}, claimed
        assert where(tmp_path / "kanban", task["id"]) == [("cancelled", "cancelled")]
        assert person_board.get(task["id"])["status"] == "cancelled"
    finally:
        claimer_board.close()
        person_board.close()
