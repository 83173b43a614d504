"""When the fork server starts: only for a team with an agent of the built-in runtime, whenever the
first one comes (at `up`, or by a reload or `start`)."""

from __future__ import annotations

import os
import signal
import subprocess

from hermes_sup.supervisor.forking import ENV

from .conftest import CLI, ROOT, wait_until
from .test_forkserver import agent, events, server_of, started, workspace


def test_a_team_without_a_built_in_agent_starts_no_server_until_a_reload_adds_one(tmp_path, up, monkeypatch):
    """The server speeds up only the built-in runtime's agents: a team of `command` agents never pays for
    its imports; the first built-in agent a reload adds starts it, and that agent's restart is a fork."""
    monkeypatch.setenv(ENV, "1")
    ws = workspace(tmp_path, "http://127.0.0.1:9")
    config = (ws / "hermes.yaml").read_text()
    command_only = config.split("  - {name: alpha")[0] + config.split("\n")[-2] + "\n"
    assert "orphaner" in command_only and "alpha" not in command_only
    (ws / "hermes.yaml").write_text(command_only)
    sup = up(ws).pid
    wait_until(lambda: started(ws, "orphaner"), timeout=30)
    assert server_of(sup) is None, "no agent it could fork: no fork server"
    (ws / "hermes.yaml").write_text(config)
    done = subprocess.run([*CLI, "-w", str(ws), "reload"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    wait_until(lambda: sum("fork server ready" in (e.get("note") or "") for e in events(ws)) == 1, timeout=30)
    assert server_of(sup) is not None
    wait_until(lambda: agent(ws, "beta").get("state") == "running", timeout=30)
    first = agent(ws, "beta")["pid"]
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: len(started(ws, "beta")) == 2, timeout=10)
    assert started(ws, "beta")[-1]["start"] == "fork", "once ready, the server forks the reload's agents"
