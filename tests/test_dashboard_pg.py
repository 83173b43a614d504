"""The web dashboard on a PostgreSQL board (the suite's own server): its stream woken and its picture
read through the board protocol alone, and in a real Chromium beside a team run by `up --dashboard`
on PostgreSQL: cards appear and move without a reload, a held card shows its holder, host and lease,
the budgets panel shows spend against its cap, and a provider that refuses connections shows an
open breaker."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from hermes_sup.supervisor.config.workspace import find_workspace, open_workspace_board
from hermes_sup.supervisor.dashboard import sse, views
from hermes_sup.supervisor.dashboard.app import Server, Settings

from . import pgserver
from .conftest import CLI, ROOT, stop_process, supervisor_state, wait_until
from .llm_server import ScriptedLLM, openai_reply
from .pgserver import PgServer, free_port
from .test_dashboard import ARTIFACTS, Stream, browser, card_in, drop, event_of  # noqa: F401 (browser: a fixture)

DSN_ENV = "HERMES_DASH_PG_DSN"
PASSWORD = "pw-" + uuid.uuid4().hex


@pytest.fixture
def database(pg_server: PgServer) -> Iterator[str]:
    with pgserver.fresh_database(pg_server, "dash", PASSWORD) as dsn:
        yield dsn


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert result.returncode == 0, (args, result.stdout, result.stderr)
    return result


def pg_workspace(where: Path, env: dict[str, str], config: str = "") -> Path:
    ws = where / "ws"
    run(env, "init", str(ws))
    if config:
        (ws / "hermes.yaml").write_text(config)
    with open(ws / "hermes.yaml", "a") as handle:
        handle.write(f"\nboard: {{backend: postgres, dsn_env: {DSN_ENV}}}\n")
    return ws


def follower_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "dashboard-board-follower"]


def test_the_stream_follows_a_postgres_board_through_the_protocol(database: str, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """No file changes on a PostgreSQL board: the stream is woken by the look at the stream's end
    (the safety recheck is made longer than the test), and the picture and recent events come from
    the database."""
    env = {**os.environ, DSN_ENV: database}
    monkeypatch.setenv(DSN_ENV, database)
    ws = pg_workspace(tmp_path, env)
    monkeypatch.setattr(sse, "SAFETY_RECHECK", 3600.0)
    monkeypatch.setattr(sse, "KEEPALIVE", 3600.0)
    server = Server(find_workspace(ws), Settings(host="127.0.0.1", port=0))
    server.start_thread()
    try:
        wait_until(lambda: server.server.started, timeout=30)
        hub = server.dashboard.hub
        assert hub.builds == 0 and not hub.watching and not follower_threads()
        client = Stream(server.port)
        first = json.loads(client.until(lambda f: f["event"] == "snapshot")[-1]["data"])
        assert first["board"]["counts"]["todo"] == 0 and first["recent"] == []
        assert hub.builds == 1 and hub.watching
        woken = hub.generation
        run(env, "-w", str(ws), "task", "add", "On postgres", "--id", "pg-one", "--role", "nobody")
        frames = client.until(lambda f: f["event"] == "snapshot" and
                              json.loads(f["data"])["board"]["counts"]["todo"] == 1, timeout=30)
        assert [(e["task"], e["to"]) for e in map(event_of, frames) if e] == [("pg-one", "todo")]
        picture = json.loads(frames[-1]["data"])
        assert [item["id"] for item in picture["board"]["columns"]["todo"]] == ["pg-one"]
        assert [(e["task"], e["to"]) for e in picture["recent"]] == [("pg-one", "todo")]
        assert hub.generation > woken, "woken by the look at the stream's end, not by the recheck"
        resume_at = frames[-1]["id"]
        client.close()
        wait_until(lambda: hub.clients == 0 and not hub.watching, timeout=15)
        wait_until(lambda: not follower_threads(), timeout=15)  # nothing looks at the database any more
        run(env, "-w", str(ws), "task", "cancel", "pg-one")
        # Resumed from the database's own cursor: the missed event, nothing twice.
        again = Stream(server.port, last_event_id=resume_at)
        frames = again.until(lambda f: f["event"] == "snapshot")
        assert [(e["task"], e["to"]) for e in map(event_of, frames) if e] == [("pg-one", "cancelled")]
        again.close()
    finally:
        server.stop()


def test_a_quiet_postgres_board_is_looked_at_without_the_events_lock(database: str, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """While a page is open and nothing happens, the follower's looks (10 a second) read the stream's
    lock-free marker and never events_end (which takes the events lock exclusively, queueing writers
    behind it); a new event is still on the page within a second or two."""
    import time

    env = {**os.environ, DSN_ENV: database}
    monkeypatch.setenv(DSN_ENV, database)
    ws = pg_workspace(tmp_path, env)
    monkeypatch.setattr(sse, "SAFETY_RECHECK", 3600.0)
    monkeypatch.setattr(sse, "KEEPALIVE", 3600.0)
    server = Server(find_workspace(ws), Settings(host="127.0.0.1", port=0))
    server.start_thread()
    client = None
    try:
        wait_until(lambda: server.server.started, timeout=30)
        board, hub = server.dashboard.board, server.dashboard.hub
        ends, looks = [0], [0]
        real_end, real_spend = board.events_end, hub.spend

        def counted_end() -> int:
            ends[0] += 1
            return real_end()

        def counted_spend():  # called once at each look of the follower
            looks[0] += 1
            return real_spend()

        monkeypatch.setattr(board, "events_end", counted_end)
        monkeypatch.setattr(hub, "spend", counted_spend)
        client = Stream(server.port)
        client.until(lambda f: f["event"] == "snapshot")
        wait_until(lambda: looks[0] >= 3, timeout=30)  # the follower runs, its first look made
        quiet_from, looked_from = ends[0], looks[0]
        wait_until(lambda: looks[0] >= looked_from + 30, timeout=60)
        assert ends[0] == quiet_from, f"{ends[0] - quiet_from} events_end over {looks[0] - looked_from} quiet looks"
        started = time.monotonic()
        run(env, "-w", str(ws), "task", "add", "Seen", "--id", "seen", "--role", "nobody")
        added = time.monotonic()
        client.until(lambda f: f["event"] == "snapshot" and json.loads(f["data"])["board"]["counts"]["todo"] == 1,
                     timeout=30)
        assert time.monotonic() - added < 5.0, (added - started, time.monotonic() - added)
        assert ends[0] > quiet_from  # the end read again once the marker moved

        # An open drawer looks every 0.25 s the same way, and reads no journal row while none is new.
        marks, rows = [0], [0]
        real_marks, real_rows = board.journal_marks, board.journal_rows

        def counted_marks(task_id: str):
            marks[0] += 1
            return real_marks(task_id)

        def counted_rows(*args, **kwargs):
            rows[0] += 1
            return real_rows(*args, **kwargs)

        monkeypatch.setattr(board, "journal_marks", counted_marks)
        monkeypatch.setattr(board, "journal_rows", counted_rows)
        drawer = Stream(server.port, path="/api/task/seen/log")
        try:
            wait_until(lambda: marks[0] >= 2, timeout=30)  # its first look, with its end, made
            drawer_from, rows_from, marks_from = ends[0], rows[0], marks[0]
            wait_until(lambda: marks[0] >= marks_from + 12, timeout=60)
            assert ends[0] == drawer_from, f"{ends[0] - drawer_from} events_end over {marks[0] - marks_from} looks"
            assert rows[0] == rows_from, "a quiet journal is not read again"
        finally:
            drawer.close()
    finally:
        if client is not None:
            client.close()
        server.stop()


def test_recent_events_on_postgres_are_the_newest(database: str, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    env = {**os.environ, DSN_ENV: database}
    monkeypatch.setenv(DSN_ENV, database)
    ws = pg_workspace(tmp_path, env)
    board = open_workspace_board(find_workspace(ws))
    try:
        for number in range(80):
            board.add({"id": f"t{number}", "title": "x"}, by="cli")
        assert [e["task"] for e in views.recent_events(board, 5)] == [f"t{n}" for n in range(75, 80)]
        assert [e["task"] for e in views.recent_events(board, 500)] == [f"t{n}" for n in range(80)]
    finally:
        board.close()


def test_the_drawers_log_reads_who_held_the_task_from_postgres(database: str, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Who held a task when decides under which agent a tool call copied into two agents' logs is
    shown; the drawer reads it again when the board's stream (here, the database's) moves on."""
    env = {**os.environ, DSN_ENV: database}
    monkeypatch.setenv(DSN_ENV, database)
    ws = pg_workspace(tmp_path, env)
    server = Server(find_workspace(ws), Settings(host="127.0.0.1", port=0))
    server.start_thread()
    board = open_workspace_board(find_workspace(ws))
    log = None
    try:
        wait_until(lambda: server.server.started, timeout=30)
        board.add({"id": "held", "title": "Held", "role": "z"}, by="cli")
        call = {"task": "held", "turn": "steps", "tool": "write_file", "args": {"path": "a.txt"}, "status": "started"}

        def write(agent: str, record: dict) -> None:
            path = ws / "runs" / agent / "tool_calls.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a") as handle:
                handle.write(json.dumps(record) + "\n")

        write("worker-a", {**call, "call_id": "before", "at": "2000-01-01T00:00:00Z"})
        log = Stream(server.port, path="/api/task/held/log")
        first = json.loads(log.until(lambda f: f["event"] == "entry")[-1]["data"])
        assert "worker-a" in first["lines"][0]  # the drawer has read the claims: none yet
        doc = board.claim("worker-z", roles=["z"])
        assert doc is not None and doc["id"] == "held"
        at = [entry["at"] for entry in doc["history"] if entry.get("to") == "doing"][-1]
        copied = {**call, "call_id": "after", "at": at}
        write("worker-a", copied)  # a copy in another agent's log (a holder before, say) ...
        write("worker-z", copied)  # ... of the call its holder made
        second = json.loads(log.until(lambda f: f["event"] == "entry")[-1]["data"])
        assert "worker-z" in second["lines"][0], second
    finally:
        if log is not None:
            log.close()
        board.close()
        server.stop()


