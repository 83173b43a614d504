"""The docs' "Coming from Hermes Agent" (docs/how-to/from-hermes-agent.md, once a section of the
README), run as written: its shell lines in order, in a workspace
of the test's, with HOME a folder of the test's whose ~/.hermes the real Hermes Agent CLI made
(`hermes profile create coder`, `hermes kanban create ...`, hermes-agent from .venv-hermes). What a
line's comment quotes must be in what it printed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from .conftest import ROOT
from .test_runtime_hermes import hermes_program

PAGE = ROOT / "docs" / "how-to" / "from-hermes-agent.md"  # the section, a page of its own
OTHER_AGENTS = ROOT / "docs" / "how-to" / "other-runtimes.md"  # the README's "Running other agents"


def readme_lines() -> list[tuple[str, list[str]]]:
    section = PAGE.read_text()
    found = []
    for block in re.findall(r"```sh\n(.*?)```", section, re.S):
        for line in block.splitlines():
            command, _, comment = line.partition(" # ")
            if command.strip():
                found.append((command.strip(), re.findall(r'"([^"]*)"', comment)))
    return found


def test_coming_from_hermes_agent_as_written(tmp_path: Path):
    hermes = hermes_program()
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9",
           "NO_PROXY": "127.0.0.1,localhost"}
    env.pop("HERMES_HOME", None)
    for argv in ([hermes, "profile", "create", "coder"], [hermes, "kanban", "create", "Write the report"]):
        made = subprocess.run(argv, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
        assert made.returncode == 0, made.stdout + made.stderr
    (home / ".hermes" / "config.yaml").write_text("model:\n  default: anthropic/claude-sonnet-4\n"
                                                 "  provider: openrouter\n")
    ws = tmp_path / "ws"
    subprocess.run([sys.executable, "-m", "hermes_sup.supervisor", "init", str(ws)], check=True, capture_output=True,
                   cwd=ROOT)
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "hermes-sup").write_text(f"#!/bin/sh\nexec {sys.executable} -m hermes_sup.supervisor \"$@\"\n")
    (shim / "hermes-sup").chmod(0o755)
    env = {**env, "PATH": f"{shim}:{env['PATH']}", "PYTHONPATH": str(ROOT)}
    lines = readme_lines()
    assert len(lines) == 4 and all(line.startswith("hermes-sup import-hermes ~/.hermes") for line, _ in lines)
    for line, quoted in lines:
        done = subprocess.run(["/bin/sh", "-c", line], cwd=ws, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{line}\n{done.stdout}{done.stderr}"
        for text in quoted:
            assert text in done.stdout, f"{line}: {text!r} not in\n{done.stdout}"
    from hermes_sup.supervisor.config.workspace import load_config

    agents = {agent["name"]: agent for agent in load_config(ws / "hermes.yaml")["agents"]}
    assert agents["ada"]["providers"] == ["ada"] and "coder" in agents


def test_running_other_agents_configs_load_as_written(tmp_path: Path):
    """The section's hermes.yaml examples load as they are (what a config names of this machine, a
    granted folder and Hermes' home, made by the test)."""
    import yaml
    from hermes_sup.supervisor.config.workspace import load_config

    section = OTHER_AGENTS.read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", section, re.S)
    assert len(blocks) == 2
    (tmp_path / "app").mkdir()
    subprocess.run(["git", "init", "-q", str(tmp_path / "app")], check=True)
    subprocess.run(["git", "-C", str(tmp_path / "app"), "commit", "-q", "--allow-empty", "-m", "start"], check=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t"})
    home = tmp_path / "srv-hermes"
    (home / "profiles" / "research").mkdir(parents=True)
    for block in blocks:
        written = block.replace("/srv/hermes", str(home)).replace("/opt/hermes/bin/hermes", hermes_program())
        data = yaml.safe_load(written)
        assert data["agents"], written
        extra = f"folders: {{app: {{path: '{tmp_path / 'app'}', mode: rw, worktree: true}}}}\n"
        (tmp_path / "hermes.yaml").write_text(extra + written)
        config = load_config(tmp_path / "hermes.yaml")
        assert config["agents"][0]["runtime"] in ("command", "hermes")
