"""The chaos run: a team of 4 agents against the scripted LLM server works 200 tasks (multi-step tool
use, `steps` plans, tasks with dependencies) while a driver SIGKILLs a random agent every second or
so, twice SIGKILLs the supervisor and runs `up` again, and once drops a burst of 50 files at once.

Then it checks what the product promises: every task in exactly one terminal folder, each result
the scripted one, no state or task file damaged, `events.jsonl` accounting for every transition, no
side effect recorded as completed ever executed twice, no process left. It prints what it saw.

It runs twice: on the file board, and on a PostgreSQL board (the suite's throw-away server, a
database of its own), where the same checks read the tasks' rows and the events table instead.

Run it alone with `pytest -m chaos -s` (about a minute and a half each on 2 cores); `-m "not chaos"`
leaves it out of a quick run.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import statistics
import subprocess
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hermes_sup.kanban import Board
from hermes_sup.kanban.pg.store import PgStore

from . import pgserver
from .conftest import CLI, gone, init_workspace, stop_process, wait_until
from .llm_server import ScriptedLLM, openai_reply
from .pgserver import PgServer

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(400)]

ROOT = Path(__file__).resolve().parent.parent
AGENTS = 4
KILL_EVERY = 1.0              # seconds between agent kills, on average
SUPERVISOR_KILLS_AT = (10.0, 25.0)  # seconds into the run
BURST_AT = 15.0
THINKING = (0.05, 0.4)        # seconds the scripted model takes to answer, so kills land mid-call
DEADLINE = 240.0              # the whole run, a bound, not an expectation
TERMINAL = ("done", "failed", "cancelled")
PG_DSN_ENV = "CHAOS_PG_DSN"
STATUS_FOLDERS = ("todo", "doing", "blocked", "done", "failed", "cancelled")

TALLY_SKILL = '''"""A side effect the chaos test can count: one line per execution, appended in one write."""
import json
import os

from hermes_sup.agents.tools import Tool, register


def tally(ctx, args):
    line = json.dumps({"key": args["key"], "task": (ctx.task or {}).get("id"), "agent": ctx.agent,
                       "pid": os.getpid()}) + "\\n"
    fd = os.open(os.environ["CHAOS_TALLY"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    return "counted " + args["key"]


register(Tool("tally", "Count one unit of work.", tally,
              {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"],
               "additionalProperties": False}, capabilities=("fs.write",)))
'''


# -- the scripted model: answers by content, so any agent can serve any task at any point --------

TASK_LINE = re.compile(r"^Task (\S+):")
DEPENDENCY_LINE = re.compile(r"^## (\S+):", re.MULTILINE)


THINK = random.Random(7)


def respond(api: str, body: dict[str, Any]) -> dict[str, Any]:
    """Turn 1: tally; turn 2: write a file; then the final answer, naming the dependencies whose
    results were in the task's first message. Each answer takes a while, as a model's does."""
    return {**answer(body), "delay": THINK.uniform(*THINKING)}


def answer(body: dict[str, Any]) -> dict[str, Any]:
    messages = body["messages"]
    first = next(m["content"] for m in messages if m["role"] == "user")
    task_id = TASK_LINE.match(first).group(1)
    results = sum(1 for m in messages if m["role"] == "tool")
    if results < 2:
        call = ("tally", {"key": f"{task_id}:llm"}) if results == 0 else (
            "write_file", {"path": f"{task_id}.txt", "content": task_id})
        reply = openai_reply(tool_calls=[call], prompt=200, completion=12)
        reply["json"]["choices"][0]["message"]["tool_calls"][0]["id"] = f"call_{task_id}_{results + 1}"
        return reply
    return openai_reply(expected_answer(task_id, DEPENDENCY_LINE.findall(first)), prompt=260, completion=8)


def expected_answer(task_id: str, dependencies: list[str]) -> str:
    return f"done {task_id}" + (f" using {','.join(sorted(dependencies))}" if dependencies else "")


def steps_for(task_id: str) -> list[dict[str, Any]]:
    # The wait is where kills land, so plans are resumed part-way.
    return [{"tool": "tally", "args": {"key": f"{task_id}:step-1"}},
            {"tool": "wait", "args": {"seconds": 0.3}},
            {"tool": "write_file", "args": {"path": f"{task_id}.txt", "content": task_id}},
            {"tool": "tally", "args": {"key": f"{task_id}:step-4"}}]


STEPS_RESULT = ["counted {id}:step-1", "waited 0.3 s", "wrote {n} characters to {id}.txt", "counted {id}:step-4"]


def expected_steps(task_id: str) -> list[str]:
    return [line.format(id=task_id, n=len(task_id)) for line in STEPS_RESULT]


# -- the run ----------------------------------------------------------------------------------------

def workspace(tmp_path: Path, llm: ScriptedLLM, board: str = "") -> Path:
    ws = tmp_path / "ws"
    init_workspace(ws)
    (ws / "skills" / "tally.py").write_text(TALLY_SKILL)
    (tmp_path / "counts").mkdir()  # the skill runs confined: it writes where it is granted to
    (ws / "hermes.yaml").write_text(f"""\
