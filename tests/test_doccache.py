"""The listing's document cache never gives a stale answer, and a damaged or hostile cache file is ignored."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hermes_sup.kanban import Board, doccache, reads, watch
from hermes_sup.kanban.reads import Listing

from .conftest import wait_until


class Cache:
    """Which listing the tests below read through: the documents' (`list`) or the listing fields'
    (`list_fields`, its own cache file): each must keep every promise."""

    name = doccache.NAME
    fields = False


@pytest.fixture(autouse=True, params=["documents", "fields"])
def which(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Cache, "name", doccache.FIELDS_NAME if request.param == "fields" else doccache.NAME)
    monkeypatch.setattr(Cache, "fields", request.param == "fields")


@pytest.fixture
def eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cache files changed just now too (by default a file is cached once its change is a second
    old), so that every test below really reads through the cache."""
    monkeypatch.setattr(doccache, "RACY_NS", -10**15)


def listing_of(board: Board) -> Listing:
    return board.list_fields() if Cache.fields else board.list()


def listed(board: Board) -> dict[str, dict]:
    return {doc["id"]: doc for doc in listing_of(board).tasks}


def cache_of(board: Board) -> dict:
    return json.loads((board.root / Cache.name).read_bytes().partition(b"\n")[2])


def cached_ids(board: Board) -> set[str]:
    return {key.partition("/")[2][:-len(".json")] for key in cache_of(board)["entries"]}


def write_cache(path: Path, top: dict, padding: int = 0) -> None:
    """A cache file as the board writes it (a digest of its body in its header), saying what `top` says."""
    body = json.dumps(top).encode() + b" " * padding
    path.write_bytes(b"%s %s\n%s" % (doccache.MAGIC, hashlib.blake2b(body, digest_size=16).hexdigest().encode(), body))
    path.chmod(0o644)


def next_tick(path: Path) -> None:
    """Wait until the kernel's coarse clock moved past `path`'s change time, so that a rewrite
    now gets a new ctime (the case the cache's racy rule guards in real use)."""
    seen = os.stat(path).st_ctime_ns
    probe = path.parent.parent / ".tick-probe"

    def ticked() -> bool:
        probe.write_bytes(b"x")
        return os.stat(probe).st_ctime_ns > seen
    wait_until(ticked, timeout=10)
    probe.unlink()


def test_the_cache_is_written_and_used(board, eager):
    tasks = [board.add({"title": f"task {n}"}) for n in range(5)]
    first = listed(board)
    assert cached_ids(board) == {task["id"] for task in tasks}
    assert listed(board) == first
    # Served from the cache: a document put in it for an unchanged file is what the listing shows.
    path = board.root / Cache.name
    top = cache_of(board)
    key = f"todo/{tasks[0]['id']}.json"
    top["entries"][key][4]["title"] = "from the cache"
    write_cache(path, top)
    assert listed(board)[tasks[0]["id"]]["title"] == "from the cache"


def test_a_task_rewritten_in_place_with_the_same_size_is_seen_at_once(board, eager):
    task = board.add({"title": "aaaa"})
    listed(board)
    path = board.root / "todo" / f"{task['id']}.json"
    next_tick(path)
    data, before = path.read_bytes(), os.stat(path)
    with open(path, "r+b") as handle:  # same inode, same size, and its mtime set back by hand
        handle.write(data.replace(b'"aaaa"', b'"bbbb"'))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (os.stat(path).st_ino, os.stat(path).st_size, os.stat(path).st_mtime_ns) == \
        (before.st_ino, before.st_size, before.st_mtime_ns)
    assert listed(board)[task["id"]]["title"] == "bbbb"


def test_a_task_moved_replaced_by_hand_or_deleted_is_seen_at_once(board, eager):
    moved, replaced, deleted = (board.add({"title": title}) for title in ("moved", "replaced", "deleted"))
    listed(board)
    board.move(moved["id"], "blocked")
    path = board.root / "todo" / f"{replaced['id']}.json"
    doc = json.loads(path.read_bytes())
    doc["title"] = "REPLACED"  # the same size: only the inode says it changed
    tmp = path.with_name(".hand")
    tmp.write_text(json.dumps(doc))
    os.rename(tmp, path)
    (board.root / "todo" / f"{deleted['id']}.json").unlink()
    now = listed(board)
    assert now[moved["id"]]["status"] == "blocked"
    assert now[replaced["id"]]["title"] == "REPLACED"
    assert deleted["id"] not in now
    assert cached_ids(board) == {moved["id"], replaced["id"]}


