"""The fork server's fast fork with real processes and cgroups: an agent cloned (clone3) straight into
its cgroup as the asker's own child; where the kernel kills what is cloned into a cgroup once killed,
or a seccomp profile refuses clone3 (Docker's answers ENOSYS), the agent is still made, the slower way,
born in its cgroup and running once told to go."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from hermes_sup.agents.forkchild import go_message
from hermes_sup.supervisor import cgroups
from hermes_sup.supervisor.forking import agent_argv, server_env

from .conftest import wait_until

# Starts the program in its argv under a seccomp filter that answers clone3 (435) with ENOSYS, as
# Docker's default profile does; every other system call is allowed.
NO_CLONE3 = r"""
import ctypes, os, sys
class Insn(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32)]
class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Insn))]
insns = (Insn * 4)(Insn(0x20, 0, 0, 0),                 # load the system call's number
                   Insn(0x15, 0, 1, 435),               # clone3?
                   Insn(0x06, 0, 0, 0x00050000 | 38),   # then fail with ENOSYS
                   Insn(0x06, 0, 0, 0x7FFF0000))        # else allow
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
assert libc.prctl(22, 2, ctypes.byref(Prog(4, insns))) == 0, ctypes.get_errno()  # SECCOMP_MODE_FILTER
os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
"""


def fast_fork_here() -> bool:
    """Whether this kernel has clone3 and CLONE_INTO_CGROUP (Linux 5.7) and no filter refuses it."""
    import ctypes
    import errno

    libc = ctypes.CDLL(None, use_errno=True)
    refused = libc.syscall(435, None, 0) == -1 and ctypes.get_errno() == errno.ENOSYS
    major, minor = (int(part) for part in os.uname().release.split(".")[:2])
    return not refused and (major, minor) >= (5, 7)


@pytest.fixture
def cgroup_base(tmp_path: Path) -> Iterator[Path]:
    containment = cgroups.detect(tmp_path)
    if containment.mode != "cgroup" or containment.base is None:
        pytest.skip(f"cgroups are not available here: {containment.detail}")
    try:
        yield containment.base
    finally:
        for folder in [p for p in containment.base.iterdir() if p.is_dir()]:
            cgroups.kill(folder)
        cgroups.remove(containment.base, timeout=10)


@contextlib.contextmanager
def fork_server(*, clone3: bool = True) -> Iterator[socket.socket]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    argv = ["-P", "-m", "hermes_sup.agents.forkserver", str(theirs.fileno()), str(os.getpid())]
    argv = [sys.executable, *argv] if clone3 else [sys.executable, "-c", NO_CLONE3, *argv]
    server = subprocess.Popen(argv, env=server_env(os.environ), pass_fds=[theirs.fileno()])
    theirs.close()
    try:
        assert json.loads(ours.recv(4096))["ready"] is True
        yield ours
    finally:
        ours.close()
        server.wait(timeout=10)


def ask(sock: socket.socket, tmp_path: Path, cgroup: Path | None) -> tuple[dict, int, Path]:
    """Ask as the supervisor does: the reply, the go pipe's write end and the agent's log."""
    log = tmp_path / f"log-{len(list(tmp_path.iterdir()))}"
    fds = [os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)]
    go_read, go_write = os.pipe()
    fds.append(go_read)
    if cgroup is not None:
        fds.append(os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY))
    request = {"argv": list(agent_argv(sys.executable)), "cwd": str(tmp_path), "env_size": 100,
               "cgroup": cgroup is not None}
    socket.send_fds(sock, [json.dumps(request).encode()], fds)
    for fd in fds:
        os.close(fd)
    return json.loads(sock.recv(4096)), go_write, log


def run_to_the_end(pid: int, go_write: int, log: Path) -> tuple[int, str]:
    """Tell the agent to go (outside a supervisor, it says so and exits 2): its exit code and log."""
    os.write(go_write, go_message({"PATH": os.environ["PATH"]}))
    os.close(go_write)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), log.read_text()


def cgroup_of(pid: int) -> str:
    return Path(f"/proc/{pid}/cgroup").read_text().strip().rsplit("::", 1)[-1]


def test_an_agent_is_cloned_as_the_askers_child_straight_into_its_cgroup(tmp_path, cgroup_base):
    """No middle process: the asker (the supervisor; here the test) is the agent's parent at once,
    and the agent is in its cgroup from its first instruction."""
    if not fast_fork_here():
        pytest.skip("no clone3 into a cgroup here (Linux < 5.7 or a seccomp filter): the next tests' path")
    folder = cgroup_base / "agent-a"
    folder.mkdir()
    with fork_server() as sock:
        for where in (folder, None):
            reply, go_write, log = ask(sock, tmp_path, where)
            assert reply["via"] == "clone3", reply
            pid = reply["pid"]
            assert psutil.Process(pid).ppid() == os.getpid(), "the asker's child, not the server's"
            if where is not None:
                assert cgroup_of(pid).endswith("/agent-a"), "born in its cgroup"
            code, logged = run_to_the_end(pid, go_write, log)
            assert code == 2 and "started outside a supervisor" in logged, (code, logged)


def test_a_cgroup_once_killed_still_gets_a_live_agent(tmp_path, cgroup_base):
    """Linux 6.18 kills a process cloned into a cgroup that cgroup.kill was ever written to; the
    server sees it killed at birth and forks the agent the slower way."""
    folder = cgroup_base / "agent-b"
    folder.mkdir()
    (folder / "cgroup.kill").write_text("1")  # an earlier agent's leftovers were killed here
    with fork_server() as sock:
        reply, go_write, log = ask(sock, tmp_path, folder)
        pid = reply["pid"]
        assert psutil.Process(pid).ppid() == os.getpid()
        assert cgroup_of(pid).endswith("/agent-b")
        code, logged = run_to_the_end(pid, go_write, log)
        assert code == 2 and "started outside a supervisor" in logged, (code, logged)
        if reply["via"] == "fork":  # the kernel killed the clone (6.18): its zombie is the asker's
            assert os.waitstatus_to_exitcode(os.waitpid(reply["killed_at_birth"], 0)[1]) == -9, "never ran"


def test_the_spawns_cgroup_is_made_anew_once_empty_so_the_clone_is_not_killed(tmp_path, cgroup_base):
    """What the supervisor gives the server (cgroups.joiner): a killed agent cgroup, empty again, is
    made anew, so the fast fork works for every restart and not only the first start."""
    if not fast_fork_here():
        pytest.skip("no clone3 into a cgroup here (Linux < 5.7 or a seccomp filter)")
    folder = cgroup_base / "agent-c"
    folder.mkdir()
    (folder / "cgroup.kill").write_text("1")
    path, opened, procs, _join = cgroups.joiner((folder,))
    os.close(procs)
    assert path == folder
    try:
        with fork_server() as sock:
            fds = [os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT), *os.pipe()]
            request = {"argv": list(agent_argv(sys.executable)), "cwd": str(tmp_path), "env_size": 100,
                       "cgroup": True}
            socket.send_fds(sock, [json.dumps(request).encode()], [fds[0], fds[1], opened])
            reply = json.loads(sock.recv(4096))
            for fd in fds[:2]:
                os.close(fd)
            assert reply["via"] == "clone3", reply
            assert cgroup_of(reply["pid"]).endswith("/agent-c")
            os.close(fds[2])  # never told to go: it exits before running anything
            assert os.waitstatus_to_exitcode(os.waitpid(reply["pid"], 0)[1]) == 127
    finally:
        os.close(opened)


def test_a_restart_goes_to_the_agents_other_cgroup_while_its_first_still_holds_a_dying_process(tmp_path,
                                                                                            cgroup_base):
    """A killed agent's keeper (and what it left) may still be dying in its cgroup, killed through
    cgroup.kill, when the replacement starts: the replacement is born in the agent's other cgroup, by
    the fast clone, and the two take turns from then on."""
    if not fast_fork_here():
        pytest.skip("no clone3 into a cgroup here (Linux < 5.7 or a seccomp filter)")
    first, second = cgroups.agent_cgroups(cgroup_base, "worker")
    assert first.parent == second.parent == cgroup_base and first != second
    first.mkdir()
    lingering = subprocess.Popen(["sleep", "60"], preexec_fn=lambda: (first / "cgroup.procs").write_text("0"))
    try:
        second.mkdir()
        (second / "cgroup.kill").write_text("1")  # an earlier instance's, killed and empty: made anew
        path, opened, procs, _join = cgroups.joiner((first, second))
        os.close(opened)
        os.close(procs)
        assert path == second, "the populated one is passed over"
        with fork_server() as sock:
            reply, go_write, _log = ask(sock, tmp_path, second)
            os.close(go_write)  # never told to go: it exits before running anything
            assert reply["via"] == "clone3", reply
            assert cgroup_of(reply["pid"]).endswith(f"/{second.name}")
            assert os.waitstatus_to_exitcode(os.waitpid(reply["pid"], 0)[1]) == 127
        lingering.kill()
        lingering.wait()
        wait_until(lambda: not cgroups.populated(first), timeout=5)
        path, opened, procs, _join = cgroups.joiner((first, second))
        os.close(opened)
        os.close(procs)
        assert path == first, "once empty, the first is made anew and taken again"
    finally:
        lingering.kill()
        lingering.wait()


def test_when_both_cgroups_hold_something_the_dead_instances_leftovers_go_first(cgroup_base):
    """The last instance's cgroup is never chosen while the other is free (its leftovers are killed
    once the replacement runs); when neither is free, they are killed first and the first is taken."""
    first, second = cgroups.agent_cgroups(cgroup_base, "busy")
    procs = []
    for folder in (first, second):
        folder.mkdir()
        join = (folder / "cgroup.procs").write_text
        procs.append(subprocess.Popen(["sleep", "60"], preexec_fn=lambda join=join: join("0")))
    try:
        path, opened, fd, _join = cgroups.joiner((first, second), dead=second)
        os.close(opened)
        os.close(fd)
        assert path == first
        assert procs[1].wait(timeout=10) == -9, "the dead instance's leftovers were killed"
        assert procs[0].poll() is None, "and nothing else"
        procs[0].kill()
        procs[0].wait()
        wait_until(lambda: not cgroups.populated(first), timeout=5)
        path, opened, fd, _join = cgroups.joiner((first, second), dead=first)
        os.close(opened)
        os.close(fd)
        assert path == second, "the other, free, rather than the dead one's"
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_where_clone3_is_refused_agents_are_still_forked_into_their_cgroup(tmp_path, cgroup_base):
    folder = cgroup_base / "agent-d"
    folder.mkdir()
    with fork_server(clone3=False) as sock:
        reply, go_write, log = ask(sock, tmp_path, folder)
        assert reply["via"] == "fork", reply
        pid = reply["pid"]
        assert psutil.Process(pid).ppid() == os.getpid(), "reparented to the subreaper (here, the test)"
        assert cgroup_of(pid).endswith("/agent-d")
        code, logged = run_to_the_end(pid, go_write, log)
        assert code == 2 and "started outside a supervisor" in logged, (code, logged)


# As the fork server clones (its parent, here the test, becomes the clone's): the clone reports what
# glibc and Python think of it, with a second thread signalling the first (pthread_kill acts on the
# thread id glibc keeps in the thread's descriptor, which a raw clone3 would leave as the server's).
CLONED = r"""
import json, os, random, signal, sys, threading
from hermes_sup.agents.forkclone import clone, probe
offset = probe()
before = random.random()
pid = clone(None, offset)
if pid == 0:
    found = {}
    def other():
        try:
            signal.pthread_kill(threading.main_thread().ident, 0)
            found["pthread_kill"] = "ok"
        except OSError as exc:
            found["pthread_kill"] = exc.strerror
    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    found.update(pid=os.getpid(), native=threading.get_native_id(), ppid=os.getppid(), random=random.random())
    print(json.dumps(found), flush=True)
    os._exit(0)
