"""The agent's keeper (agents/keeper.py): a process sharing the agent's memory, so that a killed agent is
seen dead before its memory is torn down; it holds nothing else, dies with its agent, and its memory
is counted once."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from hermes_sup.agents import keeper
from hermes_sup.supervisor import cgroups
from hermes_sup.supervisor.proctable import Proc, same_memory, table, trees_rss_mb

from .conftest import gone, wait_until
from .test_forkclone import cgroup_base  # noqa: F401 - the fixture
from .test_supervisor import agent, hermes, make_ws

pytestmark = pytest.mark.skipif(os.uname().machine != "x86_64", reason="the keeper is made on x86_64 only")

# A process that starts its keeper, says both pids and waits; `extra` opens a descriptor first.
HOLDER = """
import os, sys, time
from hermes_sup.agents import keeper
if sys.argv[1] == "extra":
    os.open(os.devnull, os.O_RDONLY)
junk = bytearray(64 << 20)  # 64 MB of its own, for the kernel to tear down
for i in range(0, len(junk), 4096):
    junk[i] = 1
print(os.getpid(), keeper.start(), flush=True)
if sys.argv[2] == "exit":
    sys.exit(0)
time.sleep(120)
"""


def holder(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[str], int | None]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, *args], stdout=subprocess.PIPE, text=True,
                            close_fds=True, cwd=tmp_path)
    assert proc.stdout is not None
    pid, kept = proc.stdout.readline().split()
    assert pid == str(proc.pid)
    return proc, None if kept == "None" else int(kept)


def keeper_of(pid: int) -> int | None:
    for child in psutil.Process(pid).children():
        try:
            if child.name() == keeper.NAME.decode()[:15]:
                return child.pid
        except psutil.NoSuchProcess:  # a short-lived child (the skills' check at start) gone while we looked
            continue
    return None


def test_a_killed_process_is_seen_dead_while_its_keeper_still_holds_its_memory(tmp_path):
    proc, kept = holder(tmp_path, "-", "wait")
    try:
        assert kept is not None and same_memory(proc.pid, kept)
        assert sorted(os.listdir(f"/proc/{kept}/fd")) == ["0", "1", "2"], "a copy of the standard three only"
        blocked = int(next(line for line in Path(f"/proc/{kept}/status").read_text().splitlines()
                           if line.startswith("SigBlk:")).split()[1], 16)
        assert all(blocked & (1 << (signum - 1)) for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP))
        pidfd = os.pidfd_open(proc.pid)
        try:
            os.kill(proc.pid, signal.SIGKILL)
            assert select.select([pidfd], [], [], 10)[0], "the exit is reported"
        finally:
            os.close(pidfd)
        # Reported while the memory is still there, held by the keeper (64 MB resident, not torn down).
        resident = int(Path(f"/proc/{kept}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        assert resident > 60 << 20, resident
        assert proc.wait(timeout=5) == -signal.SIGKILL
    finally:
        proc.kill()
        if kept is not None:
            os.kill(kept, signal.SIGKILL)  # the supervisor's part, outside one
            wait_until(lambda: gone(kept), timeout=10)


def test_an_agent_that_ends_itself_takes_its_keeper_with_it(tmp_path):
    proc, kept = holder(tmp_path, "-", "exit")
    assert kept is not None
    assert proc.wait(timeout=10) == 0
    assert not psutil.pid_exists(kept), "killed and reaped by the agent's exit handler: not even a zombie"


def test_no_keeper_holds_a_descriptor_beyond_the_standard_three(tmp_path, monkeypatch):
    proc, kept = holder(tmp_path, "extra", "exit")
    assert kept is None, "a copy of any other descriptor (a board lock's) would outlive the agent"
    assert proc.wait(timeout=10) == 0
    monkeypatch.setenv(keeper.OFF_ENV, "1")
    assert keeper.start() is None


def test_memory_shared_with_a_parent_counts_once_and_a_look_alike_still_counts():
    procs = {1: Proc(1, 0, 0.0, 0.0, 0, False), 10: Proc(10, 1, 0.0, 0.0, 0, False),
             11: Proc(11, 10, 0.0, 0.0, 0, False), 12: Proc(12, 10, 0.0, 0.0, 0, False)}
    sizes = {10: 50 << 20, 11: 50 << 20, 12: 5 << 20}
    shares = {(10, 11)}  # 11 is 10's keeper; 12 a tool it runs
    found = trees_rss_mb(procs, [10], size=lambda p: sizes[p.pid], shares=lambda a, b: (a, b) in shares)
    assert found == {10: 55.0}
    # A process only named like a keeper has memory of its own: counted (kcmp says, not the name).
    named = subprocess.Popen([sys.executable, "-c", "import ctypes, sys, time\n"
                              "ctypes.CDLL(None).prctl(15, b'hermes-keeper', 0, 0, 0)\n"
                              "print(flush=True)\nsys.stdin.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert named.stdout is not None and named.stdout.readline() == "\n"
        assert psutil.Process(named.pid).name() == "hermes-keeper"
        assert not same_memory(os.getpid(), named.pid)
        mine = trees_rss_mb(table(), [os.getpid()])[os.getpid()]
        own = psutil.Process().memory_info().rss / (1 << 20)
        assert mine >= own + 5, (mine, own)
    finally:
        named.kill()
        named.wait()


def test_a_supervised_agent_has_a_keeper_that_goes_with_it_and_its_memory_counts_once(tmp_path, up):
    ws = make_ws(tmp_path, "- name: worker\n", defaults="restart: {policy: always, backoff: {initial: 0.1}}")
    up(ws)
    pid = wait_until(lambda: agent(ws, "worker").get("state") == "running" and agent(ws, "worker")["pid"], timeout=60)
    kept = wait_until(lambda: keeper_of(pid), timeout=10)
    assert same_memory(pid, kept)
    # The skills' check at start runs in a process of the agent's own for about a second: its
    # memory is the agent's tree's too. Measured once the keeper is all that is left under it.
    wait_until(lambda: {child.pid for child in psutil.Process(pid).children(recursive=True)} == {kept}, timeout=30)
    own = psutil.Process(pid).memory_info().rss / (1 << 20)
    assert trees_rss_mb(table(), [pid])[pid] < own * 1.5, "the keeper's memory is the agent's: not counted again"
    where = cgroups.cgroup_of(pid)
    if where is not None and cgroups.base_path(ws) == where.parent:
        assert kept in cgroups.members(where)
        assert cgroups.rss_mb(where) < own * 1.5
    def row() -> dict:
        status = hermes(ws, "status", "--json")
        assert status.returncode == 0, status.stderr
        return next(row for row in json.loads(status.stdout)["agents"] if row["name"] == "worker")

    # Asked again while something passing (a child for a moment, the agent's own growth since `own`
    # on a loaded machine) makes it more: counted twice, the keeper would make it so every time.
    def once() -> bool:
        rss = row()["rss_mb"]
        return 0 < rss < max(own, psutil.Process(pid).memory_info().rss / (1 << 20)) * 1.5

    wait_until(once, timeout=30)
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: gone(kept), timeout=10)  # killed with what its agent left
    again = wait_until(lambda: agent(ws, "worker").get("state") == "running" and agent(ws, "worker")["pid"] != pid
                       and agent(ws, "worker")["pid"], timeout=60)
    second = wait_until(lambda: keeper_of(again), timeout=10)
    assert hermes(ws, "stop", "worker").returncode == 0
    wait_until(lambda: gone(again) and gone(second), timeout=30)


def test_a_cgroups_memory_check_asks_kcmp_once_per_member_at_most(cgroup_base, monkeypatch):  # noqa: F811
    """Each member is compared with its parent only: 40 processes of separate memory in an agent's
    cgroup cost 40 comparisons, not one per pair (800), which a tool's thousands made minutes."""
    calls = []

    def counted(a: int, b: int) -> bool:
        calls.append((a, b))
        return same_memory(a, b)

    monkeypatch.setattr(cgroups, "same_memory", counted)
    folder = cgroup_base / "many"
    folder.mkdir()
    join = (folder / "cgroup.procs").write_text
    shell = subprocess.Popen(["/bin/sh", "-c", "for i in $(seq 40); do sleep 60 & done; wait"],
                             preexec_fn=lambda: join("0"))
    try:
        wait_until(lambda: len(cgroups.members(folder)) == 41, timeout=10)
        assert cgroups.rss_mb(folder) > 0
        assert len(calls) <= 41, len(calls)
    finally:
        cgroups.kill(folder)
        shell.wait()


def test_a_spare_past_descriptor_1024_is_still_looked_at(tmp_path):
    from hermes_sup.supervisor.spares import Spare

    child = subprocess.Popen(["sleep", "60"])
    pidfd = os.pidfd_open(child.pid)
    high = os.dup2(pidfd, 1500)
    os.close(pidfd)
    try:
        spare = Spare(child.pid, high, -1, None, str(tmp_path), (), (0, 0), (0, 0))
        assert not spare.exited()
        child.kill()
        child.wait()
        assert spare.exited()
    finally:
        os.close(high)