def test_a_file_changed_within_the_last_second_is_not_cached(board):
    task = board.add({"title": "just now"})
    assert listed(board)[task["id"]]["title"] == "just now"
    assert not (board.root / Cache.name).exists() or task["id"] not in cached_ids(board)


def test_a_cache_edited_by_hand_or_with_another_inode_is_not_believed(board, eager):
    task = board.add({"title": "real"})
    listed(board)
    path = board.root / Cache.name
    top = cache_of(board)
    key = f"todo/{task['id']}.json"
    # A document the board would refuse, its digest not made again: the whole cache is ignored.
    path.write_bytes(path.read_bytes().replace(b'"priority":0', b'"priority":"high"'))
    assert b'"priority":"high"' in path.read_bytes()
    assert listed(board)[task["id"]]["priority"] == 0
    top["entries"] = {key: [top["entries"][key][0] + 1, *top["entries"][key][1:4],
                            {**top["entries"][key][4], "title": "x"}]}
    write_cache(path, top)  # the stamp of another inode
    assert listed(board)[task["id"]]["title"] == "real"


@pytest.mark.skipif(os.geteuid() != 0, reason="making a file another user's needs root")
def test_a_cache_another_user_wrote_is_not_believed(board, eager):
    task = board.add({"title": "real"})
    listed(board)
    path = board.root / Cache.name
    top = cache_of(board)
    top["entries"][f"todo/{task['id']}.json"][4]["title"] = "forged"
    write_cache(path, top)
    os.chown(path, 65534, 65534)
    assert listed(board)[task["id"]]["title"] == "real"


def test_a_cache_others_may_write_is_not_believed(board, eager):
    task = board.add({"title": "real"})
    listed(board)
    path = board.root / Cache.name
    top = cache_of(board)
    top["entries"][f"todo/{task['id']}.json"][4]["title"] = "forged"
    write_cache(path, top)
    path.chmod(0o666)
    assert listed(board)[task["id"]]["title"] == "real"


@pytest.mark.parametrize("kind", ["garbage", "huge", "symlink", "fifo", "directory"])
def test_a_damaged_or_hostile_cache_file_is_ignored_and_replaced(board, eager, tmp_path, kind):
    task = board.add({"title": "real"})
    listed(board)
    path = board.root / Cache.name
    top = cache_of(board)
    top["entries"][f"todo/{task['id']}.json"][4]["title"] = "lie"
    path.unlink()
    if kind == "garbage":
        path.write_bytes(b"\x00{[not json" * 100)
    elif kind == "huge":  # a lie behind more bytes than a cache may have: never read
        write_cache(path, top, padding=doccache.MAX_BYTES)
    elif kind == "symlink":  # a lie the link points at: never followed
        target = tmp_path / "elsewhere"
        write_cache(target, top)
        path.symlink_to(target)
    elif kind == "fifo":  # would hang a reader that opened it blocking
        os.mkfifo(path)
    else:  # cannot be read nor replaced: the listing is still right
        path.mkdir()
    assert listed(board)[task["id"]]["title"] == "real"
    if kind == "directory":
        assert path.is_dir()
    else:
        assert path.is_file() and not path.is_symlink()
        assert cache_of(board)["entries"][f"todo/{task['id']}.json"][4]["title"] == "real"
    if kind == "symlink":
        assert b'"lie"' in target.read_bytes()


def test_a_damaged_task_file_is_still_reported_with_a_cache(board, eager):
    task = board.add({"title": "soon damaged"})
    listed(board)
    path = board.root / "todo" / f"{task['id']}.json"
    path.write_bytes(b"{not json")
    listing = listing_of(board)
    assert task["id"] not in {doc["id"] for doc in listing.tasks}
    assert [entry["path"] for entry in listing.damaged] == [f"todo/{task['id']}.json"]


def test_files_changed_just_now_do_not_make_every_listing_write_the_cache(board):
    task = board.add({"title": "just now"})
    for _ in range(2):
        assert task["id"] in listed(board)
    assert not (board.root / Cache.name).exists()  # nothing it could keep


def test_writing_the_cache_wakes_no_one(board, eager, monkeypatch):
    board.start_watching()
    if board.watch_mode != "inotify":
        pytest.skip("needs inotify")
    seen: list[str] = []  # what the watch was woken by
    judge = watch.wakes
    monkeypatch.setattr(watch, "wakes", lambda top, name: (judge(top, name) and not seen.append(name)) or False)
    board.add({"title": "cached"})
    (board.root / Cache.name).unlink(missing_ok=True)
    listed(board)
    assert (board.root / Cache.name).exists()
    (board.root / "rejected" / "sentinel").write_text("x")  # inotify reports in order: the cache's writes came first
    wait_until(lambda: "sentinel" in seen, timeout=30)
    assert not [name for name in seen if "doccache" in name], seen