print(json.dumps({"offset": offset, "child": pid, "random": random.random()}), flush=True)
"""


def test_a_cloned_agent_is_to_glibc_and_python_what_a_forked_one_is():
    if not fast_fork_here():
        pytest.skip("no clone3 here")
    done = subprocess.run([sys.executable, "-c", CLONED], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    [parent] = [line for line in lines if "offset" in line]
    [child] = [line for line in lines if "pthread_kill" in line]
    assert os.waitstatus_to_exitcode(os.waitpid(parent["child"], 0)[1]) == 0, "the asker's child"
    assert parent["offset"] is not None, "glibc's thread id field was found"
    assert child["pid"] == child["native"] == parent["child"] and child["ppid"] == os.getpid()
    assert child["pthread_kill"] == "ok", "another thread can signal the main one: its thread id is its own"
    assert child["random"] != parent["random"], "Python's at-fork hooks ran (random reseeded)"


# Clones given no time to say they run (ALIVE_WITHIN 0): each one the server gives up on is killed and
# gone before clone returns, so no replacement could ever run beside it.
IMPATIENT = r"""
import json, os
from hermes_sup.agents import forkclone
forkclone.ALIVE_WITHIN = 0
offset = forkclone.probe()
outcomes = []
while len(outcomes) < 200 and sum(kind == "killed" for kind, _ in outcomes) < 3:
    try:
        pid = forkclone.clone(None, offset)
    except forkclone.KilledAtBirth as exc:
        outcomes.append(("killed", exc.pid))
        continue
    if pid == 0:
        os._exit(0)
    outcomes.append(("ran", pid))
print(json.dumps(outcomes), flush=True)
"""


def test_a_clone_given_up_on_is_killed_before_any_replacement():
    if not fast_fork_here():
        pytest.skip("no clone3 here")
    done = subprocess.run([sys.executable, "-c", IMPATIENT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    outcomes = json.loads(done.stdout)
    codes = {kind: [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for k, pid in outcomes if k == kind]
             for kind in ("killed", "ran")}
    assert codes["killed"], "no clone was given up on: nothing tested"
    assert set(codes["killed"]) == {-9}, codes
    assert set(codes["ran"]) <= {0}, codes
