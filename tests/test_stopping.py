"""Stopping agents: every process group of an agent's session gets the signal, a whole team's groups
come from one read of /proc, and `down` stops a supervisor too busy to answer it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from hermes_sup.supervisor.sessions import session_groups, session_table, signal_session

from .conftest import CLI, ROOT, gone, init_workspace, supervisor_state, wait_until

# A session leader whose child leaves for a process group of its own (as a terminal command
# does), both sleeping; it prints the child's pid.
LEADER = ("import os, sys, time\n"
          "pid = os.fork()\n"
          "if pid == 0:\n"
          "    os.setpgid(0, 0); time.sleep(600); os._exit(0)\n"
          "print(pid, flush=True); time.sleep(600)\n")


def test_one_read_of_proc_finds_every_group_of_a_session_and_the_signal_reaches_them_all() -> None:
    leader = subprocess.Popen([sys.executable, "-c", LEADER], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        child = int(leader.stdout.readline())
        wait_until(lambda: os.getpgid(child) == child)
        table = session_table()
        assert {leader.pid, child} <= table[leader.pid]
        assert session_groups(leader.pid, table) == session_groups(leader.pid) == {leader.pid, child}
        assert session_groups(-1, table) == {-1}  # a session gone: its own group only, nothing else
        signal_session(leader.pid, signal.SIGKILL, table)
        wait_until(lambda: gone(child), timeout=10)
        assert leader.wait(timeout=10) == -signal.SIGKILL
    finally:
        leader.kill()
        leader.wait(timeout=10)


def _sigterm_pending(pid: int) -> bool:
    """Whether SIGTERM waits to be delivered to `pid` (a stopped process keeps it pending)."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    pending = int(fields["ShdPnd"], 16) | int(fields["SigPnd"], 16)
    return bool(pending & (1 << (signal.SIGTERM - 1)))


def test_down_stops_a_supervisor_too_busy_to_answer_in_time(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    init_workspace(ws)
    run = {"capture_output": True, "text": True, "timeout": 90, "cwd": ROOT}
    up = subprocess.run([*CLI, "-w", str(ws), "up", "--detach"], **run)
    assert up.returncode == 0, up.stdout + up.stderr
    pid = supervisor_state(ws)["pid"]
    # Stopped, it cannot answer: as a supervisor busy for longer than the CLI waits for its answer.
    os.kill(pid, signal.SIGSTOP)
    down = subprocess.Popen([*CLI, "-w", str(ws), "down", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT)
    try:
        wait_until(lambda: _sigterm_pending(pid), timeout=60)  # the answer's wait ended, and down asked by signal
    finally:
        os.kill(pid, signal.SIGCONT)
    out, err = down.communicate(timeout=90)
    assert down.returncode == 0, out + err
    assert json.loads(out)["message"] == "stopped"
    wait_until(lambda: gone(pid), timeout=10)
    status = json.loads(subprocess.run([*CLI, "-w", str(ws), "status", "--json"], **run).stdout)
    assert status["running"] is False
    assert {a["state"] for a in status["agents"]} == {"stopped"}
