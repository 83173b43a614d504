"""Who owns an agent's processes: never two processes for one agent, nothing left running after `down`,
not even after a supervisor crash, and a reused pid is never taken for an agent. Real processes,
signals and cgroups."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from hermes_sup.agents.notify import ORPHANED
from hermes_sup.kanban import Board
from hermes_sup.kanban.liveness import start_time
from hermes_sup.supervisor import cgroups
from hermes_sup.supervisor.config.workspace import Workspace, load_config
from hermes_sup.supervisor.procs import MARKER_ENV, Marked, Marker, marked, marker_value, stop_all
from hermes_sup.supervisor.runner import Supervisor

from .conftest import CLI, ROOT, gone, init_workspace, wait_until
from .test_supervisor import FAKE, agent, hermes, make_ws, state

BEAT = f"command: [{sys.executable}, {FAKE}, beat]"


def instances(ws: Path, name: str) -> set[str]:
    """The agent instances (one per start) that have a live process carrying their marker."""
    return {p.marker.nonce for p in marked(ws) if p.marker.agent == name}


def test_down_after_a_supervisor_crash_stops_the_agents_it_left(tmp_path, up):
    # A long grace: the agents do not leave by themselves while the test looks.
    ws = make_ws(tmp_path, "- name: worker\n  roles: [work]\n", defaults="orphan_grace: 600\n")
    board = Board(ws / "kanban")
    task = board.add({"title": "long", "role": "work", "steps": [{"tool": "wait", "args": {"seconds": 120}}]})
    sup = up(ws)
    wait_until(lambda: board.get(task["id"])["status"] == "doing", timeout=30)
    pid = agent(ws, "worker")["pid"]
    sup.kill()
    sup.wait(timeout=10)
    done = hermes(ws, "down", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["message"] == "not running" and report["stopped_orphans"] >= 1, report  # the agent and its helpers
    assert gone(pid)
    released = board.get(task["id"])
    assert released["status"] == "todo" and released["attempts"] == 0, "stopped by SIGTERM: the claim was given back"
    assert hermes(ws, "down").stdout.strip() == "hermes-sup is not running in this workspace"


@pytest.mark.parametrize("contained", [True, False], ids=["cgroup-if-any", "process-group"])
def test_an_up_after_a_crash_before_the_state_was_saved_runs_one_process_per_agent(tmp_path, up, monkeypatch,
                                                                                   contained):
    if not contained:  # no cgroup to sweep: only the marker finds the old process
        monkeypatch.setenv(cgroups.OFF_ENV, "1")
    ws = make_ws(tmp_path, "- name: worker\n", defaults="orphan_grace: 600\n")
    sup = up(ws)
    wait_until(lambda: agent(ws, "worker").get("state") == "running", timeout=30)
    old = agent(ws, "worker")["pid"]
    sup.kill()
    sup.wait(timeout=10)
    (ws / "runs" / "supervisor.json").unlink()  # as if it died before its first save
    up(ws)
    wait_until(lambda: agent(ws, "worker").get("state") == "running", timeout=30)
    assert agent(ws, "worker")["pid"] != old
    assert gone(old), "the old process was stopped, not left beside the new one"
    assert len(instances(ws, "worker")) == 1


def _lone_agent(tmp_path: Path, *, orphaned: bool) -> tuple[Path, Path, socket.socket, psutil.Process]:
    """An agent heart-beating to a notify socket of the test's: started by this process (as by a
    supervisor still alive), or `orphaned` through a shell that exits at once (as when its supervisor
    died: it is reparented)."""
    ws = tmp_path / "ws"
    init_workspace(ws)
    runs = ws / "runs"
    workdir = runs / "worker"
    workdir.mkdir(parents=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(runs / "notify.sock"))
    listener.settimeout(30)  # a recv below fails the test rather than hang it
    config = {"name": "worker", "orphan_grace": 0.5, "heartbeat_timeout": 0.4,
              "llm": {"providers": {}, "tiers": {"cheap": [], "standard": [], "premium": []}}}
    env = {**os.environ, "HERMES_SUP_AGENT": json.dumps(config), "HERMES_SUP_WORKSPACE": str(ws),
           "HERMES_SUP_NOTIFY": str(runs / "notify.sock")}
    argv = [sys.executable, "-P", "-m", "hermes_sup.agents", "run"]
    if not orphaned:  # its supervisor: this process, alive throughout
        env["HERMES_SUP_SUPERVISOR_PID"] = str(os.getpid())
    with open(workdir / "agent.log", "wb") as log:
        if orphaned:
            # Its supervisor: a shell that exits at once, leaving it to be reparented.
            shell = subprocess.run(["/bin/sh", "-c", 'HERMES_SUP_SUPERVISOR_PID=$$ "$@" </dev/null >>agent.log 2>&1 &'
                                    ' echo $!', "sh", *argv],
                                   cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=log, check=True, text=True,
                                   timeout=30)
            proc = psutil.Process(int(shell.stdout.strip()))
        else:
            proc = psutil.Process(subprocess.Popen(argv, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                   stdin=subprocess.DEVNULL).pid)
    return runs, workdir, listener, proc


def test_an_agent_leaves_when_the_supervisor_it_reaches_does_not_run_it(tmp_path):
    # A supervisor that started after ours died binds the same notify socket: our heartbeats reach it,
    # but if it runs another process for our name, nobody supervises us and we must leave.
    runs, workdir, listener, proc = _lone_agent(tmp_path, orphaned=True)
    try:
        (runs / "supervisor.json").write_text(json.dumps({"agents": {"worker": {"pid": proc.pid}}}))
        wait_until(lambda: listener.recv(4096), timeout=30)  # it heart-beats
        with pytest.raises(psutil.TimeoutExpired):
            proc.wait(timeout=3)  # six times the grace: it stays while its supervisor runs it
        (runs / "supervisor.json").write_text(json.dumps({"agents": {"worker": {"pid": 1}}}))
        assert proc.wait(timeout=20) == ORPHANED, "a supervisor that lived would restart it"
        assert "stopped (no supervisor for 0.5 s)" in (workdir / "agent.log").read_text()
    finally:
        with contextlib.suppress(psutil.Error):
            proc.kill()
        listener.close()


def test_an_agent_stays_while_the_supervisor_that_started_it_runs_however_late_it_says_so(tmp_path):
    """256 agents on 2 cores: the supervisor, busy starting the others, wrote its state file late, and
    half the team stopped itself ("no supervisor for 30 s", exit 0, never restarted). An agent whose
    parent is still the supervisor that started it is that supervisor's, whatever the file says yet."""
    runs, workdir, listener, proc = _lone_agent(tmp_path, orphaned=False)
    try:
        (runs / "supervisor.json").write_text(json.dumps({"agents": {}}))  # not written since it started
        wait_until(lambda: listener.recv(4096), timeout=30)
        with pytest.raises(psutil.TimeoutExpired):
            proc.wait(timeout=3)  # six times the grace
        assert "no supervisor" not in (workdir / "agent.log").read_text()
    finally:
        with contextlib.suppress(psutil.Error):
            proc.kill()
            proc.wait(timeout=10)
        listener.close()


