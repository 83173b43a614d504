"""Budgets on a PostgreSQL board: the ledger follows the board, so the agents of two hosts (two
supervisors, `host: box-a` and `box-b`, one database) reserve against one spend and never pass a
cap together; `usage` on either host shows the whole team's spend; `reload` raising the cap
resumes them. And the ledger factory itself: which ledger for which board, and its errors."""

from __future__ import annotations

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
from hermes_sup.agents.budget import Caps, decide
from hermes_sup.agents.ledger import FileLedger, LedgerError, open_ledger, read_spend, read_spend_noted
from hermes_sup.kanban.pg import open_store
from hermes_sup.supervisor.governance.usage import team_records
from psycopg.conninfo import make_conninfo

from . import pgserver
from .conftest import CLI, ROOT, init_workspace, wait_until
from .llm_server import ScriptedLLM, openai_reply
from .pgserver import PgServer
from .test_budget import LEFT, team_yaml

DSN_ENV = "W16C_BUDGET_DSN"
PASSWORD = "pw-" + uuid.uuid4().hex
CALL = 0.10  # one call's worst case and real cost: max_tokens 100 at $1000 a million output tokens


@pytest.fixture
def database(pg_server: PgServer) -> Iterator[str]:
    """A database of its own (the board's tables and the ledger's), with a password in its DSN that
    must never reach a file of either host."""
    with pgserver.fresh_database(pg_server, "budget", PASSWORD) as dsn:
        yield dsn


def host_yaml(url: str, total: float, host: str) -> str:
    return team_yaml(url, total, count=2) + f"board: {{backend: postgres, dsn_env: {DSN_ENV}}}\nhost: {host}\n"


