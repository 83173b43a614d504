"""PgStore as a BoardStore: every protocol verb, its registration with the backend factory, and the
real CLI on a workspace whose board is PostgreSQL (the DSN in an environment variable, never printed)."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from hermes_sup.kanban.backends import BoardConfigError, open_board
from hermes_sup.kanban.events import CursorError, CursorRead
from hermes_sup.kanban.pg.store import PgStore
from hermes_sup.kanban.store import BoardStore

from . import pgserver
from .conftest import wait_until
from .pgserver import PgServer
from .test_store import protocol_members

DSN_ENV = "W14C_BOARD_DSN"
# Trust authentication ignores it, but it is in the DSN: no output or file may ever show it.
PASSWORD = "pw-" + uuid.uuid4().hex


@pytest.fixture
def database(pg_server: PgServer) -> Iterator[str]:
    """A DSN (with a password in it) to a fresh database: the factory's board lives in its default
    schema, so each test gets a database of its own."""
    with pgserver.fresh_database(pg_server, "w", PASSWORD) as dsn:
        yield dsn


@pytest.fixture
def board(database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[PgStore]:
    monkeypatch.setenv(DSN_ENV, database)
    store = open_board(tmp_path, {"backend": "postgres", "dsn_env": DSN_ENV}, host="box-1")
    assert isinstance(store, PgStore)
    yield store
    store.close()


def test_pg_store_implements_every_protocol_verb_with_a_compatible_signature() -> None:
    for name, value in protocol_members().items():
        if value is None:
            continue  # an attribute set when opened: see test_the_factory_opens_a_pg_store
        assert hasattr(PgStore, name), f"PgStore lacks {name}"
        if isinstance(value, property):
            assert isinstance(getattr(PgStore, name), property), f"PgStore.{name} is not a property"
            continue
        if not inspect.isfunction(value):
            continue
        implemented = inspect.unwrap(getattr(PgStore, name))
        assert inspect.isfunction(implemented), f"PgStore.{name} is not a method"
        wanted = inspect.signature(value).parameters
        have = inspect.signature(implemented).parameters
        for param in wanted.values():
            assert param.name in have, f"PgStore.{name} lacks parameter {param.name}"
            got = have[param.name]
            assert got.kind == param.kind, f"PgStore.{name}({param.name}) is {got.kind}, the protocol says {param.kind}"
            assert got.default == param.default, f"PgStore.{name}({param.name}) defaults to {got.default!r}"
        for extra in set(have) - set(wanted):
            assert have[extra].default is not inspect.Parameter.empty, f"PgStore.{name} requires {extra}"


def test_the_factory_opens_a_pg_store(board: PgStore, tmp_path: Path) -> None:
    assert isinstance(board, BoardStore)
    assert board.root == (tmp_path / "kanban").absolute() and (board.root / "inbox").is_dir()
    assert board.host == "box-1" and board.problems == []
    (board.root / "inbox" / "drop.json").write_text(json.dumps({"id": "dropped", "title": "from a drop"}))
    assert board.ingest().ingested == ["dropped"]


def test_a_missing_dsn_variable_is_a_config_error_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DSN_ENV, raising=False)
    with pytest.raises(BoardConfigError, match=f"\\${DSN_ENV} is not set"):
        open_board(tmp_path, {"backend": "postgres", "dsn_env": DSN_ENV})


def test_the_event_stream_by_cursor_with_appended_records(board: PgStore) -> None:
    start = board.events_end()
    board.check_cursor(start)
    board.add({"id": "a", "title": "a"})
    board.append_event({"kind": "supervisor", "at": "2026-01-01T00:00:00Z", "event": "up", "note": "up"})
    board.cancel("a")
    read = board.events_since(start)
    assert isinstance(read, CursorRead) and read.bad == 0 and not read.restarted
    assert [e["to"] if e["kind"] == "board" else e["kind"] for _c, e in read.events] == [
        "todo", "supervisor", "cancelled"]
    assert read.events[1][1] == {"kind": "supervisor", "at": "2026-01-01T00:00:00Z", "event": "up", "note": "up"}
    cursors = [c for c, _e in read.events]
    assert cursors == sorted(cursors) and read.cursor == cursors[-1] == board.events_end()
    assert board.events_since(cursors[0], max_events=1).events == read.events[1:2]
    assert board.events_since(read.cursor).events == []
    with pytest.raises(CursorError):
        board.check_cursor(read.cursor + 1)
    again = board.events_since(read.cursor + 100)  # another board's cursor: read from the start
    assert again.restarted and [c for c, _e in again.events][-3:] == cursors
    with pytest.raises(OSError):
        board.append_event({"kind": "agent", "note": "x" * 300_000})
    # A record that is no event of ours (no `event` named) is passed over, counted as bad, its cursor spent.
    board.append_event({"kind": "supervisor", "at": "2026-01-01T00:00:00Z", "note": "no event named"})
    skipped = board.events_since(read.cursor)
    assert skipped.events == [] and skipped.bad == 1 and skipped.cursor == board.events_end() > read.cursor


def test_watching_health_and_quarantine(board: PgStore) -> None:
    assert board.watch_mode == "off"
    board.heartbeat()
    checks = {what: (level, detail) for what, level, detail in board.health()}
    assert checks["database"][0] == "ok" and "PostgreSQL" in checks["database"][1]
    assert checks["hosts"] == ("ok", "this host is box-1; 1 heartbeating")
    assert checks["watcher"][0] == "ok" and board.watch_mode == "polling"
    assert PASSWORD not in repr(checks)
    seen = board.signal.generation
    board.add({"id": "wakes", "title": "a new todo notifies"})
    assert board.signal.wait(seen, 10)
    assert board.quarantine_damaged([{"name": "x.json"}]) == []
    assert board.watch_events() is None  # the stream is read on a timer


def test_exclusive_holds_off_another_hosts_writes(board: PgStore, database: str, tmp_path: Path) -> None:
    board.add({"id": "held-off", "title": "t"})
    board.add({"id": "own", "title": "t"})
    other = open_board(tmp_path / "other", {"backend": "postgres", "dsn_env": DSN_ENV}, host="box-2")
    done = threading.Event()
    tasks_table = f'"{board.schema}".tasks'

    def waiting_on_tasks(conn: psycopg.Connection) -> bool:
        """Whether a backend waits for a lock on the tasks table: the other host's write, held off."""
        return bool(conn.execute("SELECT count(*) FROM pg_locks WHERE relation = to_regclass(%s) "
                                 "AND NOT granted", (tasks_table,)).fetchone()[0])

    try:
        with board.exclusive(), psycopg.connect(database, autocommit=True) as observer:
            board.comment("own", "own writes pass")  # this process's verbs run inside the block
            writer = threading.Thread(target=lambda: (other.cancel("held-off"), done.set()), daemon=True)
            writer.start()
            # The database says when the other host's write has come and waits: no timed window,
            # which under load could pass before the writer had even tried.
            wait_until(lambda: waiting_on_tasks(observer) or done.is_set(), timeout=30)
            assert not done.is_set(), "another host wrote while the board was held"
            assert board.get("held-off")["status"] == "todo"
        assert done.wait(30)
        assert board.get("held-off")["status"] == "cancelled"
    finally:
        other.close()