def _marked_sleep(ws: Path, name: str) -> subprocess.Popen[bytes]:
    """A process carrying the marker of agent `name` (as a process of one of its instances would)."""
    marker = Marker(str(ws.resolve()), name, "0123456789abcdef")
    return subprocess.Popen(["sleep", "300"], env={**os.environ, MARKER_ENV: marker_value(marker)})


def _pretend_state(ws: Path, name: str, pid: int, started: float, digest: str) -> None:
    (ws / "runs" / "supervisor.json").write_text(json.dumps({
        "pid": 999999999, "pid_started": 1.0,
        "agents": {name: {"pid": pid, "pid_started": started, "digest": digest, "state": "running",
                          "restarts": 0}}}))


def _digest(ws: Path, name: str) -> str:
    sup = Supervisor(Workspace(ws), load_config(ws / "hermes.yaml"), say=lambda _line: None)
    sup.board.close()
    return sup.children[name].spec.digest


def test_a_reused_pid_with_another_start_time_is_not_adopted(tmp_path, up):
    ws = make_ws(tmp_path, f"- name: beater\n  {BEAT}\n")
    reused = _marked_sleep(ws, "beater")
    try:
        started = psutil.Process(reused.pid).create_time()
        _pretend_state(ws, "beater", reused.pid, started - 50.0, _digest(ws, "beater"))
        up(ws)
        wait_until(lambda: agent(ws, "beater").get("state") == "running", timeout=30)
        assert agent(ws, "beater")["pid"] != reused.pid, "a pid whose start time differs is another process"
        assert reused.wait(timeout=15) == -signal.SIGTERM, "a process of the agent nobody runs is stopped"
    finally:
        reused.kill()
        reused.wait()


