"""A task's board work reads what changed, never the whole backlog: counted reads, not timings."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from hermes_sup.kanban import Board
from hermes_sup.kanban.base import Folder

from .conftest import wait_until


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The task files the board reads from here on, by name."""
    seen: list[str] = []
    real = Folder.read

    def counting(self: Folder, path: Path) -> dict:
        seen.append(path.name)
        return real(self, path)

    monkeypatch.setattr(Folder, "read", counting)
    return seen


def one_task_with_rescans(board: Board, agent: str) -> None:
    """What an agent's loop does for one task while the watcher keeps asking for rescans."""
    board.signal.bump(full=True)
    board.mark_waiting("no provider", agent=agent)  # an agent without a model: notes plain tasks only
    board.signal.bump(full=True)
    doc = board.claim(agent)
    assert doc is not None
    board.complete(doc["id"], doc["claim"]["token"], {"ok": True})
    board.signal.bump(full=True)
    board.mark_waiting(None, agent=agent)


@pytest.mark.parametrize("backlog", [50, 1000])
def test_reads_per_task_do_not_grow_with_the_backlog(tmp_path: Path, reads: list[str], backlog: int,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from hermes_sup.kanban import claimindex as claims
    monkeypatch.setattr(claims, "RESCAN_SHARE", 0)  # every rescan the watcher asks for happens
    # Files changed less than a second before a rescan are read again (the kernel's clock is coarse):
    # the backlog is as old as a real one by the time an agent drains it.
    monkeypatch.setattr(claims, "wall_ns", lambda: time.time_ns() + 2_000_000_000)
    board = Board(tmp_path / "kanban")
    for i in range(backlog):
        board.add({"title": f"t{i}", "steps": [{"tool": "write_file", "args": {"path": "a", "content": "x"}}]})
    board.claim("warm-up")  # builds the index: every task read once
    reads.clear()
    for _ in range(5):
        one_task_with_rescans(board, "a1")
    # Each task: its claim and completion read it (and the one after it is looked at); a rescan
    # reads only files changed since the last, and mark_waiting none (they all have steps).
    assert len(reads) <= 5 * 8, (backlog, len(reads), sorted(set(reads))[:10])
    board.close()


def test_a_rescan_reads_again_a_task_changed_by_hand(tmp_path: Path, reads: list[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from hermes_sup.kanban import claimindex as claims
    monkeypatch.setattr(claims, "RESCAN_SHARE", 0)
    board = Board(tmp_path / "kanban")
    low = board.add({"title": "low", "priority": 1, "role": "work"})
    high = board.add({"title": "to raise", "priority": 0, "role": "work"})
    for i in range(20):
        board.add({"title": f"filler {i}", "priority": 1, "role": "work"})
    monkeypatch.setattr(claims, "wall_ns", lambda: time.time_ns() + 2_000_000_000)  # all a second old
    assert board.claim("warm-up", roles=["nobody"]) is None  # the index built, nothing claimed
    path = board.root / "todo" / f"{high['id']}.json"
    before = path.stat()
    probe = tmp_path / "tick"
    # The edit below must fall in a later tick of the kernel's file clock than the task's creation
    # (within one tick the times cannot tell two writes apart: then the rule above reads it again).
    wait_until(lambda: (probe.write_text("x"), probe.stat().st_ctime_ns > before.st_ctime_ns)[1], timeout=5)
    text = path.read_text()
    assert '"priority":0' in text or '"priority": 0' in text
    # Raised in place, the same size, its mtime set back: only the ctime (no one can set it) tells.
    path.write_text(text.replace('"priority":0', '"priority":9').replace('"priority": 0', '"priority": 9'))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_size == before.st_size and path.stat().st_ino == before.st_ino
    reads.clear()
    board.signal.bump(full=True)
    claimed = board.claim("a1", roles=["work"])
    assert claimed is not None and claimed["id"] == high["id"], "the hand edit was not seen"
    assert reads.count(f"{low['id']}.json") == 0, "an unchanged task was read again"
    board.close()


def test_a_claimer_that_finds_nothing_leaves_the_board_lock_alone(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from hermes_sup.kanban.lock import BoardLock
    board = Board(tmp_path / "kanban")
    board.add({"title": "for another role", "role": "writer"})
    assert board.claim("a1", roles=["coder"]) is None  # the index is built (under the lock)
    taken: list[int] = []
    real = BoardLock.acquire
    monkeypatch.setattr(BoardLock, "acquire", lambda self: (taken.append(1), real(self))[1])
    for _ in range(10):  # woken again and again for work others took
        assert board.claim("a1", roles=["coder"]) is None
    assert taken == [], "a claim that found nothing took the board lock"
    # Something only the locked path repairs (a damaged task file) sends it there once.
    from hermes_sup.kanban import claimindex as claims
    monkeypatch.setattr(claims, "RESCAN_SHARE", 0)  # the watcher's rescan comes at once
    (board.root / "todo" / "broken-1.json").write_text("{not json")
    board.signal.bump(full=True)
    assert board.claim("a1", roles=["coder"]) is None
    assert taken and (board.root / "rejected").exists() and not (board.root / "todo" / "broken-1.json").exists()
    board.close()


def test_a_rescan_lists_again_only_the_folders_that_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hermes_sup.kanban import claimindex as claims
    board = Board(tmp_path / "kanban")
    for i in range(4):
        board.add({"title": f"t{i}"})
    for _ in range(2):
        doc = board.claim("a1")
        assert doc is not None
        board.complete(doc["id"], doc["claim"]["token"], {"ok": True})
    listed: list[str] = []
    real = os.scandir

    def counting(path):  # type: ignore[no-untyped-def]
        listed.append(os.path.basename(os.fspath(path)))
        return real(path)

    monkeypatch.setattr(claims.os, "scandir", counting)
    monkeypatch.setattr(claims, "wall_ns", lambda: time.time_ns() + 2_000_000_000)  # a second on
    board.claims.rescan()
    listed.clear()
    board.claims.rescan()  # nothing changed: done/ (and the others) are not listed again
    assert "done" not in listed
    doc = board.claim("a1")
    board.complete(doc["id"], doc["claim"]["token"], {"ok": True})
    listed.clear()
    board.claims.rescan()
    assert "done" in listed and board.disk.index.status.get(doc["id"]) == "done"
    # Within a second of a folder's change its times cannot tell a second change: listed again.
    monkeypatch.setattr(claims, "wall_ns", time.time_ns)
    doc = board.claim("a1")
    board.complete(doc["id"], doc["claim"]["token"], {"ok": True})
    board.claims.rescan()
    listed.clear()
    board.claims.rescan()
    assert "done" in listed
    board.close()


def test_rescans_share_the_board_among_its_claimers(tmp_path: Path) -> None:
    """A rescan holds the board lock: with 16 agents each rescanning a twentieth of its own time, the
    lock was held for rescans most of the time. The share is the board's, split among the claimers
    it has at work (the tasks in doing at the last rescan)."""
    from hermes_sup.kanban import claimindex as claims

    assert claims.rescan_interval(0.01, 1) == pytest.approx(claims.RESCAN_SHARE * 0.01)
    assert claims.rescan_interval(0.01, 16) == pytest.approx(16 * claims.rescan_interval(0.01, 1))
    assert claims.rescan_interval(0.01, 0) == claims.rescan_interval(0.01, 1)
    # However long a rescan and however many claimers, what only a rescan finds waits no longer.
    assert claims.rescan_interval(1.0, 64) == claims.RESCAN_MAX_INTERVAL
    board = Board(tmp_path / "kanban")
    for i in range(6):
        board.add({"title": f"t{i}"})
    for i in range(4):
        assert board.claim(f"a{i}") is not None
    board.claims.rescan()
    assert board.claims.claimers == 4
    alone = claims.rescan_interval(0.01, 1)  # the wait one claimer's 10 ms rescan asks for
    board.claims.indexed_at, board.claims.rescan_seconds = time.monotonic() - 2 * alone, 0.01
    board.signal.full_rescan_due = True
    assert not board.claims.rescan_due(), "due after one claimer's share of the time though 4 claimers rescan too"
    board.claims.indexed_at -= 2.5 * alone  # past the share times the 4 claimers
    assert board.claims.rescan_due()
    board.close()


def test_a_claim_does_not_read_the_tasks_others_have_reserved(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """With 16 agents each claim read and parsed the tasks the others had just reserved (their
    markers made, their commits not yet seen) before finding the markers: it reserves first now."""
    from hermes_sup.kanban.markers import owner_text as _owner_text

    reads: list[str] = []
    real = Folder.raw

    def counting(self: Folder, path: Path) -> bytes:
        reads.append(path.name)
        return real(self, path)

    monkeypatch.setattr(Folder, "raw", counting)

    board, other = Board(tmp_path / "kanban"), Board(tmp_path / "kanban")
    ids = [board.add({"title": f"t{i}", "priority": 10 - i})["id"] for i in range(8)]
    board.claim("warm-up-reader")  # builds this board's index; takes the first task
    for task_id in ids[1:6]:  # five claimers of the other board's kind are mid-claim
        os.symlink(_owner_text(), other.txn.marker(task_id))
    reads.clear()
    doc = board.claim("a1")
    assert doc is not None and doc["id"] == ids[6], doc
    assert not set(reads) & {f"{task_id}.json" for task_id in ids[1:6]}, reads
    board.close()
    other.close()


def test_a_waiter_that_keeps_finding_nothing_looks_less_often_and_one_after_quiet_at_once() -> None:
    """64 waiting agents each looked at every task arriving, all but one in vain, taking the time
    the ingest of the next ones needed. Pure rule, then the loop with a board that changes all the
    time and never has anything for this waiter."""
    import threading

    from hermes_sup.kanban.waitloop import LOOK_BACKOFF_MAX, look_delay, wait_for_work

    assert look_delay(0) == 0.0
    assert 0 < look_delay(1) < look_delay(2) < look_delay(5) <= LOOK_BACKOFF_MAX == look_delay(10_000)

    class Busy:  # every wait ends with a change: the board never rests
        generation = 0

        def wait(self, seen: int, timeout: float) -> bool:
            self.generation += 1
            return True

    looks: list[float] = []
    began = time.monotonic()
    assert wait_for_work(Busy(), look_after=lambda: None, claim=lambda: looks.append(time.monotonic()),
                         nap=lambda: 5.0, timeout=0.6, stop=threading.Event()) is None
    took = time.monotonic() - began
    # Without the rule: a look per change, tens of thousands in 0.6 s.
    assert len(looks) <= 8 + took / LOOK_BACKOFF_MAX, (len(looks), took)

    class Then:  # six changes, a quiet spell, one change, then quiet
        generation = 0
        script = ["change"] * 6 + ["quiet", "change"]

        def wait(self, seen: int, timeout: float) -> bool:
            changed = (self.script.pop(0) if self.script else "quiet") == "change"
            self.generation += changed
            if not changed:
                time.sleep(timeout)
            return changed

    looks.clear()
    wait_for_work(Then(), look_after=lambda: None, claim=lambda: looks.append(time.monotonic()),
                  nap=lambda: 0.01, timeout=0.5, stop=threading.Event())
    # Looks 1-7: the first, then after each change, later and later; 8: after the quiet spell; 9:
    # after the change that followed it, as soon as after a first fruitless look.
    assert looks[6] - looks[5] >= look_delay(6) and looks[8] - looks[7] < look_delay(6), looks[:10]


def test_a_fruitless_claim_rescans_no_sooner_than_the_boards_share_allows(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A claim that finds nothing rescanned whenever the index was over 2 s old: with 64 waiting
    agents that was a rescan of the backlog under the board lock at nearly every look."""
    from hermes_sup.kanban import claimindex, claims

    board = Board(tmp_path / "kanban")
    board.add({"title": "not for a1", "role": "writer"})
    assert board.claim("a1") is None
    rescans: list[int] = []
    real = claims.Claims.rescan
    monkeypatch.setattr(claims.Claims, "rescan", lambda self: rescans.append(1) or real(self))
    board.claims.claimers, board.claims.rescan_seconds = 8, 0.05
    interval = claimindex.rescan_interval(0.05, 8)  # the share times 50 ms times 8 claimers: over 2 s
    assert interval > 2 * claimindex.RESYNC_AFTER
    board.claims.indexed_at = time.monotonic() - 1.5 * claimindex.RESYNC_AFTER
    assert board.claim("a1") is None and not rescans, "rescanned 3 s after the last, before the share allows"
    board.claims.indexed_at = time.monotonic() - interval - 1.0
    assert board.claim("a1") is None and rescans, "never rescans"
    board.close()


def test_a_claimers_first_index_is_built_without_the_board_lock(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """256 agents starting on a backlog each built their index under the board lock, one after
    another, and some gave up after 60 s. The first build reads the folders without it (the first
    look still takes the lock once, briefly: a board's first locked call finishes what a killed
    process left). A task moved by hand still gets its locked repair."""
    from hermes_sup.kanban import claims
    from hermes_sup.kanban.lock import BoardLock

    board = Board(tmp_path / "kanban")
    for i in range(50):
        board.add({"title": f"t{i}"})
    board.close()
    held = {"now": False}
    real_acquire, real_release = BoardLock.acquire, BoardLock.release
    monkeypatch.setattr(BoardLock, "acquire", lambda self: real_acquire(self) or held.update(now=True))
    monkeypatch.setattr(BoardLock, "release", lambda self: held.update(now=False) or real_release(self))
    rescans: list[bool] = []
    real_rescan = claims.Claims.rescan
    monkeypatch.setattr(claims.Claims, "rescan",
                        lambda self, **kw: rescans.append(held["now"]) or real_rescan(self, **kw))
    fresh = Board(tmp_path / "kanban")
    assert fresh.claim("a1") is not None
    assert rescans == [False], f"the first claim's rescans, under the lock or not: {rescans}"
    # A document in todo/ that says another status (moved there by hand) is repaired under the lock.
    moved = fresh.list("todo").tasks[0]
    path = tmp_path / "kanban" / "todo" / f"{moved['id']}.json"
    path.write_text(path.read_text().replace('"status": "todo"', '"status": "blocked"'))
    other = Board(tmp_path / "kanban")
    assert other.claim("a2") is not None
    assert other.get(moved["id"])["status"] in ("todo", "doing"), other.get(moved["id"])
    fresh.close()
    other.close()


def test_a_pick_found_gone_follows_the_log_instead_of_walking_the_tasks_others_took(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """16 claimers on 2 cores: a claimer whose index fell behind while it picked went through the
    tasks the others had taken since (a reservation, a failed read and a release each), hundreds in
    one pick while the others took more. The first one found gone sends it to the log's tail."""
    reads: list[str] = []  # the task files this claimer's board reads
    real = Folder.raw
    board, other = Board(tmp_path / "kanban"), Board(tmp_path / "kanban")

    def counting(self: Folder, path: Path) -> bytes:
        if self is board.disk:
            reads.append(path.name)
        return real(self, path)

    monkeypatch.setattr(Folder, "raw", counting)
    ids = [board.add({"title": f"t{i}", "priority": 100 - i})["id"] for i in range(40)]
    board.claim("warm-up-reader")  # builds this board's index; takes the first task
    other.claim("warm-up-other")
    caught_up = board.claims.catch_up

    def then_others_take_thirty() -> bool:
        # Between this claimer's look at the log and its pick: the others' claims it has not seen.
        answer = caught_up()
        if answer and len(ids) == 40:
            for _ in range(30):
                taken = other.claim("b1")
                assert taken is not None
                ids.remove(taken["id"])
        return answer

    monkeypatch.setattr(board.claims, "catch_up", then_others_take_thirty)
    reads.clear()
    doc = board.claim("a1")
    assert doc is not None and doc["id"] == ids[2], doc  # the first task no one took (0 and 1: warm-ups)
    # The one task found gone, then the tail, then its pick: not each of the 30 the other board took.
    assert len([name for name in reads if name != f"{doc['id']}.json"]) <= 1, reads
    board.close()
    other.close()


def _reads_of(board_of: list[Board], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The task files the first board of `board_of` reads from here on, by name."""
    reads: list[str] = []
    real = Folder.raw

    def counting(self: Folder, path: Path) -> bytes:
        if board_of and self is board_of[0].disk:
            reads.append(path.name)
        return real(self, path)

    monkeypatch.setattr(Folder, "raw", counting)
    return reads


def test_a_claimer_indexes_the_tasks_others_added_from_the_log_without_reading_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With 16 agents draining a backlog each new task's file was read and parsed by all 16 to
    index it: the event of a task entering todo carries what the index keeps."""
    board, other = Board(tmp_path / "kanban"), Board(tmp_path / "kanban")
    reads = _reads_of([board], monkeypatch)
    board.claim("warm-up")  # builds this board's index (of nothing)
    added = [other.add({"title": f"t{i}", "priority": i % 3, "role": "writer" if i % 2 else None})["id"]
             for i in range(20)]
    drop = tmp_path / "kanban" / "inbox" / "dropped.json"
    drop.write_text('{"title": "d", "id": "dropped", "priority": 9}')
    os.utime(drop, (time.time() - 5, time.time() - 5))  # finished being written (no watcher saw it)
    assert other.ingest().ingested == ["dropped"]
    reads.clear()
    doc = board.claim("a1")  # no role: the best it may take is the dropped task, then priority 2
    assert doc is not None and doc["id"] == "dropped"
    assert reads == ["dropped.json"], reads
    doc = board.claim("a1")
    assert doc is not None and doc["id"] == added[2], doc["id"]  # priority 2, oldest, no role
    assert reads == ["dropped.json", f"{added[2]}.json"], reads
    board.close()
    other.close()


@pytest.mark.parametrize("index", [
    {"priority": "9"}, {"priority": True}, {"depends_on": ["../../x"]}, {"role": 3}, {"has_steps": 1},
    {"extra": 1}, None, [], "x",
])
def test_an_event_whose_carried_meta_is_malformed_makes_the_claimer_read_the_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, index: object) -> None:
    """Anyone who can write the log can write any line: a carried meta that is not exactly what a
    task entering todo carries is ignored, and the file is read as before."""
    from hermes_sup.kanban.index import carried

    board, other = Board(tmp_path / "kanban"), Board(tmp_path / "kanban")
    reads = _reads_of([board], monkeypatch)
    board.claim("warm-up")
    doc = other.add({"title": "t", "priority": 1})
    line = {"at": doc["created_at"], "task": doc["id"], "from": None, "to": "todo", "by": "x", "note": "again"}
    if isinstance(index, dict):
        line["index"] = {**carried(doc), **index}
    elif index is not None:
        line["index"] = index
    with open(tmp_path / "kanban" / "events.jsonl", "a") as log:
        log.write(json.dumps(line) + "\n")
    reads.clear()
    claimed = board.claim("a1")
    assert claimed is not None and claimed["id"] == doc["id"]
    assert reads.count(f"{doc['id']}.json") == 2, reads  # indexed from the file, then its claim's read
    board.close()
    other.close()


def test_a_carried_meta_is_a_hint_the_claim_checks_against_the_file(tmp_path: Path) -> None:
    """A well-formed line that lies (no role, where the file asks for a reviewer) gets no claimer a
    task it may not take: the claim reads the file before taking it, as it always did."""
    from hermes_sup.kanban.index import carried

    board, other = Board(tmp_path / "kanban"), Board(tmp_path / "kanban")
    board.claim("warm-up")
    doc = other.add({"title": "t", "role": "reviewer"})
    line = {"at": doc["created_at"], "task": doc["id"], "from": None, "to": "todo", "by": "x", "note": "",
            "index": {**carried(doc), "role": None, "priority": 99}}
    with open(tmp_path / "kanban" / "events.jsonl", "a") as log:
        log.write(json.dumps(line) + "\n")
    assert board.claim("a1") is None
    assert board.claim("a2", roles=["reviewer"])["id"] == doc["id"]
    board.close()
    other.close()


def test_lines_naming_tasks_with_no_file_cost_a_pick_a_few_rounds_not_one_each(tmp_path: Path) -> None:
    """A pick that finds its task gone follows the log again only a few times, and only while the
    log brings something: 2,000 well-formed lines for tasks that have no file (a hostile writer, or
    a log replaced by an older copy) cost one walk each before the bound (minutes in all)."""
    from hermes_sup.kanban.index import carried

    board = Board(tmp_path / "kanban")
    real = board.add({"title": "real", "priority": 0})
    for i in range(2000):  # ahead of the ghosts in claim order, and no one's to take
        board.add({"title": f"r{i}", "priority": 1000, "role": "reviewer"})
    claimer = Board(tmp_path / "kanban")
    assert claimer.claim("warm-up", assigned_only=True) is None  # builds its index, takes nothing
    with open(tmp_path / "kanban" / "events.jsonl", "a") as log:
        for i in range(2000):
            log.write(json.dumps({"at": real["created_at"], "task": f"ghost-{i}", "from": None, "to": "todo",
                                  "by": "x", "note": "", "index": {**carried(real), "priority": 500}}) + "\n")
    tail_reads = [0]
    read_new = claimer.claims.tail.read_new

    def counted() -> list:
        tail_reads[0] += 1
        return read_new()

    claimer.claims.tail.read_new = counted  # type: ignore[method-assign]
    doc = claimer.claim("a1")
    assert doc is not None and doc["id"] == real["id"]
    assert tail_reads[0] <= 10, tail_reads  # its catch-up and a few rounds (PICK_ROUNDS), not 2,000
    board.close()
    claimer.close()


def test_a_line_that_misstates_a_tasks_priority_does_not_change_the_claim_order(tmp_path: Path) -> None:
    """A carried meta is checked against the file the claim reads: a task the line puts first but
    its file does not is put back in its place, and the best task by the files is taken first."""
    from hermes_sup.kanban.index import carried

    board, other = Board(tmp_path / "kanban"), Board(tmp_path / "kanban")
    board.claim("warm-up")
    low = other.add({"title": "low", "priority": 0})
    high = other.add({"title": "high", "priority": 5})
    with open(tmp_path / "kanban" / "events.jsonl", "a") as log:
        log.write(json.dumps({"at": low["created_at"], "task": low["id"], "from": None, "to": "todo", "by": "x",
                              "note": "", "index": {**carried(low), "priority": 99}}) + "\n")
    assert board.claim("a1")["id"] == high["id"]
    assert board.claim("a1")["id"] == low["id"]
    board.close()
    other.close()


def test_a_claimer_working_through_a_backlog_still_sees_a_task_moved_in_by_hand(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While its turns find work a claimer looks without resuming its watch, and it was the
    resume that asked for the rescan finding what no event tells of (a task copied into todo/ by
    hand): its look asks for it too, with the same share of the board's time."""
    from hermes_sup.kanban import claimindex as claims
    monkeypatch.setattr(claims, "RESCAN_SHARE", 0)
    board = Board(tmp_path / "kanban")
    for i in range(5):
        board.add({"title": f"filler {i}", "priority": 1})
    first = board.wait_for_work("a1", timeout=10)
    assert first is not None and board.slots.working
    other = Board(tmp_path / "elsewhere")
    urgent = other.add({"title": "by hand", "priority": 9})
    other.close()
    shutil.copy(tmp_path / "elsewhere" / "todo" / f"{urgent['id']}.json", board.root / "todo")
    claimed = board.wait_for_work("a1", timeout=10)
    assert claimed is not None and claimed["id"] == urgent["id"], "the task moved in by hand was not seen"
    board.close()
