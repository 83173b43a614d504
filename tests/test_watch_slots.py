"""Watch slots: only a few waiting claimers of a board watch it; the others look every few seconds, unwoken and
without the board lock, and still find the work meant for them alone."""

from __future__ import annotations

import os
import select
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


def napping(thread: threading.Thread) -> bool:
    """Whether `thread` sleeps in epoll_wait: a passive waiter's nap on the bell."""
    task = Path(f"/proc/self/task/{thread.native_id}")
    try:
        return (task / "wchan").read_text() in ("do_epoll_wait", "ep_poll") \
            or (task / "syscall").read_text().split()[0] in ("232", "281")  # x86-64 epoll_wait, epoll_pwait
    except (OSError, IndexError):
        return False


def test_a_waiter_that_finds_work_rings_for_one_napping_waiter_which_takes_its_slot(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A backlog dropped on an idle team: the 4 watchers claimed at once and the other 12 agents
    joined only after their nap (up to 2 s of a 6 s drain). The finder rings the bell as it leaves
    its slot and one napper, not all, wakes: it takes the slot and looks, and rings on if it finds
    work. With a 60 s nap, every napper that moves here was moved by the bell."""
    monkeypatch.setattr(watchslots, "SLOTS", 1)
    monkeypatch.setattr(watchslots, "PASSIVE_NAP", 60.0)
    root = tmp_path / "kanban"
    watcher, dropper = Board(root), Board(root)
    passives = {name: Board(root) for name in ("p1", "p2", "p3")}
    stop = threading.Event()
    got: dict[str, object] = {}
    looks = {name: 0 for name in passives}

    def counting(name: str, real):  # type: ignore[no-untyped-def]
        def claim(*args, **kwargs):  # type: ignore[no-untyped-def]
            looks[name] += 1
            return real(*args, **kwargs)
        return claim

    def wait(board: Board, name: str) -> None:
        got[name] = board.wait_for_work(name, roles=("work",), timeout=30, stop=stop)

    first = threading.Thread(target=wait, args=(watcher, "w"))
    first.start()
    wait_until(lambda: watcher.slots.held is not None, timeout=10)
    threads = {}
    for name, board in passives.items():
        board.claim("warm-up")
        monkeypatch.setattr(board.claims, "claim", counting(name, board.claims.claim))
        threads[name] = threading.Thread(target=wait, args=(board, name))
        threads[name].start()
    try:
        wait_until(lambda: all(napping(thread) for thread in threads.values()), timeout=10)
        assert looks == {"p1": 1, "p2": 1, "p3": 1}, looks
        dropper.add({"title": "one", "role": "work"})
        first.join(timeout=10)
        assert got.get("w") is not None, "the watcher took the task"
        woken = wait_until(lambda: next((name for name, board in passives.items() if board.slots.held is not None),
                                        None), timeout=10)
        wait_until(lambda: looks[woken] == 2, timeout=10)  # it looks (finding nothing) as it takes the slot
        # a napper woken too would be runnable now (the ring's write woke it): it would look once
        # more (finding no slot) before it napped again
        wait_until(lambda: all(napping(threads[name]) for name in passives if name != woken), timeout=10)
        assert all(looks[name] == 1 for name in passives if name != woken), f"a ring woke more than one napper: {looks}"
        # which that check sees only when a herd's other wakers ran before the one woken read the
        # bell: the kernel is asked for one waker outright
        for board in passives.values():
            info = Path(f"/proc/self/fdinfo/{board.slots._poll.fileno()}").read_text()
            [events] = [int(line.split()[3], 16) for line in info.splitlines()
                        if line.startswith("tfd:") and int(line.split()[1]) == board.slots._bell]
            assert events & select.EPOLLEXCLUSIVE, info
        dropper.add({"title": "two", "role": "work"})
        dropper.add({"title": "three", "role": "work"})
        # the new watcher claims one and rings; the next napper wakes, takes the slot, finds the other
        wait_until(lambda: sum(1 for name in passives if got.get(name) is not None) == 2, timeout=10)
        assert sorted(doc["title"] for doc in got.values() if doc is not None) == ["one", "three", "two"]
        [last] = [name for name in passives if got.get(name) is None]
        # the finder of the last task rang too: the last napper woke and watches now, in the slot
        wait_until(lambda: passives[last].slots.held is not None, timeout=10)
    finally:
        stop.set()
        for board in (watcher, *passives.values()):
            board.wake()
        for thread in (first, *threads.values()):
            thread.join(timeout=10)
        for board in (watcher, dropper, *passives.values()):
            board.close()



@pytest.mark.parametrize("planted", ["file", "symlink", "fifo-others-write", "no-epoll"])
def test_a_bell_that_is_not_this_users_own_fifo_is_not_used_and_nothing_is_left_open(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, planted: str) -> None:
    """Another user's FIFO, or one others may write, would let them swallow the rings or wake the
    nappers one byte at a time; a setup that fails halfway (no EPOLLEXCLUSIVE in a sandbox) must
    not fail the claim that rings. No bell then: the waiters nap their PASSIVE_NAP."""
    folder = tmp_path / watchslots.SLOTS_DIR
    folder.mkdir()
    bell = folder / watchslots.BELL
    if planted == "file":
        bell.write_text("")
    elif planted == "symlink":
        os.mkfifo(tmp_path / "elsewhere", 0o600)
        bell.symlink_to(tmp_path / "elsewhere")
    elif planted == "fifo-others-write":
        os.mkfifo(bell)
        os.chmod(bell, 0o622)
    else:
        def refused() -> None:
            raise OSError(22, "EPOLLEXCLUSIVE refused")
        monkeypatch.setattr(select, "epoll", refused)
    before = sorted(os.listdir("/proc/self/fd"))
    slots = WatchSlots(tmp_path, 1)
    slots.ring()  # never raises
    assert slots._bell_fd() is None
    began = time.monotonic()
    assert slots.nap(0.2) is False and time.monotonic() - began >= 0.19, "a nap without a bell sleeps its time"
    slots.close()
    assert sorted(os.listdir("/proc/self/fd")) == before, "a descriptor of the bell's was left open"