def test_a_process_that_is_not_an_agent_of_this_workspace_is_neither_adopted_nor_stopped(tmp_path, up):
    ws = make_ws(tmp_path, f"- name: beater\n  {BEAT}\n")
    stranger = subprocess.Popen(["sleep", "300"])
    try:
        started = psutil.Process(stranger.pid).create_time()
        _pretend_state(ws, "beater", stranger.pid, started, _digest(ws, "beater"))
        up(ws)
        wait_until(lambda: agent(ws, "beater").get("state") == "running", timeout=30)
        assert agent(ws, "beater")["pid"] != stranger.pid, "same pid and start time, but no agent's marker"
        assert stranger.poll() is None, "a process that is not ours is never signalled"
    finally:
        stranger.kill()
        stranger.wait()


def test_start_never_runs_a_second_process_for_a_live_agent(tmp_path):
    ws = make_ws(tmp_path, f"- name: beater\n  {BEAT}\n")
    said: list[str] = []
    sup = Supervisor(Workspace(ws), load_config(ws / "hermes.yaml"), say=said.append)
    sup.notify_path = ws / "runs" / "notify.sock"  # nobody listens: the fake agent does not mind
    child = sup.children["beater"]
    try:
        sup.start(child)
        first = child.proc
        assert first is not None
        sup.start(child)
        assert child.proc is first and first.poll() is None
        assert said[-1] == f"beater: still running as pid {first.pid}; not starting another"
        assert [p.pid for p in marked(ws)] == [first.pid]
    finally:
        if child.proc is not None:
            child.proc.kill()
            child.proc.wait()
        sup.board.close()
        if sup.containment.base is not None:
            cgroups.remove(sup.containment.base)


@pytest.mark.parametrize("contained", [True, False], ids=["cgroup", "process-group"])
def test_processes_an_agent_started_with_setsid_do_not_outlive_down(tmp_path, up, monkeypatch, contained):
    if not contained:
        monkeypatch.setenv(cgroups.OFF_ENV, "1")
    containment = cgroups.detect(tmp_path, keep=False)
    if contained and containment.mode != "cgroup":
        pytest.skip(f"cgroups are not available here: {containment.detail}")
    ws = make_ws(tmp_path, f"- name: escaper\n  command: [{sys.executable}, {FAKE}, setsid]\n")
    up(ws)
    wait_until(lambda: agent(ws, "escaper").get("state") == "running", timeout=30)
    log = ws / "runs" / "escaper" / "agent.log"
    line = wait_until(lambda: re.search(r"escaped (\d+) (\d+)", log.read_text()), timeout=10)
    escaped, scrubbed = int(line[1]), int(line[2])
    wait_until(lambda: psutil.Process(scrubbed).cmdline()[:1] == ["sleep"], timeout=10)
    leader = agent(ws, "escaper")["pid"]
    for pid in (escaped, scrubbed):
        assert os.getsid(pid) != os.getsid(leader), "it left the agent's session"
    done = hermes(ws, "down")
    assert done.returncode == 0, done.stderr
    assert gone(escaped), "it was in the agent's cgroup, and carried the agent's marker"
    if contained:
        assert gone(scrubbed), "it was in the agent's cgroup"
        assert cgroups.base_path(ws) is not None and not cgroups.base_path(ws).exists(), "the cgroups were removed"
    else:  # the limit of process-group mode: one that left the session and dropped its environment stays
        assert not gone(scrubbed)
        os.kill(scrubbed, signal.SIGKILL)
    mode = "supervisor: cgroup v2: each agent in a cgroup of its own" if contained else \
        f"supervisor: process groups only: ${cgroups.OFF_ENV} is set"
    assert mode in (tmp_path / "up.log").read_text(), "the log says which mode is in use"


