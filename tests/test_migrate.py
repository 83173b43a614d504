"""`hermes-sup board migrate --to postgres`: the plan (pure), and the copy against the suite's real server,
compared field by field through `task show --json` before and after switching hermes.yaml's board."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hermes_sup.kanban import Board
from hermes_sup.kanban.liveness import start_time
from hermes_sup.kanban.task import normalize
from hermes_sup.supervisor.upkeep.migrate import event_row, marker_offset, marker_record, plan_migration, stored_form
from psycopg.conninfo import make_conninfo

from . import pgserver
from .pgserver import PgServer

CLI = [str(Path(sys.executable).parent / "hermes-sup")]
DSN_ENV = "W14E_MIGRATE_DSN"
PASSWORD = "pw-" + uuid.uuid4().hex
NOW = "2026-01-02T03:04:05.000006Z"


# -- the plan, without a server ---------------------------------------------------------------------

def _doc(task_id: str, **fields: Any) -> dict[str, Any]:
    return {**normalize({"id": task_id, "title": task_id, **fields}, default_id=task_id, now=NOW, by="cli",
                        note="added"), **{k: v for k, v in fields.items() if k in ("attempts", "claims")}}


def test_plan_copies_new_skips_same_and_refuses_other_content_doing_damaged_and_unstorable() -> None:
    new, same, other = _doc("new", meta={"k": [1, 2.5]}), _doc("same"), _doc("other")
    plan = plan_migration([new, same, other], [], {"same": stored_form(same), "other": {**stored_form(other),
                                                                                        "title": "changed"}}, [])
    assert [doc["id"] for doc in plan.copy] == ["new"] and plan.copy[0] == {**new, "claim": None}
    assert plan.skipped == ["same"]
    assert plan.conflicts == ["other (differs in title)"] and not plan.ok
    assert plan.counts(plan.copy)["todo"] == 1

    held = {**_doc("held"), "status": "doing"}
    huge = _doc("huge", priority=10**20)
    plan = plan_migration([held, huge], [{"file": "doing/bad.json", "reason": "not JSON"}], {}, [])
    assert not plan.copy and not plan.ok
    assert any("in doing: held" in text for text in plan.refusals)
    assert any("doing/bad.json" in text for text in plan.refusals)
    assert any("'huge'" in text and "64-bit" in text for text in plan.refusals)


def test_plan_says_what_the_database_stores_differently() -> None:
    doc = _doc("nul", body="a\x00b")
    plan = plan_migration([doc], [], {}, [])
    assert plan.copy[0]["body"] == "a\ufffdb"
    assert plan.altered and "body" in plan.altered[0]


def test_events_map_to_columns_only_when_they_hold_them_unchanged() -> None:
    board_event = {"kind": "board", "at": NOW, "task": "t", "from": None, "to": "todo", "by": "cli", "note": "added"}
    assert event_row(board_event) == {"record": None, "at": NOW, "task": "t", "src": None, "dst": "todo",
                                      "by": "cli", "note": "added"}
    for at in ("yesterday", "2026-01-02T03:04:05Z", "2026-13-45T03:04:05.000006Z"):
        odd = {**board_event, "at": at}  # a time the column would not give back as written, or no time at all
        assert event_row(odd)["record"] == odd and event_row(odd)["at"] is None
    started = {"kind": "supervisor", "at": NOW, "event": "started", "agent": "w-1", "pid": 12}
    assert event_row(started) == {"record": started, "at": NOW, "task": "", "src": None, "dst": None,
                                  "by": "supervisor", "note": ""}
    events = [(10, board_event), (20, started), (30, board_event)]
    plan = plan_migration([], [], {}, events, events_after=20)
    assert plan.events_already == 2 and len(plan.events) == 1


def test_an_earlier_copy_counts_only_for_the_same_log() -> None:
    marker = marker_record(at=NOW, source="/ws/kanban", inode=7, offset=300, tasks=1, events=2)
    assert marker_offset(marker, source="/ws/kanban", inode=7) == 300
    assert marker_offset(marker, source="/ws/kanban", inode=8) == 0  # the log was replaced since
    assert marker_offset(marker, source="/other/kanban", inode=7) == 0
    assert marker_offset({**marker, "source_offset": "300"}, source="/ws/kanban", inode=7) == 0
    assert marker_offset(None, source="/ws/kanban", inode=7) == 0


# -- the copy, against the real server ----------------------------------------------------------------

@pytest.fixture
def database(pg_server: PgServer) -> Iterator[str]:
    # The server trusts the socket, so the password is never checked: it is there to be kept out of
    # every output.
    with pgserver.fresh_database(pg_server, "migrate", PASSWORD) as dsn:
        yield dsn


def _run(env: dict[str, str], ws: Path, *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([*CLI, "-w", str(ws), *args], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == code, (args, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    return result


def _no_secret(result: subprocess.CompletedProcess[str], dsn: str) -> None:
    for text in (result.stdout, result.stderr):
        assert dsn not in text and PASSWORD not in text


def _files_workspace(tmp_path: Path, env: dict[str, str]) -> Path:
    """A file board with a task in each status but doing, each with what a status carries."""
    ws = tmp_path / "ws"
    _run(env, ws, "init")
    with Board(ws / "kanban") as board:
        board.add({"id": "base", "title": "base", "priority": 5, "meta": {"n": 1.5, "deep": {"a": [1, None]}},
                   "tier": "cheap"})
        board.add({"id": "after", "title": "after", "depends_on": ["base"], "role": "work", "body": "text"})
        board.add({"id": "aa-planned", "title": "planned", "assignee": "w-1", "max_attempts": 2,
                   "steps": [{"tool": "write_file", "args": {"path": "x.txt", "content": "x"}}]})
        for task_id in ("won", "lost", "asked", "answered", "dropped"):
            board.add({"id": task_id, "title": task_id, "priority": 9})
        tokens = {}
        for _ in range(5):
            doc = board.claim("w-1", pid=os.getpid())
            tokens[doc["id"]] = doc["claim"]["token"]
        board.complete("won", tokens["won"], {"answer": "42", "files": ["a.txt"]})
        board.fail("lost", tokens["lost"], "it broke", permanent=True)
        board.block("asked", tokens["asked"], "needs a person", question="which year?")
        board.block("answered", tokens["answered"], "needs a person", question="which month?")
        board.answer("answered", "May")
        board.release("dropped", tokens["dropped"], "released")
        board.cancel("dropped")
        board.comment("won", "well done", by="reviewer")
        board.append_event({"at": NOW, "kind": "supervisor", "event": "started", "agent": "w-1", "pid": 1,
                            "note": "started"})
    (ws / "kanban" / "inbox" / "broken.json").write_text("{not json")
    _run(env, ws, "board")  # the broken drop goes to rejected/ with its event, as a team would do it
    return ws


def _shown(env: dict[str, str], ws: Path, ids: list[str]) -> dict[str, Any]:
    return {task_id: json.loads(_run(env, ws, "task", "show", task_id, "--json").stdout) for task_id in ids}


def _events(env: dict[str, str], ws: Path) -> list[dict[str, Any]]:
    events = [json.loads(line) for line in _run(env, ws, "events", "--json").stdout.splitlines()]
    # The cursor is each backend's own (a byte offset, a row number), and PostgreSQL's transitions
    # carry no kind ("board" is the default).
    for event in events:
        del event["cursor"]
        if event.get("kind") == "board":
            del event["kind"]
    return events


def _switch(ws: Path) -> None:
    config = ws / "hermes.yaml"
    config.write_text(config.read_text() + f"\nboard: {{backend: postgres, dsn_env: {DSN_ENV}}}\n")


def _rows(dsn: str, query: str) -> list[tuple]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(query).fetchall()


@pytest.mark.timeout(300)
def board_files(ws: Path) -> list[str]:
    """The file board's files, its listing caches left out: any read may write those."""
    return sorted(str(p.relative_to(ws)) for p in (ws / "kanban").rglob("*")
                  if p.is_file() and not p.name.startswith(".doccache"))


