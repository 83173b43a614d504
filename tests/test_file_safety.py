"""The board never writes, reads or moves files through a symlink planted in its folders, and
every name it makes from an outside name is safe to create and to show."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hermes_sup.kanban import Board, BoardError
from hermes_sup.kanban.fsio import create_exclusive

from .conftest import ROOT

TASK = {"id": "outside", "title": "a document that is not on the board", "status": "todo",
        "history": [], "created_at": "2026-01-01T00:00:00.000000Z"}


def test_a_planted_error_note_link_is_not_written_through_when_a_drop_is_rejected(board, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (board.root / "rejected" / "bad.json.error.txt").symlink_to(victim)
    (board.root / "inbox" / "bad.json").write_text("{not json")
    report = board.ingest()
    assert victim.read_text() == "precious"
    moved = report.rejected[0]["moved_to"]
    assert moved != "rejected/bad.json"
    assert "invalid JSON" in (board.root / f"{moved}.error.txt").read_text()
    assert (board.root / moved).read_text() == "{not json"


@pytest.mark.parametrize("target", ["victim.txt", "absent.txt"], ids=["existing", "dangling"])
def test_a_note_name_taken_by_a_link_after_it_was_chosen_is_not_written_through(tmp_path, target):
    # The name is chosen free (unique_path) and the link planted in between: only the exclusive,
    # no-follow create stands between the note and the link's target.
    victim = tmp_path / target
    if target == "victim.txt":
        victim.write_text("precious")
    note = tmp_path / "rejected" / "bad.json.error.txt"
    note.parent.mkdir()
    note.symlink_to(victim)
    with pytest.raises(FileExistsError):
        create_exclusive(note, b"invalid JSON")
    assert note.is_symlink()
    assert (victim.read_text() == "precious") if target == "victim.txt" else not victim.exists()


def test_a_planted_error_note_link_is_not_written_through_when_a_damaged_task_is_moved_aside(board, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (board.root / "rejected" / "todo--broken.json.error.txt").symlink_to(victim)
    (board.root / "todo" / "broken.json").write_text("{torn")
    assert board.claim("a") is None
    assert victim.read_text() == "precious"
    notes = [name for name in os.listdir(board.root / "rejected") if name.endswith(".error.txt")]
    assert len(notes) == 2 and "damaged" in (board.root / "rejected" / "todo--broken-1.json.error.txt").read_text()


@pytest.mark.parametrize("name", ["inbox", "rejected", ".ingested", "todo", "done", ".pending"])
def test_a_symlinked_board_folder_is_refused_with_a_clear_error(tmp_path, name):
    root = tmp_path / "kanban"
    Board(root).close()
    elsewhere = tmp_path / "elsewhere"
    os.rename(root / name, elsewhere)
    (root / name).symlink_to(elsewhere)
    with pytest.raises(BoardError, match=f"{name} is a symlink .*never works through links"):
        Board(root)


def test_an_inbox_replaced_by_a_link_while_the_board_runs_keeps_its_files(board, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "private.json").write_text('{"title": "not a drop"}')
    os.rmdir(board.root / "inbox")
    (board.root / "inbox").symlink_to(elsewhere)
    with pytest.raises(BoardError, match="inbox is a symlink"):
        board.ingest()
    assert os.listdir(elsewhere) == ["private.json"]
    assert board.counts()["todo"] == 0


@pytest.mark.parametrize("name", ["events.jsonl", ".lock"])
def test_a_symlinked_log_or_lock_is_refused_and_its_target_untouched(tmp_path, name):
    root = tmp_path / "kanban"
    with Board(root) as first:
        first.add({"title": "makes the log and the lock"})
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (root / name).unlink()
    (root / name).symlink_to(victim)
    with pytest.raises(BoardError, match="is a symlink"):
        Board(root).add({"title": "x"})
    assert victim.read_text() == "precious\n"


def test_a_symlinked_task_file_is_never_read_through_but_moved_aside(board, tmp_path):
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps(TASK))
    (board.root / "todo" / "outside.json").symlink_to(outside)
    with pytest.raises(BoardError, match="damaged: it is a symlink"):
        board.get("outside")
    listing = board.list()
    assert listing.tasks == [] and "symlink" in listing.damaged[0]["reason"]
    assert board.claim("a") is None, "a link's target is never claimed"
    assert (board.root / "rejected" / "todo--outside.json").is_symlink(), "the link itself is moved aside"
    assert outside.read_text() == json.dumps(TASK)


def test_a_link_to_a_fifo_in_a_status_folder_does_not_hang_the_board(board, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (board.root / "todo" / "stuck.json").symlink_to(fifo)
    os.mkfifo(board.root / "doing" / "pipe.json")
    board.add({"title": "a real task", "id": "real"})
    code = ("import json, sys; from hermes_sup.kanban import Board; b = Board(sys.argv[1]); "
            "print(json.dumps([[t['id'] for t in b.list().tasks], b.claim('a')['id'], b.recover()]))")
    out = subprocess.run([sys.executable, "-c", code, str(board.root)], capture_output=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True).stdout
    listed, claimed, _recovered = json.loads(out)
    assert listed == ["real"] and claimed == "real"
    assert sorted(os.listdir(board.root / "rejected")) == [
        "doing--pipe.json", "doing--pipe.json.error.txt", "todo--stuck.json", "todo--stuck.json.error.txt"]


def test_a_task_id_naming_a_path_outside_the_board_is_never_found(board, tmp_path):
    outside = tmp_path / "elsewhere.json"
    outside.write_text(json.dumps(TASK))
    sneaky = os.path.relpath(tmp_path / "elsewhere", board.root / "todo")
    for call in (lambda: board.get(sneaky), lambda: board.comment(sneaky, "x"),
                 lambda: board.move(sneaky, "done"), lambda: board.renew(sneaky, 1),
                 lambda: board.complete(sneaky, 1)):
        with pytest.raises(BoardError):
            call()
    assert outside.read_text() == json.dumps(TASK)


def test_a_folder_planted_as_a_marker_is_moved_aside_and_the_task_stays_workable(board):
    task = board.add({"title": "named by a planted folder", "id": "planted"})
    os.mkdir(board.root / ".pending" / "planted")
    with Board(board.root) as fresh:  # its first locked call finishes interrupted transitions
        doc = fresh.claim("a")
        assert doc is not None and doc["id"] == task["id"]
        assert fresh.complete("planted", doc["claim"]["token"], "ok")["status"] == "done"
    assert os.path.isdir(board.root / "rejected" / "pending--planted")
    os.mkdir(board.root / ".pending" / "planted")
    assert board.move("planted", "todo")["status"] == "todo", "a move places its own marker over it"
    assert [name for name in os.listdir(board.root / ".pending") if not name.startswith(".")] == []


def test_names_that_look_like_temp_files_do_not_crash_the_sweep(board):
    board.add({"title": "still claimable", "id": "x"})
    huge_pid = board.root / "todo" / ".x.json.99999999999999999999999.abcdef.tmp"
    huge_pid.write_text("not ours")
    folder = board.root / "todo" / ".x.json.123.abcdef.tmp"
    folder.mkdir()
    os.utime(folder, (1, 1))
    with Board(board.root) as fresh:  # its first locked call sweeps dead writers' temp files
        assert fresh.claim("a")["id"] == "x"
        fresh.recover(sweep=True)
    assert huge_pid.exists() and folder.is_dir(), "what the board did not write, it does not delete"


def test_a_task_file_whose_name_is_not_utf8_is_listed_and_moved_aside_printably(board):
    task = json.dumps({**TASK, "id": "x"}).encode()
    with open(os.path.join(bytes(board.root / "todo"), b"caf\xe9.json"), "wb") as handle:
        handle.write(task)
    listing = board.list()
    assert listing.damaged[0]["path"] == "todo/caf\\xe9.json"
    json.dumps(listing.damaged, ensure_ascii=False).encode("utf-8")  # printable as it is listed
    assert board.claim("a") is None
    assert os.listdir(bytes(board.root / "todo")) == []
    assert (board.root / "rejected" / "todo--caf\\xe9.json").read_bytes() == task
    for note in board.problems:
        note.encode("utf-8")