folders: {{counts: {{path: '{tmp_path / "counts"}', mode: rw}}}}
providers:
  scripted: {{kind: openai, base_url: '{llm.url}/v1', model: m, timeout: 20}}
tiers: {{cheap: [scripted], standard: [scripted], premium: [scripted]}}
defaults:
  restart: {{policy: on-failure, backoff: {{initial: 0.1, max: 0.5}}, max_restarts: 100000, window: 60}}
  stop_timeout: 5
  heartbeat_timeout: 30
  orphan_grace: 60
agents:
  - name: crew
    count: {AGENTS}
    skills: [tally]
    folders: [counts]
    env: {{CHAOS_TALLY: '{tmp_path / "counts" / "tally.jsonl"}'}}
{board}""")
    return ws


def seed(board: Any) -> dict[str, dict[str, Any]]:
    """150 tasks up front: 60 for the model, 45 steps plans, 15 groups of three where the third
    waits for the other two. Returns what each should end with."""
    expected: dict[str, dict[str, Any]] = {}
    for i in range(60):
        board.add({"id": f"llm-{i}", "title": f"think {i}", "max_attempts": 50})
        expected[f"llm-{i}"] = {"answer": expected_answer(f"llm-{i}", [])}
    for i in range(45):
        board.add({"id": f"plan-{i}", "title": f"plan {i}", "steps": steps_for(f"plan-{i}"), "max_attempts": 50})
        expected[f"plan-{i}"] = {"steps": expected_steps(f"plan-{i}")}
    for g in range(15):
        a, b, c = f"grp{g}-a", f"grp{g}-b", f"grp{g}-c"
        board.add({"id": a, "title": f"group {g}: think", "max_attempts": 50})
        board.add({"id": b, "title": f"group {g}: plan", "steps": steps_for(b), "max_attempts": 50})
        board.add({"id": c, "title": f"group {g}: combine", "depends_on": [a, b], "max_attempts": 50})
        expected |= {a: {"answer": expected_answer(a, [])}, b: {"steps": expected_steps(b)},
                     c: {"answer": expected_answer(c, [a, b])}}
    return expected


def burst(ws: Path, expected: dict[str, dict[str, Any]]) -> dict[str, float]:
    """50 files written into the inbox at once (each renamed into place, as an editor saves)."""
    dropped = {}
    inbox = ws / "kanban" / "inbox"
    for i in range(50):
        task_id = f"burst-{i}"
        doc: dict[str, Any] = {"id": task_id, "title": f"dropped {i}", "max_attempts": 50}
        if i % 2:
            doc["steps"] = steps_for(task_id)
            expected[task_id] = {"steps": expected_steps(task_id)}
        else:
            expected[task_id] = {"answer": expected_answer(task_id, [])}
        (inbox / f".{task_id}.tmp").write_text(json.dumps(doc))
    for i in range(50):
        os.replace(inbox / f".burst-{i}.tmp", inbox / f"burst-{i}.json")
        dropped[f"burst-{i}"] = time.time()
    return dropped


def supervisor_state(ws: Path) -> dict[str, Any]:
    try:
        return json.loads((ws / "runs" / "supervisor.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}


class Team:
    """`hermes-sup up` in the foreground, which the driver may SIGKILL and start again."""

    def __init__(self, ws: Path, log: Path, env: dict[str, str] | None = None) -> None:
        self.ws = ws
        self.env = env
        self.log = open(log, "a")  # noqa: SIM115 - closed in stop()
        self.proc: subprocess.Popen[str] | None = None
        self.pids: set[int] = set()

    def up(self) -> None:
        self.proc = subprocess.Popen([*CLI, "-w", str(self.ws), "up"], stdout=self.log,
                                     stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=self.env)
        self.pids.add(self.proc.pid)
        proc = self.proc
        wait_until(lambda: supervisor_state(self.ws).get("pid") == proc.pid, timeout=30)

    def kill_supervisor(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def agent_pids(self) -> list[int]:
        agents = supervisor_state(self.ws).get("agents") or {}
        pids = [info["pid"] for info in agents.values() if info.get("pid")]
        self.pids.update(pids)
        return pids

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
        self.log.close()


class FileView:
    """What the driver reads and does on the file board: folders, task files, events.jsonl."""

    def __init__(self, ws: Path) -> None:
        self.ws = ws
        self.board = Board(ws / "kanban")

    def statuses(self) -> dict[str, list[str]]:
        """Where each task file is, by id (a list, so a task in two folders shows)."""
        found: dict[str, list[str]] = {}
        for status in STATUS_FOLDERS:
            for path in (self.ws / "kanban" / status).glob("*.json"):
                found.setdefault(path.stem, []).append(status)
        return found

    def done(self, ids: list[str]) -> dict[str, dict[str, Any]]:
        return {task_id: json.loads((self.ws / "kanban" / "done" / f"{task_id}.json").read_text()) for task_id in ids}

    def events(self) -> list[dict[str, Any]]:
        return jsonl(self.ws / "kanban" / "events.jsonl")

    def close(self) -> None:
        pass


class PgView:
    """The same on a PostgreSQL board: the tasks' rows (a task is one row, so it has one status)
    and the events table, read by cursor as `events` does."""

    def __init__(self, dsn: str) -> None:
        self.board = PgStore(dsn, schema="hermes_sup", host="chaos-driver", boot_id="driver")
        self._conn = psycopg.connect(dsn, autocommit=True)

    def statuses(self) -> dict[str, list[str]]:
        rows = self._conn.execute("SELECT id, status FROM hermes_sup.tasks").fetchall()
        return {task_id: [status] for task_id, status in rows}

    def done(self, ids: list[str]) -> dict[str, dict[str, Any]]:
        docs = {doc["id"]: doc for doc in self.board.list("done").tasks}
        return {task_id: docs[task_id] for task_id in ids}

    def events(self) -> list[dict[str, Any]]:
        found, cursor = [], 0
        while True:
            read = self.board.events_since(cursor)
            if not read.events:
                return found
            found.extend(event for _cursor, event in read.events)
            cursor = read.cursor

    def close(self) -> None:
        self._conn.close()
        self.board.close()


def moment(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def p99(values: list[float]) -> float:
    return values[round(0.99 * (len(values) - 1))]


def jsonl(path: Path) -> list[dict[str, Any]]:
    """Every complete line of a JSONL file (a torn last line is the one thing a SIGKILL may leave,
    and the agents set those aside themselves)."""
    if not path.exists():
        return []
    data = path.read_bytes()
    complete = data[: data.rfind(b"\n") + 1]
    return [json.loads(line) for line in complete.splitlines() if line.strip()]


def test_a_team_under_fire_finishes_every_task_exactly_once(tmp_path, capsys):
    run_chaos(tmp_path, capsys, "file board")


@pytest.fixture
def chaos_database(pg_server: PgServer) -> Any:
    with pgserver.fresh_database(pg_server, "chaos") as dsn:
        yield dsn


def test_a_team_under_fire_on_postgres_finishes_every_task_exactly_once(tmp_path, capsys, chaos_database):
    """The same run, the same checks, with the board in PostgreSQL (one host: the resume journal a
    reclaimed steps plan reads is the host's own runs/ folder)."""
    run_chaos(tmp_path, capsys, "PostgreSQL board", dsn=chaos_database)


def run_chaos(tmp_path: Path, capsys: Any, backend: str, dsn: str = "") -> None:
    rng = random.Random(int(os.environ.get("CHAOS_SEED", "20261122")))
    figures: Counter[str] = Counter()
    env = {**os.environ, PG_DSN_ENV: dsn} if dsn else None
    board_section = f"board: {{backend: postgres, dsn_env: {PG_DSN_ENV}}}\nhost: chaos-a\n" if dsn else ""
    with ScriptedLLM(responder=respond) as llm, contextlib.ExitStack() as stack:
        ws = workspace(tmp_path, llm, board_section)
        view: FileView | PgView = stack.enter_context(contextlib.closing(PgView(dsn) if dsn else FileView(ws)))
        board = view.board
        expected = seed(board)
        team = Team(ws, tmp_path / "up.log", env)
        retried: set[str] = set()
        dropped: dict[str, float] = {}
        try:
            team.up()
            started = time.monotonic()
            supervisor_kills = list(SUPERVISOR_KILLS_AT)
            next_kill = started + rng.uniform(0.5, 1.5) * KILL_EVERY
            while True:
                now = time.monotonic()
                where = view.statuses()
                if len(where) == 200 and all(folders[0] in TERMINAL for folders in where.values()):
                    break
                left = Counter(f[0] for f in where.values())
                assert now - started < DEADLINE, f"not finished in {DEADLINE} s: {left}"
                if not dropped and now - started >= BURST_AT:
                    dropped = burst(ws, expected)
                if supervisor_kills and now - started >= supervisor_kills[0]:
                    supervisor_kills.pop(0)
                    team.kill_supervisor()
                    figures["supervisor kills"] += 1
                    time.sleep(rng.uniform(0.2, 1.0))  # the agents work on, orphaned, meanwhile
                    team.up()
                if now >= next_kill:
                    pids = team.agent_pids()
                    if pids:
                        victim = rng.choice(pids)
                        try:
                            os.kill(victim, signal.SIGKILL)
                            figures["agent kills"] += 1
                        except ProcessLookupError:
                            pass
                    next_kill = now + rng.uniform(0.5, 1.5) * KILL_EVERY
                # A person's part: a plan step cut off mid-way that is not safe to repeat blocks its
                # task; the person checks and retries it, as the reason says.
                for task_id, folders in where.items():
                    if folders == ["blocked"]:
                        doc = board.get(task_id)
                        if "not safe to repeat" in (doc.get("error") or ""):
                            board.retry(task_id, by="person")
                            retried.add(task_id)
                time.sleep(0.05)
            elapsed = time.monotonic() - started
            team.agent_pids()
        finally:
            final = supervisor_state(ws)
            team.stop()

        # Every task in exactly one terminal folder, with the scripted result.
        where = view.statuses()
        assert sorted(where) == sorted(expected)
        assert all(len(folders) == 1 for folders in where.values()), [t for t, f in where.items() if len(f) > 1]
        assert Counter(folders[0] for folders in where.values()) == {"done": 200}
        docs = view.done(list(where))
        wrong = {t: d["result"] for t, d in docs.items() if d["result"] != expected[t]}
        assert not wrong, f"results not the scripted ones: {dict(list(wrong.items())[:5])}"

        # No state file damaged: every JSON document parses, every log line but a torn tail parses.
        for path in [ws / "runs" / "supervisor.json", *(ws / "runs").glob("*/state.json")]:
            json.loads(path.read_text())
        events = view.events()
        assert not list((ws / "kanban" / "rejected").glob("*")), "no task file was set aside as damaged"

        # events.jsonl accounts for every transition of every task, in order.
        by_task: dict[str, list[tuple[str, str, str]]] = {}
        for event in events:
            if event.get("kind", "board") == "board":  # the supervisor's events (restarts) move no task
                by_task.setdefault(event["task"], []).append((event["at"], event["to"], event["by"]))
        for task_id, doc in docs.items():
            history = [(h["at"], h["to"], h["by"]) for h in doc["history"]]
            assert by_task.get(task_id) == history, f"{task_id}: events {by_task.get(task_id)} != history {history}"

        # A side effect recorded as completed ran once; none ran twice unless a person retried it.
        tally = Counter(record["key"] for record in jsonl(ws.parent / "counts" / "tally.jsonl"))
        completed: set[str] = set()
        for log in (ws / "runs").glob("*/tool_calls.jsonl"):
            records = jsonl(log)
            keys = {(r["task"], r["call_id"]): r["args"]["key"] for r in records
                    if r["status"] == "started" and r["tool"] == "tally"}
            completed |= {keys[(r["task"], r["call_id"])] for r in records
                          if r["status"] == "done" and r.get("outcome") == "ok" and (r["task"], r["call_id"]) in keys}
        twice = {key: n for key, n in tally.items() if n > 1 and key.split(":")[0] not in retried}
        assert not twice, f"side effects executed more than once: {twice}"
        assert all(tally[key] >= 1 for key in completed)
        assert all(tally[key] == 1 for key in completed if key.split(":")[0] not in retried)

        # No process of the team is left.
        assert all(wait_until(lambda pid=pid: gone(pid), timeout=15) for pid in team.pids)

        # What the run saw.
        recoveries = [e for e in events if e.get("by") == "board" and str(e.get("note", "")).startswith("recovered")]
        reclaimed = [t for t, d in docs.items()
                     if len({h["by"] for h in d["history"] if h["to"] == "doing"}) > 1]
        done_at = {t: moment(next(h["at"] for h in reversed(d["history"]) if h["to"] == "done"))
                   for t, d in docs.items()}
        latencies = sorted(done_at[t] - at for t, at in dropped.items())
        ingested = sorted(moment(docs[t]["history"][0]["at"]) - at for t, at in dropped.items())
        restarts = sum(int(info.get("restarts") or 0) for info in (final.get("agents") or {}).values())
        with capsys.disabled():
            print(f"\nchaos ({backend}): 200 tasks done in {elapsed:.1f} s with {AGENTS} agents; "
                  f"{figures['agent kills']} agent kills, {figures['supervisor kills']} supervisor kills, "
                  f"{restarts} restarts (by the last supervisor's count), {len(recoveries)} claims recovered, "
                  f"{len(reclaimed)} tasks reclaimed by another agent, {len(retried)} retried by a person; "
                  f"{len(llm.requests)} model calls, {sum(tally.values())} side effects; burst of 50 drops: "
                  f"drop-to-todo p50 {statistics.median(ingested):.2f} s, p99 {p99(ingested):.2f} s; drop-to-done "
                  f"p50 {statistics.median(latencies):.2f} s, p99 {p99(latencies):.2f} s (behind the 150 queued)")
        assert figures["agent kills"] >= 20 and figures["supervisor kills"] == 2
