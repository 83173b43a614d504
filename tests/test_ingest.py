"""Dropped files: good ones become tasks, bad ones land in rejected/ with their reason, files
still being written are left alone, and a crash mid-ingest never makes two tasks of one file."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
from hermes_sup.kanban import Board
from hermes_sup.kanban.drops import decide, open_writers, scan
from hermes_sup.kanban.events import read_all

from .conftest import wait_until

BAD_INPUTS = {
    "bad.json": (b'{"title": "x", oops}', "invalid JSON at line 1, column 16"),
    "no-title.json": (b'{"body": "no title here"}', "missing title"),
    "wrong-type.json": (b'{"title": "x", "priority": "urgent"}', "field 'priority' must be an integer"),
    "unknown-status.json": (b'{"title": "x", "status": "someday"}', "unknown status 'someday'"),
    "cycle.json": (b'{"title": "x", "id": "loop-b", "depends_on": ["loop-a"]}',
                   "depends_on creates a cycle: loop-b -> loop-a -> loop-b"),
    "unsafe-id.json": (b'{"title": "x", "id": "../../etc/passwd"}', "is not a safe file name"),
    "garbage.json": (bytes(range(256)) * 4, "file is binary, not text"),
    "latin1.txt": ("caf\xe9 au lait".encode("latin-1"), "not UTF-8 text"),
    "huge.txt": (b"title\n" + b"x" * (1024 * 1024), "the limit for a task file is 1048576 bytes"),
    "list.yaml": (b"- just\n- a list\n", "not a list"),
    "weird.exe": (b"MZ\x90\x00", "unsupported file type"),
}


def drop(board: Board, name: str, data: bytes, zone: str = "inbox") -> None:
    folder = board.root / zone if zone != "." else board.root
    (folder / name).write_bytes(data)


def age(path, seconds: float = 5.0) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then), follow_symlinks=False)


def test_every_bad_input_is_rejected_with_its_reason_and_a_good_file_still_lands(board, tmp_path):
    board.add({"title": "a", "id": "loop-a", "depends_on": ["loop-b"]})
    for name, (data, _reason) in BAD_INPUTS.items():
        drop(board, name, data)
        age(board.root / "inbox" / name)
    outside = tmp_path / "secret.json"
    outside.write_text('{"title": "not yours"}')
    (board.root / "inbox" / "link.json").symlink_to(outside)
    drop(board, "good.json", b'{"title": "the good one", "priority": 2}')

    report = board.ingest()

    reasons = {item["file"].removeprefix("inbox/"): item["reason"] for item in report.rejected}
    for name, (_data, reason) in BAD_INPUTS.items():
        assert reason in reasons[name], name
        assert (board.root / "rejected" / name).exists()
        error_text = (board.root / "rejected" / f"{name}.error.txt").read_text()
        assert reason in error_text and f"inbox/{name}" in error_text
    assert "is a symlink" in reasons["link.json"]
    assert (board.root / "rejected" / "link.json").is_symlink(), "the link itself is moved, never followed"
    assert outside.read_text() == '{"title": "not yours"}'
    assert len(report.ingested) == 1
    good = board.get(report.ingested[0])
    assert good["title"] == "the good one" and good["priority"] == 2 and good["status"] == "todo"
    assert good["source"]["file"] == "inbox/good.json"
    assert os.listdir(board.root / "inbox") == []
    events, _ = read_all(board.events_path)
    assert sum(1 for e in events if e["to"] == "rejected") == len(BAD_INPUTS) + 1


def test_formats(board):
    drop(board, "a.yaml", b"title: from yaml\nrole: review\n")
    drop(board, "b.md", b"---\npriority: 3\n---\n# From markdown\nbody\n")
    drop(board, "c.txt", b"From text\nline two\n")
    report = board.ingest()
    titles = sorted(board.get(i)["title"] for i in report.ingested)
    assert titles == ["From markdown", "From text", "from yaml"]
    assert report.rejected == []


def test_only_inbox_is_a_drop_zone_files_in_the_board_folder_are_left_alone(board):
    for name in ("d.json", "e.md", "f.yaml", "g.txt"):
        drop(board, name, b'{"title": "not dropped, just kept here"}', zone=".")
        age(board.root / name)
    report = board.ingest()
    assert report.ingested == [] and report.rejected == [] and report.waiting == []
    for name in ("d.json", "e.md", "f.yaml", "g.txt"):
        assert (board.root / name).read_bytes() == b'{"title": "not dropped, just kept here"}'
    assert board.counts()["todo"] == 0 and os.listdir(board.root / "rejected") == []


def test_an_editor_temp_file_is_ignored_until_renamed(board):
    tmp = board.root / "inbox" / ".task.json.swp"
    tmp.write_text('{"title": "half')
    assert board.ingest().ingested == []
    tmp.write_text('{"title": "whole"}')
    os.rename(tmp, board.root / "inbox" / "task.json")
    report = board.ingest()
    assert [board.get(i)["title"] for i in report.ingested] == ["whole"]


def test_a_file_still_open_for_writing_is_not_read_half_way(board):
    path = board.root / "inbox" / "slow.json"
    with open(path, "w") as handle:
        handle.write('{"title": "written in')
        handle.flush()
        age(path)
        report = board.ingest()
        assert report.ingested == [] and report.rejected == []
        assert report.waiting == ["inbox/slow.json"]
        handle.write(' two parts"}')
    report = board.ingest()
    assert [board.get(i)["title"] for i in report.ingested] == ["written in two parts"]


def test_writers_are_seen_through_proc(tmp_path):
    path = tmp_path / "f.json"
    with open(path, "w"):
        st = os.stat(path)
        assert (st.st_dev, st.st_ino) in open_writers(tmp_path)
    assert (st.st_dev, st.st_ino) not in open_writers(tmp_path)
    with open(path):
        assert (st.st_dev, st.st_ino) not in open_writers(tmp_path), "a reader is not a writer"


def test_readiness_decision():
    assert decide(is_task_type=True, hinted_complete=True, has_writer=True, quiet_for=0) == "ready"
    assert decide(is_task_type=True, hinted_complete=False, has_writer=True, quiet_for=99) == "wait"
    assert decide(is_task_type=True, hinted_complete=False, has_writer=False, quiet_for=0) == "ready"
    assert decide(is_task_type=True, hinted_complete=False, has_writer=None, quiet_for=0.1) == "wait"
    assert decide(is_task_type=True, hinted_complete=False, has_writer=None, quiet_for=3) == "ready"
    assert decide(is_task_type=False, hinted_complete=True, has_writer=False, quiet_for=0.1) == "wait"
    assert decide(is_task_type=False, hinted_complete=False, has_writer=False, quiet_for=3) == "reject-type"


def test_scan_skips_hidden_temp_and_backup_names(board):
    for name in (".hidden.json", "x.json~", "x.json.tmp", "#x.json#", "x.part", "ok.json"):
        (board.root / "inbox" / name).write_text("{}")
    assert [d.path.name for d in scan(board.root)] == ["ok.json"]


def test_a_fresh_unknown_file_type_gets_a_grace_period(board):
    probe = board.root / "inbox" / "4913"  # vim's write probe: created and deleted at once
    probe.write_text("")
    assert board.ingest().rejected == []
    age(probe)
    assert board.ingest().rejected[0]["reason"].startswith("unsupported file type")


def test_ingest_is_idempotent_across_a_crash(board, spawn):
    path = board.root / "inbox" / "once.json"
    path.write_text('{"title": "only once"}')
    keep = board.root.parent / "once-link"
    os.link(path, keep)  # the same inode, so we can check what the crashed ingest left
    proc = spawn("step", str(board.root), "ingest", env={"HERMES_SUP_FAULT": "ingest-written"})
    assert proc.wait(timeout=30) == -9
    assert path.exists(), "killed after writing the task, before moving the user's file"
    assert len(os.listdir(board.root / "todo")) == 1
    report = board.ingest()
    assert len(report.ingested) == 1
    assert len(os.listdir(board.root / "todo")) == 1, "the same file never yields two tasks"
    task_id = report.ingested[0]
    assert (board.root / ".ingested" / f"{task_id}--once.json").exists()
    events, _ = read_all(board.events_path)
    assert [e["to"] for e in events if e["task"] == task_id] == ["todo"]


def test_the_same_name_dropped_again_later_is_a_new_task(board):
    (board.root / "inbox" / "again.json").write_text('{"title": "first"}')
    first = board.ingest().ingested
    (board.root / "inbox" / "again.json").write_text('{"title": "first"}')
    second = board.ingest().ingested
    assert len(first) == len(second) == 1 and first != second


def test_explicit_id_that_exists_is_rejected(board):
    board.add({"title": "x", "id": "taken"})
    drop(board, "dup.json", json.dumps({"title": "y", "id": "taken"}).encode())
    report = board.ingest()
    assert "a task with id 'taken' already exists (in todo/)" in report.rejected[0]["reason"]


@pytest.mark.parametrize("writer", ["cp", "rename"])
def test_watcher_marks_complete_files_so_they_are_taken_at_once(board, writer):
    board.start_watching()
    assert board.watcher.mode == "inotify"
    target = board.root / "inbox" / f"{writer}.json"
    if writer == "cp":
        target.write_text('{"title": "copied"}')
    else:
        tmp = board.root / f".{writer}.tmp"
        tmp.write_text('{"title": "renamed"}')
        os.rename(tmp, target)
    st = os.stat(target)
    wait_until(lambda: board.watcher.is_complete(target, st.st_mtime_ns), timeout=10)
    assert len(board.ingest().ingested) == 1


LAUGHS = b"title: x\nmeta:\n a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + b"".join(
    b" %c: &%c [%s]\n" % (c, c, b", ".join([b"*%c" % (c - 1)] * 9)) for c in range(ord("b"), ord("j")))
HOSTILE = {
    "deep-list.json": (b"[" * 100_000 + b"]" * 100_000, "nested more than 64 levels deep"),
    "deep-meta.json": (b'{"title": "x", "meta": ' + b'{"a": ' * 100_000 + b"1" + b"}" * 100_001,
                       "nested more than 64 levels deep"),
    "deep.yaml": (b"title: x\nmeta: " + b"[" * 200 + b"]" * 200 + b"\n", "nested more than 64 levels deep"),
    # Past the YAML parser's own limit too (libyaml's, since PyYAML 6.0.4), which words it: rejected all the same.
    "deepest.yaml": (b"title: x\nmeta: " + b"[" * 100_000 + b"]" * 100_000 + b"\n", "line 2"),
    "big-int.json": (b'{"title": "x", "priority": ' + b"9" * 5000 + b"}", "an integer of 5000 digits"),
    "big-int.yaml": (b"title: x\npriority: " + b"9" * 5000 + b"\n", "an integer of 5000 digits"),
    "nan.json": (b'{"title": "x", "meta": {"n": NaN}}', "not a finite number"),
    "surrogate.json": (b'{"title": "x \\ud800"}', "unpaired surrogate"),
    "bare-date.yaml": (b"title: x\nmeta: {due: 2024-01-01}\n", "line 2, column 13: a date or time (2024-01-01)"),
    "timestamp.yaml": (b"title: x\nmeta: {at: !!timestamp 2024-01-01T00:00:00Z}\n", "a date or time"),
    "set.yaml": (b"title: x\nmeta: {s: !!set {a, b}}\n", "!!set"),
    "binary.yaml": (b"title: x\nmeta: {b: !!binary aGVsbG8=}\n", "!!binary"),
    "dated.md": (b"---\ntitle: x\nmeta: {due: 2024-01-01}\n---\nbody\n",
                 "line 3, column 13: a date or time (2024-01-01)"),
    "self-ref.yaml": (b"title: x\nmeta: &a {self: *a}\n", "aliases"),
    "laughs.yaml": (LAUGHS, "aliases"),
    "int-key.yaml": (b"title: x\nmeta: {1: one}\n", "keys must be text"),
}
BAD_NAME = b"caf\xe9 \x1b[31m.json"  # not UTF-8, and a terminal escape


def _limited_memory() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


def test_hostile_documents_are_rejected_in_bounded_time_and_memory_and_the_next_drop_still_lands(board, spawn):
    for name, (data, _reason) in HOSTILE.items():
        drop(board, name, data)
    with open(os.path.join(bytes(board.root / "inbox"), BAD_NAME), "wb") as handle:
        handle.write(b'{"title": "a fine task with a bad name"}')
    # A separate process with 1 GiB of address space: a billion laughs or a recursion crash shows
    # up as a dead process, not as a test runner eating the machine.
    proc = spawn("step", str(board.root), "ingest", stdout=subprocess.PIPE, preexec_fn=_limited_memory)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, "the ingest crashed"
    report = json.loads(out)
    assert report["ingested"] == [] and report["waiting"] == []
    reasons = {item["file"]: item["reason"] for item in report["rejected"]}
    for name, (_data, reason) in HOSTILE.items():
        assert reason in reasons[f"inbox/{name}"], name
        assert (board.root / "rejected" / name).is_file()
        assert reason in (board.root / "rejected" / f"{name}.error.txt").read_text()
    safe = "caf\\xe9 \\x1b[31m.json"
    assert "file name is not valid UTF-8" in reasons[f"inbox/{safe}"]
    assert (board.root / "rejected" / safe).read_bytes() == b'{"title": "a fine task with a bad name"}'
    assert "not valid UTF-8" in (board.root / "rejected" / f"{safe}.error.txt").read_text()
    assert os.listdir(board.root / "inbox") == []
    assert all(name.isprintable() for name in os.listdir(board.root / "rejected"))
    events, bad = read_all(board.events_path)
    assert bad == 0 and sum(1 for e in events if e["to"] == "rejected") == len(HOSTILE) + 1

    drop(board, "after.json", b'{"title": "the next drop"}')
    report = board.ingest()
    assert [board.get(i)["title"] for i in report.ingested] == ["the next drop"]


def test_a_name_as_long_as_the_filesystem_allows_is_ingested_or_rejected_and_the_next_drop_lands(board):
    long_good = "g" * 250 + ".json"  # 255 bytes: with "<id>--" or ".error.txt" it would not fit
    long_bad = "b" * 245 + ".json"
    drop(board, long_good, b'{"title": "a long name"}')
    drop(board, long_bad, b"{broken")
    report = board.ingest()
    assert [board.get(i)["title"] for i in report.ingested] == ["a long name"]
    moved = report.rejected[0]["moved_to"]
    assert (board.root / moved).read_bytes() == b"{broken"
    assert "invalid JSON" in (board.root / f"{moved}.error.txt").read_text()
    assert os.listdir(board.root / "inbox") == []
    assert [name.endswith(".json") for name in os.listdir(board.root / ".ingested")] == [True]
    drop(board, "next.json", b'{"title": "the next drop"}')
    assert [board.get(i)["title"] for i in board.ingest().ingested] == ["the next drop"]


def test_a_hostile_line_in_the_event_log_does_not_stop_claims(board):
    board.claim("a")  # builds the index, so the next claim reads the log's new lines
    with open(board.events_path, "a") as log:
        log.write("[" * 100_000 + "\n" + '{"task": "x", "to": "todo"}' + "\n")
    doc = board.add({"title": "still claimable"})
    assert board.claim("a")["id"] == doc["id"]
    events, bad = read_all(board.events_path)
    assert bad == 1 and events[-1]["task"] == doc["id"]


def test_a_drop_the_board_cannot_move_does_not_stop_the_drops_after_it(board):
    stuck = board.root / "inbox" / "stuck.json"
    stuck.write_text('{"title": "cannot be moved"}')
    age(stuck, 60)  # the oldest: taken first on every pass
    # The immutable flag makes the rename fail even for root; without it, there is no portable way.
    if subprocess.run(["chattr", "+i", str(stuck)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here")
    try:
        drop(board, "next.json", b'{"title": "the next drop"}')
        report = board.ingest()
        assert [board.get(i)["title"] for i in report.ingested] == ["the next drop"]
        assert report.failed[0]["file"] == "inbox/stuck.json" and "not permitted" in report.failed[0]["reason"]
        assert any("inbox/stuck.json could not be taken" in note for note in board.problems)
        again = board.ingest()
        assert again.ingested == [] and len(again.failed) == 1
        assert board.counts()["todo"] == 2, "the stuck file's task was written once, never twice"
    finally:
        subprocess.run(["chattr", "-i", str(stuck)], check=True)
    report = board.ingest()
    assert len(report.ingested) == 1 and report.failed == [] and board.counts()["todo"] == 2
    assert os.listdir(board.root / "inbox") == []


def test_an_event_naming_a_path_instead_of_a_task_does_not_stop_claims(board):
    board.claim("a")  # builds the index, so the next claim reads the log's new lines
    with open(board.events_path, "a") as log:
        log.write('{"task": "../../etc/passwd", "to": "todo"}\n{"task": "Not An Id", "to": "done"}\n')
    doc = board.add({"title": "still claimable"})
    assert board.claim("a")["id"] == doc["id"]


def test_a_drops_document_is_flushed_before_the_board_lock_and_a_drop_changed_meanwhile_wins(board, monkeypatch):
    """Each drop's new document was written and fsync'd under the board lock: the other agents'
    claims and closes waited a disk flush per drop while one agent ingested a backlog. It is now
    flushed before the lock, as a transition's is; a drop rewritten between the read and the lock
    is read again under it, and what lands is what it says then, with no temp file left behind."""
    from hermes_sup.kanban import ingest
    from hermes_sup.kanban.lock import BoardLock

    held = {"now": False}
    real_acquire, real_release = BoardLock.acquire, BoardLock.release

    def acquire(self: BoardLock) -> None:
        real_acquire(self)
        held["now"] = held["now"] or self.path.name == ".lock"  # the board's lock, not the ingest turn

    def release(self: BoardLock) -> None:
        if self.path.name == ".lock":
            held["now"] = False
        real_release(self)

    monkeypatch.setattr(BoardLock, "acquire", acquire)
    monkeypatch.setattr(BoardLock, "release", release)
    flushes: list[bool] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: flushes.append(held["now"]) or real_fsync(fd))
    for n in range(5):
        (board.root / "inbox" / f"t{n}.json").write_text(json.dumps({"id": f"t{n}", "title": f"first {n}"}))
    real_read = ingest.read_drop
    rewritten: list[str] = []

    def read_then_rewrite(path):
        read = real_read(path)
        if path.name == "t3.json" and not rewritten:  # after its read, before its lock: an editor saves again
            rewritten.append(path.name)
            path.write_text(json.dumps({"id": "t3", "title": "second 3"}))
        return read

    monkeypatch.setattr(ingest, "read_drop", read_then_rewrite)
    report = board.ingest()
    assert sorted(report.ingested) == [f"t{n}" for n in range(5)], report
    # One flush a drop before the lock, and one more, under it, for the drop read again there.
    assert sorted(flushes) == [False] * 5 + [True], flushes
    assert [board.get(f"t{n}")["title"] for n in range(5)] == ["first 0", "first 1", "first 2", "second 3", "first 4"]
    assert board.get("t3")["source"]["file"] == "inbox/t3.json"
    assert not [p.name for p in (board.root / "todo").iterdir() if p.name.startswith(".")], "a temp file was left"


def test_fsync_all_says_which_file_it_could_not_make_durable(tmp_path) -> None:
    from hermes_sup.kanban.fsyncs import fsync_all

    fds = [os.open(tmp_path / f"doc-{n}.json", os.O_WRONLY | os.O_CREAT) for n in range(12)]
    # A pipe cannot be fsynced (EINVAL). A closed descriptor's number is no failure to count on:
    # another thread of the worker may open a file under that number before the fsync.
    unsyncable, other_end = os.pipe()
    try:
        results = fsync_all([*fds[:6], unsyncable, *fds[6:]])
    finally:
        for fd in [*fds, unsyncable, other_end]:
            os.close(fd)
    assert results[:6] == [None] * 6 and results[7:] == [None] * 6
    assert isinstance(results[6], OSError)
    assert fsync_all([]) == []


def temp_files(board: Board) -> list[str]:
    return [entry for status in ("todo", "doing", "done") for entry in os.listdir(board.root / status)
            if entry.endswith(".tmp")]


def test_a_drop_whose_document_could_not_be_made_durable_stays_and_is_taken_next_time(tmp_path, monkeypatch) -> None:
    """A batch's documents are made durable together (kanban/fsyncs.py); one that may not be (EIO
    from the disk) is not put in place: its drop stays in inbox/, the rest of the batch goes on."""
    from hermes_sup.kanban import ingest as ingest_module

    board = Board(tmp_path / "kanban")
    for name in ("one", "two", "three"):
        (board.root / "inbox" / f"{name}.json").write_text(json.dumps({"id": name, "title": name}))
    real = ingest_module.fsync_all

    def failing_for_two(fds):
        results = real(fds)
        return [OSError(5, "Input/output error") if ".two.json." in os.readlink(f"/proc/self/fd/{fd}") else result
                for fd, result in zip(fds, results, strict=True)]
    monkeypatch.setattr(ingest_module, "fsync_all", failing_for_two)
    report = board.ingest()
    assert sorted(report.ingested) == ["one", "three"]
    assert [item["file"] for item in report.failed] == ["inbox/two.json"]
    assert "Input/output error" in report.failed[0]["reason"]
    assert (board.root / "inbox" / "two.json").exists()
    assert not temp_files(board), "a temp file was left"
    monkeypatch.setattr(ingest_module, "fsync_all", real)
    assert board.ingest().ingested == ["two"]
    assert board.get("two")["status"] == "todo"
    board.close()


def test_a_batch_cut_short_by_the_board_lock_leaves_no_temp_file_and_loses_no_drop(tmp_path) -> None:
    """A batch writes its documents before it takes the lock: if the lock is not had (a `board`
    command stopped with Ctrl-Z holds it), none of them may outlive the pass, which the supervisor
    tries again every few seconds."""
    from hermes_sup.kanban import BoardError

    board, holder = Board(tmp_path / "kanban", lock_timeout=0.2), Board(tmp_path / "kanban")
    names = [f"d{n:02d}" for n in range(40)]  # more than a batch
    for name in names:
        (board.root / "inbox" / f"{name}.json").write_text(json.dumps({"id": name, "title": name}))
    with holder._locked():
        with pytest.raises(BoardError):
            board.ingest()
        assert not temp_files(board), "a batch stopped by the lock left its documents behind"
    assert sorted(os.listdir(board.root / "inbox")) == [f"{name}.json" for name in names]
    assert sorted(board.ingest().ingested) == names
    assert not temp_files(board)
    board.close()
    holder.close()