# -- the real CLI on a PostgreSQL board ---------------------------------------------------------


def _cli(ws: Path, env: dict[str, str], *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(Path(sys.executable).parent / "hermes-sup"), "-w", str(ws), *args],
                            capture_output=True, text=True, env=env, timeout=120)
    if ok:
        assert result.returncode == 0, (args, result.stdout, result.stderr)
    return result


def test_the_cli_works_on_a_postgres_board_and_never_prints_the_dsn(database: str, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    env = {**os.environ, DSN_ENV: database}
    subprocess.run([str(Path(sys.executable).parent / "hermes-sup"), "init", str(ws)], env=env, check=True,
                   capture_output=True, timeout=120)
    config = ws / "hermes.yaml"
    config.write_text(config.read_text() + f"\nboard: {{backend: postgres, dsn_env: {DSN_ENV}}}\nhost: box-1\n")
    outputs: list[str] = []

    def cli(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        result = _cli(ws, env, *args, ok=ok)
        outputs.extend((result.stdout, result.stderr))
        return result

    added = json.loads(cli("task", "add", "Write the report", "--json").stdout)
    task_id = added["id"]
    cli("task", "add", "Second one", "--id", "second")
    listing = json.loads(cli("board", "--json").stdout)
    assert sorted(t["id"] for t in listing["columns"]["todo"]) == sorted([task_id, "second"])
    assert listing["counts"]["todo"] == 2 and listing["damaged"] == []
    assert "Write the report" in cli("board").stdout
    assert json.loads(cli("task", "show", task_id, "--json").stdout)["title"] == "Write the report"
    cli("task", "comment", task_id, "looks fine")
    cli("task", "cancel", task_id)
    cli("task", "retry", task_id)
    shown = json.loads(cli("task", "show", task_id, "--json").stdout)
    assert shown["status"] == "todo" and [c["text"] for c in shown["comments"]] == ["looks fine"]
    events = [json.loads(line) for line in cli("events", "--json").stdout.splitlines()]
    moves = [(e["task"], e["to"]) for e in events]
    assert moves == [(task_id, "todo"), ("second", "todo"), (task_id, "cancelled"), (task_id, "todo")]
    later = cli("events", "--since", str(events[1]["cursor"]), "--json").stdout.splitlines()
    assert [(e["task"], e["to"]) for e in map(json.loads, later)] == moves[2:]
    assert cli("events", "--since", str(events[-1]["cursor"] + 5), ok=False).returncode == 2
    doctor = cli("doctor", ok=False)
    assert "PostgreSQL" in doctor.stdout and "LISTEN" in doctor.stdout
    missing = _cli(ws, {k: v for k, v in env.items() if k != DSN_ENV}, "board", ok=False)
    outputs.extend((missing.stdout, missing.stderr))
    assert missing.returncode == 2 and DSN_ENV in missing.stderr
    files = [p.read_text(errors="replace") for p in ws.rglob("*") if p.is_file()]
    for secret in (database, PASSWORD):
        for text in [*outputs, *files]:
            assert secret not in text


def test_wait_for_work_takes_this_hosts_drops(board: PgStore) -> None:
    inbox = board.root / "inbox"
    (inbox / ".late.tmp").write_text(json.dumps({"id": "late-drop", "title": "dropped while waiting"}))
    os.rename(inbox / ".late.tmp", inbox / "late-drop.json")
    got = board.wait_for_work("ag", timeout=30)
    assert got is not None and got["id"] == "late-drop" and list(inbox.iterdir()) == []
