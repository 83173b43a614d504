"""A host SIGKILLed whole on a PostgreSQL board (issue 14): two `hermes-sup up` (box-a, box-b) share the
database; box-a's agent runs a tool call that leaves a mark, then waits on its next model call, when
box-a's supervisor and every process under it are killed at once, as a machine that dies. box-b takes
the task once box-a's heartbeat is host_timeout old, resumes the conversation from the journal in the
database, and finishes it without running the completed call again."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from hermes_sup.kanban.pg.store import PgStore
from hermes_sup.supervisor.sweep import sweep

from . import pgserver
from .conftest import CLI, ROOT, gone, stop_process, supervisor_state, wait_until
from .llm_server import ScriptedLLM, openai_reply
from .pgserver import PgServer

DSN_ENV = "W14D_HOST_DEATH_DSN"
PASSWORD = "pw-" + uuid.uuid4().hex
HOST_TIMEOUT = 3.0
# host_timeout, then up to one sweep interval (2 s), the sweeper lease of the dead host running
# out (host_timeout), a poll for work (1 s) and a model call: "a few seconds", generous on 2 busy cores.
SLACK = 15.0
DONE = "marked-once"


@pytest.fixture
def database(pg_server: PgServer) -> Iterator[str]:
    with pgserver.fresh_database(pg_server, "death", PASSWORD) as dsn:
        yield dsn


def host(where: Path, name: str, agent: str, llm: ScriptedLLM, env: dict[str, str]) -> Path:
    ws = where / name
    subprocess.run([*CLI, "init", str(ws)], check=True, capture_output=True, cwd=ROOT, env=env, timeout=60)
    (ws / "hermes.yaml").write_text(
        f"host: {name}\n"
        f"board: {{backend: postgres, dsn_env: {DSN_ENV}, host_timeout: {HOST_TIMEOUT}}}\n"
        "defaults:\n  stop_timeout: 5\n"
        f"providers:\n  scripted: {{kind: openai, base_url: '{llm.url}/v1', model: m}}\n"
        "tiers: {cheap: [scripted], standard: [scripted], premium: [scripted]}\n"
        # The folder the command marks each run in: granted, as the terminal writes nowhere else.
        f"folders:\n  marks: {{path: {where / 'marks'}, mode: rw}}\n"
        f"agents:\n  - name: {agent}\n    capabilities: [fs.read, fs.write, shell]\n    folders: [marks]\n")
    return ws


def start(ws: Path, env: dict[str, str], logs: list[Any]) -> subprocess.Popen[str]:
    log = open(ws.parent / f"{ws.name}.log", "w")  # noqa: SIM115 - closed at the end of the test
    logs.append(log)
    proc = subprocess.Popen([*CLI, "-w", str(ws), "up"], stdout=log, stderr=subprocess.STDOUT, text=True,
                            cwd=ROOT, env=env)
    wait_until(lambda: supervisor_state(ws).get("pid") == proc.pid, timeout=60, interval=0.1)
    return proc


def kill_whole_host(supervisor: subprocess.Popen[str], ws: Path) -> list[int]:
    """SIGKILL the supervisor and every process under it at once: all are stopped first, so none
    sees another die (no agent notices its supervisor gone, no supervisor restarts an agent)."""
    agents = [a["pid"] for a in supervisor_state(ws)["agents"].values() if a.get("pid")]
    root = psutil.Process(supervisor.pid)
    procs = [root, *root.children(recursive=True)]
    assert set(agents) <= {p.pid for p in procs}, "an agent of box-a is not under its supervisor"
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):  # a short-lived child may have ended meanwhile
            proc.send_signal(signal.SIGSTOP)
    procs = [root, *root.children(recursive=True)]  # nothing frozen starts anything
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    supervisor.wait(timeout=30)
    pids = [p.pid for p in procs]
    wait_until(lambda: all(gone(pid) for pid in pids), timeout=30, interval=0.05)
    return pids


@pytest.mark.timeout(300)
def test_a_host_killed_whole_has_its_task_resumed_elsewhere_without_running_a_completed_call_again(
        database: str, tmp_path: Path) -> None:
    env = {**os.environ, DSN_ENV: database}
    marks = tmp_path / "marks" / "marks.txt"
    marks.parent.mkdir()
    box_a_dead = threading.Event()

    def model(api: str, body: dict[str, Any]) -> dict[str, Any]:
        if not any(m.get("role") == "tool" for m in body.get("messages") or []):
            # A model that has not seen the call's result asks for it (again, if the conversation was lost).
            return openai_reply(tool_calls=[("terminal", {
                "command": f"echo ran >> {shlex.quote(str(marks))} && echo {DONE}"})])
        # box-a's call waits here until box-a is dead: it never gets an answer.
        box_a_dead.wait(120)
        return openai_reply("the mark is made")

    procs: list[subprocess.Popen[str]] = []
    logs: list[Any] = []
    hosts: list[Path] = []
    killed: list[int] = []
    with ScriptedLLM(responder=model) as llm, \
            PgStore(database, host="observer", boot_id="observer", migrate_schema=True) as board:
        try:
            box_a, box_b = host(tmp_path, "box-a", "doer-a", llm, env), host(tmp_path, "box-b", "doer-b", llm, env)
            hosts += [box_a, box_b]
            procs.append(start(box_a, env, logs))
            task = board.add({"id": "mark-it", "title": "make the mark", "max_attempts": 3}, by="test")
            wait_until(lambda: (board.get(task["id"])["claim"] or {}).get("agent") == "doer-a", timeout=60)
            procs.append(start(box_b, env, logs))
            # box-a ran the call and is waiting on its next model call; box-b's agent is up and idle.
            wait_until(lambda: any(m.get("role") == "tool" for r in llm.requests
                                   for m in r["body"].get("messages") or []), timeout=60, interval=0.05)
            wait_until(lambda: (supervisor_state(box_b).get("agents", {}).get("doer-b") or {}).get("pid"),
                       timeout=60, interval=0.1)
            assert marks.read_text() == "ran\n"
            seen = len(llm.requests)
            killed = kill_whole_host(procs[0], box_a)
            died = time.monotonic()
            box_a_dead.set()
            done = wait_until(lambda: (d := board.get(task["id"]))["status"] == "done" and d,
                              timeout=HOST_TIMEOUT + SLACK, interval=0.1)
            took = time.monotonic() - died
        finally:
            box_a_dead.set()
            for proc in procs:
                stop_process(proc)
            for ws in hosts:
                sweep(ws, ws / "runs", 0)
            for log in logs:
                log.close()
    assert took < HOST_TIMEOUT + SLACK, took
    assert done["result"] == {"answer": "the mark is made"}
    assert [e["by"] for e in done["history"] if e["to"] == "doing"] == ["doer-a", "doer-b"]
    taken_back = [e for e in done["history"] if e["from"] == "doing" and e["to"] == "todo"]
    assert len(taken_back) == 1 and "box-a" in taken_back[0]["note"], done["history"]
    assert marks.read_text() == "ran\n", "the completed tool call ran again on box-b"
    first_of_b = llm.requests[seen]["body"]["messages"]
    assert [m["role"] for m in first_of_b] == ["system", "user", "assistant", "tool"], "box-b started afresh"
    assert DONE in first_of_b[-1]["content"], "box-b's model was not given box-a's tool result"
    assert all(gone(pid) for pid in killed)
    # box-b's `task log` shows what box-a did, from the database: box-b's own files hold none of it.
    log = subprocess.run([*CLI, "-w", str(box_b), "task", "log", task["id"], "--json"], capture_output=True,
                         text=True, env=env, cwd=ROOT, timeout=60)
    assert log.returncode == 0, log.stderr
    entries = [json.loads(line) for line in log.stdout.splitlines()]
    ran = [e for e in entries if e["kind"] == "tool" and e["status"] == "done"]
    assert [(e["agent"], e["tool"]) for e in ran] == [("doer-a", "terminal")] and DONE in ran[0]["result"], entries
    said = [(e["agent"], e["role"]) for e in entries if e["kind"] == "message"]
    assert said[:3] == [("doer-a", "system"), ("doer-a", "user"), ("doer-a", "assistant")], said
    assert said[-1] == ("doer-b", "assistant"), said
    assert {e["agent"] for e in entries if e["kind"] == "model" and e["outcome"] == "ok"} == {"doer-a", "doer-b"}
    show = subprocess.run([*CLI, "-w", str(box_b), "task", "show", task["id"], "--transcript", "--json"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert show.returncode == 0, show.stderr
    assert [e for e in json.loads(show.stdout)["transcript"] if e["kind"] == "tool" and e["status"] == "done"] == ran
    for ws in hosts:
        for path in ws.rglob("*"):
            if path.is_file():
                text = path.read_text(errors="replace")
                assert database not in text and PASSWORD not in text, path