def cli(ws: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "-w", str(ws), *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


def held(dsn: str) -> list[tuple[float, bool]]:
    """(amount, settled) of every row of the ledger in the database."""
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT amount, settled FROM hermes_sup.budget_holds").fetchall()


@pytest.mark.timeout(400)
def test_two_hosts_share_one_budget_on_postgres_and_reload_resumes_them(database, tmp_path, up, monkeypatch):
    monkeypatch.setenv(DSN_ENV, database)  # the supervisors (and their agents) inherit it
    gate = threading.Event()  # answers wait for it: calls of both hosts' agents are in flight together

    def answer(api: str, body: dict) -> dict:
        gate.wait(30)
        return openai_reply("done it", completion=100, model="m")  # exactly the worst case

    store = open_store({"dsn_env": DSN_ENV}, host="tester")
    try:
        with ScriptedLLM(responder=answer) as llm:
            hosts = []
            for name in ("box-a", "box-b"):
                ws = tmp_path / name
                init_workspace(ws)
                (ws / "hermes.yaml").write_text(host_yaml(llm.url, 0.35, name))  # three calls fit, not four
                hosts.append(ws)
            tasks = [store.add({"title": f"task {n}"})["id"] for n in range(6)]
            for ws in hosts:
                up(ws)  # four agents in all, two a host, each free to claim any task

            # Three calls fit under the cap; a fourth agent's call would pass it. Held until three were
            # sent (a shared ledger sends no fourth), the answers then settle them all.
            wait_until(lambda: len(llm.requests) >= 3, timeout=90, interval=0.05)
            gate.set()

            def docs() -> list[dict]:
                return [store.get(task) for task in tasks]

            def quiet() -> bool:  # each task done, or in todo with the agents' budget note on it
                return all(d["status"] == "done" or (d["status"] == "todo" and str(d.get("waiting") or "").startswith(
                    "budget reached")) for d in docs())

            wait_until(quiet, timeout=120, interval=0.2)
            assert sorted(d["status"] for d in docs()) == ["done"] * 3 + ["todo"] * 3, \
                "each host spent the cap on its own: a ledger per host"
            assert len(llm.requests) == 3, "no call past the cap was sent, from either host"
            rows = held(database)
            assert sorted(rows) == [(pytest.approx(CALL), True)] * 3, rows
            waiting = [d for d in docs() if d["status"] == "todo"]
            assert all(d["attempts"] == 0 for d in waiting), "a cap reached spends no attempt"
            assert waiting[0]["waiting"] == "budget reached: team total $0.35 until the cap is raised" + LEFT

            for ws in hosts:  # either host tells the whole team's spend and why the rest waits
                shown = json.loads(cli(ws, "task", "show", waiting[0]["id"], "--json").stdout)
                assert (shown["waiting_kind"], shown["waiting"]) == (
                    "budget", "budget reached: team total $0.35 until the cap is raised" + LEFT), shown
                usage = json.loads(cli(ws, "usage", "--json").stdout)
                assert usage["budgets"] == [{"scope": "team", "cap": "total", "limit": 0.35,
                                             "spent": pytest.approx(0.3), "left": pytest.approx(0.05)}], usage

            for ws in hosts:
                (ws / "hermes.yaml").write_text(host_yaml(llm.url, 1.0, ws.name))
                reloaded = cli(ws, "reload")
                assert reloaded.returncode == 0, reloaded.stderr
            wait_until(lambda: [d["status"] for d in docs()] == ["done"] * 6, timeout=180, interval=0.2)
            assert len(llm.requests) == 6
            assert sum(amount for amount, _settled in held(database)) == pytest.approx(0.6)
            with psycopg.connect(database) as conn:  # each hold under its host's name, as hermes.yaml gives it
                named = {host for (host,) in conn.execute("SELECT host FROM hermes_sup.budget_holds")}
            assert named <= {"box-a", "box-b"}, named
    finally:
        store.close()
    events = [json.loads(line) for line in cli(hosts[1], "events", "--json").stdout.splitlines()]
    reached = [e for e in events if e.get("event") == "budget_reached"]
    assert len(reached) == 1, reached  # said once for the team, not once a host
    for ws in hosts:
        for path in ws.rglob("*"):
            if path.is_file():
                text = path.read_text(errors="replace")
                assert database not in text and PASSWORD not in text, path


# -- the factory ------------------------------------------------------------------------------------

def test_the_file_board_keeps_its_ledger_in_runs(tmp_path):
    ledger = open_ledger(tmp_path, None)
    assert isinstance(ledger, FileLedger) and ledger.path == tmp_path / "runs" / "budget.jsonl"
    ledger.reserve(agent="w", task="t", amount=0.25, check=lambda entries, now: None)
    assert [e.amount for e in read_spend(tmp_path, {"backend": "files"})] == [0.25]


def test_a_postgres_board_reserves_in_its_database_shared_by_hosts(tmp_path, database):
    environ = {DSN_ENV: database}
    board = {"backend": "postgres", "dsn_env": DSN_ENV}
    box_a = open_ledger(tmp_path / "a", board, host="box-a", environ=environ)
    box_b = open_ledger(tmp_path / "b", board, host="box-b", environ=environ)
    try:
        caps = Caps(team_total=1.0)

        def check(entries, now):
            return decide(entries, caps, agent="w", task="t", task_limit=None, worst=0.6, now=0.0)

        assert hasattr(box_a.reserve(agent="w", task="t", amount=0.6, check=check), "id")
        refusal = box_b.reserve(agent="w", task="t", amount=0.6, check=check)
        assert not hasattr(refusal, "id") and refusal.spent == pytest.approx(0.6), "box-b sees box-a's hold"
        assert [e.amount for e in read_spend(tmp_path / "c", board, environ=environ)] == [0.6]
        assert not (tmp_path / "a" / "runs" / "budget.jsonl").exists(), "nothing kept on the host"
        assert database not in repr(box_a) and PASSWORD not in repr(box_a)
    finally:
        box_a.close()
        box_b.close()


def test_a_ledger_database_out_of_reach_is_a_clear_error_without_the_dsn(tmp_path, database):
    board = {"backend": "postgres", "dsn_env": DSN_ENV}
    with pytest.raises(LedgerError, match=rf"\${DSN_ENV} is not set"):
        open_ledger(tmp_path, board, environ={})
    gone = make_conninfo(database, host=str(tmp_path), port=1)  # no server listens there
    ledger = open_ledger(tmp_path, board, environ={DSN_ENV: gone})  # connects at first use, not here
    with pytest.raises(LedgerError) as info:
        ledger.entries()
    assert f"${DSN_ENV}" in str(info.value) and PASSWORD not in str(info.value), str(info.value)


def test_a_board_backend_without_a_ledger_is_refused_not_given_a_ledger_per_host(tmp_path, monkeypatch):
    from hermes_sup.kanban import backends

    monkeypatch.setattr(backends, "_REGISTRY", dict(backends._REGISTRY))
    backends.register("memo", lambda *args, **kwargs: None)
    with pytest.raises(LedgerError, match="board backend 'memo' keeps no budget ledger"):
        open_ledger(tmp_path, {"backend": "memo"})


def test_a_connection_the_server_ended_is_made_again_and_the_reservation_made_once(tmp_path, database):
    """A database restart or a terminated backend between two calls: the next reservation goes
    through on a new connection (without that, every call after a restart would fail its task)."""
    ledger = open_ledger(tmp_path, {"backend": "postgres", "dsn_env": DSN_ENV}, host="box-a",
                         environ={DSN_ENV: database})
    try:
        first = ledger.reserve(agent="w", task="t", amount=0.25, check=lambda entries, now: None)
        with psycopg.connect(database, autocommit=True) as admin:
            ended = admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                  "WHERE application_name = 'hermes-sup-ledger'").fetchall()
            assert ended == [(True,)]
            wait_until(lambda: not admin.execute("SELECT 1 FROM pg_stat_activity WHERE application_name = "
                                                 "'hermes-sup-ledger'").fetchall(), timeout=30)
        second = ledger.reserve(agent="w", task="t", amount=0.25, check=lambda entries, now: None)
        assert hasattr(first, "id") and hasattr(second, "id")
        assert sorted(amount for amount, _settled in held(database)) == [0.25, 0.25], "each hold once"
    finally:
        ledger.close()