def test_migrate_copies_every_field_of_every_task_and_the_events_and_a_second_run_copies_nothing(
        database: str, tmp_path: Path) -> None:
    env = {**os.environ, DSN_ENV: database}
    ws = _files_workspace(tmp_path, env)
    with Board(ws / "kanban") as board:
        ids = [doc["id"] for doc in board.list().tasks]
        todo_order = [doc["id"] for doc in board.list("todo").tasks]
    before, events_before = _shown(env, ws, ids), _events(env, ws)
    rejected_before = json.loads(_run(env, ws, "board", "--json").stdout)["rejected"]
    files_before = board_files(ws)

    dry = _run(env, ws, "board", "migrate", "--to", "postgres", "--dsn-env", DSN_ENV, "--dry-run")
    _no_secret(dry, database)
    assert "would copy 8 task(s)" in dry.stdout and "nothing was written" in dry.stdout
    first = _run(env, ws, "board", "migrate", "--to", "postgres", "--dsn-env", DSN_ENV, "--json")
    _no_secret(first, database)
    report = json.loads(first.stdout)
    assert report["copied"] == {"todo": 4, "doing": 0, "blocked": 1, "done": 1, "failed": 1, "cancelled": 1}
    assert report["events"]["copied"] == len(events_before) and report["switch"].startswith("board: {backend: postgres")
    # The file board is left as it was: a copy, not a move.
    assert board_files(ws) == files_before
    # The table is analyzed: planned as empty, each claim would read and sort every copied task.
    assert _rows(database, "SELECT reltuples FROM pg_class WHERE oid = 'hermes_sup.tasks'::regclass") == [(8.0,)]

    config = (ws / "hermes.yaml").read_text()
    _switch(ws)
    after = _shown(env, ws, ids)
    for task_id in ids:
        assert after[task_id] == before[task_id], task_id
    assert _events(env, ws)[:len(events_before)] == events_before
    assert json.loads(_run(env, ws, "board", "--json").stdout)["rejected"] == rejected_before
    # What the columns decide on: dependencies, claim order (the tasks' own creation times), tokens.
    assert _rows(database, "SELECT task_id, depends_on FROM hermes_sup.dependencies") == [("after", "base")]
    assert [r[0] for r in _rows(database, "SELECT id FROM hermes_sup.tasks WHERE status = 'todo' "
                                          "ORDER BY priority DESC, created, id")] == todo_order
    # Each task was claimed at most once on the file board (token 1): PostgreSQL's next token is above it.
    assert _rows(database, "SELECT last_value, is_called FROM hermes_sup.fence_seq") == [(1, True)]
    # A second run (the board switched back to files for it) copies nothing and says so.
    (ws / "hermes.yaml").write_text(config)
    second = _run(env, ws, "board", "migrate", "--to", "postgres", "--dsn-env", DSN_ENV)
    _no_secret(second, database)
    assert "nothing new to copy" in second.stdout and "skipped 8 task(s)" in second.stdout
    assert "0 event(s)" in second.stdout
    assert _rows(database, "SELECT count(*) FROM hermes_sup.tasks") == [(8,)]
    assert _rows(database, "SELECT count(*) FROM hermes_sup.events WHERE record->>'event' = 'board_migrated'") == [(1,)]


