"""`hermes-sup prune`: finished tasks' transcripts, tool-call records and working folders removed after
an age, the task documents and the usage ledger kept, and todo/doing/blocked tasks never touched."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from pathlib import Path

import filelock
import pytest
from hermes_sup.kanban import Board, doccache
from hermes_sup.supervisor.sweep import LOCK_FILE
from hermes_sup.supervisor.upkeep.prune import finished_before, journal_keep, parse_age, prune

from .conftest import CLI, ROOT, init_workspace

OLD = "2026-01-01T00:00:00.000000Z"
TRANSCRIPT = '{"role":"user","content":"x"}\n'
COMPRESSED = "compressed away\n"


def test_only_a_finished_task_last_changed_before_the_cutoff_is_pruned():
    cutoff = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)
    for status in ("done", "failed", "cancelled"):
        assert finished_before({"id": "t", "status": status, "updated_at": OLD}, cutoff)
    for status in ("todo", "doing", "blocked"):
        assert not finished_before({"id": "t", "status": status, "updated_at": OLD}, cutoff)
    assert not finished_before({"id": "t", "status": "done", "updated_at": "2026-07-01T00:00:00Z"}, cutoff)
    for hostile in ({"id": "../x", "status": "done", "updated_at": OLD},
                    {"id": "t", "status": "done", "updated_at": "yesterday"},
                    {"id": "t", "status": "done", "updated_at": "2026-01-01T00:00:00"},  # no zone: unknown
                    {"id": "t", "status": "done"}):
        assert not finished_before(hostile, cutoff), hostile


def test_a_tool_log_keeps_every_line_but_the_pruned_tasks_records():
    ids = frozenset({"a"})
    assert not journal_keep(b'{"task":"a","tool":"x"}', ids)
    assert journal_keep(b'{"task":"b"}', ids) and journal_keep(b"{torn", ids) and journal_keep(b"[1]", ids)


def test_an_age_is_a_number_and_a_unit():
    assert parse_age("7d") == 7 * 86400 and parse_age("12h") == 43200 and parse_age("0s") == 0
    for bad in ("", "7", "d", "-1d", "nanh", "infd", "7w"):
        with pytest.raises(ValueError, match="--older-than"):
            parse_age(bad)


def make_team_files(ws: Path) -> dict[str, str]:
    """A board with a task in every status, and under runs/ what agents left for each of them."""
    board = Board(ws / "kanban")
    ids = {}
    claimed_in_order = ("done", "failed", "doing", "blocked")  # by priority, highest first
    for status in ("done", "failed", "cancelled", "todo", "doing", "blocked"):
        priority = 9 - claimed_in_order.index(status) if status in claimed_in_order else 0
        ids[status] = board.add({"id": f"{status}-task", "title": status, "max_attempts": 1,
                                 "priority": priority})["id"]
    board.cancel(ids["cancelled"])
    for status in claimed_in_order:
        claimed = board.claim("worker")
        assert claimed is not None and claimed["id"] == ids[status], claimed
        token = claimed["claim"]["token"]
        if status == "done":
            board.complete(claimed["id"], token, {"answer": "ok"})
        elif status == "failed":
            board.fail(claimed["id"], token, "no", permanent=True)
        elif status == "blocked":
            board.block(claimed["id"], token, "waits")
    board.close()
    for agent in ("first", "second"):
        folder = ws / "runs" / agent
        (folder / "transcripts").mkdir(parents=True)
        with (folder / "tool_calls.jsonl").open("w") as log, (folder / "llm_calls.jsonl").open("w") as ledger:
            for task_id in ids.values():
                (folder / "transcripts" / f"{task_id}.jsonl").write_text(TRANSCRIPT)
                log.write(json.dumps({"task": task_id, "tool": "write_file", "status": "done"}) + "\n")
                ledger.write(json.dumps({"task": task_id, "tokens_in": 10}) + "\n")
    (ws / "runs/first/transcripts/done-task.jsonl.1").write_text(COMPRESSED)
    (ws / "runs/first/transcripts/done-task-2.jsonl").write_text("another task's, whose id starts the same\n")
    for task_id in ids.values():
        work = ws / "runs" / "tasks" / task_id / "work"
        work.mkdir(parents=True)
        (work / "out.txt").write_text("y" * 1000)
    return ids


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file's bytes but the empty lock files (flock's, created by whoever locks first) and the
    board's document caches (kanban/.doccache, .doccache.fields and their temp files): a cache, not
    data, that any read of the board may write. A document changed less than a second before a scan
    is not cached (doccache.RACY_NS), so on a slow machine the dry run, a second or more after the
    tasks were written, caches them and rewrites the file: no change prune made."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name not in (LOCK_FILE, ".lock")
            and not (p.parent.name == "kanban" and p.name.startswith(doccache.NAME))}


def test_prune_removes_what_finished_tasks_left_and_nothing_else(tmp_path):
    ws = tmp_path / "ws"
    init_workspace(ws)
    ids = make_team_files(ws)
    before = snapshot(ws)
    dry = subprocess.run([*CLI, "-w", str(ws), "prune", "--older-than", "0s", "--dry-run", "--json"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert dry.returncode == 0, dry.stderr
    planned = json.loads(dry.stdout)
    assert snapshot(ws) == before, "a dry run changes nothing"
    assert sorted(item["task"] for item in planned["tasks"]) == ["cancelled-task", "done-task", "failed-task"]

    done = subprocess.run([*CLI, "-w", str(ws), "prune", "--older-than", "0s"], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    after = snapshot(ws)
    finished, open_ = ("done", "failed", "cancelled"), ("todo", "doing", "blocked")
    for status in finished:
        task_id = ids[status]
        assert not (ws / "runs" / "tasks" / task_id).exists()
        assert not any(f"transcripts/{task_id}.jsonl" in name for name in after), status
        assert f"kanban/{status}/{task_id}.json" in after, "the task document stays"
    assert "runs/first/transcripts/done-task-2.jsonl" in after, "only the exact task's files"
    for status in open_:
        task_id = ids[status]
        assert after[f"runs/tasks/{task_id}/work/out.txt"] == b"y" * 1000
        for agent in ("first", "second"):
            assert f"runs/{agent}/transcripts/{task_id}.jsonl" in after
    for agent in ("first", "second"):
        assert after[f"runs/{agent}/llm_calls.jsonl"] == before[f"runs/{agent}/llm_calls.jsonl"], "the ledger"
        tools = [json.loads(line)["task"] for line in after[f"runs/{agent}/tool_calls.jsonl"].splitlines()]
        assert sorted(tools) == sorted(ids[status] for status in open_), "only the finished tasks' records went"
    freed = sum(len(before[name]) for name in before if name not in after) + sum(
        len(before[name]) - len(after[name]) for name in after if name in before)
    assert done.stdout.splitlines()[-1] == f"3 task(s), freed {freed:,} bytes"
    size = 1000 + 2 * len(TRANSCRIPT) + len(COMPRESSED)  # its folder, two transcripts, a compressed copy
    assert f"removed done-task (done): 4 path(s), {size:,} bytes" in done.stdout
    assert planned["bytes"] == freed, "the dry run said what the run freed"
    again = subprocess.run([*CLI, "-w", str(ws), "prune", "--older-than", "0s", "--json"], capture_output=True,
                           text=True, timeout=60, cwd=ROOT)
    assert json.loads(again.stdout)["bytes"] == 0 and snapshot(ws) == after


def test_a_task_finished_more_recently_than_the_age_is_kept(tmp_path):
    ws = tmp_path / "ws"
    init_workspace(ws)
    make_team_files(ws)
    before = snapshot(ws)
    result = subprocess.run([*CLI, "-w", str(ws), "prune", "--older-than", "1d"], capture_output=True, text=True,
                            timeout=60, cwd=ROOT)
    assert result.returncode == 0 and result.stdout.splitlines()[-1] == "0 task(s), freed 0 bytes"
    assert snapshot(ws) == before
    with Board(ws / "kanban") as board:
        later = prune(ws / "runs", board, 86400, now=dt.datetime.now(dt.UTC) + dt.timedelta(days=2))
    assert sorted(item["task"] for item in later.tasks) == ["cancelled-task", "done-task", "failed-task"]


def test_while_the_team_runs_the_tool_logs_its_agents_append_to_are_left_whole(tmp_path):
    ws = tmp_path / "ws"
    init_workspace(ws)
    make_team_files(ws)
    log = (ws / "runs/first/tool_calls.jsonl").read_bytes()
    supervisor = filelock.FileLock(str(ws / "runs" / LOCK_FILE))  # as `up` holds it
    with supervisor:
        result = subprocess.run([*CLI, "-w", str(ws), "prune", "--older-than", "0s", "--json"],
                                capture_output=True, text=True, timeout=60, cwd=ROOT)
    pruned = json.loads(result.stdout)
    assert len(pruned["tasks"]) == 3 and pruned["journals"] == []
    assert "the team is running" in pruned["notes"][0]
    assert (ws / "runs/first/tool_calls.jsonl").read_bytes() == log
    assert not (ws / "runs/tasks/done-task").exists(), "the finished task's own files went all the same"


def test_bad_input_is_a_clear_error(tmp_path):
    ws = tmp_path / "ws"
    init_workspace(ws)
    result = subprocess.run([*CLI, "-w", str(ws), "prune", "--older-than", "soon"], capture_output=True, text=True,
                            timeout=60, cwd=ROOT)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "--older-than wants a duration (30m, 12h, 7d), not 'soon'" in result.stderr