def test_prune_keeps_the_ledger_on_either_board(tmp_path, database, monkeypatch):
    """What finished tasks spent stays spent after `prune` removed their files: a total cap counts
    it for good, on the file board (runs/budget.jsonl) as in the database."""
    monkeypatch.setenv(DSN_ENV, database)
    for board in ("files", "postgres"):
        ws = tmp_path / board
        init_workspace(ws)
        section = {"backend": "files"} if board == "files" else {"backend": "postgres", "dsn_env": DSN_ENV}
        yaml = "budgets:\n  team: {total: 1.0}\nagents:\n  - name: worker\n" + (
            f"board: {{backend: postgres, dsn_env: {DSN_ENV}}}\n" if board == "postgres" else "")
        (ws / "hermes.yaml").write_text(yaml)
        store = open_board_for(ws, section)
        try:
            task = store.add({"title": "spent"})["id"]
            claimed = store.claim("worker")
            assert claimed is not None and claimed["id"] == task
            ledger = open_ledger(ws, section)
            try:
                hold = ledger.reserve(agent="worker", task=task, amount=0.5, check=lambda entries, now: None)
                ledger.settle(hold, 0.25)
            finally:
                ledger.close()
            (ws / "runs" / "tasks" / task).mkdir(parents=True)  # what prune is for: the task's files
            store.complete(task, claimed["claim"]["token"], {"answer": "ok"})
        finally:
            store.close()
        pruned = cli(ws, "prune", "--older-than", "0s", "--json")
        assert pruned.returncode == 0 and task in pruned.stdout, (pruned.stdout, pruned.stderr)
        # The database's journal is pruned too (nothing was written to it here); the file board keeps none.
        assert json.loads(pruned.stdout)["database"] == (None if board == "files" else
                                                         {"tasks": 0, "rows": 0, "bytes": 0}), pruned.stdout
        assert not (ws / "runs" / "tasks" / task).exists()
        assert [e.amount for e in read_spend(ws, section)] == [0.25], board
        usage = json.loads(cli(ws, "usage", "--json").stdout)
        assert usage["budgets"] == [{"scope": "team", "cap": "total", "limit": 1.0, "spent": 0.25,
                                     "left": 0.75}], (board, usage)