@pytest.mark.timeout(300)
def test_migrate_refuses_a_conflicting_id_and_writes_nothing(database: str, tmp_path: Path) -> None:
    env = {**os.environ, DSN_ENV: database}
    ws = tmp_path / "ws"
    _run(env, ws, "init")
    for title in ("one", "two", "three"):
        _run(env, ws, "task", "add", title, "--id", title)
    other = tmp_path / "other"
    _run(env, other, "init")
    _switch(other)
    _run(env, other, "task", "add", "another two", "--id", "two")
    events = _rows(database, "SELECT count(*) FROM hermes_sup.events")

    refused = _run(env, ws, "board", "migrate", "--to", "postgres", "--dsn-env", DSN_ENV, code=1)
    _no_secret(refused, database)
    assert "nothing was copied" in refused.stderr and "two (differs in" in refused.stderr
    assert _rows(database, "SELECT id FROM hermes_sup.tasks") == [("two",)]
    assert _rows(database, "SELECT count(*) FROM hermes_sup.events") == events
    # A workspace already on PostgreSQL has no file board to copy.
    again = _run(env, other, "board", "migrate", "--to", "postgres", "--dsn-env", DSN_ENV, code=2)
    assert "already on postgres" in again.stderr


@pytest.mark.timeout(300)
def test_migrate_refuses_while_the_team_runs_or_a_task_is_held(database: str, tmp_path: Path) -> None:
    env = {**os.environ, DSN_ENV: database}
    ws = tmp_path / "ws"
    _run(env, ws, "init")
    _run(env, ws, "task", "add", "held", "--id", "held")
    # A live supervisor, as supervisor.json names it: this very process, by pid and start time.
    state = ws / "runs" / "supervisor.json"
    state.write_text(json.dumps({"pid": os.getpid(), "pid_started": start_time(os.getpid()), "agents": {}}))
    running = _run(env, ws, "board", "migrate", "--to", "postgres", "--dsn-env", DSN_ENV, code=1)
    assert "hermes-sup down" in running.stderr
    state.unlink()
    with Board(ws / "kanban") as board:
        board.claim("w-1", pid=os.getpid())
    held = _run(env, ws, "board", "migrate", "--to", "postgres", "--dsn-env", DSN_ENV, code=1)
    assert "in doing: held" in held.stderr
    assert _rows(database, "SELECT count(*) FROM hermes_sup.tasks") == [(0,)]


