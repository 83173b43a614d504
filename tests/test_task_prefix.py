"""Tasks named by a prefix of their id, resolved through the board protocol (`task_ids`) on either
backend, through the real CLI and the dashboard's actions: an ambiguous prefix is refused naming
every candidate and changes nothing, a unique one names its task wherever the board keeps it.

The PostgreSQL workspace is one moved there by `board migrate`, which leaves the file board's folders
as they were: a resolver that looked at the folders found the copy there (`write-report`) and not the
task added on PostgreSQL since (`write-review`)."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from . import pgserver
from .conftest import CLI, ROOT
from .pgserver import PgServer

DSN_ENV = "HERMES_PREFIX_PG_DSN"
PASSWORD = "pw-" + uuid.uuid4().hex  # in the DSN: never printed


def hermes(env: dict[str, str], ws: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "-w", str(ws), *args], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=120)


def ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, (result.args, result.stdout, result.stderr)
    return result


@pytest.fixture(params=["files", "postgres"])
def workspace(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """A workspace with `write-report` and `write-review` on its board, and the environment to run
    the CLI in; on PostgreSQL only `write-report` is also in the file board's folders."""
    ws = tmp_path / "ws"
    ok(subprocess.run([*CLI, "init", str(ws)], capture_output=True, text=True, cwd=ROOT, timeout=120))
    env = dict(os.environ)
    ok(hermes(env, ws, "task", "add", "Write the report", "--id", "write-report", "--role", "nobody"))
    if request.param == "files":
        ok(hermes(env, ws, "task", "add", "Write the review", "--id", "write-review", "--role", "nobody"))
        yield ws, env
        return
    server: PgServer = request.getfixturevalue("pg_server")
    with pgserver.fresh_database(server, "prefix", PASSWORD) as dsn:
        env[DSN_ENV] = dsn
        ok(hermes(env, ws, "board", "migrate", "--to", "postgres", "--dsn-env", DSN_ENV))
        with open(ws / "hermes.yaml", "a") as handle:
            handle.write(f"\nboard: {{backend: postgres, dsn_env: {DSN_ENV}}}\n")
        ok(hermes(env, ws, "task", "add", "Write the review", "--id", "write-review", "--role", "nobody"))
        assert (ws / "kanban" / "todo" / "write-report.json").exists()  # the copy migrate left behind
        assert not (ws / "kanban" / "todo" / "write-review.json").exists()
        yield ws, env


def statuses(env: dict[str, str], ws: Path) -> dict[str, str]:
    listed = json.loads(ok(hermes(env, ws, "task", "list", "--json")).stdout)
    return {doc["id"]: doc["status"] for doc in listed["tasks"]}


def test_an_ambiguous_prefix_is_refused_naming_both_and_changes_nothing(workspace) -> None:
    ws, env = workspace
    for command in (["task", "cancel", "write-re"], ["task", "retry", "write-re"],
                    ["task", "move", "write-re", "blocked"], ["task", "comment", "write-re", "hello"],
                    ["task", "answer", "write-re", "yes"], ["task", "show", "write-re"], ["task", "log", "write-re"],
                    ["task", "wait", "write-re", "--timeout", "1"]):
        refused = hermes(env, ws, *command)
        assert refused.returncode == 2, (command, refused.stdout, refused.stderr)
        assert "'write-re' is the start of 2 task ids: write-report, write-review; give more of it" \
            in refused.stderr, (command, refused.stderr)
    assert statuses(env, ws) == {"write-report": "todo", "write-review": "todo"}
    shown = json.loads(ok(hermes(env, ws, "task", "show", "write-review", "--json")).stdout)
    assert "comments" not in shown or shown["comments"] == [], "nothing was commented either"
    if DSN_ENV in env:
        assert PASSWORD not in refused.stdout + refused.stderr


def test_a_unique_prefix_names_its_task_wherever_the_board_keeps_it(workspace) -> None:
    ws, env = workspace
    shown = json.loads(ok(hermes(env, ws, "task", "show", "write-rev", "--json")).stdout)
    assert shown["id"] == "write-review" and shown["title"] == "Write the review"
    commented = json.loads(ok(hermes(env, ws, "task", "comment", "write-rev", "[b]noted[/b]", "--json")).stdout)
    assert commented["id"] == "write-review" and commented["comments"][-1]["text"] == "[b]noted[/b]"
    cancelled = ok(hermes(env, ws, "task", "cancel", "write-rev"))
    assert "write-review: todo -> cancelled" in cancelled.stdout
    assert statuses(env, ws) == {"write-report": "todo", "write-review": "cancelled"}
    ok(hermes(env, ws, "task", "retry", "write-rev"))
    typo = hermes(env, ws, "task", "show", "write-reveiw")
    assert typo.returncode == 2 and "no task 'write-reveiw'" in typo.stderr
    assert "did you mean write-review" in typo.stderr, typo.stderr
    logged = hermes(env, ws, "task", "log", "write-rev")
    assert logged.returncode == 0, logged.stderr


def test_the_dashboards_actions_resolve_a_prefix_through_the_board(workspace, monkeypatch) -> None:
    """The page's task view and actions take an id as the CLI does: the same refusal, the same task."""
    from hermes_sup.supervisor.config.workspace import find_workspace
    from hermes_sup.supervisor.dashboard.app import Server, Settings

    from .conftest import wait_until
    from .test_dashboard import post

    ws, env = workspace
    if DSN_ENV in env:
        monkeypatch.setenv(DSN_ENV, env[DSN_ENV])
    server = Server(find_workspace(ws), Settings(host="127.0.0.1", port=0))
    server.start_thread()
    try:
        wait_until(lambda: server.server.started, timeout=30)
        status, reply = post(server.port, "/api/task/write-re/cancel", {})
        assert status == 404 and "is the start of 2 task ids: write-report, write-review" in reply["error"]
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/api/task/write-rev", timeout=30) as answer:
            assert json.loads(answer.read())["id"] == "write-review"
        status, doc = post(server.port, "/api/task/write-rev/cancel", {})
        assert status == 200 and (doc["id"], doc["status"]) == ("write-review", "cancelled")
    finally:
        server.stop()
    assert statuses(env, ws) == {"write-report": "todo", "write-review": "cancelled"}