def open_board_for(ws: Path, section: dict):
    from hermes_sup.kanban.backends import open_board

    return open_board(ws, section, host="tester")


def test_a_reservation_reads_settled_spend_summed_not_every_call_ever_made(tmp_path, database):
    """The ledger is kept for good and grows with every call; under the table lock all hosts wait
    on, a reservation reads one row per agent, task and day of settled spend, and each open hold."""
    ledger = open_ledger(tmp_path, {"backend": "postgres", "dsn_env": DSN_ENV}, host="box-a",
                         environ={DSN_ENV: database})
    try:
        for task in ("t1", "t2"):
            for _ in range(30):
                ledger.settle(ledger.reserve(agent="w", task=task, amount=0.5, check=lambda entries, now: None), 0.01)
        still = ledger.reserve(agent="w", task="t1", amount=0.5, check=lambda entries, now: None)
        seen: list = []
        ledger.reserve(agent="w", task="t3", amount=0.5, check=lambda entries, now: seen.extend(entries))
        assert sorted((e.task, round(e.amount, 8)) for e in seen) == [("t1", 0.3), ("t1", 0.5), ("t2", 0.3)]
        assert round(sum(e.amount for e in ledger.entries()), 8) == 1.6
        ledger.release(still)
    finally:
        ledger.close()


