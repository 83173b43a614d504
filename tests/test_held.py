"""The agents' inotify instances the supervisor holds (supervisor/held.py): handed over by a real agent,
one per agent however often it restarts, nothing else kept, and a copy that watches nothing once its
agent closed its own."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

from hermes_sup.kanban.inotify import IN_CREATE, IN_IGNORED, Inotify, parse_events
from hermes_sup.supervisor.held import Held

from .conftest import gone, wait_until
from .test_forkserver import same_open_files
from .test_supervisor import agent, hermes, make_ws


def inotify_count(pid: int) -> int:
    """How many inotify descriptors `pid` has open (one closed as they are read is not)."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(FileNotFoundError):
            count += os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:inotify"
    return count


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


def test_one_inotify_instance_is_copied_per_agent_process_and_nothing_else():
    me, pidfd = os.getpid(), os.pidfd_open(os.getpid())
    first, second = Inotify(), Inotify()
    read, write = os.pipe()
    other = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom hermes_sup.kanban.inotify import Inotify\n"
                              "print(Inotify().fd, flush=True)\ntime.sleep(60)"], stdout=subprocess.PIPE, text=True)
    held = Held()
    try:
        before = inotify_count(me)
        for refused in (str(read), "a word", "-1", str(1 << 20)):  # not an inotify instance, not a descriptor
            assert not held.take("worker", me, pidfd, refused)
        assert held.take("worker", me, pidfd, str(first.fd))
        kept = held.holding("worker")
        assert kept is not None and ("anon_inode:inotify", "anon_inode:inotify") in same_open_files(me, me)
        assert inotify_count(me) == before + 1
        assert not held.take("worker", me, pidfd, str(second.fd)), "once per process"
        assert held.holding("worker") == kept
        number = other.stdout.readline().strip()
        other_fd = os.pidfd_open(other.pid)
        assert held.take("worker", other.pid, other_fd, number)  # the agent's next process: the old copy goes
        wait_until(lambda: closed(kept), timeout=10)
        assert len(held) == 1 and held.holding("worker") != kept
        short = Held()
        short.room = 3  # every descriptor is past half the open-file limit: none is held
        assert not short.take("worker", me, pidfd, str(first.fd)) and len(short) == 0
        wait_until(lambda: inotify_count(me) == before + 1, timeout=10)  # its copy closed
        held.close_all()
        assert len(held) == 0 and inotify_count(me) == before
        os.close(other_fd)
    finally:
        other.kill()
        other.wait()
        first.close()
        second.close()
        for fd in (read, write, pidfd):
            os.close(fd)


def test_the_notify_socket_keeps_no_descriptor_it_is_passed(tmp_path):
    """Where the kernel can refuse them (SO_PASSRIGHTS, Linux 6.16) it does; elsewhere each is closed."""
    from hermes_sup.supervisor.control import enable_credentials, recv_datagram

    path = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server, \
            socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
        server.bind(path)
        enable_credentials(server)
        try:
            refusing = server.getsockopt(socket.SOL_SOCKET, 83) == 0  # SO_PASSRIGHTS
            assert refusing, "the kernel can refuse descriptors: enable_credentials must ask it to"
        except OSError:  # an older kernel
            refusing = False
        read, write = os.pipe()
        try:
            sender.sendmsg([b"NAME=x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", write))], 0, path)
        except PermissionError:
            assert refusing
        else:
            assert not refusing
            os.close(write)
            write = -1
            data, pid, _uid = recv_datagram(server)
            assert data == b"NAME=x" and pid == os.getpid()
            assert os.read(read, 1) == b"", "the passed write end was closed: the pipe is at its end"
        finally:
            for fd in (read, write):
                if fd >= 0:
                    os.close(fd)


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