@pytest.mark.parametrize("contained", [True, False], ids=["cgroup", "process-group"])
def test_processes_an_agent_started_with_setsid_die_with_it_when_it_crashes(tmp_path, up, monkeypatch, contained):
    if not contained:
        monkeypatch.setenv(cgroups.OFF_ENV, "1")
    containment = cgroups.detect(tmp_path, keep=False)
    if contained and containment.mode != "cgroup":
        pytest.skip(f"cgroups are not available here: {containment.detail}")
    ws = make_ws(tmp_path, f"- name: escaper\n  command: [{sys.executable}, {FAKE}, setsid]\n")
    up(ws)
    wait_until(lambda: agent(ws, "escaper").get("state") == "running", timeout=30)
    log = ws / "runs" / "escaper" / "agent.log"
    found = wait_until(lambda: re.findall(r"escaped (\d+) (\d+)", log.read_text()), timeout=10)
    escaped, scrubbed = int(found[0][0]), int(found[0][1])
    wait_until(lambda: psutil.Process(scrubbed).cmdline()[:1] == ["sleep"], timeout=10)
    os.kill(agent(ws, "escaper")["pid"], signal.SIGKILL)  # no `down`: the agent itself ends
    wait_until(lambda: agent(ws, "escaper").get("restarts", 0) >= 1, timeout=30)
    try:
        assert wait_until(lambda: gone(escaped), timeout=10), "it carried the dead agent's marker"
        if contained:
            assert wait_until(lambda: gone(scrubbed), timeout=10), "it was in the dead agent's cgroup"
    finally:
        if not contained:  # the limit of process-group mode (see the `down` test): ours to clean up
            later = wait_until(lambda: re.findall(r"escaped (\d+) (\d+)", log.read_text())[1:], timeout=30)
            for pid in (scrubbed, int(later[0][1])):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


PARENT = """
import json, os, subprocess, sys
config, workspace, folder = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
config["parent_pid"] = os.getpid()
env = {**os.environ, "HERMES_SUP_AGENT": json.dumps(config), "HERMES_SUP_WORKSPACE": workspace}
with open(os.path.join(folder, "agent.log"), "ab") as log:
    child = subprocess.Popen([sys.executable, "-P", "-m", "hermes_sup.agents", "run"], cwd=folder, env=env,
                             stdout=log, stderr=subprocess.STDOUT, process_group=0)
print(child.pid, flush=True)
child.wait()
"""


def test_a_delegated_child_leaves_at_once_when_its_parent_dies(tmp_path):
    # No supervisor here to kill the parent's processes, and a grace far beyond the test: the child
    # must see for itself that its parent is gone (a restarted parent starts a child of its own).
    ws = tmp_path / "ws"
    init_workspace(ws)
    board = Board(ws / "kanban")
    name = "boss.sub-1"
    task = board.add({"title": "the subtask", "assignee": name,
                      "steps": [{"tool": "wait", "args": {"seconds": 120}}]})
    folder = ws / "runs" / "boss" / "children" / name
    folder.mkdir(parents=True)
    config = {"name": name, "only_task": task["id"], "orphan_grace": 600, "heartbeat_timeout": 4,
              "llm": {"providers": {}, "tiers": {"cheap": [], "standard": [], "premium": []}}}
    parent = subprocess.Popen([sys.executable, "-c", PARENT, json.dumps(config), str(ws), str(folder)],
                              stdout=subprocess.PIPE, text=True)
    child = None
    try:
        child = int(parent.stdout.readline())
        wait_until(lambda: board.get(task["id"])["status"] == "doing", timeout=30)
        parent.kill()
        parent.wait(timeout=10)
        wait_until(lambda: gone(child), timeout=15)
        released = board.get(task["id"])
        assert released["status"] == "todo" and released["attempts"] == 0, "it gave its claim back"
        assert f"its parent agent (pid {parent.pid}) is gone" in released["history"][-1]["note"]
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()
        if child is not None and not gone(child):
            os.kill(child, signal.SIGKILL)


