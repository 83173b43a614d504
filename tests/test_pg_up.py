"""`hermes-sup up` on a PostgreSQL board: two "hosts" (workspaces with their own `host:` name and
supervisor, the same DSN) run the example team; tasks dropped on either are done exactly once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from . import pgserver
from .conftest import wait_until
from .pgserver import PgServer

CLI = [str(Path(sys.executable).parent / "hermes-sup")]
DSN_ENV = "W14C_UP_DSN"
PASSWORD = "pw-" + uuid.uuid4().hex
TASKS = 12


@pytest.fixture
def database(pg_server: PgServer) -> Iterator[str]:
    with pgserver.fresh_database(pg_server, "up", PASSWORD) as dsn:
        yield dsn


def _run(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=120)
    if check:
        assert result.returncode == 0, (args, result.stdout, result.stderr)
    return result


def _host(where: Path, name: str, env: dict[str, str]) -> Path:
    ws = where / name
    _run(env, "init", "--example", str(ws))
    for path in (ws / "kanban" / "inbox").glob("*.json"):
        path.unlink()
    config = ws / "hermes.yaml"
    config.write_text(config.read_text() + f"\nboard: {{backend: postgres, dsn_env: {DSN_ENV}}}\nhost: {name}\n")
    return ws


def _drop(ws: Path, name: str, doc: dict) -> None:
    inbox = ws / "kanban" / "inbox"
    (inbox / f".{name}.tmp").write_text(json.dumps(doc))
    os.rename(inbox / f".{name}.tmp", inbox / f"{name}.json")


@pytest.mark.timeout(300)
def test_two_hosts_run_the_example_team_on_one_postgres_board(database: str, tmp_path: Path) -> None:
    env = {**os.environ, DSN_ENV: database}
    hosts = [_host(tmp_path, "box-a", env), _host(tmp_path, "box-b", env)]
    wanted = {f"sum-{i}" for i in range(TASKS)}
    try:
        for ws in hosts:
            _run(env, "-w", str(ws), "up", "--detach")
        for i in range(TASKS):
            # Steps, so the workers need no model; half dropped on each host's inbox.
            _drop(hosts[i % 2], f"sum-{i}", {
                "id": f"sum-{i}", "title": f"sum {i}", "role": "work",
                "steps": [{"tool": "write_file", "args": {"path": f"n{i}.csv", "content": f"n\n{i}\n"}},
                          {"tool": "csv_summary", "args": {"path": f"n{i}.csv"}}]})

        def done() -> set[str]:
            listing = json.loads(_run(env, "-w", str(hosts[0]), "board", "--json").stdout)
            return {t["id"] for t in listing["columns"]["done"]}

        # Nothing but the teams ingests: no board command runs on box-b meanwhile.
        wait_until(lambda: wanted <= done(), timeout=120, interval=0.5)
        # Each supervisor heartbeats its host's row: a host is judged dead by its silence.
        checks = {c["name"]: c for c in json.loads(_run(env, "-w", str(hosts[0]), "doctor", "--json",
                                                        check=False).stdout)["checks"]}
        assert checks["hosts"]["level"] == "ok" and "2 heartbeating" in checks["hosts"]["detail"], checks["hosts"]
    finally:
        for ws in hosts:
            _run(env, "-w", str(ws), "down", "--timeout", "10", check=False)
    lines = _run(env, "-w", str(hosts[1]), "events", "--json").stdout.splitlines()
    events = [json.loads(line) for line in lines]
    finished = Counter(e["task"] for e in events if e.get("to") == "done")
    claims = Counter(e["task"] for e in events if e.get("to") == "doing")
    assert {task: finished[task] for task in wanted} == dict.fromkeys(wanted, 1)
    assert {task: claims[task] for task in wanted} == dict.fromkeys(wanted, 1), "a task was claimed twice"
    for ws in hosts:
        status = json.loads(_run(env, "-w", str(ws), "status", "--json").stdout)
        assert status["running"] is False
    for ws in hosts:
        for path in ws.rglob("*"):
            if path.is_file():
                text = path.read_text(errors="replace")
                assert database not in text and PASSWORD not in text, path
