"""Spare agent processes (supervisor/spares.py): a restarted agent gets one, waiting in its other cgroup with
nothing of its agent's but its log and folder, its next restart is that process, and it goes when its
agent stops or the team does."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import psutil
from hermes_sup.supervisor import cgroups
from hermes_sup.supervisor.forking import ROOM_ENV, agent_argv
from hermes_sup.supervisor.spares import SPARE_AFTER, wanted_at
from hermes_sup.supervisor.spec import build_specs

from .conftest import gone, init_workspace, wait_until
from .test_forkserver import environ, server_of, started, traceable_by_its_user, zombies
from .test_supervisor import agent, hermes

SECRET = "spare-test-secret-0451"


def spare_of(sup: int, ws: Path, name: str) -> int | None:
    """The supervisor's child that is the agent runtime and nobody's agent (nor the fork server)."""
    agents = {info.get("pid") for info in (agent(ws, n) for n in ("worker", "other"))}
    for child in psutil.Process(sup).children():
        try:
            if child.pid not in agents and child.pid != server_of(sup) and child.status() != psutil.STATUS_ZOMBIE \
                    and child.cwd() == str(ws / "runs" / name):
                return child.pid
        except psutil.Error:
            continue
    return None


def test_a_restarted_agent_is_restarted_as_its_spare_which_held_nothing_of_it_before(tmp_path, up, monkeypatch):
    monkeypatch.setenv("HERMES_SUP_FORK_SERVER", "1")
    ws = tmp_path / "ws"
    init_workspace(ws)
    (ws / "hermes.yaml").write_text(
        "defaults: {stop_timeout: 5, restart: {policy: always, backoff: {initial: 0.1}}}\n"
        f"agents:\n  - {{name: worker, env: {{WORKER_SECRET: {SECRET}}}}}\n  - {{name: other}}\n")
    sup = up(ws).pid
    first = wait_until(lambda: agent(ws, "worker").get("state") == "running" and agent(ws, "worker")["pid"], timeout=60)
    wait_until(lambda: agent(ws, "other").get("state") == "running", timeout=60)
    assert spare_of(sup, ws, "worker") is None, "an agent never restarted has none"
    os.kill(first, signal.SIGKILL)
    second = wait_until(lambda: agent(ws, "worker").get("state") == "running" and agent(ws, "worker")["pid"] != first
                        and agent(ws, "worker")["pid"], timeout=60)
    spare = wait_until(lambda: spare_of(sup, ws, "worker"), timeout=30)
    assert spare_of(sup, ws, "other") is None

    # What it holds before its go: the agent's argv, log and folder, and none of its environment.
    process = psutil.Process(spare)
    assert process.cmdline()[:5] == list(agent_argv(process.cmdline()[0]))
    env = environ(spare)
    assert "WORKER_SECRET" not in env and ROOM_ENV in env, "the fork server's environment, not the agent's"
    assert SECRET.encode() not in Path(f"/proc/{spare}/environ").read_bytes()
    held = sorted(os.readlink(f"/proc/{spare}/fd/{fd}") for fd in os.listdir(f"/proc/{spare}/fd"))
    assert held[:1] == ["/dev/null"] and held.count(str(ws / "runs/worker/agent.log")) == 2, held
    assert len(held) == 4 and held[3].startswith("pipe:"), held  # and the read end of its go pipe
    assert os.getsid(spare) == spare
    where = cgroups.cgroup_of(spare)
    if where is not None and where.parent == cgroups.base_path(ws):
        assert where in cgroups.agent_cgroups(where.parent, "worker") and where != cgroups.cgroup_of(second)

    os.kill(second, signal.SIGKILL)
    third = wait_until(lambda: agent(ws, "worker").get("state") == "running" and agent(ws, "worker")["pid"] != second
                       and agent(ws, "worker")["pid"], timeout=60)
    assert third == spare, "the spare became the agent"
    assert environ(third)["WORKER_SECRET"] == SECRET
    wait_until(lambda: f"worker: ready (pid {third}," in (ws / "runs/worker/agent.log").read_text(), timeout=30)
    assert [e.get("start") for e in started(ws, "worker")] == ["fork", "fork", "fork"]

    fourth = wait_until(lambda: spare_of(sup, ws, "worker"), timeout=30)  # another, for the next
    # A waiting spare is its user's to ptrace (or to open its go pipe through /proc) only once it went:
    # then it is dumpable, as an exec'd agent is.
    assert traceable_by_its_user([fourth, third]) == [False, True]
    log = ws / "runs/worker/agent.log"
    os.replace(log, log.with_name("agent.log.1"))  # as the agent rotates it: the spare's log is not agent.log
    os.kill(third, signal.SIGKILL)
    fifth = wait_until(lambda: agent(ws, "worker").get("state") == "running" and agent(ws, "worker")["pid"] != third
                       and agent(ws, "worker")["pid"], timeout=60)
    assert fifth != fourth and os.readlink(f"/proc/{fifth}/fd/1") == str(log), "forked anew, onto agent.log"
    wait_until(lambda: gone(fourth), timeout=10)
    sixth = wait_until(lambda: spare_of(sup, ws, "worker"), timeout=30)
    assert hermes(ws, "stop", "worker").returncode == 0
    wait_until(lambda: gone(fifth) and gone(sixth), timeout=30)  # a stopped agent keeps no spare
    wait_until(lambda: not zombies(sup), timeout=10)
    assert spare_of(sup, ws, "worker") is None
    assert hermes(ws, "start", "worker").returncode == 0
    again = wait_until(lambda: agent(ws, "worker").get("state") == "running" and agent(ws, "worker")["pid"], timeout=60)
    os.kill(again, signal.SIGKILL)
    last = wait_until(lambda: spare_of(sup, ws, "worker"), timeout=30)
    assert hermes(ws, "down").returncode == 0
    wait_until(lambda: gone(last) and gone(sup), timeout=30)  # `down` ends the spares too
    base = cgroups.base_path(ws)
    assert base is None or not base.exists(), "and removes every cgroup, the spare's included"


def test_only_a_running_restarted_agent_of_the_runtime_wants_a_spare_and_not_at_once(tmp_path):
    from hermes_sup.supervisor.child import Child

    init_workspace(tmp_path)
    spec, command = build_specs({"agents": [{"name": "w"}, {"name": "c", "command": ["sleep", "9"]}]}, tmp_path)
    child = Child(spec, state="running", restarts=0, started=100.0)
    assert wanted_at(child, False, None) is None, "never restarted"
    child.restarts = 1
    assert wanted_at(child, False, None) == 100.0 + SPARE_AFTER
    assert wanted_at(child, True, None) is None, "it has one"
    assert wanted_at(child, False, 200.0) == 205.0, "a failed try waits"
    for state in ("starting", "backoff", "stopped", "fatal"):
        assert wanted_at(Child(spec, state=state, restarts=1, started=100.0), False, None) is None
    assert wanted_at(Child(command, state="running", restarts=1, started=100.0), False, None) is None


def test_a_forked_agent_that_does_not_take_its_go_is_killed_and_the_supervisor_goes_on(monkeypatch):
    """A spare waits long, and any process of the user may SIGSTOP it: a go message larger than what
    its pipe still holds must not block the supervisor's loop (it did, until the spare was continued)."""
    import subprocess

    from hermes_sup.supervisor import forking

    monkeypatch.setattr(forking, "GO_WITHIN", 0.3)
    read, write = os.pipe()
    reader = subprocess.Popen(["sleep", "60"], pass_fds=[read])  # holds the read end and never reads
    os.close(read)
    os.set_blocking(write, False)
    with contextlib.suppress(BlockingIOError):
        while True:
            os.write(write, b"x" * 65536)
    said: list[str] = []
    assert not forking.tell_go(write, {"KEY": "v" * 1000}, reader.pid, said.append)
    assert reader.wait(timeout=5) == -signal.SIGKILL
    assert said and "did not take its go" in said[0]
