"""The pure parts of process ownership: markers, strays, cgroup paths (no processes)."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import pytest
from hermes_sup.supervisor.cgroups import agent_name, cgroup2_mount, own_cgroup
from hermes_sup.supervisor.procs import MARKER_ENV, Marked, Marker, marker_value, parse_environ, strays


def test_a_marker_survives_its_round_trip_through_an_environment_block():
    marker = Marker("/srv/ws with space", 'we"ird\nname', "00ff")
    block = b"PATH=/bin\0" + f"{MARKER_ENV}={marker_value(marker)}".encode() + b"\0HOME=/root\0"
    assert parse_environ(block) == marker


@pytest.mark.parametrize("value", [b"not json", b"[1, 2]", b'{"ws": "/w"}', b"", b"null"])
def test_a_damaged_marker_is_no_marker(value):
    assert parse_environ(b"A=1\0" + MARKER_ENV.encode() + b"=" + value + b"\0") is None


def test_an_environment_without_a_marker_has_none():
    assert parse_environ(b"HERMES_SUP_WORKSPACE=/w\0HERMES_SUP_AGENT={}\0") is None
    assert parse_environ(b"X" + MARKER_ENV.encode() + b"={}\0") is None


def test_strays_are_the_instances_not_kept():
    def proc(pid: int, agent: str, nonce: str) -> Marked:
        return Marked(pid, 1.0, Marker("/w", agent, nonce))

    found = [proc(1, "a", "kept"), proc(2, "a", "old"), proc(3, "b", "other"), proc(4, "a", "kept")]
    assert [p.pid for p in strays(found, {"kept"})] == [2, 3]
    assert [p.pid for p in strays(found, {"kept"}, agent="a")] == [2]
    assert [p.pid for p in strays(found, set(), agent="b")] == [3]


def test_the_cgroup2_mount_is_found_in_mountinfo():
    hybrid = ("25 20 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n"
              "26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
              "27 25 0:24 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n")
    assert cgroup2_mount(hybrid) == Path("/sys/fs/cgroup/unified")
    assert cgroup2_mount("30 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n") == Path("/sys/fs/cgroup")
    assert cgroup2_mount("27 25 0:24 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n") is None


def test_doctor_names_the_mount_option_that_spares_each_agent_start_a_grace_period():
    """Joining a cgroup took about 15 ms of each restart on a 2-core machine (the kernel waits an RCU
    grace period for its lock's writers), 0.07 ms with the hierarchy mounted favordynmods."""
    from hermes_sup.supervisor.cgroups import cgroup2_options, join_note

    plain = "26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
    favoured = "30 1 0:26 / /sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw,nsdelegate,favordynmods\n"
    assert cgroup2_options(plain) == {"rw", "nosuid", "nsdelegate"}
    assert "favordynmods" in cgroup2_options(favoured)
    assert cgroup2_options("27 25 0:24 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n") == set()
    assert "favordynmods" in join_note(cgroup2_options(plain), "6.18.44-fc")
    assert join_note(cgroup2_options(favoured), "6.1.0-13-amd64") == ""
    assert join_note(cgroup2_options(plain), "5.15.0-91-generic") == "", "no such option before Linux 6.0"
    assert join_note(cgroup2_options(plain), "weird") == ""
    real = Path("/proc/self/mountinfo").read_text()
    if cgroup2_mount(real) is not None:  # this machine's own line parses too
        assert "rw" in cgroup2_options(real) or "ro" in cgroup2_options(real)


def test_own_cgroup_is_the_unified_line():
    assert own_cgroup("4:memory:/x\n0::/user.slice/app.scope\n") == "/user.slice/app.scope"
    assert own_cgroup("4:memory:/x\n") is None


@pytest.mark.parametrize("name", ["../../etc", "a/b", ".hidden", "", "x" * 300, "worker-1"])
def test_an_agent_cgroup_name_is_one_safe_folder_whatever_the_agent_is_called(name):
    folder = agent_name(name)
    assert "/" not in folder and not folder.startswith(".") and len(folder) <= 49
    assert agent_name(name) == folder and (name == "x" or agent_name(name + "x") != folder)


def test_each_agents_tree_memory_comes_from_one_scan_and_matches_its_processes():
    """`status` of 256 agents took 6.6 s: each agent's tree memory scanned the process table once.
    One scan now serves every agent, with the same figures: the process and all it started."""
    import subprocess

    import psutil
    from hermes_sup.supervisor.procs import tree_rss_mb, trees_rss_mb

    trees = [subprocess.Popen(["/bin/sh", "-c", "sleep 300 & sleep 300 & wait"]) for _ in range(2)]
    try:
        def expected(pid: int) -> float:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
            return sum(p.memory_info().rss for p in procs) / (1 << 20)

        import time
        deadline = time.monotonic() + 10
        def settled(pid: int) -> bool:  # both sleeps exec'd: a child forked and not yet exec'd is sh's size
            with contextlib.suppress(psutil.Error):
                children = psutil.Process(pid).children()
                return len(children) == 2 and all(child.cmdline()[:1] == ["sleep"] for child in children)
            return False

        while not all(settled(t.pid) for t in trees) and time.monotonic() < deadline:
            time.sleep(0.05)
        found = trees_rss_mb(t.pid for t in trees)
        for tree in trees:
            # sh and its two sleeps, about 1.7 MB each: within a tenth of a MB, so one left out shows
            assert abs(found[tree.pid] - expected(tree.pid)) < 0.1, (found, expected(tree.pid))
        assert tree_rss_mb(trees[0].pid) == pytest.approx(found[trees[0].pid], abs=0.1)
        assert trees_rss_mb([999_999_999]) == {999_999_999: 0.0}
    finally:
        for tree in trees:
            for child in psutil.Process(tree.pid).children(recursive=True):
                child.kill()
            tree.kill()
            tree.wait()


def test_a_stat_line_is_read_after_the_last_parenthesis_whatever_the_command_is_called():
    """Pure: a process may call itself anything, ') R 1 2' included; the fields follow the last ')'."""
    from hermes_sup.supervisor.proctable import PAGE, TICKS, parse_stat

    fields = ["S", "77", *["0"] * 9, "250", "150", *["0"] * 6, str(30 * TICKS), "0", "10"]
    proc = parse_stat(42, "42 (evil) R 1 2 (x)) " + " ".join(fields) + " 0 0\n", boot=1000.0)
    assert proc is not None
    assert (proc.ppid, proc.started, proc.cpu, proc.rss, proc.zombie) == (77, 1030.0, 4.0, 10 * PAGE, False)
    assert parse_stat(42, "42 (short) S 1", boot=0.0) is None


def test_status_rows_say_each_agents_uptime_memory_and_cpu_from_one_read_of_the_table(tmp_path):
    """status of 256 agents spent half its second in psutil; its rows now come from /proc/PID/stat,
    read once for the table and once more for the CPU sample. The figures are psutil's, and a pid
    whose start time is not the agent's is no agent of ours (a reused pid)."""
    import subprocess
    import time

    import psutil
    from hermes_sup.supervisor.cli.status import status_rows

    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    idle = subprocess.Popen(["sleep", "300"])
    try:
        started = {p.pid: psutil.Process(p.pid).create_time() for p in (busy, idle)}
        time.sleep(0.3)  # some uptime, and the busy one's CPU under way
        state = {"agents": {
            "busy": {"pid": busy.pid, "pid_started": started[busy.pid], "state": "running"},
            "idle": {"pid": idle.pid, "pid_started": started[idle.pid], "state": "running"},
            "reused": {"pid": idle.pid, "pid_started": started[idle.pid] - 100, "state": "running"},
            "never": {"pid": None, "state": "starting"}}}
        rows = {row["name"]: row for row in status_rows(state, tmp_path)}
        for name, proc in (("busy", busy), ("idle", idle)):
            assert rows[name]["uptime_s"] == pytest.approx(time.time() - started[proc.pid], abs=1.0)
            rss = psutil.Process(proc.pid).memory_info().rss / (1 << 20)
            assert rows[name]["rss_mb"] == pytest.approx(rss, abs=0.1)
        # Busy, not a core's worth: on 2 cores beside the suite's other workers it had 9 % of one.
        assert rows["busy"]["cpu_percent"] > 1 and rows["idle"]["cpu_percent"] < 1, rows
        for name in ("reused", "never"):
            assert (rows[name]["uptime_s"], rows[name]["rss_mb"], rows[name]["cpu_percent"]) == (None, None, None)
    finally:
        for proc in (busy, idle):
            proc.kill()
            proc.wait()


def test_status_rows_time_each_agents_cpu_over_its_own_interval(tmp_path, monkeypatch):
    """The CPU sample's start was the table's read, but its clock started after the whole table was
    read: a busy single-threaded agent showed 115-180 % where the scan took 100 ms. Timed per agent,
    it stays at most one core's worth however long the table takes."""
    import subprocess
    import time

    import psutil
    from hermes_sup.supervisor import proctable
    from hermes_sup.supervisor.cli.status import status_rows

    real_table = proctable.table
    monkeypatch.setattr(proctable, "table", lambda: (real_table(), time.sleep(0.3))[0])  # a slow scan
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        state = {"agents": {"busy": {"pid": busy.pid, "pid_started": psutil.Process(busy.pid).create_time(),
                                     "state": "running"}}}
        row = status_rows(state, tmp_path)[0]
    finally:
        busy.kill()
        busy.wait()
    # At most one core, give or take a clock tick (10 ms of a 0.1 s sample); 340 % before.
    assert 0 <= row["cpu_percent"] <= 125, row


def test_a_process_table_that_cannot_be_read_whole_says_so(monkeypatch):
    """Out of descriptors, a process is not gone: the read fails loudly (the memory check then looks
    again next time) rather than leaving the process out of its agent's memory."""
    import errno

    import pytest
    from hermes_sup.supervisor import proctable

    def no_descriptors(*_args: object, **_kwargs: object) -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    assert proctable.read(os.getpid()) is not None
    assert proctable.read(2**22 + 12345) is None  # no such process: gone
    monkeypatch.setattr(proctable.os, "open", no_descriptors)
    with pytest.raises(OSError):
        proctable.read(os.getpid())