@pytest.mark.parametrize(("relative", "expected"), [
    (".doccache", True), ("..doccache.123.abcdef.tmp", True), ("events.jsonl", True),
    (".doccache.fields", True), ("..doccache.fields.123.abcdef.tmp", True), ("todo/.doccache.fields", False),
    ("todo/x.json", False), ("todo/.doccache", False), ("inbox/..doccache.1.a.tmp", False)])
def test_which_changes_are_the_boards_own_bookkeeping(relative, expected):
    assert watch.quiet(relative) is expected


def test_a_cache_temp_file_left_by_a_killed_writer_is_swept(board):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])  # a pid that no longer runs
    dead.wait(timeout=30)
    left = board.root / f".{Cache.name}.{dead.pid}.abcdef.tmp"
    left.write_bytes(b"half a cache")
    mine = board.root / f"..doccache.{os.getpid()}.abcdef.tmp"  # a writer that lives: kept
    mine.write_bytes(b"being written")
    other = board.root / f".notes.{dead.pid}.abcdef.tmp"  # not the board's to sweep in its own folder
    other.write_bytes(b"x")
    board.recover()
    assert not left.exists()
    assert mine.exists() and other.exists()


@pytest.mark.parametrize("which", ["fields"], indirect=True)
def test_the_listing_fields_are_the_documents_and_follow_every_change(board, eager):
    board.add({"title": "plain", "id": "plain", "body": "b" * 5000, "depends_on": []})
    board.add({"title": "stepped", "id": "stepped", "steps": [{"tool": "terminal", "args": {"command": "true"}}],
               "priority": 3})
    board.add({"title": "after", "id": "after", "depends_on": ["stepped"], "role": "code", "assignee": "worker"})
    for _ in range(3):
        claimed = board.claim("worker", roles=["code"])
        if claimed["id"] == "stepped":
            board.complete("stepped", claimed["claim"]["token"], {"out": "r" * 5000})
        elif claimed["id"] == "plain":
            board.block("plain", claimed["claim"]["token"], "stuck", question="which?")
        else:
            board.fail(claimed["id"], claimed["claim"]["token"], "it broke", permanent=True)

    def both() -> tuple[list[dict], list[dict]]:
        return [reads.listed_fields(doc) for doc in board.list().tasks], board.list_fields().tasks

    documents, fields = both()
    assert fields == documents and len(fields) == 3
    assert not {"body", "result"} & {key for doc in fields for key in doc}
    assert {doc["id"]: doc["steps"] for doc in fields} == {"plain": False, "stepped": True, "after": False}
    assert both() == (documents, fields)  # now from both caches
    assert cached_ids(board) == {"plain", "stepped", "after"}
    board.answer("plain", "this one")
    board.comment("stepped", "a note")  # no transition: only the file changes
    claimed = board.claim("worker", roles=["code"])
    documents, fields = both()
    assert fields == documents
    assert {doc["id"]: doc["status"] for doc in fields}["plain"] == "doing" == claimed["status"]
    held = claimed["claim"]  # who holds it, where, and until when (the dashboard's card), never its token
    assert {doc["id"]: doc["claim"] for doc in fields}["plain"] == {
        "agent": "worker", "host": held["host"], "lease_until_ts": held["lease_until_ts"]}


@pytest.mark.parametrize("which", ["fields"], indirect=True)
def test_a_cache_of_other_fields_is_not_believed(board, eager):
    task = board.add({"title": "real"})
    board.list()
    board.list_fields()
    key = f"todo/{task['id']}.json"
    documents = json.loads((board.root / doccache.NAME).read_bytes().partition(b"\n")[2])
    fields = cache_of(board)
    assert documents["version"] != fields["version"]
    # Each file holding the other's kind, with a lie in it and a right digest: neither is believed.
    documents["entries"][key][4]["title"] = "whole document"
    fields["entries"][key][4]["title"] = "fields"
    write_cache(board.root / doccache.FIELDS_NAME, documents)
    write_cache(board.root / doccache.NAME, fields)
    assert board.list_fields().tasks[0]["title"] == "real"
    assert board.list().tasks[0]["title"] == "real"
    # And fields of the right kind under an older version of what they hold.
    fields["version"] = f"{doccache.VERSION}:id,title,status"
    write_cache(board.root / doccache.FIELDS_NAME, fields)
    assert board.list_fields().tasks[0]["title"] == "real"