def test_the_drawers_log_shows_another_hosts_journal_from_postgres(database: str, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """An agent of box-a journals its tool calls in the board's database (none reach box-b's runs/):
    the drawer of box-b's dashboard shows them, as `task log` on box-b does, also one written while
    the drawer is open; and the task's document (the drawer's overview) reads them too."""
    from hermes_sup.kanban.pg import open_store

    env = {**os.environ, DSN_ENV: database}
    monkeypatch.setenv(DSN_ENV, database)
    ws = pg_workspace(tmp_path, env, "host: box-b\n")
    box_a = open_store({"dsn_env": DSN_ENV}, host="box-a")
    server = Server(find_workspace(ws), Settings(host="127.0.0.1", port=0))
    server.start_thread()
    log = None
    try:
        wait_until(lambda: server.server.started, timeout=30)
        box_a.add({"id": "remote", "title": "Worked on box-a"}, by="cli")
        token = box_a.claim("worker-a")["claim"]["token"]
        journal = box_a.task_journal("remote", token, "worker-a", tmp_path / "box-a-work")
        call = {"task": "remote", "turn": "steps", "tool": "write_file", "args": {"path": "a.txt"}}
        journal.append_tool_call({**call, "call_id": "first", "status": "started", "at": "2026-01-01T00:00:00Z"})
        log = Stream(server.port, path="/api/task/remote/log")
        first = json.loads(log.until(lambda f: f["event"] == "entry")[-1]["data"])
        assert "worker-a" in first["lines"][0] and "write_file" in first["lines"][0], first
        journal.append_tool_call({**call, "call_id": "second", "tool": "read_file", "status": "started",
                                  "at": "2026-01-01T00:00:01Z"})
        second = json.loads(log.until(lambda f: f["event"] == "entry")[-1]["data"])
        assert "read_file" in second["lines"][0], second
        assert not list((ws / "runs").glob("*/tool_calls.jsonl")), "box-a's records are in the database only"
        printed = run(env, "-w", str(ws), "task", "log", "remote").stdout
        assert "write_file" in printed and "read_file" in printed  # the drawer and the terminal agree
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/api/task/remote", timeout=30) as answer:
            doc = json.loads(answer.read())
        assert any("read_file" in line for line in doc["log"]), doc["log"]
    finally:
        if log is not None:
            log.close()
        box_a.close()
        server.stop()


def llm_record(task: str, call: str, cost: float, at: str) -> dict:
    return {"task": task, "call": call, "at": at, "provider": "p", "model": "m", "outcome": "ok",
            "tokens_in": 10, "tokens_out": 5, "tokens_cached": 0, "cost_usd": cost}


def test_the_pages_usage_is_the_whole_teams_as_usage_says(database: str, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """box-a's model calls are in its own runs/ and the board's database, never in box-b's runs/:
    box-b's page counts them in its header and on their task's card, the figures `usage --json`
    gives on box-b (box-b's own call, in its file and the database, counted once)."""
    from hermes_sup.kanban.pg import open_store

    env = {**os.environ, DSN_ENV: database}
    monkeypatch.setenv(DSN_ENV, database)
    ws = pg_workspace(tmp_path, env, "host: box-b\n")
    box_a = open_store({"dsn_env": DSN_ENV}, host="box-a")
    box_b = open_store({"dsn_env": DSN_ENV}, host="box-b")
    server = Server(find_workspace(ws), Settings(host="127.0.0.1", port=0))
    server.start_thread()
    try:
        wait_until(lambda: server.server.started, timeout=30)
        for store, task, agent, work in ((box_a, "on-a", "worker-a", tmp_path / "box-a-work"),
                                         (box_b, "on-b", "worker-b", ws / "runs" / "worker-b")):
            store.add({"id": task, "title": task, "role": agent}, by="cli")
            token = store.claim(agent, roles=[agent])["claim"]["token"]
            journal = store.task_journal(task, token, agent, work)
            for number in range(2 if task == "on-a" else 1):
                journal.append_llm_call(llm_record(task, f"{task}-{number}", 0.25, f"2026-01-01T00:00:0{number}Z"))
            journal.close()
        said = json.loads(run(env, "-w", str(ws), "usage", "--json").stdout)
        assert said["total"]["calls"] == 3 and said["tasks"]["on-a"]["cost_usd"] == 0.5, said
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/api/snapshot", timeout=30) as answer:
            usage = json.loads(answer.read())["usage"]
        assert usage["total"] == said["total"]  # the header
        assert usage["agents"] == said["agents"]
        for task in ("on-a", "on-b"):  # each card's cost
            assert usage["tasks"][task] == {key: said["tasks"][task][key] for key in ("cost_usd", "calls")}
    finally:
        box_a.close()
        box_b.close()
        server.stop()


def budget_config(total: float, host: str) -> str:
    return (f"prices:\n  m: {{input: 0, output: 1000}}\nbudgets:\n  team: {{total: {total}}}\nhost: {host}\n"
            "agents:\n  - name: worker\n    count: 1\n")


def test_budgets_on_postgres_are_every_hosts_spend_and_wake_the_stream(database: str, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Spend written by two other hosts' agents into the database's ledger (no event, no file of this
    workspace changes) is shown, and wakes the stream at the follower's look (the safety recheck is
    made longer than the test)."""
    from hermes_sup.agents.ledger import open_ledger

    env = {**os.environ, DSN_ENV: database}
    monkeypatch.setenv(DSN_ENV, database)
    ws = pg_workspace(tmp_path, env, budget_config(1.0, "box-b"))
    monkeypatch.setattr(sse, "SAFETY_RECHECK", 3600.0)
    monkeypatch.setattr(sse, "KEEPALIVE", 3600.0)
    board = {"backend": "postgres", "dsn_env": DSN_ENV}
    ledgers = [open_ledger(tmp_path / host, board, host=host) for host in ("box-a", "box-c")]
    server = Server(find_workspace(ws), Settings(host="127.0.0.1", port=0))
    server.start_thread()
    client = None
    try:
        wait_until(lambda: server.server.started, timeout=30)
        client = Stream(server.port)
        first = json.loads(client.until(lambda f: f["event"] == "snapshot")[-1]["data"])
        assert first["budgets"] == [{"scope": "team", "cap": "total", "limit": 1.0, "spent": 0.0, "left": 1.0}]
        builds = server.dashboard.hub.builds
        for amount, ledger in zip((0.25, 0.125), ledgers, strict=True):
            hold = ledger.reserve(agent="worker-1", task="t", amount=0.5, check=lambda entries, now: None)
            ledger.settle(hold, amount)

        def spent(frame: dict[str, str]) -> bool:
            return frame["event"] == "snapshot" and json.loads(frame["data"])["budgets"][0]["spent"] == 0.375

        frames = client.until(spent, timeout=30)
        assert json.loads(frames[-1]["data"])["budgets"][0]["left"] == pytest.approx(0.625)
        assert server.dashboard.hub.builds > builds
        assert not (ws / "runs" / "budget.jsonl").exists(), "the database's ledger, not this host's file"
    finally:
        if client is not None:
            client.close()
        for ledger in ledgers:
            ledger.close()
        server.stop()


# -- in a real browser, beside a team on PostgreSQL ---------------------------------------------

def team_yaml(llm_url: str, dead_port: int) -> str:
    # cheap (every small task): the scripted server; premium: a port nobody listens on.
    return ("defaults:\n  stop_timeout: 20\n  heartbeat_timeout: 30\n"
            f"providers:\n  local: {{kind: openai, base_url: '{llm_url}', model: m, max_tokens: 100, timeout: 30}}\n"
            f"  gone: {{kind: openai, base_url: 'http://127.0.0.1:{dead_port}/v1', model: m, timeout: 10}}\n"
            "tiers: {cheap: [local], standard: [local], premium: [gone]}\n"
            "prices:\n  m: {input: 0, output: 1000}\n"
            "budgets:\n  team: {total: 5}\n"
            "agents:\n  - name: worker\n    count: 2\n")


@pytest.mark.timeout(300)
def test_the_page_on_a_postgres_team(browser, database: str, tmp_path: Path) -> None:  # noqa: F811
    from hermes_sup.supervisor.sweep import sweep
    from playwright.sync_api import expect

    gate = threading.Event()  # the model's answer waits for it: the task stays held meanwhile

    def answer(api: str, body: dict) -> dict:
        gate.wait(60)
        return openai_reply("done it", completion=100, model="m")  # $0.10 at the prices above

    env = {**os.environ, DSN_ENV: database}
    with ScriptedLLM(responder=answer) as llm:
        ws = pg_workspace(tmp_path, env, team_yaml(llm.url, free_port()))
        with open(tmp_path / "up.log", "w") as log:
            proc = subprocess.Popen([*CLI, "-w", str(ws), "up", "--dashboard", "--dashboard-port", "0"], stdout=log,
                                    stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env)
        context = None
        try:
            said = re.compile(r"dashboard: (http://127\.0\.0\.1:\d+/)")
            url = wait_until(lambda: (said.findall((tmp_path / "up.log").read_text()) or [None])[0], timeout=60)
            agents = lambda: supervisor_state(ws).get("agents") or {}  # noqa: E731
            wait_until(lambda: agents() and all(a["state"] == "running" for a in agents().values()), timeout=60)
            context = browser.new_context(viewport={"width": 1500, "height": 1100})
            page = context.new_page()
            problems: list[str] = []
            page.on("pageerror", lambda exc: problems.append(str(exc)))
            api_calls: list[str] = []
            page.on("request", lambda r: api_calls.append(r.url) if "/api/" in r.url and r.method == "GET" else None)
            page.goto(str(url))
            page.wait_for_selector("#live[data-state='live']", timeout=30_000)
            page.evaluate("window.__same_page = 'yes'")
            expect(page.locator("#budgets tr[data-scope='team'] .spent")).to_have_text("$0.0000", timeout=30_000)

            # A task dropped in the inbox, held by its gate, then done once the gate is.
            run(env, "-w", str(ws), "task", "add", "Gate", "--id", "gate", "--role", "nobody")
            drop(ws, "dropped", {"id": "dropped", "title": "Dropped in the inbox", "depends_on": ["gate"],
                                 "steps": [{"tool": "write_file", "args": {"path": "dropped.txt", "content": "hi"}}]})
            card = card_in(page, "todo", "dropped")
            expect(card).to_be_visible(timeout=30_000)
            expect(card.locator(".why")).to_contain_text("gate", timeout=30_000)
            run(env, "-w", str(ws), "task", "move", "gate", "done")
            expect(card_in(page, "done", "dropped")).to_be_visible(timeout=60_000)
            expect(card_in(page, "todo", "dropped")).to_have_count(0)

            # Added from the page itself: through the same board verb, on the database.
            page.fill("#add-title", "Added from the page")
            page.fill("#add-role", "nobody")
            page.click("#add-form button[type='submit']")
            expect(page.locator("#board .column[data-status='todo'] .card", has_text="Added from the page")
                   ).to_be_visible(timeout=30_000)
            listed = json.loads(run(env, "-w", str(ws), "board", "--json").stdout)
            assert [t["title"] for t in listed["columns"]["todo"]] == ["Added from the page"]

            # A task whose model call hangs: held, with its holder, host, attempt and lease left.
            run(env, "-w", str(ws), "task", "add", "Think it over", "--id", "think")
            held = card_in(page, "doing", "think")
            expect(held).to_be_visible(timeout=60_000)
            expect(held).to_contain_text(re.compile(r"@worker-\d on \S+"), timeout=30_000)
            expect(held).to_contain_text("attempt 1/3")
            expect(held.locator(".lease")).to_contain_text(re.compile(r"lease \d+[sm] left"), timeout=30_000)
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "test_the_page_on_a_postgres_team-held.png"), full_page=True)
            gate.set()
            expect(card_in(page, "done", "think")).to_be_visible(timeout=60_000)
            # Its cost, settled in the ledger, against the team's cap.
            expect(page.locator("#budgets tr[data-scope='team'] .spent")).to_have_text("$0.1000", timeout=30_000)
            expect(page.locator("#budgets tr[data-scope='team'] .limit")).to_have_text("$5.0000")

            # A task for the premium tier: its provider refuses connections and its breaker opens.
            run(env, "-w", str(ws), "task", "add", "Needs the big model", "--id", "big", "--tier", "premium")
            # The first agent to try it (the other may try it too, and open its own).
            breaker = page.locator("#breakers tr[data-provider='gone']").first
            expect(breaker).to_have_attribute("data-level", "warn", timeout=60_000)
            expect(breaker.locator(".state")).to_contain_text("open: down until")
            expect(card_in(page, "todo", "big").locator(".why")).to_contain_text("provider gone down", timeout=60_000)
            page.screenshot(path=str(ARTIFACTS / "test_the_page_on_a_postgres_team.png"), full_page=True)
            assert page.evaluate("window.__same_page") == "yes"  # no reload
            assert not [u for u in api_calls if "/api/events" not in u]  # nor any read of the board
            # The drawer of the done task: its history and its model call, from the database and the journals.
            card_in(page, "done", "think").click()
            expect(page.locator("#d-history")).to_contain_text("doing → done", timeout=30_000)
            expect(page.locator("#d-log")).to_contain_text("model  local (m)", timeout=30_000)
            assert problems == []
        finally:
            gate.set()
            if context is not None:
                context.close()
            stop_process(proc)
            sweep(ws, ws / "runs", 0)


# -- two hosts, one page --------------------------------------------------------------------------

def host_yaml(llm_url: str, host: str, role: str) -> str:
    # host_timeout 3: a host is silent 3 s after its last heartbeat (each 0.5 s), so the test sees it soon.
    return ("defaults:\n  stop_timeout: 20\n  heartbeat_timeout: 30\n"
            f"providers:\n  local: {{kind: openai, base_url: '{llm_url}', model: m, max_tokens: 100, timeout: 30}}\n"
            "tiers: {cheap: [local], standard: [local], premium: [local]}\n"
            "prices:\n  m: {input: 0, output: 1000}\n"
            "budgets:\n  team: {total: 5}\n"
            f"host: {host}\n"
            f"board: {{backend: postgres, dsn_env: {DSN_ENV}, host_timeout: 3}}\n"
            f"agents:\n  - name: worker\n    roles: [{role}]\n    count: 1\n")


@pytest.mark.timeout(300)
def test_one_page_shows_a_two_host_team(browser, database: str, tmp_path: Path) -> None:  # noqa: F811
    """box-a and box-b, each a supervisor with one agent (both named worker), on one database; the
    page of box-b's dashboard shows both hosts' agents (box-a's without buttons: box-b cannot command
    them), the team's spend of both hosts against the cap, box-a's tool calls in a drawer, and box-a's
    agents marked once box-a falls silent."""
    from hermes_sup.supervisor.sweep import sweep
    from playwright.sync_api import expect

    env = {**os.environ, DSN_ENV: database}
    hosts: dict[str, Path] = {}
    procs: dict[str, subprocess.Popen[str]] = {}
    context = None
    with ScriptedLLM(responder=lambda api, body: openai_reply("done it", completion=100, model="m")) as llm:
        try:
            for name, role in (("box-a", "a"), ("box-b", "b")):
                hosts[name] = ws = tmp_path / name
                run(env, "init", str(ws))
                (ws / "hermes.yaml").write_text(host_yaml(llm.url, name, role))
                extra = ["--dashboard", "--dashboard-port", "0"] if name == "box-b" else []
                with open(tmp_path / f"{name}.log", "w") as log:
                    procs[name] = subprocess.Popen([*CLI, "-w", str(ws), "up", *extra], stdout=log,
                                                   stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env)
            said = re.compile(r"dashboard: (http://127\.0\.0\.1:\d+/)")
            url = wait_until(lambda: (said.findall((tmp_path / "box-b.log").read_text()) or [None])[0], timeout=60)
            for ws in hosts.values():
                wait_until(lambda ws=ws: [a["state"] for a in (supervisor_state(ws).get("agents") or {}).values()]
                           == ["running"], timeout=60)
            context = browser.new_context(viewport={"width": 1500, "height": 1100})
            page = context.new_page()
            problems: list[str] = []
            page.on("pageerror", lambda exc: problems.append(str(exc)))
            page.goto(str(url))
            page.wait_for_selector("#live[data-state='live']", timeout=30_000)

            # Both hosts' agents, each with its host; only this host's can be commanded from here.
            ours, theirs = (page.locator(f"#agents tbody tr[data-host='{host}']") for host in ("box-b", "box-a"))
            expect(ours.locator(".state")).to_have_text("running", timeout=30_000)
            expect(theirs.locator(".state")).to_have_text("running", timeout=30_000)
            expect(theirs).to_have_attribute("data-agent", "worker")
            their_pid = supervisor_state(hosts["box-a"])["agents"]["worker"]["pid"]
            expect(theirs.locator(".pid")).to_have_text(str(their_pid))
            assert theirs.locator("button").count() == 0 and ours.locator("button").count() == 3

            # A model call on each host, and box-a's steps: the spend of both against the one cap.
            run(env, "-w", str(hosts["box-a"]), "task", "add", "Think on a", "--id", "a-think", "--role", "a")
            run(env, "-w", str(hosts["box-b"]), "task", "add", "Think on b", "--id", "b-think", "--role", "b")
            drop(hosts["box-a"], "a-steps", {"id": "a-steps", "title": "Steps on a", "role": "a", "steps": [
                {"tool": "write_file", "args": {"path": "from-a.txt", "content": "hi"}}]})
            for task in ("a-think", "b-think", "a-steps"):
                expect(card_in(page, "done", task)).to_be_visible(timeout=60_000)
            expect(page.locator("#budgets tr[data-scope='team'] .spent")).to_have_text("$0.2000", timeout=30_000)

            # box-a's tool call, journaled in the database (box-b's runs/ never had it), in the drawer.
            card_in(page, "done", "a-steps").click()
            expect(page.locator("#d-log")).to_contain_text("write_file -> ok", timeout=30_000)
            expect(page.locator("#d-log")).to_contain_text("worker")
            page.locator("#drawer-close").click()
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "test_one_page_shows_a_two_host_team.png"), full_page=True)

            # box-a stops: its heartbeat ends, and once host_timeout has passed its agents are marked.
            stop_process(procs["box-a"])
            expect(theirs).to_have_attribute("data-silent", "yes", timeout=30_000)
            expect(theirs.locator(".state")).to_contain_text("(host silent)")
            expect(ours).to_have_attribute("data-silent", "no")
            page.screenshot(path=str(ARTIFACTS / "test_one_page_shows_a_two_host_team-silent.png"), full_page=True)
            assert problems == []
        finally:
            if context is not None:
                context.close()
            for proc in procs.values():
                stop_process(proc)
            for ws in hosts.values():
                sweep(ws, ws / "runs", 0)


def test_a_number_past_any_float_in_a_task_row_breaks_no_page(database: str, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Another host (or anyone with the database) may write a task's document by hand: a number like
    1e400 is valid JSON there, and comes back as Python's infinity, which the picture's stream then
    sent as `Infinity`, no JSON to the page (JSON.parse throws: the page stopped drawing, on every
    host) and a 500 for /api/picture. Every number the page gets is a finite one (t2's, no task's
    created_at and waiting, make it damaged, as the file board's check makes such a file)."""
    env = {**os.environ, DSN_ENV: database}
    monkeypatch.setenv(DSN_ENV, database)
    ws = pg_workspace(tmp_path, env)
    board = open_workspace_board(find_workspace(ws))
    try:
        huge = "1" + "0" * 400 + ".5"  # a fraction: read back as a float, which is infinity
        with psycopg.connect(database, autocommit=True) as conn:
            for task_id, fields in (("t1", f'"error": -{huge}, "meta": {{"n": [{huge}]}}, '
                                           f'"claim": {{"lease_until_ts": {huge}}}'),
                                    ("t2", f'"created_at": {huge}, "waiting": [{huge}]')):
                board.add({"id": task_id, "title": task_id}, by="cli")
                conn.execute("UPDATE hermes_sup.tasks SET document = document || %s::jsonb WHERE id = %s",
                             (f"{{{fields}}}", task_id))
        picture = views.snapshot(board, find_workspace(ws), "box-a")
        json.dumps(picture, allow_nan=False)  # what JSON.parse takes
        assert [item["id"] for item in picture["board"]["columns"]["todo"]] == ["t1"]
        assert [item["path"] for item in picture["board"]["damaged"]] == ["task t2 (board database)"]
    finally:
        board.close()
