"""Rows of a PostgreSQL board that another host wrote, read by this one (the suite's real server):
any host with the board's credentials can write any row, so one that is not what the board writes is
skipped and counted, as a bad line of the file board's events.jsonl is, and every reader carries on:
`events` (exit 0, the good events around it, a note counting it), `events -f`, the supervisor's
alerts, the dashboard's picture and stream, doctor. The same for the other tables: a task row that is
no task, a heartbeat, lease or budget hold dated at infinity, a sweeper lease no holder would take."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from . import pgserver
from .conftest import CLI, ROOT, init_workspace, supervisor_state, wait_until
from .pgserver import PgServer
from .test_alerts import hook  # noqa: F401 (a fixture)

DSN_ENV = "HERMES_BADROW_PG_DSN"
PASSWORD = "pw-" + uuid.uuid4().hex  # in the DSN: never printed
FAKE = Path(__file__).resolve().parent / "fake_agent.py"
# What another host (or anyone with the database) may have put in an events row's `record`: every one
# a JSON value jsonb holds, none an event.
NOT_EVENTS = ("'[1]'", "'\"text\"'", "'null'", "'7'", "'{\"kind\": \"board\", \"task\": [1]}'")


@pytest.fixture
def database(pg_server: PgServer) -> Iterator[str]:
    with pgserver.fresh_database(pg_server, "badrow", PASSWORD) as dsn:
        yield dsn


@pytest.fixture
def pg_ws(database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A workspace whose board is the fresh database (the DSN in the environment, as a host has it)."""
    monkeypatch.setenv(DSN_ENV, database)
    ws = tmp_path / "ws"
    init_workspace(ws)
    with open(ws / "hermes.yaml", "a") as handle:
        handle.write(f"\nboard: {{backend: postgres, dsn_env: {DSN_ENV}}}\n")
    return ws