def test_an_agent_waiting_on_a_cap_keeps_waiting_when_the_ledger_cannot_be_read(tmp_path):
    """A cap was reached and the ledger's database went away: the agent's loop looks again (it
    does every few seconds) and keeps LLM tasks waiting, saying why, instead of dying on the error."""
    from hermes_sup.agents.worker import BUDGET_UNKNOWN, OFFLINE_RECHECK, Agent
    from hermes_sup.kanban.why import BUDGET_REACHED

    llm = {"providers": {"p": {"kind": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1", "api_key": "k"}},
           "tiers": {"standard": ["p"], "cheap": ["p"], "premium": ["p"]},
           "prices": {"m": {"input": 0, "output": 1000}}, "budgets": {"team": {"total": 0.35}}}
    agent = Agent({"name": "w", "llm": llm, "tier": "standard"}, tmp_path, tmp_path / "runs" / "w")
    try:
        gone = f"host={tmp_path} port=1 dbname=x user=u password={PASSWORD}"  # no server listens there
        agent.ledger = open_ledger(tmp_path, {"backend": "postgres", "dsn_env": DSN_ENV}, environ={DSN_ENV: gone})
        agent._budget_wait = (agent.gate(None), CALL)
        reason, wait = agent._waiting_reason()
        assert reason.startswith(f"{BUDGET_UNKNOWN} (the budget ledger's database (${DSN_ENV}) failed")
        assert reason.startswith(BUDGET_REACHED) and PASSWORD not in reason and wait == OFFLINE_RECHECK
        assert agent._budget_wait is not None, "it looks again later"
    finally:
        agent.board.close()


def test_usage_says_why_it_cannot_show_budgets_kept_in_a_database_it_cannot_reach(tmp_path, monkeypatch):
    """Not a silent $0 from a runs/ the agents never wrote: the spend is in the board's database."""
    monkeypatch.delenv(DSN_ENV, raising=False)
    ws = tmp_path / "ws"
    init_workspace(ws)
    (ws / "hermes.yaml").write_text("budgets:\n  team: {total: 1.0}\nagents:\n  - name: worker\n"
                                    f"board: {{backend: postgres, dsn_env: {DSN_ENV}}}\n")
    shown = cli(ws, "usage", "--json")
    assert shown.returncode == 0, shown.stderr
    usage = json.loads(shown.stdout)
    assert usage["budgets"] == [] and usage["notes"][1:] == [
        f"budgets not shown: the board is on PostgreSQL, but ${DSN_ENV} is not set: the budget ledger is in "
        "the board's database"], usage
    # Nor a silent "this host is the team": the other hosts' model calls are in that database too.
    assert usage["notes"][0].startswith("only this host's model calls are shown: the board's journal could not "
                                        "be read") and f"${DSN_ENV} is not set" in usage["notes"][0], usage


def test_a_gone_hosts_holds_are_freed_as_the_board_frees_its_tasks_and_its_late_settlement_still_counts(
        tmp_path, database):
    """A host that falls silent (or boots again) takes its reservations with it once the board's
    hosts row says so, not an hour later; should its call still end, the real cost is written."""
    from hermes_sup.kanban.pg import boot_id

    environ = {DSN_ENV: database}
    board = {"backend": "postgres", "dsn_env": DSN_ENV, "host_timeout": 30}
    open_store({"dsn_env": DSN_ENV}, host="tester", environ=environ).close()  # the board's tables, hosts too
    caps = Caps(team_total=1.0)

    def check(entries, now):
        return decide(entries, caps, agent="w", task="t", task_limit=None, worst=0.4, now=0.0)

    ledgers = {name: open_ledger(tmp_path, board, host=name, environ=environ)
               for name in ("box-silent", "box-rebooted", "box-alive", "box-a")}
    try:
        with psycopg.connect(database, autocommit=True) as conn:
            conn.execute("INSERT INTO hermes_sup.hosts (host_id, boot_id, heartbeat) VALUES "
                         "('box-silent', %(boot)s, now() - interval '31 seconds'), ('box-rebooted', 'another boot', "
                         "now()), ('box-alive', %(boot)s, now())", {"boot": boot_id()})
        holds = {name: ledgers[name].reserve(agent="w", task="t", amount=0.3, check=lambda entries, now: None)
                 for name in ("box-silent", "box-rebooted", "box-alive")}
        # Of the 0.9 reserved, box-alive's 0.3 stands: 0.3 + 0.4 fits under 1.0.
        mine = ledgers["box-a"].reserve(agent="w", task="t", amount=0.4, check=check)
        assert hasattr(mine, "id"), mine
        assert sorted(round(e.amount, 8) for e in ledgers["box-a"].entries()) == [0.3, 0.4]
        ledgers["box-silent"].settle(holds["box-silent"], 0.2)  # its call ended after all: spent is spent
        ledgers["box-silent"].settle(holds["box-silent"], 0.2)  # and settling twice counts once
        assert sorted(round(e.amount, 8) for e in ledgers["box-a"].entries()) == [0.2, 0.3, 0.4]
    finally:
        for ledger in ledgers.values():
            ledger.close()


# A host whose clock runs three days ahead of the database's: its agents reserve in Python, where
# only the host's clock is patched (the database keeps its own).
SKEWED = """
import json, sys, time
real = time.time
time.time = lambda: real() + 3 * 86400
from hermes_sup.agents.ledger import open_ledger
from pathlib import Path
ledger = open_ledger(Path(sys.argv[1]), {"backend": "postgres", "dsn_env": sys.argv[2]}, host="box-fast")
seen = []
hold = ledger.reserve(agent="w", task="t", amount=0.25, check=lambda entries, *now: seen.extend(now))
ledger.settle(hold, 0.2)
seen.append(ledger.now())
ledger.close()
print(json.dumps(seen))
"""


def test_a_holds_day_and_its_check_go_by_the_databases_clock_not_the_hosts(tmp_path, database):
    """Near midnight UTC a host whose clock is off would count its calls on another day than the
    team's: the per-day caps would each let through what the other day's spend should stop."""
    done = subprocess.run([sys.executable, "-c", SKEWED, str(tmp_path), DSN_ENV], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env={**os.environ, DSN_ENV: database})
    assert done.returncode == 0, done.stderr
    with psycopg.connect(database) as conn:
        today, db_now = conn.execute("SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD'), "
                                     "extract(epoch FROM now())::float8").fetchone()
        days = [day for (day,) in conn.execute("SELECT day FROM hermes_sup.budget_holds")]
    assert days == [today], "the hold is dated by the database's day"
    seen = json.loads(done.stdout)
    assert len(seen) == 2 and abs(seen[0] - db_now) < 600, "the check is given the database's time"
    assert abs(seen[1] - db_now) < 600, "and a paused agent looks again by it"


# `hermes-sup usage` on a host whose clock runs three days ahead of the database's.
SKEWED_USAGE = """
import sys, time
real = time.time
time.time = lambda: real() + 3 * 86400
from hermes_sup.supervisor.cli import main
main(sys.argv[1:])
"""


def test_usage_counts_todays_spend_by_the_databases_day(tmp_path, database, monkeypatch):
    """The per-day caps' spend `usage` shows is the database's day's, the day the agents reserve by,
    whatever this host's clock says."""
    monkeypatch.setenv(DSN_ENV, database)
    ws = tmp_path / "ws"
    init_workspace(ws)
    (ws / "hermes.yaml").write_text("budgets:\n  team: {per_day: 1.0}\nagents:\n  - name: worker\n"
                                    f"board: {{backend: postgres, dsn_env: {DSN_ENV}}}\n")
    ledger = open_ledger(ws, {"backend": "postgres", "dsn_env": DSN_ENV})
    try:
        ledger.settle(ledger.reserve(agent="w", task="t", amount=0.5, check=lambda entries, now: None), 0.25)
    finally:
        ledger.close()
    shown = subprocess.run([sys.executable, "-c", SKEWED_USAGE, "-w", str(ws), "usage", "--json"],
                           capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["budgets"] == [{"scope": "team", "cap": "per_day", "limit": 1.0, "spent": 0.25,
                                                    "left": 0.75}]


def test_usage_on_postgres_creates_no_ledger_and_says_there_is_none_yet(tmp_path, database, monkeypatch):
    """A read never writes: `usage` before any agent reserved finds no ledger tables, shows no spend
    and says why, and leaves the database without them."""
    monkeypatch.setenv(DSN_ENV, database)
    ws = tmp_path / "ws"
    init_workspace(ws)
    (ws / "hermes.yaml").write_text("budgets:\n  team: {total: 1.0}\nagents:\n  - name: worker\n"
                                    f"board: {{backend: postgres, dsn_env: {DSN_ENV}}}\n")
    shown = cli(ws, "usage", "--json")
    assert shown.returncode == 0, shown.stderr
    usage = json.loads(shown.stdout)
    assert usage["budgets"] == [{"scope": "team", "cap": "total", "limit": 1.0, "spent": 0, "left": 1.0}], usage
    assert any("no budget ledger yet" in note for note in usage["notes"]), usage["notes"]
    with psycopg.connect(database) as conn:
        tables = conn.execute("SELECT to_regclass('hermes_sup.budget_holds'), "
                              "to_regclass('hermes_sup.budget_said')").fetchone()
    assert tables == (None, None), "usage created the ledger's tables"
    spend = read_spend_noted(tmp_path, {"backend": "postgres", "dsn_env": DSN_ENV})
    assert spend.entries == [] and len(spend.notes) == 1
    # Nor does the dashboard looking for changes of spend while a page is open.
    from hermes_sup.supervisor.config.workspace import Workspace
    from hermes_sup.supervisor.dashboard.views import LedgerVersion
    version = LedgerVersion(Workspace(ws))
    try:
        assert version() == version()
    finally:
        version.close()
    with psycopg.connect(database) as conn:
        tables = conn.execute("SELECT to_regclass('hermes_sup.budget_holds')").fetchone()
    assert tables == (None,), "the dashboard created the ledger's tables"


def model_call(task: str, call: str, tokens_in: int, cost: float) -> dict:
    return {"at": f"2026-01-01T00:00:0{call[-1]}.000000Z", "task": task, "call": call, "outcome": "ok",
            "provider": "local", "model": "m", "tokens_in": tokens_in, "tokens_out": 10, "tokens_cached": 0,
            "cost_usd": cost}


def test_usage_on_either_host_counts_the_whole_teams_model_calls_each_once(tmp_path, database, monkeypatch):
    """box-a's and box-b's agents each log their calls in their own files and, for a task, in the
    board's journal: usage on either host shows both hosts' agents, a call in both places once, and
    a call whose database copy never arrived (a lost claim) on the host that made it."""
    from hermes_sup.kanban.journal import Journal

    monkeypatch.setenv(DSN_ENV, database)
    hosts = {}
    for name in ("box-a", "box-b"):
        ws = tmp_path / name
        init_workspace(ws)
        (ws / "hermes.yaml").write_text(f"agents:\n  - name: worker\nboard: {{backend: postgres, dsn_env: {DSN_ENV}}}\n"
                                        f"host: {name}\n")
        hosts[name] = ws
    stores = {name: open_store({"dsn_env": DSN_ENV}, host=name) for name in hosts}
    try:
        for name, agent, calls in (("box-a", "worker-1", ("a1",)), ("box-b", "worker-2", ("b1", "b2"))):
            task = stores[name].add({"title": f"{name}'s"})["id"]
            claimed = stores[name].claim(agent)
            assert claimed is not None and claimed["id"] == task
            journal = stores[name].task_journal(task, claimed["claim"]["token"], agent, hosts[name] / "runs" / agent)
            for call in calls:
                journal.append_llm_call(model_call(task, call, 100, 0.5))
            journal.close()
        lost = Journal(hosts["box-a"] / "runs" / "worker-1" / "llm_calls.jsonl")
        lost.append(model_call("t-lost", "a2", 7, 0.25))  # in box-a's file alone
        lost.close()
    finally:
        for store in stores.values():
            store.close()

    def agents(name: str) -> dict:
        shown = cli(hosts[name], "usage", "--json")
        assert shown.returncode == 0, shown.stderr
        usage = json.loads(shown.stdout)
        assert usage["notes"] == [], usage["notes"]
        return {agent: (row["calls"], row["tokens_in"], row["cost_usd"]) for agent, row in usage["agents"].items()}

    assert agents("box-a") == {"worker-1": (2, 107, 0.75), "worker-2": (2, 200, 1.0)}
    assert agents("box-b") == {"worker-1": (1, 100, 0.5), "worker-2": (2, 200, 1.0)}


def test_the_teams_model_calls_are_this_hosts_and_the_boards_rows_each_once():
    record = model_call("t", "c1", 5, 0.1)
    other = model_call("t", "c2", 6, 0.2)
    local = [("w1", record)]
    rows = [{"agent": "w1", "entry": dict(record)}, {"agent": "w2", "entry": other}, {"agent": "w2", "entry": other},
            {"agent": "w3", "entry": "not a record"}, {"agent": None, "entry": model_call("t", "c3", 1, 0.0)}]
    merged, notes = team_records(local, rows)
    assert merged == [("w1", record), ("w2", other), ("-", model_call("t", "c3", 1, 0.0))]
    assert notes == ["1 model-call row(s) in the board's database are not records and are skipped"]
    assert team_records(local, None) == (local, [])


def test_a_hold_of_negative_or_no_amount_written_by_another_host_frees_no_budget(tmp_path, database):
    """Any host (or anyone with the database) can write the ledger's rows: one of -100 dollars, or of
    NaN (which PostgreSQL's float holds, and which makes every sum and every comparison with a cap
    false), made the team's spend look smaller or unknowable, and every host's agents then spent past
    the caps. As runs/budget.jsonl's reader does, such an amount counts as nothing."""
    ledger = open_ledger(tmp_path, {"backend": "postgres", "dsn_env": DSN_ENV}, host="box-a",
                         environ={DSN_ENV: database})
    try:
        ledger.settle(ledger.reserve(agent="w", task="t1", amount=0.5, check=lambda entries, now: None), 0.5)
        with psycopg.connect(database, autocommit=True) as conn:
            for amount, settled in ((-100.0, True), (float("nan"), True), (float("-inf"), False),
                                    (float("nan"), False), (float("inf"), True)):
                conn.execute("INSERT INTO hermes_sup.budget_holds (id, agent, task, day, amount, settled, host) "
                             "VALUES (%s, 'w', 't1', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD'), %s, %s, "
                             "'box-evil')", (uuid.uuid4().hex, amount, settled))
        seen: list = []
        ledger.reserve(agent="w", task="t2", amount=0.25, check=lambda entries, now: seen.extend(entries))
        assert round(sum(e.amount for e in seen), 8) == 0.5, seen
        assert round(sum(e.amount for e in ledger.entries()), 8) == 0.75
        # Against a total cap of $0.60 the next $0.25 is refused: the team has $0.75 out.
        caps = Caps(team_total=0.6)
        assert decide(ledger.entries(), caps, agent="w", task="t3", task_limit=None, worst=0.25,
                      now=ledger.now()) is not None
    finally:
        ledger.close()


def test_amounts_near_the_largest_float_another_host_wrote_sum_to_a_finite_spend(tmp_path, database, monkeypatch):
    """Two holds of 1.7e308 (any host can write them) summed past the largest float: in one group the
    database's sum failed every reservation of every host (an error, not a refusal), and across groups
    the spend was infinity, which no page's JSON takes. An amount counts at most MAX_AMOUNT."""
    from hermes_sup.agents.ledger_pg import MAX_AMOUNT
    from hermes_sup.supervisor.governance.usage import budget_standing

    ledger = open_ledger(tmp_path, {"backend": "postgres", "dsn_env": DSN_ENV}, host="box-a",
                         environ={DSN_ENV: database})
    try:
        ledger.settle(ledger.reserve(agent="w", task="t1", amount=0.5, check=lambda entries, now: None), 0.5)
        with psycopg.connect(database, autocommit=True) as conn:
            for task in ("t1", "t1", "t2"):
                conn.execute("INSERT INTO hermes_sup.budget_holds (id, agent, task, day, amount, settled, host) "
                             "VALUES (%s, 'w', %s, to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD'), 1.7e308, true, "
                             "'box-evil')", (uuid.uuid4().hex, task))
        seen: list = []
        assert ledger.reserve(agent="w", task="t3", amount=0.25, check=lambda entries, now: seen.extend(entries)
                              or None) is not None
        assert sum(e.amount for e in seen) == pytest.approx(3 * MAX_AMOUNT, rel=1e-9)
    finally:
        ledger.close()
    (tmp_path / "runs").mkdir(exist_ok=True)
    monkeypatch.setenv(DSN_ENV, database)
    rows = budget_standing(tmp_path / "runs", {"team": {"total": 1.0}}, 0.0,
                           board={"backend": "postgres", "dsn_env": DSN_ENV}, host="box-a")
    json.dumps(rows, allow_nan=False)
    assert rows[0]["spent"] == pytest.approx(3 * MAX_AMOUNT + 0.75, rel=1e-9)