@pytest.mark.parametrize("contained", [True, False], ids=["cgroup", "process-group"])
def test_doctor_says_how_agents_are_contained(tmp_path, contained):
    ws = tmp_path / "ws"
    init_workspace(ws)
    env = {**os.environ, cgroups.OFF_ENV: "" if contained else "1"}
    available = cgroups.detect(ws, keep=False)
    if contained and available.mode != "cgroup":
        pytest.skip(f"cgroups are not available here: {available.detail}")
    report = subprocess.run([*CLI, "-w", str(ws), "doctor", "--json"], capture_output=True, text=True, env=env,
                            cwd=ROOT, timeout=60)
    check = next(c for c in json.loads(report.stdout)["checks"] if c["name"] == "process containment")
    if contained:
        assert check["level"] == "ok" and check["detail"].startswith("cgroup v2: each agent in a cgroup of its own")
    else:
        assert check["level"] == "info" and check["detail"] == f"process groups only: ${cgroups.OFF_ENV} is set"
    assert not cgroups.base_path(ws).exists(), "doctor leaves no cgroup behind"


def test_a_restart_or_reload_asked_while_down_runs_starts_nothing(tmp_path, up):
    ws = make_ws(tmp_path, f"- name: stubborn\n  command: [{sys.executable}, {FAKE}, ignore-term]\n")
    sup = up(ws)
    wait_until(lambda: agent(ws, "stubborn").get("state") == "running", timeout=30)
    first = agent(ws, "stubborn")["pid"]
    # The stop's window must outlast the two commands asked during it: on a loaded 2-core machine
    # each CLI start took over a second, and with 2 s the second found the supervisor gone.
    down = subprocess.Popen([*CLI, "-w", str(ws), "down", "--timeout", "10"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        wait_until(lambda: state(ws).get("shutting_down"), timeout=30)  # it ignores SIGTERM: still there
        refused = hermes(ws, "restart", "stubborn")
        with (ws / "hermes.yaml").open("a") as config:
            config.write(f"  - name: late\n    {BEAT}\n")
        reload = hermes(ws, "reload")
        out, err = down.communicate(timeout=60)
        assert down.returncode == 0, out + err
    finally:
        if down.poll() is None:
            down.kill()
            down.communicate()
    assert sup.wait(timeout=10) == 0
    assert gone(first) and marked(ws) == [], "nothing of the team outlives down"
    for answer in (refused, reload):
        assert answer.returncode == 1 and "stopping the team; nothing is started now" in answer.stderr


def test_what_an_adopted_agent_started_dies_with_it(tmp_path, up):
    # It ignores SIGTERM: a short stop_timeout, or the teardown waits out the default one.
    ws = make_ws(tmp_path, f"- name: stubborn\n  stop_timeout: 1\n  command: [{sys.executable}, {FAKE}, ignore-term]\n")
    first = up(ws)
    wait_until(lambda: agent(ws, "stubborn").get("state") == "running", timeout=30)
    log = ws / "runs" / "stubborn" / "agent.log"
    grandchild = int(wait_until(lambda: re.search(r"grandchild (\d+)", log.read_text()), timeout=10)[1])
    first.kill()
    first.wait(timeout=10)
    up(ws)
    wait_until(lambda: "adopted" in (tmp_path / "up.log").read_text(), timeout=30)
    pid = agent(ws, "stubborn")["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: agent(ws, "stubborn").get("restarts") == 1, timeout=30)
    assert gone(grandchild), "killed with the adopted agent it belonged to"


@pytest.mark.parametrize("recorded", [{}, {"pid_started": None}, {"pid_started": 0}, {"pid_started": "x"}],
                         ids=["no-start-time", "null", "zero", "text"])
def test_down_never_signals_a_pid_named_without_its_start_time(tmp_path, recorded):
    ws = make_ws(tmp_path, f"- name: beater\n  {BEAT}\n")
    stranger = subprocess.Popen(["sleep", "300"])
    try:
        (ws / "runs" / "supervisor.json").write_text(json.dumps({"pid": stranger.pid, **recorded, "agents": {}}))
        done = hermes(ws, "down", "--timeout", "1")
        assert done.returncode == 0 and done.stdout.strip() == "hermes-sup is not running in this workspace"
        assert stranger.poll() is None, "not the supervisor: never signalled"
    finally:
        stranger.kill()
        stranger.wait()


def test_stop_all_never_signals_a_pid_that_names_another_process_than_the_one_found():
    # Found carrying a marker, then gone, and its pid taken by a process of somebody else's before
    # the stop: the start time found no longer matches, so it is not signalled.
    innocent = subprocess.Popen(["sleep", "300"])
    try:
        found = Marked(innocent.pid, start_time(innocent.pid) - 100.0, Marker("/ws", "worker", "0123456789abcdef"))
        assert stop_all([found], 0) == 0
        assert innocent.poll() is None, "another process by now: never signalled"
    finally:
        innocent.kill()
        innocent.wait()


def test_an_agent_that_stopped_for_no_supervisor_while_it_lived_is_restarted_and_said(tmp_path, up):
    """The supervisor's socket away for longer than orphan_grace (as when its heartbeats do not reach a
    busy supervisor): the agent stops itself, with a status of its own, and the supervisor that lives
    restarts it and says so in an event (an alert's too), never a quiet "stopped"."""
    # Beats every second (a quarter of heartbeat_timeout): the agent finds itself orphaned within seconds;
    # the supervisor, hearing nothing, reads its state file and does not take it for hung.
    ws = make_ws(tmp_path, "- name: worker\n", defaults="orphan_grace: 1\nheartbeat_timeout: 4")
    up(ws)
    first = wait_until(lambda: agent(ws, "worker").get("state") == "running" and agent(ws, "worker")["pid"],
                       timeout=60)
    sock = ws / "runs" / "sockets" / "notify.sock"
    os.rename(sock, sock.with_name("notify.away"))
    try:
        wait_until(lambda: gone(first), timeout=30)
    finally:
        os.rename(sock.with_name("notify.away"), sock)
    wait_until(lambda: agent(ws, "worker").get("state") == "running" and agent(ws, "worker")["pid"] != first,
               timeout=60)
    log = (ws / "kanban" / "events.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in log if '"supervisor"' in line]
    said = [(r["event"], r.get("code")) for r in records if r.get("agent") == "worker"]
    assert ("orphaned", None) in said and ("exited", str(ORPHANED)) in said, said
    assert "stopped (no supervisor for 1 s)" in (ws / "runs" / "worker" / "agent.log").read_text()


def test_heartbeats_the_full_notify_queue_dropped_are_not_a_hung_agent(tmp_path, up):
    """The notify queue holds 10 datagrams by default; a supervisor of 256 agents, busy, had them
    overflow and killed 390 live agents as hung. An agent's heartbeat thread writes its state file at
    every beat as well: a supervisor that hears nothing looks there before it kills."""
    ws = make_ws(tmp_path, "- name: worker\n", defaults="orphan_grace: 600\nheartbeat_timeout: 2")
    up(ws)
    first = wait_until(lambda: agent(ws, "worker").get("state") == "running" and agent(ws, "worker")["pid"],
                       timeout=60)
    sock = ws / "runs" / "sockets" / "notify.sock"
    os.rename(sock, sock.with_name("notify.away"))  # every heartbeat from now on is lost
    try:
        with pytest.raises(AssertionError):  # three times heartbeat_timeout: it is not killed
            wait_until(lambda: gone(first), timeout=6)
    finally:
        os.rename(sock.with_name("notify.away"), sock)
    assert agent(ws, "worker")["pid"] == first
    records = [json.loads(line) for line in (ws / "kanban" / "events.jsonl").read_text().splitlines()]
    assert not [r for r in records if r.get("event") == "hung"]
