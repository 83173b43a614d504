"""A broken hermes.yaml given to a running team: `reload` (the command and SIGHUP) refuses it with its
file and line, exit 2, and the team keeps running unchanged; `doctor` names it too."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from click.testing import CliRunner
from hermes_sup.supervisor.cli import main
from hermes_sup.supervisor.runner import request

from .conftest import wait_until
from .test_supervisor import FAKE, agent, hermes, make_ws

DEEP = "[" * 200 + "]" * 200  # past our limit (32), short of any YAML parser's own: refused in our words
DEEPEST = "[" * 100_000 + "]" * 100_000  # past the parser's own limit too: refused, in its words


def test_a_broken_reload_never_touches_the_running_team(tmp_path, up, monkeypatch):
    monkeypatch.delenv("HERMES_SUP_FORK_SERVER", raising=False)  # hermes.yaml says whether it is on
    ws = make_ws(tmp_path, f"- name: keep\n  command: [{sys.executable}, {FAKE}, beat]\n")
    config = ws / "hermes.yaml"
    good = config.read_text()
    proc = up(ws)
    wait_until(lambda: agent(ws, "keep").get("state") == "running", timeout=30)
    pid = agent(ws, "keep")["pid"]
    broken = [
        (good + "agents:\n  - name: other\n", ":7: invalid YAML: duplicate key 'agents' (first on line 4)"),
        (good.replace("- name: keep", "- name: ../../x"), ":5: agent name '../../x' must be"),
        ("agents: []\n", ":1: no agents"),
        (good + "    skills: [no_such_skill]\n", ":5: agent keep: skills: no skill named 'no_such_skill'"),
        (good.replace("stop_timeout: 5", "stop_timeout: .nan"), ":2: invalid YAML: .nan is not a finite number"),
        (good + "    env: {X: &x 1, Y: *x}\n", ":7: invalid YAML: aliases (*x) are not allowed"),
        (good + f"    env: {{X: {DEEP}}}\n", ":7: invalid YAML: the data is nested more than 32 levels deep"),
        (good + f"    env: {{X: {DEEPEST}}}\n", ":7: invalid YAML: "),
        (good + f"    max_iterations: {'9' * 5000}\n", ":7: invalid YAML: an integer of 5000 digits"),
        ("agents: [\n", ":2: invalid YAML"),
        (good + "  - name: other\n    command: [/nonexistent/agent]\n",
         ":7: agent other: command '/nonexistent/agent' is not an executable file"),
    ]
    for text, message in broken:
        config.write_text(text)
        done = hermes(ws, "reload")
        assert done.returncode == 2, (message, done.stderr)
        assert f"reload refused, the team is unchanged: {config}{message}" in done.stderr, done.stderr
        assert proc.poll() is None and agent(ws, "keep")["pid"] == pid and agent(ws, "keep")["state"] == "running"
    config.write_bytes(good.encode() + b"    identity: caf\xe9\n")
    done = hermes(ws, "reload")
    assert done.returncode == 2 and f"{config}:7: not UTF-8 text" in done.stderr, done.stderr
    # Unreadable: the command no longer finds the workspace, so ask the supervisor itself, and by SIGHUP.
    config.unlink()
    config.mkdir()
    reply = request(ws / "runs", {"cmd": "reload"})
    assert reply is not None and reply["ok"] is False and f"{config}: cannot be read" in reply["message"]
    config.rmdir()
    config.write_text(good + f"    env: {{X: {DEEP}}}\n")
    os.kill(proc.pid, signal.SIGHUP)
    log = tmp_path / "up.log"
    wait_until(lambda: "nested more than 32" in log.read_text(), timeout=30)
    assert proc.poll() is None and agent(ws, "keep")["pid"] == pid
    config.write_text(good)
    done = hermes(ws, "reload", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["plan"]["keep"] == ["keep"], done.stderr
    assert agent(ws, "keep")["pid"] == pid
    config.write_text("fork_server: false\n" + good)  # read at `up` only: the reload says so
    done = hermes(ws, "reload", "--json")
    said = "fork_server is now off in hermes.yaml but stays on until the next `up`"
    assert json.loads(done.stdout)["message"] == f"reload: nothing changed (keep unchanged); {said}"
    assert agent(ws, "keep")["pid"] == pid


def test_doctor_names_a_skill_that_does_not_exist(tmp_path):
    ws = tmp_path / "ws"
    assert CliRunner().invoke(main, ["init", str(ws)]).exit_code == 0
    config = ws / "hermes.yaml"
    config.write_text("agents:\n  - name: a\n    skills: [data_tools]\n  - name: b\n    skills: [nope]\n")
    result = CliRunner().invoke(main, ["-w", str(ws), "doctor", "--json"])
    assert result.exit_code == 1
    checks = {check["name"]: check for check in json.loads(result.stdout)["checks"]}
    assert checks["config"]["level"] == "error"
    assert checks["config"]["detail"].startswith(f"{config}:4: agent b: skills: no skill named 'nope'")
    assert Path(ws / "skills").is_dir()
