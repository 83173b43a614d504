"""The terminal's confinement (agents/sandbox.py, agents/confine.py): black-box, a command tries what it
must not do under bubblewrap and under Landlock, and the same command under `sandbox: none` shows each
probe can succeed; then the decisions, pure."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
from pathlib import Path

import pytest
from hermes_sup.agents import (
    builtins,  # noqa: F401 - registers the built-in tools
    sandbox,
)
from hermes_sup.agents.landlock import abi, readable_roots
from hermes_sup.agents.sandbox import Confinement, SandboxRefused, bwrap_argv, choose, plan
from hermes_sup.agents.tools import Toolbox, ToolContext, ToolError

from .conftest import marked_sleep, running, wait_until

CONFINED = ["bubblewrap", "landlock"]


def needs(mode: str) -> None:
    if mode == "landlock" and abi() < 1:
        pytest.skip("this kernel has no Landlock")
    if mode == "bubblewrap" and sandbox.bubblewrap()[0] is None:
        why = sandbox.bubblewrap()[1]
        if "not installed" in why:  # `make test` installs it
            pytest.fail(f"bubblewrap is needed here: {why}")
        pytest.skip(why)  # installed, but this machine refuses it namespaces (doctor says the same)


@pytest.fixture
def place(tmp_path):
    ws = tmp_path / "ws"
    (ws / "runs" / "tasks" / "t1" / "work").mkdir(parents=True)
    (ws / "runs" / "other").mkdir()
    (ws / "runs" / "other" / "state.json").write_text('{"secret": "OTHERS-STATE"}')
    (ws / ".env").write_text("OPENAI_API_KEY=ENV-SECRET\n")
    for name in ("rw", "ro", "outside"):
        (tmp_path / name).mkdir()
    (tmp_path / "ro" / "paper.txt").write_text("a paper\n")
    (tmp_path / "outside" / "private.txt").write_text("OUTSIDE-SECRET\n")
    return tmp_path


def context(place: Path, mode: str, caps: tuple[str, ...] = ("shell",)) -> ToolContext:
    folders = {"rw": {"path": str(place / "rw"), "mode": "rw"}, "ro": {"path": str(place / "ro"), "mode": "ro"}}
    return ToolContext(scratch=place / "ws" / "runs" / "tasks" / "t1" / "work", stop=threading.Event(),
                       settings={"sandbox": mode, "folders": folders}, grants=caps, workspace=place / "ws")


def run(ctx: ToolContext, command: str) -> str:
    return Toolbox(grants=tuple(ctx.grants or ())).call(ctx, "terminal", {"command": command, "timeout": 60})


@pytest.mark.parametrize("mode", [*CONFINED, "none"])
def test_writes_go_only_to_the_task_folder_and_the_rw_grants(place, mode):
    needs(mode)
    ctx = context(place, mode)
    run(ctx, f"echo x > here.txt; echo x > {place}/rw/new.txt; echo x > {place}/ro/new.txt; "
             f"echo x > {place}/outside/new.txt; rm -f {place}/ro/paper.txt; echo x > {place}/ws/runs/other/x")
    assert (ctx.scratch / "here.txt").exists() and (place / "rw" / "new.txt").exists(), "granted writes work"
    breached = [p for p in ("ro/new.txt", "outside/new.txt", "ws/runs/other/x") if (place / p).exists()]
    breached += [] if (place / "ro" / "paper.txt").exists() else ["ro/paper.txt removed"]
    assert breached == ([] if mode != "none" else ["ro/new.txt", "outside/new.txt", "ws/runs/other/x",
                                                   "ro/paper.txt removed"])


@pytest.mark.parametrize("mode", [*CONFINED, "none"])
def test_a_command_reads_its_grants_not_the_workspace_nor_other_folders(place, mode):
    needs(mode)
    out = run(context(place, mode), f"cat {place}/ro/paper.txt; cat {place}/ws/.env; "
                                    f"cat {place}/ws/runs/other/state.json; cat {place}/outside/private.txt; "
                                    f"ls {place}/ws/runs | sed s/^/LISTED:/")
    assert "a paper" in out
    leaked = [s for s in ("ENV-SECRET", "OTHERS-STATE", "OUTSIDE-SECRET", "LISTED:other") if s in out]
    assert leaked == ([] if mode != "none" else ["ENV-SECRET", "OTHERS-STATE", "OUTSIDE-SECRET", "LISTED:other"]), out


@pytest.mark.parametrize("mode", [*CONFINED, "none"])
def test_a_command_cannot_undo_its_confinement_nor_read_the_agents_process(place, mode):
    # Run by root, a command under bubblewrap owned its namespaces: `umount` took the hiding tmpfs
    # away. Under Landlock /proc showed the agent's environment (its keys), and /var/run led to /run.
    needs(mode)
    script = (f"umount -l /tmp 2>/dev/null; umount -l {place}/ws 2>/dev/null; cat {place}/ws/.env; "
              f"ls /proc/{os.getpid()} >/dev/null 2>&1 && echo AGENT-PROC-SEEN; echo HOME=$HOME; "
              f"cat /proc/{os.getpid()}/environ | wc -c | sed s/^/ENVIRON:/; "
              "find /var/run/ /dev/shm/ -mindepth 1 -maxdepth 1 | sed s/^/RUN:/; "
              f"{sys.executable} -c \"import os; os.setgid(4321); print('SETGID-OK')\"; echo RAN")
    out = run(context(place, mode), script)
    if mode == "none":  # the control: each probe can succeed
        assert "ENV-SECRET" in out and "ENVIRON:0" not in out, out
        assert ("SETGID-OK" in out) is (os.getuid() == 0)
        return
    assert "RAN" in out and "ENV-SECRET" not in out and "SETGID-OK" not in out, out
    assert "AGENT-PROC-SEEN" not in out, "the agent's process is not to be seen (its environment holds keys)"
    if os.environ.get("HOME", "").startswith(("/root", "/home")):
        assert f"HOME={os.environ['HOME']}\n" not in out, "a hidden home is not the command's"
    assert "ENVIRON:0" in out or "ENVIRON:" not in out, out
    assert "RUN:" not in out, "/run (by way of /var/run) and /dev/shm show nothing of the machine's"


@pytest.mark.parametrize("mode", [*CONFINED, "none"])
def test_no_connection_without_the_network_capability(place, mode):
    # TCP, and what Landlock's TCP rule alone let through: MPTCP (to the same listener) and UDP.
    needs(mode)
    listener = socket.create_server(("127.0.0.1", 0))
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.settimeout(0)
    port, udp_port = listener.getsockname()[1], udp.getsockname()[1]
    probe = (f"{sys.executable} -c \"import socket\n"
             f"for proto, name in ((0, 'PLAIN'), (262, 'MULTIPATH')):\n"
             f"    try:\n"
             f"        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, proto); s.settimeout(5)\n"
             f"        s.connect(('127.0.0.1', {port})); print(name + '-TCP-CONNECTED')\n"
             f"    except OSError as exc: print(name, exc)\n"
             f"try: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'UDP', ('127.0.0.1', {udp_port}))\n"
             f"except OSError as exc: print('UDP', exc)\n\"")

    def udp_received() -> bool:
        try:
            return udp.recv(16) == b"UDP"
        except BlockingIOError:
            return False

    try:
        cut_off = run(context(place, mode), probe)
        cut_off_udp = udp_received()
        allowed = run(context(place, mode, ("shell", "network")), probe)
        allowed_udp = wait_until(udp_received, timeout=5)
    finally:
        listener.close()
        udp.close()
    assert ("PLAIN-TCP-CONNECTED" in cut_off) is (mode == "none"), cut_off
    assert "MULTIPATH-TCP-CONNECTED" not in cut_off or mode == "none", cut_off
    assert cut_off_udp is (mode == "none")
    assert "PLAIN-TCP-CONNECTED" in allowed and allowed_udp, allowed


@pytest.mark.parametrize("mode", [*CONFINED, "none"])
def test_what_a_command_leaves_running_dies_with_it(place, mode):
    needs(mode)
    marks = marked_sleep(), marked_sleep()
    try:
        # The command ends once the first has left its session (the file says so).
        run(context(place, mode), f"setsid sh -c 'touch left; exec {marks[0]}' >/dev/null 2>&1 < /dev/null & "
                                  f"( ( {marks[1]} >/dev/null 2>&1 < /dev/null & ) & ) ; "
                                  "until [ -e left ]; do sleep 0.01; done; echo started")
        if mode == "none":  # the control: the process group's kill misses the one that left it
            assert running(marks[0]), "without confinement a setsid escape outlives the command"
        else:
            wait_until(lambda: not any(running(m) for m in marks), timeout=5)
    finally:
        for mark in marks:
            for pid in running(mark):
                os.kill(pid, 9)


@pytest.mark.parametrize("mode", CONFINED)
@pytest.mark.parametrize("signal_name", ["KILL", "STOP"])
def test_a_command_cannot_stop_what_kills_its_leftovers(place, mode, signal_name):
    # The Landlock launcher kills what the command leaves; the command could kill or freeze it first.
    needs(mode)
    mark = marked_sleep()
    try:
        with contextlib.suppress(ToolError):  # a frozen launcher: the call times out
            Toolbox(grants=("shell",)).call(context(place, mode), "terminal", {
                "command": f"setsid sh -c 'touch left; exec {mark}' >/dev/null 2>&1 < /dev/null & "
                           f"until [ -e left ]; do sleep 0.01; done; kill -{signal_name} $PPID; echo sent",
                "timeout": 3})
        wait_until(lambda: not running(mark), timeout=10)
    finally:
        for pid in running(mark):
            os.kill(pid, 9)


def test_a_command_never_runs_unconfined_unless_the_agent_says_so(place, monkeypatch):
    monkeypatch.setattr(sandbox, "how", lambda mode: choose(mode, (None, "bubblewrap is not installed"), 0))
    with pytest.raises(ToolError, match=r"no sandbox for commands on this machine .*sandbox: none"):
        run(context(place, "auto"), "touch ran")
    assert not (place / "ws" / "runs" / "tasks" / "t1" / "work" / "ran").exists()


# -- the decisions, pure ----------------------------------------------------------------------------

def test_choose_takes_the_best_the_machine_has_and_what_the_agent_allows():
    assert choose("auto", ("/usr/bin/bwrap", ""), 6)[0] == "bubblewrap"
    kind, gaps = choose("auto", (None, "bubblewrap is not installed"), 6)
    assert kind == "landlock" and "bubblewrap is not installed" in gaps and "unix sockets" in gaps
    assert "signal its launcher" in choose("landlock", (None, ""), 5)[1]
    assert "signal its launcher" not in choose("landlock", (None, ""), 6)[1]
    assert choose("none", (None, "x"), 0)[0] == "none"
    with pytest.raises(SandboxRefused, match="not installed"):
        choose("bubblewrap", (None, "bubblewrap is not installed"), 6)
    with pytest.raises(SandboxRefused, match="no Landlock"):
        choose("landlock", ("/usr/bin/bwrap", ""), 0)


def test_the_plan_hides_the_workspace_and_home_and_shows_the_interpreter_only():
    conf = plan(Path("/w/runs/tasks/t/work"), Path("/w/runs/tasks/t/work"),
                [(Path("/data/app"), True), (Path("/data/app/docs"), False)], workspace=Path("/w"), network=False,
                env={"HOME": "/home/u", "PATH": "/usr/bin"}, home="/home/u",
                interpreter=["/home/u/.pyenv/versions/3.11", "/home/u", "/w/.venv", "/w/runs", "/usr/bin"],
                private=("/home", "/tmp"))
    assert conf.hidden == (Path("/home"), Path("/tmp"), Path("/home/u"), Path("/w"))
    assert conf.shown == (Path("/home/u/.pyenv/versions/3.11"), Path("/w/.venv")), "not a home itself, nor runs/"
    assert conf.writable == (Path("/w/runs/tasks/t/work"), Path("/data/app"))
    assert conf.readable == (Path("/data/app/docs"),)


def test_mounts_come_outer_first_so_an_ro_grant_inside_an_rw_one_stays_read_only():
    conf = Confinement(cwd=Path("/w/t"), writable=(Path("/w/t"), Path("/data/app")), readable=(Path("/data/app/docs"),),
                       hidden=(Path("/w"), Path("/tmp")), network=False)
    argv = bwrap_argv(conf, ["/bin/sh", "-c", "true"])
    binds = [(argv[i], argv[i + 1]) for i, a in enumerate(argv) if a in ("--bind", "--ro-bind", "--tmpfs")]
    assert binds == [("--ro-bind", "/"), ("--tmpfs", "/tmp"), ("--tmpfs", "/w"), ("--bind", "/data/app"),
                     ("--bind", "/w/t"), ("--ro-bind", "/data/app/docs")]
    inner = bwrap_argv(Confinement(cwd=Path("/x"), writable=(Path("/x"),), hidden=(Path("/x/ws"),)), ["true"])
    assert inner.index("/x/ws") > inner.index("--bind"), "a hidden folder inside a shown one is hidden still"
    assert "--share-net" not in argv and argv[-4:] == ["--", "/bin/sh", "-c", "true"]
    assert "--share-net" in bwrap_argv(Confinement(cwd=Path("/"), writable=(), network=True), ["true"])


def test_landlock_reads_are_everything_but_the_hidden_folders():
    tree = {"/": ["usr", "tmp", "home"], "/home": ["u", "v"], "/home/u": ["code", "ws", "wsx"]}
    roots = readable_roots(["/tmp", "/home/u/ws"], lambda p: tree.get(p, []))
    assert roots == ["/home/u/code", "/home/u/wsx", "/home/v", "/usr"], "wsx is not inside ws"


def test_the_seccomp_filter_refuses_every_socket_and_foreign_calls():
    from hermes_sup.agents.seccomp import ARCHES, IO_URING_SETUP, program

    AF_UNIX, SOCKETPAIR = 1, 53

    def verdict(rows, data: dict[int, int]) -> str:  # a classic BPF machine over seccomp_data's words
        pc, acc = 0, 0
        while True:
            code, jt, jf, k = rows[pc]
            if code == 0x20:
                acc, pc = data[k], pc + 1
            elif code in (0x15, 0x35):
                hit = acc == k if code == 0x15 else acc >= k
                pc += 1 + (jt if hit else jf)
            else:
                return "allow" if k == 0x7FFF0000 else f"errno {k & 0xFFFF}"

    arch, socket_nr = ARCHES["x86_64"]
    rows = program(arch, socket_nr)
    call = lambda nr, family=0, a=arch: verdict(rows, {4: a, 0: nr, 16: family})  # noqa: E731
    assert call(0) == "allow" and call(59) == "allow" and call(SOCKETPAIR, AF_UNIX) == "allow"
    assert call(socket_nr, AF_UNIX) == "errno 13", "a named unix socket: the control socket, a docker.sock"
    assert call(socket_nr, 2) == call(socket_nr, 10) == call(socket_nr, 16) == "errno 13", "inet, inet6, netlink"
    assert call(IO_URING_SETUP) == "errno 13", "io_uring makes sockets without socket()"
    assert call(socket_nr | 0x40000000, 2) == "errno 13", "x32"
    assert call(socket_nr, AF_UNIX, a=0x40000003) == "errno 13", "i386's calls on x86_64"
    assert call(0, a=0x40000003) == call(102, 2, a=0x40000003) == "errno 13", "any i386 call (socketcall: 102)"


@pytest.mark.parametrize("mode", CONFINED)
def test_a_team_folder_not_granted_and_runs_on_another_disk_are_hidden_wherever_they_are(tmp_path, mode):
    """Outside the machine's private folders a path is readable as the system is: the team's folders
    this agent is not granted (folders_hidden) and the workspace's runs/ linked to another disk must
    be hidden by name. A command run under `sandbox: none` shows each is there to read."""
    needs(mode)
    if not os.access("/var/cache", os.W_OK):
        pytest.skip("/var/cache is not writable here")
    import shutil
    import tempfile

    elsewhere = Path(tempfile.mkdtemp(prefix="hermes-sup-test-", dir="/var/cache"))
    try:
        (elsewhere / "theirs").mkdir()
        (elsewhere / "theirs" / "notes.txt").write_text("THEIR-NOTES\n")
        (elsewhere / "runs" / "tasks" / "t1" / "work").mkdir(parents=True)
        (elsewhere / "runs" / "other").mkdir()
        (elsewhere / "runs" / "other" / "state.json").write_text("OTHERS-STATE\n")
        ws = tmp_path / "ws"
        ws.mkdir()
        (ws / "runs").symlink_to(elsewhere / "runs")
        command = f"echo RAN; cat {elsewhere}/theirs/notes.txt {elsewhere}/runs/other/state.json"

        def run_in(sandbox_mode: str) -> str:
            ctx = ToolContext(scratch=ws / "runs" / "tasks" / "t1" / "work", stop=threading.Event(),
                              settings={"sandbox": sandbox_mode, "folders_hidden": [str(elsewhere / "theirs")]},
                              grants=("shell",), workspace=ws)
            return run(ctx, command)

        assert "THEIR-NOTES" in run_in("none") and "OTHERS-STATE" in run_in("none")
        out = run_in(mode)
        assert "RAN" in out and "THEIR-NOTES" not in out and "OTHERS-STATE" not in out, out
    finally:
        shutil.rmtree(elsewhere, ignore_errors=True)


@pytest.mark.parametrize("mode", [*CONFINED, "none"])
def test_a_named_unix_socket_is_out_of_reach_without_the_network_capability(place, mode):
    """The supervisor's control socket (runs/sockets/) or a docker.sock: under Landlock a command
    reached them (Landlock cannot hide a socket from connect), and could ask the team to stop."""
    needs(mode)
    (place / "ws" / "runs" / "sockets").mkdir()
    path = place / "ws" / "runs" / "sockets" / "control.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(4)
    server.settimeout(0.5)
    probe = (f"{sys.executable} -c \"import socket\ns = socket.socket(socket.AF_UNIX)\n"
             f"try: s.connect({str(path)!r}); print('UNIX-CONNECTED')\nexcept OSError as exc: print('UNIX', exc)\n\"")
    try:
        out = run(context(place, mode), probe)
        assert ("UNIX-CONNECTED" in out) == (mode == "none"), out
    finally:
        server.close()


def test_what_is_concealed_is_hidden_unless_it_is_given():
    conf = plan(Path("/w/t"), Path("/w/t"), [(Path("/data/app"), True)], workspace=None, network=False, env={},
                private=(), conceal=[Path("/data/app"), Path("/w/t"), Path("/data/other"), Path("rel")])
    assert Path("/data/other") in conf.hidden
    assert not {Path("/data/app"), Path("/w/t"), Path("rel")} & set(conf.hidden), "given, its own, or not a path"


@pytest.mark.parametrize("mode", CONFINED)
def test_a_commands_temporary_folder_is_its_own_outside_the_task_and_gone_after(place, mode):
    needs(mode)
    ctx = context(place, mode)
    out = run(ctx, "mkdir -p $TMPDIR/a/b && echo TMP=$TMPDIR")
    tmp = out.split("TMP=")[1].strip()
    assert not Path(tmp).is_relative_to(ctx.scratch) and not list(ctx.scratch.glob("*tmp*"))
    assert not os.path.exists(tmp) or mode == "bubblewrap", "the launcher removes it"  # bwrap's is a tmpfs


def test_inside_says_what_pathlib_says_of_every_kind_of_path():
    """`_inside` compares text where both paths are absolute (a plan asks it hundreds of times); it
    must agree with `Path.parents` on every case, the root, prefixes that are no parent, and the rest."""
    from hermes_sup.agents.sandbox import _inside

    cases = ["/", "/a", "/a/b", "/a/bc", "/ab", "/a/b/c", "//a", "//", "a", "a/b", ".", "/a/b/", "/a b/c", "/a/../b"]
    for path in map(Path, cases):
        for root in map(Path, cases):
            assert _inside(path, root) == (path == root or root in path.parents), (path, root)
