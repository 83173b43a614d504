"""Reservation markers (kanban/markers.py): a hard link to the owner's file, read safely, swept with their owner."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from hermes_sup.kanban import Board
from hermes_sup.kanban.markers import OWNER_PREFIX, owner_of, owner_text


def ours() -> tuple[int, float]:
    pid, started = owner_text().split()
    return int(pid), float(started)


def owner_files(root: Path) -> list[str]:
    return sorted(name for name in os.listdir(root / ".pending") if name.startswith(OWNER_PREFIX))


def test_a_claims_marker_shares_its_owner_files_inode(board: Board) -> None:
    """A claim's marker made and freed an inode (a symlink) per task; it is now a second name
    of the claimer's owner file, made once per process."""
    ids = [board.add({"title": f"t{n}"})["id"] for n in range(3)]
    seen: list[os.stat_result] = []
    prepare = board.txn.prepare

    def looking(folder: str, new: dict) -> Path:
        if folder == "todo":  # between the reservation and the commit: the marker is in place
            seen.append(os.lstat(board.txn.marker(new["id"])))
        return prepare(folder, new)

    board.txn.prepare = looking
    for _ in ids:
        assert board.claim("a1") is not None
    owners = owner_files(board.root)
    assert len(owners) == 1, owners
    owner = os.lstat(board.root / ".pending" / owners[0])
    assert len(seen) == 3
    for marker in seen:
        assert marker.st_ino == owner.st_ino and marker.st_nlink == 2, (marker, owner)
    assert owner_of(board.root / ".pending" / owners[0]) == ours()
    assert [name for name in os.listdir(board.root / ".pending") if not name.startswith(".")] == []


def test_a_killed_claimers_marker_and_owner_file_are_cleared(board: Board, spawn) -> None:
    """The claimer dies between its reservation and its commit: its marker names a dead process,
    is not live, and the sweep removes it and the owner file; ours stays."""
    doc = board.add({"title": "x"})
    proc = spawn("step", str(board.root), "claim", "doomed", env={"HERMES_SUP_FAULT": "marked"})
    assert proc.wait(timeout=30) == -signal.SIGKILL
    marker = board.root / ".pending" / doc["id"]
    assert not os.path.islink(marker) and os.lstat(marker).st_nlink == 2
    assert owner_of(marker)[0] == proc.pid
    assert not board.txn.marker_is_live(marker)
    board.txn.mark("someone-else")  # this process's owner file exists and names a live process
    board.txn.remove_marker(board.txn.marker("someone-else"))
    assert len(owner_files(board.root)) == 2
    with board.disk.locked():
        board.txn.finish_interrupted(sweep=True)
    assert not os.path.lexists(marker)
    left = owner_files(board.root)
    assert len(left) == 1 and owner_of(board.root / ".pending" / left[0])[0] == os.getpid(), left
    got = board.claim("rescuer")
    assert got is not None and got["id"] == doc["id"]


def test_a_marker_of_the_earlier_kind_or_a_planted_file_is_read_safely(board: Board) -> None:
    """A symlink marker (an earlier version's) still names its owner; a FIFO, an empty file or a
    link elsewhere planted in .pending/ names nobody, is read without blocking, and is cleared."""
    pending = board.root / ".pending"
    old = pending / "old"
    os.symlink(owner_text(), old)
    assert owner_of(old) == ours()
    board.txn.reservations.started("old")
    assert board.txn.marker_is_live(old)
    board.txn.reservations.done("old")
    assert not board.txn.marker_is_live(old)
    os.mkfifo(pending / "fifo")
    (pending / "empty").write_bytes(b"")
    (pending / "huge").write_bytes(b"1 " + b"9" * 100_000)
    os.symlink("/etc/passwd", pending / "elsewhere")
    started = time.monotonic()
    for name in ("fifo", "empty", "huge", "elsewhere"):
        assert owner_of(pending / name) is None, name
        assert not board.txn.marker_is_live(pending / name)
    assert time.monotonic() - started < 5
    with board.disk.locked():
        board.txn.finish_interrupted(sweep=False)
    assert [name for name in os.listdir(pending) if not name.startswith(".")] == []


def test_an_owner_file_removed_under_a_live_process_is_made_again(board: Board) -> None:
    ids = [board.add({"title": f"t{n}"})["id"] for n in range(2)]
    assert board.claim("a1")["id"] == ids[0]
    for name in owner_files(board.root):
        os.unlink(board.root / ".pending" / name)
    assert board.claim("a1")["id"] == ids[1]
    assert len(owner_files(board.root)) == 1


CLAIMS_AND_EXITS = """
import sys
from hermes_sup.kanban import Board
board = Board(sys.argv[1])
assert board.claim("a2") is not None
"""


def test_a_process_that_exits_takes_its_owner_file_along(board: Board) -> None:
    import subprocess
    import sys

    board.add({"title": "x"})
    done = subprocess.run([sys.executable, "-c", CLAIMS_AND_EXITS, str(board.root)], capture_output=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert owner_files(board.root) == []


def test_only_our_own_marker_is_removed_after_the_lock_and_ours_is_stale_at_once(board: Board,
                                                                                tmp_path: Path) -> None:
    """Outside the lock a claimer removes the marker it placed only if it is still its own: a
    cancel of another process may have put its marker there since. And a marker of ours that no
    reservation holds is stale at once, whatever the shared owner file's change time says."""
    owner = board.txn.owner
    mine = board.txn.marker("mine")
    owner.place(mine)
    assert owner.is_ours(mine)
    assert board.claims._stale_marker(mine)  # no reservation of this process holds it
    owner.remove_own(mine)
    assert not os.path.lexists(mine)
    theirs = board.txn.marker("theirs")
    other = tmp_path / "other-owner"
    other.write_text("1 2.0")
    os.link(other, theirs)
    owner.remove_own(theirs)
    assert os.path.lexists(theirs)


def test_an_owner_file_is_readable_as_its_folder_whatever_the_umask(board: Board) -> None:
    from hermes_sup.kanban.fsio import mode_for

    previous = os.umask(0o077)
    try:
        board.txn.owner.place(board.txn.marker("m"))
    finally:
        os.umask(previous)
    [name] = owner_files(board.root)
    assert os.lstat(board.root / ".pending" / name).st_mode & 0o777 == mode_for(board.root / ".pending")


def test_a_marker_that_cannot_be_read_now_is_not_taken_for_a_dead_ones(board: Board, monkeypatch) -> None:
    """Out of descriptors, a process read every marker as naming no one, and removed them all."""
    import errno

    from hermes_sup.kanban import markers

    marker = board.txn.marker("busy")
    board.txn.owner.place(marker)
    board.txn.reservations.started("busy")

    def exhausted(path: Path, limit: int) -> bytes:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(markers, "read_bytes_nofollow", exhausted)
    assert board.txn.marker_is_live(marker)
    board.txn.reservations.done("busy")
    assert board.txn.marker_is_live(marker)  # not known dead while unreadable
    markers.sweep_owners(board.root / ".pending")
    assert len(owner_files(board.root)) == 1
