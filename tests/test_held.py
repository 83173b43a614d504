"""The agents' inotify instances the supervisor holds (supervisor/held.py): handed over by a real agent,
one per agent however often it restarts, nothing else kept, and a copy that watches nothing once its
agent closed its own."""

from __future__ import annotations

import os
import signal
import tempfile
from pathlib import Path

from hermes_sup.kanban.inotify import IN_CREATE, IN_IGNORED, Inotify, parse_events
from hermes_sup.supervisor.held import Held, is_inotify

from .conftest import gone, wait_until
from .test_forkserver import same_open_files
from .test_supervisor import agent, hermes, make_ws


def inotify_count(pid: int) -> int:
    """How many inotify descriptors `pid` has open."""
    return sum(os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:inotify" for fd in os.listdir(f"/proc/{pid}/fd"))


def held_copy(sup: int, worker: int) -> bool:
    """Whether the supervisor holds the agent's board watch: one open file, as kcmp(2) tells."""
    return ("anon_inode:inotify", "anon_inode:inotify") in same_open_files(worker, sup)


def closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


def test_the_supervisor_holds_each_agents_board_watch_once_however_often_it_restarts(tmp_path, up):
    ws = make_ws(tmp_path, "- name: worker\n", defaults="restart: {policy: always, backoff: {initial: 0.1}}")
    sup = up(ws).pid
    pid = wait_until(lambda: agent(ws, "worker").get("state") == "running" and agent(ws, "worker")["pid"], timeout=60)
    wait_until(lambda: held_copy(sup, pid), timeout=30)
    held = inotify_count(sup)
    for _ in range(3):
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda old=pid: gone(old), timeout=10)
        pid = wait_until(lambda old=pid: agent(ws, "worker").get("state") == "running"
                         and agent(ws, "worker")["pid"] != old and agent(ws, "worker")["pid"], timeout=60)
        wait_until(lambda new=pid: held_copy(sup, new), timeout=30)
    # The killed agents' copies were closed: one held for the agent, as before the kills.
    wait_until(lambda: inotify_count(sup) == held, timeout=30)
    assert hermes(ws, "stop", "worker").returncode == 0
    wait_until(lambda: gone(pid), timeout=30)
    wait_until(lambda: inotify_count(sup) == held - 1, timeout=30)  # stopped: none is held for it


def test_only_one_inotify_instance_is_held_per_agent_and_anything_else_is_closed():
    held = Held()
    first, second = Inotify(), Inotify()
    read, write = os.pipe()
    try:
        held.hold("worker", read)  # not an inotify instance: never kept
        wait_until(lambda: closed(read), timeout=10)
        kept = os.dup(first.fd)
        held.hold("worker", kept)
        assert not closed(kept) and is_inotify(kept)
        held.hold("worker", os.dup(second.fd))  # the agent's new watch: the old copy goes
        wait_until(lambda: closed(kept), timeout=10)
        assert len(held) == 1
        fds = [os.dup(first.fd), os.dup(second.fd)]
        with held.passed(list(fds)) as passed:
            passed.keep("other")  # two descriptors in one message: neither is kept
        wait_until(lambda: all(closed(fd) for fd in fds), timeout=10)
        assert len(held) == 1
        held.close_all()
        assert len(held) == 0
        short = Held()
        short.room = 3  # every descriptor is past half the open-file limit: none is held
        spare = os.dup(first.fd)
        short.hold("worker", spare)
        wait_until(lambda: closed(spare), timeout=10)
        assert len(short) == 0
    finally:
        first.close()
        second.close()
        os.close(write)


def test_a_copy_of_a_closed_watch_watches_nothing():
    with tempfile.TemporaryDirectory() as folder:
        inotify = Inotify()
        assert inotify.watch_folder(folder, IN_CREATE)
        copy = os.dup(inotify.fd)
        try:
            inotify.close()
            Path(folder, "new").write_text("x")
            masks = [mask for _wd, mask, _name in parse_events(os.read(copy, 65536))]
            assert masks and all(mask & IN_IGNORED for mask in masks), masks  # the watch's end, no creation
        finally:
            os.close(copy)