def hermes(ws: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "-w", str(ws), *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, (result.args, result.stdout, result.stderr)
    return result


def write_bad_rows(dsn: str, records: tuple[str, ...] = NOT_EVENTS) -> None:
    """Append events rows whose record is no event, as a host with the credentials can."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for record in records:
            conn.execute(f"INSERT INTO hermes_sup.events (task, by, record) VALUES ('', 'someone', {record}::jsonb)")


def test_events_shows_the_good_events_around_bad_rows_and_counts_them(pg_ws: Path, database: str) -> None:
    ok(hermes(pg_ws, "task", "add", "Before", "--id", "before", "--role", "nobody"))
    write_bad_rows(database)
    ok(hermes(pg_ws, "task", "add", "After", "--id", "after", "--role", "nobody"))
    shown = hermes(pg_ws, "events")
    assert shown.returncode == 0, shown.stderr
    assert "Traceback" not in shown.stderr
    lines = shown.stdout.splitlines()
    assert [line.split()[1] for line in lines] == ["before", "after"], shown.stdout
    assert f"{len(NOT_EVENTS)} unreadable row(s) of the board database's events table skipped" in shown.stderr
    assert "events.jsonl" not in shown.stderr and PASSWORD not in shown.stdout + shown.stderr
    as_json = ok(hermes(pg_ws, "events", "--json"))
    records = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [r["task"] for r in records] == ["before", "after"]
    # The cursor of the event before the bad rows resumes past them: the reader moves on.
    again = ok(hermes(pg_ws, "events", "--json", "--since", str(records[0]["cursor"])))
    assert [json.loads(line)["task"] for line in again.stdout.splitlines()] == ["after"]
    doctor = hermes(pg_ws, "doctor")
    assert "Traceback" not in doctor.stdout + doctor.stderr
    assert f"{len(NOT_EVENTS)} unreadable row(s) of the board database's events table skipped" in doctor.stdout
    assert "events.jsonl" not in doctor.stdout


def test_events_follow_keeps_following_past_a_bad_row(pg_ws: Path, database: str) -> None:
    from .test_events import Stream

    ok(hermes(pg_ws, "task", "add", "Before", "--id", "before", "--role", "nobody"))
    stream = Stream(pg_ws, "-f", "--json")
    try:
        wait_until(lambda: [r["task"] for r in stream.records()] == ["before"], timeout=60)
        write_bad_rows(database)
        ok(hermes(pg_ws, "task", "add", "After", "--id", "after", "--role", "nobody"))
        wait_until(lambda: len(stream.records()) == 2 or stream.proc.poll() is not None, timeout=60)
        assert stream.proc.poll() is None, "events -f ended at the bad row"
        assert [r["task"] for r in stream.records()] == ["before", "after"]
    finally:
        code = stream.end()
    assert code == 0
    assert stream.proc.stderr is not None
    err = stream.proc.stderr.read()
    assert "Traceback" not in err and "unreadable row(s)" in err


def test_the_dashboard_answers_its_picture_and_stream_past_a_bad_row(pg_ws: Path, database: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from hermes_sup.supervisor.config.workspace import find_workspace
    from hermes_sup.supervisor.dashboard.app import Server, Settings

    from .test_dashboard import Stream as Page
    from .test_dashboard import event_of

    ok(hermes(pg_ws, "task", "add", "Before", "--id", "before", "--role", "nobody"))
    server = Server(find_workspace(pg_ws), Settings(host="127.0.0.1", port=0))
    server.start_thread()
    page = None
    try:
        wait_until(lambda: server.server.started, timeout=30)
        page = Page(server.port)
        page.until(lambda f: f["event"] == "snapshot")
        write_bad_rows(database)
        ok(hermes(pg_ws, "task", "add", "After", "--id", "after", "--role", "nobody"))
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/api/snapshot", timeout=60) as answer:
                status, picture = answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            status, picture = exc.code, {}
        assert status == 200
        assert [e["task"] for e in picture["recent"]] == ["before", "after"]
        frames = page.until(lambda f: (event_of(f) or {}).get("task") == "after", timeout=60)
        assert [e["task"] for e in map(event_of, frames) if e] == ["after"]
    finally:
        if page is not None:
            page.close()
        server.stop()


def test_an_alert_after_a_bad_row_still_fires(pg_ws: Path, database: str, monkeypatch: pytest.MonkeyPatch,
                                             up, hook) -> None:  # noqa: F811 (the fixture imported above)
    from .test_alerts import SECRET_ENV, URL_ENV

    receiver = hook()
    monkeypatch.setenv(URL_ENV, receiver.url)
    monkeypatch.setenv(SECRET_ENV, uuid.uuid4().hex)
    config = (pg_ws / "hermes.yaml").read_text()
    (pg_ws / "hermes.yaml").write_text(
        "defaults:\n  stop_timeout: 5\n  heartbeat_timeout: 30\n"
        f"agents:\n  - name: a\n    command: [{sys.executable}, {FAKE}, beat]\n"
        f"alerts:\n  - {{webhook_env: {URL_ENV}, secret_env: {SECRET_ENV}, on: [task_failed]}}\n"
        + config[config.index("\nboard:"):])
    proc = up(pg_ws)
    wait_until(lambda: supervisor_state(pg_ws).get("agents", {}).get("a", {}).get("state") == "running", timeout=60)
    write_bad_rows(database)
    ok(hermes(pg_ws, "task", "add", "After", "--id", "after", "--role", "nobody"))
    ok(hermes(pg_ws, "task", "move", "after", "failed"))
    wait_until(lambda: receiver.accepted(), timeout=60)
    assert [json.loads(body)["event"]["task"] for _, body, _ in receiver.accepted()] == ["after"]
    shown = ok(hermes(pg_ws, "events"))
    assert "alert_error" not in shown.stdout, shown.stdout
    assert proc.poll() is None, "the supervisor carries on"
    said = (pg_ws.parent / "up.log").read_text()  # where the `up` fixture keeps its output
    assert "could not check the tasks just ingested" not in said and "Traceback" not in said, said


def test_a_row_too_large_or_too_deep_is_skipped_and_counted_not_read(pg_server: PgServer) -> None:
    """The file board skips a line over MAX_EVENT_LINE unparsed; a row as large is sent as its cursor
    alone (a transition's note, a record that compresses to a few kilobytes), and a record nested
    deeper than Python reads is no event either (not a transition with an empty task)."""
    from hermes_sup.kanban.events import MAX_EVENT_LINE

    with pgserver.stores_on_one_schema(pg_server, f"t_{uuid.uuid4().hex[:12]}") as make:
        store = make("host-a")
        store.add({"title": "before", "id": "before"})
        deep = '{"a": ' * 5000 + "1" + "}" * 5000
        with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{store.schema}"')
            conn.execute("INSERT INTO events (task, by, note) VALUES ('huge', 'someone', repeat('x', %s))",
                         (MAX_EVENT_LINE + 1,))
            conn.execute("INSERT INTO events (task, by, record) VALUES ('', 'someone', jsonb_build_object("
                         "'kind', 'supervisor', 'event', 'x', 'note', repeat('x', %s)))", (MAX_EVENT_LINE,))
            conn.execute("INSERT INTO events (task, by, record) VALUES ('', 'someone', %s::jsonb)", (deep,))
            conn.execute("INSERT INTO events (task, by, note) VALUES ('fits', 'someone', repeat('x', 1000))")
        store.add({"title": "after", "id": "after"})
        read = store.events_since(0)
    assert [event.get("task") for _, event in read.events] == ["before", "fits", "after"]
    assert read.bad == 3 and read.bad_what == "row(s) of the board database's events table"


# Task documents another host wrote that are objects with a title and a history, but not a task as
# the file board's check_document reads one: each is damaged there, and must be here.
NOT_TASKS = {
    "deps-number": {"depends_on": 5},
    "deps-not-ids": {"depends_on": ["Not An Id", 3]},
    "history-numbers": {"history": [1, 2]},
    "steps-text": {"steps": "run it"},
    "created-number": {"created_at": 5},
}


def test_a_task_row_that_is_no_task_is_listed_as_damaged_and_breaks_no_reader(
        pg_ws: Path, database: str) -> None:
    """`board` (every host's), the dashboard's picture and `task show` read every row: one whose
    depends_on is a number raised TypeError out of each. Each such row is listed as damaged, as the
    file board lists a task file it cannot read; a claim sets it aside; the good task is unharmed."""
    from hermes_sup.supervisor.config.workspace import find_workspace
    from hermes_sup.supervisor.dashboard.app import Server, Settings

    ok(hermes(pg_ws, "task", "add", "Good", "--id", "good"))
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("SET search_path TO hermes_sup")
        for task_id, fields in NOT_TASKS.items():
            ok(hermes(pg_ws, "task", "add", task_id, "--id", task_id, "--priority", "5"))
            conn.execute("UPDATE tasks SET document = document || %s::jsonb WHERE id = %s",
                         (json.dumps(fields), task_id))
    shown = hermes(pg_ws, "board", "--json")
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
    picture = json.loads(shown.stdout)
    assert [item["id"] for item in picture["columns"]["todo"]] == ["good"]
    assert sorted(item["path"] for item in picture["damaged"]) == sorted(
        f"task {task_id} (board database)" for task_id in NOT_TASKS)
    assert "'depends_on' is int" in {item["path"]: item["reason"] for item in picture["damaged"]}[
        "task deps-number (board database)"]
    for task_id in NOT_TASKS:
        refused = hermes(pg_ws, "task", "show", task_id)
        assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
        assert f"task {task_id}: its document in the board database is no task" in refused.stderr
    server = Server(find_workspace(pg_ws), Settings(host="127.0.0.1", port=0))
    server.start_thread()
    try:
        wait_until(lambda: server.server.started, timeout=30)
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/api/snapshot", timeout=60) as answer:
            assert answer.status == 200
            assert [item["id"] for item in json.loads(answer.read())["board"]["columns"]["todo"]] == ["good"]
    finally:
        server.stop()
    from hermes_sup.kanban.pg.store import PgStore

    with PgStore(database, host="box-a", boot_id="boot-a") as store:
        claimed = store.claim("w1")  # the damaged rows come first (priority 5): each is set aside
        assert claimed is not None and claimed["id"] == "good"
        assert store.counts()["failed"] == len(NOT_TASKS)


def test_a_heartbeat_or_a_lease_at_infinity_breaks_no_reader(pg_ws: Path, database: str) -> None:
    """timestamptz holds 'infinity' and '-infinity', which any host can write into its hosts row or
    a task's lease: `now() - heartbeat` failed the statement that reads every host (the dashboard's
    agents panel lost every other host, doctor called the database broken), and a lease at infinity
    reached the page as `Infinity`, no JSON (/api/snapshot 500, `task show --json` unparsable)."""
    from hermes_sup.kanban.pg.store import PgStore
    from hermes_sup.supervisor.config.workspace import find_workspace
    from hermes_sup.supervisor.dashboard.app import Server, Settings

    def strict(text: str) -> object:
        return json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} is no JSON"))

    ok(hermes(pg_ws, "task", "add", "Held forever", "--id", "held"))
    other = PgStore(database, host="box-b", boot_id="boot-b")
    try:
        assert other.claim("w-b", lease=600)["id"] == "held"
        other.announce_host(lambda: [{"name": "w-b", "state": "running", "task": "held"}])
        with psycopg.connect(database, autocommit=True) as conn:
            conn.execute("SET search_path TO hermes_sup")
            conn.execute("INSERT INTO hosts (host_id, boot_id, heartbeat) VALUES ('box-future', 'x', 'infinity'), "
                         "('box-past', 'x', '-infinity')")
            conn.execute("UPDATE tasks SET lease_until = 'infinity', lease_claimed = '-infinity' WHERE id = 'held'")
        hosts = {row["host"]: row for row in other.host_agents()}
        assert set(hosts) == {"box-b", "box-future", "box-past"}
        assert hosts["box-past"]["silent"] is True and hosts["box-b"]["silent"] is False
        shown = strict(ok(hermes(pg_ws, "task", "show", "held", "--json")).stdout)
        assert shown["claim"]["agent"] == "w-b"  # type: ignore[index]
        doctor = hermes(pg_ws, "doctor")
        assert "failed to answer" not in doctor.stdout and "Traceback" not in doctor.stderr, doctor.stdout
        assert "box-past" in doctor.stdout, doctor.stdout  # silent for over host_timeout
        server = Server(find_workspace(pg_ws), Settings(host="127.0.0.1", port=0))
        server.start_thread()
        try:
            wait_until(lambda: server.server.started, timeout=30)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/api/snapshot", timeout=60) as answer:
                    status, body = answer.status, answer.read().decode()
            except urllib.error.HTTPError as exc:
                status, body = exc.code, ""
            assert status == 200
            picture = strict(body)
            assert [row["name"] for row in picture["agents"] if row.get("remote")] == ["w-b"]  # type: ignore[index]
            assert [item["id"] for item in picture["board"]["columns"]["doing"]] == ["held"]  # type: ignore[index]
        finally:
            server.stop()
    finally:
        other.close()


def test_a_sweeper_lease_another_host_set_to_infinity_stops_no_recovery(pg_server: PgServer) -> None:
    """The sweeper is whoever holds the `leases` row, taken when it ran out; one written to end at
    'infinity' (any host with the credentials can) never ran out, so no host swept again: every
    expired lease and every silent host's task stayed in doing for good. No holder takes a lease of
    more than a few seconds, so one ending later than that is taken over as nobody's."""
    with pgserver.stores_on_one_schema(pg_server, f"t_{uuid.uuid4().hex[:12]}") as make:
        store = make("host-a")
        store.add({"title": "lapsing", "id": "lapsing"})
        held = store.claim("w", lease=0.2)
        assert held is not None and held["id"] == "lapsing"
        with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{store.schema}"')
            conn.execute("INSERT INTO leases (name, holder, until) VALUES ('sweeper', 'someone', 'infinity')")
            wait_until(lambda: conn.execute("SELECT lease_until < now() FROM tasks WHERE id = 'lapsing'")
                       .fetchone()[0], timeout=30)
        assert store.recover() == [{"task": "lapsing", "to": "todo", "reason": "lease of w expired"}]


def test_a_hold_another_host_dated_at_infinity_fails_no_reservation(tmp_path, database):
    """A hold's `at` is a timestamptz any host can write as 'infinity' or '-infinity': `now() - at`
    failed the statement every reservation reads the ledger with, so every model call of every host
    failed (an error, not a refusal) for as long as the row stood. A hold dated at -infinity is as old
    as can be (freed as abandoned), one at infinity is as new (kept until its host is judged gone)."""
    from hermes_sup.agents.budget import Refusal
    from hermes_sup.agents.ledger import open_ledger

    ledger = open_ledger(tmp_path, {"backend": "postgres", "dsn_env": DSN_ENV}, host="box-a",
                         environ={DSN_ENV: database})
    try:
        ledger.settle(ledger.reserve(agent="w", task="t1", amount=0.5, check=lambda entries, now: None), 0.5)
        with psycopg.connect(database, autocommit=True) as conn:
            for at in ("infinity", "-infinity"):
                conn.execute("INSERT INTO hermes_sup.budget_holds (id, agent, task, day, amount, host, at) "
                             "VALUES (%s, 'w', 't1', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD'), 0.125, "
                             "'box-evil', %s)", (at, at))
        seen: list = []
        hold = ledger.reserve(agent="w", task="t2", amount=0.25, check=lambda entries, now: seen.extend(entries))
        assert hold is not None and not isinstance(hold, Refusal)
        assert sorted(e.amount for e in seen) == [0.125, 0.5], "the hold at -infinity was freed as abandoned"
        with psycopg.connect(database, autocommit=True) as conn:
            ids = [row[0] for row in conn.execute("SELECT id FROM hermes_sup.budget_holds WHERE host = 'box-evil'")]
        assert ids == ["infinity"]
    finally:
        ledger.close()
