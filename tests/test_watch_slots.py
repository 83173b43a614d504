"""Watch slots: only a few waiting claimers of a board watch it; the others look every few seconds, unwoken and
without the board lock, and still find the work meant for them alone."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hermes_sup.kanban import Board, inotify, watchslots
from hermes_sup.kanban.lock import BoardLock
from hermes_sup.kanban.watchslots import WatchSlots, slot_count

from .conftest import wait_until
from .test_board_watch import watch_masks


def test_two_slots_a_core_and_at_least_four() -> None:
    assert slot_count(1) == slot_count(2) == 4
    assert slot_count(8) == 16
    assert slot_count(None) == 4


def test_a_slot_is_freed_by_the_kernel_when_its_holder_dies(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from hermes_sup.kanban.watchslots import WatchSlots; "
         "assert WatchSlots(Path(sys.argv[1]), 1).take(); print('held', flush=True); time.sleep(60)", str(tmp_path)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        slots = WatchSlots(tmp_path, 1)
        assert not slots.take(), "a slot held by a live process was taken"
        holder.kill()
        holder.wait(timeout=10)
        assert slots.take(), "a dead holder's slot stayed taken"
        slots.close()
    finally:
        holder.kill()
        holder.wait(timeout=10)


def test_a_waiter_without_a_slot_is_unwoken_takes_no_lock_and_still_finds_its_own_work(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """256 agents each woken by every task arriving drained 1 task a second on 2 cores. With one
    slot, the first waiter watches; the second watches nothing and looks every PASSIVE_NAP without
    the board lock, and a task of its role only (the watcher cannot take it) is still claimed by it."""
    monkeypatch.setattr(watchslots, "SLOTS", 1)
    monkeypatch.setattr(watchslots, "PASSIVE_NAP", 0.3)
    root = tmp_path / "kanban"
    watcher, passive, dropper = Board(root), Board(root), Board(root)
    stop = threading.Event()
    got: dict[str, object] = {}

    def wait(board: Board, name: str, roles: tuple[str, ...]) -> None:
        got[name] = board.wait_for_work(name, roles=roles, timeout=30, stop=stop)

    first = threading.Thread(target=wait, args=(watcher, "w", ("work",)))
    first.start()
    wait_until(lambda: watcher.slots.held is not None, timeout=10)
    locks: list[int] = []
    real = BoardLock.acquire

    def counted(self: BoardLock) -> None:
        if threading.current_thread().name == "passive":
            locks.append(1)
        real(self)

    passive.claim("warm-up")  # its index built (a first look takes the lock to build it)...
    passive.claims.indexed_at = time.monotonic() - 100  # ...long ago: a watcher's look would rescan it
    monkeypatch.setattr(BoardLock, "acquire", counted)
    looks: list[int] = []
    real_claim = passive.claims.claim
    monkeypatch.setattr(passive.claims, "claim", lambda *a, **k: looks.append(1) or real_claim(*a, **k))
    second = threading.Thread(target=wait, args=(passive, "p", ("review",)), name="passive")
    second.start()
    try:
        wait_until(lambda: passive.disk.watcher.mode == "inotify" and passive.disk.watcher.paused, timeout=10)
        assert passive.slots.held is None
        masks = watch_masks(passive)
        assert set(masks.values()) == {inotify.IN_DELETE_SELF}, masks
        wait_until(lambda: len(looks) >= 3, timeout=10)  # it looks every PASSIVE_NAP, finding nothing
        assert not locks, f"{len(looks)} looks without a slot took the board lock {len(locks)} times"
        dropper.add({"title": "for a reviewer", "role": "review"})
        second.join(timeout=10)
        assert got.get("p") is not None and got["p"]["title"] == "for a reviewer", got
        assert first.is_alive(), "the watcher took a task not of its role"
    finally:
        stop.set()
        watcher.wake()
        first.join(timeout=10)
        second.join(timeout=10)
        for board in (watcher, passive, dropper):
            board.close()
