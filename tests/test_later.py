"""Unlinks off the transition's path (kanban/later.py): on their own thread, all done before the process ends."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from hermes_sup.kanban import Board, later


def hidden(root: Path) -> list[str]:
    return sorted(f"{status}/{name}" for status in ("todo", "doing", "done")
                  for name in os.listdir(root / status) if name.startswith("."))


def test_a_claim_and_a_completion_leave_no_keeper_once_the_unlinks_are_done(board: Board,
                                                                            monkeypatch) -> None:
    """The old documents' keepers are removed by the unlink thread, not by the agent's own."""
    removed_on: list[str] = []
    remove = later._remove

    def noting(path: Path) -> None:
        removed_on.append(threading.current_thread().name)
        remove(path)

    monkeypatch.setattr(later, "_remove", noting)
    for n in range(5):
        board.add({"title": f"t{n}"})
    for _ in range(5):
        doc = board.claim("a1")
        board.complete(doc["id"], doc["claim"]["token"], {"ok": True})
    assert later.flush(10)
    assert hidden(board.root) == []
    assert removed_on and set(removed_on) == {"board-unlink"}, removed_on
    assert len(removed_on) == 10  # a keeper per claim and per completion


def test_past_the_bound_the_caller_unlinks_itself(tmp_path: Path, monkeypatch) -> None:
    """A disk slower than the agent never grows the queue past MOST_WAITING: the caller then
    unlinks itself."""
    unlinker = later._Unlinker()
    release = threading.Event()
    remove = later._remove

    def held(path: Path) -> None:
        if threading.current_thread().name == "board-unlink":
            release.wait(10)  # the thread is stuck on a slow disk
        remove(path)

    monkeypatch.setattr(later, "_remove", held)
    files = [tmp_path / f"f{n}" for n in range(later.MOST_WAITING + 4)]
    for path in files:
        path.write_text("")
    try:
        for path in files:
            unlinker.unlink(path)
        assert [path.name for path in files if not path.exists()] == [path.name for path in files[-4:]]
    finally:
        release.set()
    assert unlinker.flush(10)
    assert not any(path.exists() for path in files)


EXITING = """
import sys
from pathlib import Path
from hermes_sup.kanban import later
for path in sorted(Path(sys.argv[1]).iterdir()):
    later.unlink(path)
"""


def test_what_is_queued_is_unlinked_before_the_process_exits(tmp_path: Path) -> None:
    folder = tmp_path / "keepers"
    folder.mkdir()
    for n in range(200):
        (folder / f".k{n}.tmp").write_bytes(b"x" * 300)
    done = subprocess.run([sys.executable, "-c", EXITING, str(folder)], capture_output=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert os.listdir(folder) == []


def test_a_forked_child_unlinks_on_a_thread_of_its_own(tmp_path: Path) -> None:
    first = tmp_path / "parent"
    first.write_text("")
    later.unlink(first)
    assert later.flush(10) and not first.exists()
    second = tmp_path / "child"
    second.write_text("")
    pid = os.fork()
    if pid == 0:  # the parent's thread is not here: a child that queued to it would never unlink
        code = 1
        try:
            later.unlink(second)
            code = 0 if later.flush(10) and not second.exists() else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_the_thread_is_woken_once_for_unlinks_that_come_together(tmp_path: Path) -> None:
    """A drain queues two unlinks a task, a few ms apart: waking the thread for each was two
    hand-offs of the interpreter's lock a task. It is woken by the first after a quiet spell and
    gathers the others for GATHER seconds."""
    from .test_claimwatch import switches

    unlinker = later._Unlinker()
    files = [tmp_path / f"k{n}" for n in range(101)]
    for path in files:
        path.write_text("")
    unlinker.unlink(files[0])
    assert unlinker.flush(10)
    before, began = switches(unlinker.thread), time.monotonic()
    for path in files[1:]:
        unlinker.unlink(path)
        time.sleep(0.001)  # a task's work between them, the interpreter's lock let go
    gatherings = (time.monotonic() - began) / later.GATHER + 2
    assert unlinker.flush(10) and not any(path.exists() for path in files)
    # a sleep or two for each gathering (about 0.15 s of unlinks: 5), not one for each of the 100
    assert switches(unlinker.thread) - before <= min(60, 4 * gatherings + 10), (switches(unlinker.thread) - before,
                                                                          gatherings)
