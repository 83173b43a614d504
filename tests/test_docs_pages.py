"""The how-to guides and the local-model tutorial run as written (tests/docrun.py): each page's shell
blocks in order, in one workspace of the test's, its team started once. What a page leaves to the
reader (a pid, a free port) is filled in; a block that cannot run here says why on the page."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hermes_sup.kanban import Board

from .conftest import CLI, ROOT, wait_until
from .docrun import page_blocks, run_as_written
from .llm_server import ScriptedLLM, openai_reply

# A page whose blocks are all left out, with what each says.
NOT_RUN = {
    "how-to/development.md": 1,
    "how-to/systemd.md": 2,
    "tutorials/local-model.md": 2,
}


def test_every_guide_runs_its_blocks_or_says_why_not() -> None:
    """Each tutorial and how-to guide with shell blocks is run by a test of test_docs.py, this file or
    test_readme_*.py, and the blocks left out are few, each with its reason on the page."""
    pages = [path.relative_to(ROOT / "docs").as_posix() for folder in ("tutorials", "how-to")
             for path in sorted((ROOT / "docs" / folder).glob("*.md"))]
    tests = "".join((ROOT / "tests" / name).read_text() for name in ("test_docs.py", "test_docs_pages.py",
                                                                   "test_readme_hosts.py", "test_readme_hermes.py"))
    for page in pages:
        text = (ROOT / "docs" / page).read_text()
        assert not re.search(r"^```\n(hermes-sup|cd|make) ", text, re.M), f"{page}: a shell block marked sh"
        if "```sh" in text:
            assert Path(page).name in tests, f"{page} has shell blocks no test runs"
        _, reasons = page_blocks(page)
        assert len(reasons) == NOT_RUN.get(page, 0), (page, reasons)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _holders_pid(ws: Path, task: str) -> int:
    """The pid of the agent holding `task`, once one does (what a reader finds in `status`)."""
    board = Board(ws / "kanban")
    claim = wait_until(lambda: board.get(task).get("claim"), timeout=60, interval=0.02)
    state = json.loads((ws / "runs" / "supervisor.json").read_text())
    return state["agents"][claim["agent"]]["pid"]


@pytest.mark.timeout(300)
def test_watch_and_steer_as_written(tmp_path: Path) -> None:
    def fill(text: str, cwd: Path) -> str:
        return text.replace("<that pid>", str(_holders_pid(cwd, "slow-job"))) if "<that pid>" in text else text

    assert run_as_written("how-to/watch-and-steer.md", tmp_path, fill=fill) >= 25
    runs = tmp_path / "steer-team" / "runs"
    calls = [json.loads(line) for log in runs.glob("*/tool_calls.jsonl") for line in log.read_text().splitlines()]
    started = {(call["call_id"], call["at"]) for call in calls
               if call.get("task") == "slow-job" and call["status"] == "started"}
    # What the page says of it: the file written is not written again, the wait cut short is waited again.
    assert sorted(call_id for call_id, _ in started) == ["step-1", "step-2", "step-2", "step-3"], started


@pytest.mark.timeout(300)
def test_the_readmes_five_minute_tour_as_written(tmp_path: Path) -> None:
    """The README's tour, its kill -9 included: the worker's pid is the one a reader finds in `ps`."""
    def fill(text: str, cwd: Path) -> str:
        if "<pid of a worker>" not in text:
            return text
        agents = json.loads((cwd / "runs" / "supervisor.json").read_text())["agents"]
        return text.replace("<pid of a worker>", str(agents["worker-1"]["pid"]))

    assert run_as_written("../README.md", tmp_path, fill=fill, section="## A five-minute tour") >= 11


@pytest.mark.timeout(300)
def test_the_research_team_over_granted_folders_as_written(tmp_path: Path) -> None:
    assert run_as_written("how-to/folders-and-mcp.md", tmp_path) == 7


@pytest.mark.timeout(300)
def test_the_dashboard_as_written(tmp_path: Path) -> None:
    """On free ports instead of 8765 and 8766, which someone on this machine may be using."""
    team, alone = _free_port(), _free_port()

    def fill(text: str, cwd: Path) -> str:
        text = text.replace("up -d --dashboard", f"up -d --dashboard --dashboard-port {team}")
        return text.replace(":8765", f":{team}").replace("8766", str(alone))

    assert run_as_written("how-to/dashboard.md", tmp_path, fill=fill) == 5


@pytest.mark.timeout(300)
def test_running_under_systemd_as_written(tmp_path: Path) -> None:
    """In the example workspace, with HOME a folder of the test's; the unit written is the page's but
    for the two paths of this machine."""
    home, ws = tmp_path / "home", tmp_path / "my-team"
    home.mkdir()
    env = {**os.environ, "HOME": str(home)}
    subprocess.run([*CLI, "init", "--example", str(ws)], check=True, capture_output=True, cwd=ROOT, timeout=60)
    assert run_as_written("how-to/systemd.md", tmp_path, env=env, cwd=ws) == 5
    written = (home / ".config" / "systemd" / "user" / "hermes-sup.service").read_text()
    written = written.replace(str(ws), "/tmp/tut/my-team")
    program = str(Path(sys.executable).parent / "hermes-sup")
    written = written.replace(program, "/home/me/hermes-sup/.venv/bin/hermes-sup")
    [shown] = re.findall(r"```ini\n(.*?)```", (ROOT / "docs" / "how-to" / "systemd.md").read_text(), re.S)
    assert written == shown
    assert "hermes-sup" in (home / ".config" / "fish" / "completions" / "hermes-sup.fish").read_text()


def _answer(api: str, body: dict) -> dict:
    return openai_reply("Planned: the guide's sections are on the board.", model="scripted")


@pytest.mark.timeout(300)
def test_a_team_on_a_local_model_as_written(tmp_path: Path) -> None:
    """tests/llm_server.py stands in for the page's local server, on the port HERMES_SUP_AUTO_PORTS names."""
    with ScriptedLLM(_answer) as llm:
        env = {**os.environ, "HERMES_SUP_AUTO_PORTS": str(llm.port)}
        assert run_as_written("tutorials/local-model.md", tmp_path, env=env) == 7
        assert llm.requests


@pytest.mark.parametrize("page", ["how-to/budgets-and-alerts.md", "how-to/schedules.md"])
def test_the_configs_of_pages_without_commands_load_as_written(page: str, tmp_path: Path) -> None:
    """These pages have no shell blocks: each hermes.yaml block loads as written, beside a team whose
    names it uses (a `worker` of two)."""
    import yaml
    from hermes_sup.supervisor.config.workspace import load_config

    blocks = re.findall(r"```yaml\n(.*?)```", (ROOT / "docs" / page).read_text(), re.S)
    assert blocks
    for block in blocks:
        team = "" if "agents" in yaml.safe_load(block) else "agents:\n  - {name: worker, roles: [plan], count: 2}\n"
        (tmp_path / "hermes.yaml").write_text(block + team)
        config = load_config(tmp_path / "hermes.yaml")
        assert set(yaml.safe_load(block)) <= set(config), (page, block)
