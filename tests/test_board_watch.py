"""The board's inotify watch (what wakes a waiter, folders made later, the overflow); one ingester at a time."""

from __future__ import annotations

import array
import fcntl
import json
import os
import struct
import termios
import threading
from pathlib import Path

import pytest
from hermes_sup.kanban import Board, inotify, waiting
from hermes_sup.kanban.fsio import write_json_atomic
from hermes_sup.kanban.lock import BoardLock
from hermes_sup.kanban.watch import BURST_RESCAN_DELAY, INGEST_LOCK, wakes

from .conftest import wait_until


def test_what_wakes_a_waiter() -> None:
    assert wakes("inbox", "report.json") and wakes("todo", "t-1.json") and wakes("", "todo")
    assert not wakes("inbox", ".report.json.swp") and not wakes("inbox", "report.json~")
    assert not wakes("todo", f".t-1.json.{os.getpid()}.a1b2c3.tmp")  # the board's own atomic write
    assert not wakes("", ".lock") and not wakes("", INGEST_LOCK) and not wakes("", "events.jsonl")


def test_parse_hands_on_the_overflow_and_names() -> None:
    watch = inotify.Inotify()
    try:
        watch._folders[3] = "/b/todo"
        name = b"t-1.json\0\0\0\0"
        data = (struct.pack("iIII", 3, inotify.IN_MOVED_TO, 0, len(name)) + name
                + struct.pack("iIII", -1, inotify.IN_Q_OVERFLOW, 0, 0)
                + struct.pack("iIII", 9, inotify.IN_CREATE, 0, 0))  # a watch not ours: nothing
        assert list(watch._parse(data)) == [inotify.Event("/b/todo", "t-1.json", inotify.IN_MOVED_TO),
                                            inotify.Event("", "", inotify.IN_Q_OVERFLOW)]
    finally:
        watch.close()


def test_a_drop_wakes_the_board_and_its_temp_files_do_not(tmp_path: Path) -> None:
    board = Board(tmp_path / "kanban")
    board.start_watching()
    try:
        assert board.watch_mode == "inotify"
        seen = board.signal.generation
        # The board's own temp files (and a rename of one into another status folder's name
        # would wake: only the temp file is tested here) wake no one.
        write_json_atomic(board.root / "todo" / f".x.json.{os.getpid()}.abcdef.tmp", {"a": 1}, fsync=False)
        (board.root / "inbox" / ".drop.json.swp").write_text("{}")
        assert not board.signal.wait(seen, 0.3)
        drop = board.root / "inbox" / "one.json"
        tmp = board.root / "inbox" / ".one.json.part"
        tmp.write_text(json.dumps({"title": "one"}))
        os.rename(tmp, drop)
        assert board.signal.wait(seen, 5), "a drop renamed into inbox/ woke no one"
        wait_until(lambda: board.watcher.is_complete(drop, drop.stat().st_mtime_ns), timeout=5)
    finally:
        board.close()


def test_a_status_folder_made_again_is_watched_and_rescanned(tmp_path: Path) -> None:
    board = Board(tmp_path / "kanban")
    board.start_watching()
    try:
        os.rmdir(board.root / "blocked")
        seen = board.signal.generation
        (board.root / "blocked").mkdir()
        assert board.signal.wait(seen, 5)
        wait_until(lambda: board.signal.full_rescan_due, timeout=5)
        wait_until(lambda: board.watcher._timer is None, timeout=5)  # the burst's own rescan came
        seen = board.signal.generation
        (board.root / "blocked" / "t-9.json").write_text("{}")
        assert board.signal.wait(seen, 5), "a file in the folder made again woke no one"
    finally:
        board.close()


def test_one_ingester_at_a_time_and_no_drop_left_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    board = Board(tmp_path / "kanban")
    inbox = board.root / "inbox"
    (inbox / "first.json").write_text(json.dumps({"title": "first"}))
    other = BoardLock(board.root / INGEST_LOCK, 5)  # another process's ingest (its own descriptor)
    assert other.try_acquire()
    assert board.ingest(wait=False).ingested == [], "ingested while another process was ingesting"
    assert (inbox / "first.json").exists()
    other.release()
    other.close()

    # A drop that comes while an ingest runs (its waker found the lock taken and went on) is taken
    # by that ingest before it returns.
    real = board.ingester._ingest_ready
    late = threading.Event()

    def ready_then_a_late_drop(report):  # type: ignore[no-untyped-def]
        seen = real(report)
        if not late.is_set():
            late.set()
            (inbox / "late.json").write_text(json.dumps({"title": "late"}))
        return seen

    monkeypatch.setattr(board.ingester, "_ingest_ready", ready_then_a_late_drop)
    report = board.ingest(wait=False)
    assert sorted(doc.split("-")[0] for doc in report.ingested) == ["first", "late"]
    assert not [p for p in inbox.iterdir() if not p.name.startswith(".")]
    board.close()