@pytest.mark.timeout(120)
def test_migrate_never_prints_the_dsn_in_its_errors(database: str, pg_server: PgServer, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    _run(dict(os.environ), ws, "init")
    missing = make_conninfo(pg_server.dsn, dbname=f"none_{uuid.uuid4().hex[:8]}", password=PASSWORD)
    result = _run({**os.environ, DSN_ENV: missing}, ws, "board", "migrate", "--to", "postgres", "--dsn-env", DSN_ENV,
                  code=1)
    _no_secret(result, missing)
    assert f"${DSN_ENV}" in result.stderr and "does not exist" in result.stderr
    # psycopg quotes the part of a string it cannot parse, which may be a password.
    broken = f"host=/nowhere password=half {PASSWORD}"
    result = _run({**os.environ, DSN_ENV: broken}, ws, "board", "migrate", "--to", "postgres", "--dsn-env", DSN_ENV,
                  code=2)
    _no_secret(result, broken)
    assert "does not hold a valid PostgreSQL connection string" in result.stderr
    result = _run({k: v for k, v in os.environ.items() if k != DSN_ENV}, ws, "board", "migrate", "--to", "postgres",
                  "--dsn-env", DSN_ENV, "--json", code=2)
    assert json.loads(result.stdout)["error"].startswith(f"${DSN_ENV} is not set")


@pytest.mark.timeout(120)
def test_a_copy_that_fails_halfway_leaves_nothing(database: str) -> None:
    from hermes_sup.kanban import BoardError
    from hermes_sup.kanban.pg import open_store
    from hermes_sup.kanban.pg.bulk import importing

    with open_store({"dsn_env": DSN_ENV}, host="box-a", environ={DSN_ENV: database}) as store:
        first, second = stored_form(_doc("first", depends_on=["second"])), stored_form(_doc("second"))
        events = [event_row({"kind": "board", "at": NOW, "task": "first", "from": None, "to": "todo", "by": "cli",
                             "note": "added"})]
        marker = marker_record(at=NOW, source="/ws/kanban", inode=1, offset=10, tasks=2, events=1)
        # The same id twice: the second insert finds it taken, after the first task was written.
        with pytest.raises(BoardError, match="appeared on the PostgreSQL board"), importing(store) as target:
            target.write([first, second, first], events, marker)
        assert store.list().tasks == []
        assert _rows(database, "SELECT count(*) FROM hermes_sup.events") == [(0,)]
        assert _rows(database, "SELECT count(*) FROM hermes_sup.dependencies") == [(0,)]
        # A creation time of the board's form that is no moment is kept in the document, never cast.
        odd = {**stored_form(_doc("odd")), "created_at": "2026-13-45T03:04:05.000006Z"}
        with importing(store) as target:
            target.write([first, second, odd], events, marker)
        assert store.get("odd")["created_at"] == odd["created_at"]
        assert sorted(doc["id"] for doc in store.list().tasks) == ["first", "odd", "second"]
        assert {store.claim("w-1")["id"], store.claim("w-1")["id"]} == {"second", "odd"}
        assert store.claim("w-1") is None  # first waits on second: its dependency is a row too