def test_a_claimer_wakes_for_work_arriving_only_until_a_view_widens_the_watch(tmp_path: Path) -> None:
    board = Board(tmp_path / "kanban")
    first, second = board.add({"title": "one"}), board.add({"title": "two"})
    one, two = board.claim("a1"), board.claim("a1")
    assert one is not None and two is not None
    waiting.start_watching(board.disk, claims_only=True)
    try:
        seen = board.signal.generation
        board.fail(first["id"], one["claim"]["token"], "no", permanent=True)  # doing -> failed: no work arrived
        assert not board.signal.wait(seen, 0.3), "a claimer woke for a task that failed"
        board.add({"title": "new work"})
        assert board.signal.wait(seen, 5), "a task arriving in todo woke no claimer"
        wait_until(lambda: board.watcher._timer is None, timeout=5)
        board.start_watching()  # a view of the board (the dashboard, board --watch) wants every change
        seen = board.signal.generation
        board.fail(second["id"], two["claim"]["token"], "no", permanent=True)
        assert board.signal.wait(seen, 5), "a widened watch missed a task moving to failed"
    finally:
        board.close()


# The inotify events a folder's files raise themselves (IN_ACCESS, IN_MODIFY, IN_ATTRIB,
# IN_CLOSE_WRITE, IN_CLOSE_NOWRITE, IN_OPEN), as the kernel's fsnotify counts them.
RAISED_BY_FILES = 0x3F


def watch_masks(board: Board) -> dict[str, int]:
    """{top folder ("" for the board's own): the mask the kernel has for its watch}, read from this
    process's /proc/self/fdinfo of the watcher's inotify descriptor."""
    names = {os.stat(board.disk.root).st_ino: ""}
    names.update({entry.inode(): entry.name for entry in os.scandir(board.disk.root) if entry.is_dir()})
    fd = board.watcher._inotify.fd
    masks = {}
    for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines():
        if line.startswith("inotify "):
            fields = dict(part.split(":", 1) for part in line.split()[1:] if ":" in part)
            masks[names.get(int(fields["ino"], 16), "?")] = int(fields["mask"], 16)
    return masks


def settled(board: Board) -> int:
    """The signal's generation once the watcher is quiet: no event queued in the kernel for it, no
    burst timer, and no bump for twice a burst's delay (under load its thread may still be handling
    what it read when the queue looks empty)."""
    fd = board.watcher._inotify.fd

    def queued() -> int:
        pending = array.array("i", [0])
        fcntl.ioctl(fd, termios.FIONREAD, pending)
        return pending[0]
    for _look in range(20):
        seen = board.signal.generation
        wait_until(lambda: queued() == 0 and board.watcher._timer is None, timeout=10)
        if not board.signal.wait(seen, 2 * BURST_RESCAN_DELAY):
            return seen
    raise AssertionError("the watcher never went quiet")


def test_a_busy_claimer_is_woken_by_nothing_but_drops_and_misses_nothing_once_it_waits(tmp_path: Path) -> None:
    """With 16 agents each task's ingest and completion woke all 16 while they worked, with 64 each
    drop woke all 64; a claimer that took a task keeps its watches on a mask nothing triggers
    until it waits again (drops then ingested by asking /proc whether anyone still writes them)."""
    board, other = Board(tmp_path / "kanban"), Board(tmp_path / "kanban")
    other.add({"title": "one"})
    try:
        assert board.wait_for_work("a1", timeout=5)["title"] == "one"
        busy = watch_masks(board)
        assert busy["todo"] == busy["done"] == busy["inbox"] == busy[""] == inotify.IN_DELETE_SELF, busy
        seen = settled(board)  # what the claim itself stirred (its own rename into todo/) is over
        other.add({"title": "two"})
        write_json_atomic(board.disk.root / "inbox" / "three.json", {"title": "three"})
        assert not board.signal.wait(seen, 0.3), "a busy claimer woke for work arriving"
        assert board.wait_for_work("a1", timeout=5)["title"] == "two", "what arrived while busy was missed"
        assert board.wait_for_work("a1", timeout=5)["title"] == "three", "a drop that arrived while busy was missed"
        assert board.wait_for_work("a1", timeout=0.2) is None  # nothing left: it waits, watching again
        idle = watch_masks(board)
        assert idle["todo"] & inotify.IN_MOVED_TO and idle["done"] & inotify.IN_MOVED_TO, idle
        # Nor may todo/ and done/ ask for what their files raise themselves: each resume would
        # have the kernel walk every entry it caches for them (done/ grows with the board).
        assert not (idle["todo"] | idle["done"]) & RAISED_BY_FILES, idle
        seen = board.signal.generation
        other.add({"title": "four"})
        assert board.signal.wait(seen, 5), "a waiting claimer missed a task arriving"
    finally:
        board.close()
        other.close()


def test_an_ingester_watches_inbox_alone_and_a_claimer_that_leaves_it_the_drops_does_not(tmp_path: Path) -> None:
    """The supervisor ingests for its agents: its watch wakes for drops and not for each of the
    team's transitions, and its agents' watches do not wake for the drops."""
    ingester, claimer = Board(tmp_path / "kanban"), Board(tmp_path / "kanban")
    try:
        ingester.wait_for_drops(0)
        masks = watch_masks(ingester)
        assert set(masks) == {"", "inbox"} and masks["inbox"] & inotify.IN_MOVED_TO, masks
        assert claimer.wait_for_work("a1", timeout=0.1, ingest=False) is None
        masks = watch_masks(claimer)
        assert "inbox" not in masks and masks["todo"] & inotify.IN_MOVED_TO, masks
        # Its supervisor gone, the same claimer ingests again, and a drop must wake it.
        assert claimer.wait_for_work("a1", timeout=0.1) is None
        assert watch_masks(claimer)["inbox"] & inotify.IN_MOVED_TO
    finally:
        ingester.close()
        claimer.close()
