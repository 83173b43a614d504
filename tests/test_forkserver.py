"""The fork server with real processes: agents forked from it work a task end to end, each holding
only its own environment and descriptors, in its own session and cgroup; a SIGKILLed one is restarted
by a fork again; the server holds no key, is no agent, and its death costs nothing but speed; an orphan
reparented to the supervisor is reaped."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
from hermes_sup.agents.forkchild import ROOM_ENV, block
from hermes_sup.kanban import Board
from hermes_sup.kanban.events import event_fields
from hermes_sup.supervisor import cgroups
from hermes_sup.supervisor.forking import ENV, agent_argv, enabled, forkable, preloads, reload_note, server_env
from hermes_sup.supervisor.procs import marked

from .conftest import ROOT, gone, init_workspace, open_files, supervisor_state, wait_until

# A `command` agent whose child leaves an orphan behind (reparented to the supervisor, a subreaper)
# that exits a moment later: its zombie is the supervisor's to reap.
ORPHANER = ("import os, time\n"
            "if os.fork() == 0:\n"
            "    orphan = os.fork()\n"
            "    if orphan == 0:\n"
            "        time.sleep(0.3); os._exit(0)\n"
            "    print('orphan', orphan, flush=True); os._exit(0)\n"
            "os.wait(); time.sleep(300)\n")


# Each agent's own provider key (its env in hermes.yaml overrides the supervisor's). That none passes
# through the server's memory is held by the tests that ask the server alone (below): here each later
# request's strings reuse the freed blocks of the one before and would hide it.
KEYS = {"alpha": "sk-alpha-" + "a" * 24, "beta": "sk-beta-" + "b" * 24}
SUPERVISORS_KEY = "sk-supervisors-key"
_KCMP_FILE = 0
_SYS_KCMP = {"x86_64": 312, "aarch64": 272}


def events(ws: Path) -> list[dict]:
    """The board's event log as written (read directly: a CLI process per look would cost a second)."""
    lines = (ws / "kanban" / "events.jsonl").read_text().splitlines()
    return [e for line in lines if (e := event_fields(json.loads(line))) is not None]


def started(ws: Path, name: str) -> list[dict]:
    return [e for e in events(ws) if e.get("event") == "started" and e.get("agent") == name]


def agent(ws: Path, name: str) -> dict:
    return supervisor_state(ws).get("agents", {}).get(name, {})


def server_of(supervisor: int) -> int | None:
    for child in psutil.Process(supervisor).children():
        try:
            if "hermes_sup.agents.forkserver" in child.cmdline():
                return child.pid
        except psutil.Error:  # a child that exited while we looked (an agent, a reaped orphan)
            continue
    return None


def zombies(pid: int) -> list[int]:
    """The children of `pid` that exited and were not reaped (one gone while we look was reaped)."""
    found = []
    for child in psutil.Process(pid).children():
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                found.append(child.pid)
        except psutil.NoSuchProcess:
            continue
    return found


def environ(pid: int) -> dict[str, str]:
    block_ = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(entry.decode().split("=", 1) for entry in block_.split(b"\0") if b"=" in entry)


def shared_kernel_objects(pid: int) -> set[str]:
    """The sockets, pipes and anonymous inodes `pid` holds (a descriptor another process shares shows the same)."""
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith(("socket:", "pipe:")):
            found.add(target)
    return found


def same_open_files(a: int, b: int) -> list[tuple[str, str]]:
    """The descriptors of `a` and of `b` that are one open file, whatever its kind (kcmp(2) KCMP_FILE,
    the kernel's word: readlink cannot tell one eventfd or inotify instance from another)."""
    import ctypes
    import platform

    syscall = ctypes.CDLL(None, use_errno=True).syscall
    number = _SYS_KCMP[platform.machine()]
    fds = {pid: [int(fd) for fd in os.listdir(f"/proc/{pid}/fd")] for pid in (a, b)}
    shared = []
    for fa in fds[a]:
        for fb in fds[b]:
            if syscall(number, a, b, _KCMP_FILE, fa, fb) == 0:  # -1: one closed while we looked
                with contextlib.suppress(OSError):
                    shared.append((os.readlink(f"/proc/{a}/fd/{fa}"), os.readlink(f"/proc/{b}/fd/{fb}")))
    return shared


def workspace(tmp_path: Path, llm_url: str) -> Path:
    ws = tmp_path / "ws"
    init_workspace(ws)
    (ws / "hermes.yaml").write_text(
        "fork_server: true\n"
        f"providers:\n  scripted: {{kind: openai, base_url: '{llm_url}/v1', model: m}}\n"
        "tiers: {cheap: [scripted], standard: [scripted], premium: [scripted]}\n"
        "defaults: {stop_timeout: 5}\n"
        "agents:\n"
        f"  - {{name: alpha, roles: [think], env: {{ALPHA_SECRET: alpha-only, OPENAI_API_KEY: {KEYS['alpha']},"
        " OPENAI_LOG: debug}}\n"
        f"  - {{name: beta, roles: [other], env: {{BETA_SECRET: beta-only, OPENAI_API_KEY: {KEYS['beta']}}}}}\n"
        f"  - {{name: orphaner, roles: [none], command: [{sys.executable}, -c, {json.dumps(ORPHANER)}]}}\n")
    return ws


def test_forked_agents_work_alone_in_their_session_and_cgroup_and_a_killed_one_is_forked_again(
        tmp_path, up, monkeypatch):
    from .llm_server import ScriptedLLM, openai_reply

    monkeypatch.setenv(ENV, "1")
    monkeypatch.setenv("OPENAI_API_KEY", SUPERVISORS_KEY)  # each agent's own overrides it; the server gets none
    with ScriptedLLM() as llm:
        llm.script("openai", openai_reply(tool_calls=[("write_file", {"path": "a.txt", "content": "forked"})]),
                   openai_reply("Written."))
        ws = workspace(tmp_path, llm.url)
        board = Board(ws / "kanban")
        task = board.add({"title": "write a file", "role": "think"})
        sup = up(ws).pid
        done = wait_until(lambda: (d := board.get(task["id"]))["status"] == "done" and d, timeout=30)
        assert done["result"] == {"answer": "Written."}
        assert (ws / "runs/tasks" / task["id"] / "work/a.txt").read_text() == "forked"
        wait_until(lambda: all(agent(ws, n).get("state") == "running" for n in ("alpha", "beta")), timeout=30)
        pids = {name: agent(ws, name)["pid"] for name in ("alpha", "beta")}
        assert {name: [e.get("start") for e in started(ws, name)] for name in pids} == \
            {"alpha": ["fork"], "beta": ["fork"]}
        assert started(ws, "orphaner")[0]["start"] == "exec", "a `command` runtime is exec'd"

        server = server_of(sup)
        assert server is not None
        server_env_ = environ(server)
        assert not any(name.endswith("_API_KEY") or name.endswith("_SECRET") for name in server_env_), server_env_
        server_block = Path(f"/proc/{server}/environ").read_bytes()
        assert not any(key.encode() in server_block for key in (*KEYS.values(), SUPERVISORS_KEY))
        assert server not in {p.pid for p in marked(ws)}, "the fork server is no agent's process"
        assert server not in {a["pid"] for a in supervisor_state(ws)["agents"].values()}
        base = cgroups.base_path(ws)
        for name, pid in pids.items():
            other = "beta" if name == "alpha" else "alpha"
            env = environ(pid)  # what /proc shows is the agent's own environment, marker included
            assert env[f"{name.upper()}_SECRET"] == f"{name}-only" and f"{other.upper()}_SECRET" not in env
            assert env["OPENAI_API_KEY"] == KEYS[name] and ROOM_ENV not in env
            block_ = Path(f"/proc/{pid}/environ").read_bytes()  # not under another name either
            assert KEYS[other].encode() not in block_ and SUPERVISORS_KEY.encode() not in block_
            assert json.loads(env["HERMES_SUP_INSTANCE"])["agent"] == name
            assert psutil.Process(pid).cmdline()[:5] == list(agent_argv(sys.executable))
            assert os.getsid(pid) == pid and psutil.Process(pid).ppid() == sup
            held = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
            assert not any(f"/runs/{other}/" in target for target in held), held
            if base is not None and base.exists():
                assert Path(f"/proc/{pid}/cgroup").read_text().strip().endswith(
                    f"/{cgroups.agent_name(name)}"), "born in its own cgroup"
        assert not shared_kernel_objects(pids["alpha"]) & shared_kernel_objects(pids["beta"])
        assert not shared_kernel_objects(server) & shared_kernel_objects(pids["alpha"])
        # No open file at all in common between the agents, the server (its end of the socketpair,
        # a request's descriptors) and the supervisor (the other end, the notify socket it binds, its
        # own copies of a log): an agent's notify socket is its own, it only sends to the bound path,
        # and its stdin, log and everything else were opened for it alone. So none is allowed, but the
        # agent's board watch, an inotify instance it hands the supervisor to hold (supervisor/held.py).
        for a, b in ((pids["alpha"], pids["beta"]), *((p, other) for p in pids.values() for other in (server, sup))):
            allowed = [("anon_inode:inotify", "anon_inode:inotify")] if b == sup else []
            assert same_open_files(a, b) in ([], allowed), (a, b, same_open_files(a, b))
        logged = (ws / "runs/alpha/agent.log").read_text()
        assert "Sending HTTP Request: POST" in logged, "its own OPENAI_LOG, read again once forked"
        assert KEYS["alpha"] not in logged

        log = ws / "runs/orphaner/agent.log"
        orphan = int(wait_until(lambda: (t := log.read_text()).startswith("orphan") and t.split()[1], timeout=10))
        wait_until(lambda: not psutil.pid_exists(orphan), timeout=5)  # exited and reaped: no zombie left

        os.kill(pids["alpha"], signal.SIGKILL)
        again = wait_until(lambda: (a := agent(ws, "alpha")).get("restarts") == 1 and a["pid"] != pids["alpha"]
                           and a["pid"], timeout=10)  # then it runs (not killed at birth): it says ready
        wait_until(lambda: f"alpha: ready (pid {again}," in (ws / "runs/alpha/agent.log").read_text(), timeout=10)
        assert agent(ws, "alpha")["last_exit"].startswith("killed by SIGKILL"), "its status was the supervisor's"
        assert [e.get("start") for e in started(ws, "alpha")] == ["fork", "fork"]
        assert not zombies(sup)


def test_a_dead_fork_server_costs_only_speed(tmp_path, up, monkeypatch):
    monkeypatch.setenv(ENV, "1")
    ws = workspace(tmp_path, "http://127.0.0.1:9")
    sup = up(ws).pid
    wait_until(lambda: agent(ws, "beta").get("state") == "running", timeout=30)
    server = server_of(sup)
    assert server is not None
    os.kill(server, signal.SIGKILL)
    wait_until(lambda: any("fork server exited" in (e.get("note") or "") for e in events(ws)), timeout=10)
    first = agent(ws, "beta")["pid"]
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: agent(ws, "beta").get("pid") not in (None, first), timeout=10)
    assert [e.get("start") for e in started(ws, "beta")] == ["fork", "exec"]
    wait_until(lambda: (again := server_of(sup)) not in (None, server) and again, timeout=15)
    wait_until(lambda: sum("fork server ready" in (e.get("note") or "") for e in events(ws)) == 2, timeout=15)
    second = agent(ws, "beta")["pid"]
    os.kill(second, signal.SIGKILL)
    wait_until(lambda: len(started(ws, "beta")) == 3, timeout=10)
    assert started(ws, "beta")[-1]["start"] == "fork", "the server came back and forks again"
    again = server_of(sup)
    os.kill(sup, signal.SIGKILL)
    wait_until(lambda: gone(again), timeout=5)  # it dies with the supervisor (PR_SET_PDEATHSIG)


def test_what_is_forked_and_what_the_server_is_given():
    python = sys.executable
    assert enabled({}, {}) is True and enabled({"fork_server": False}, {}) is False, "on unless turned off"
    assert enabled({"fork_server": None}, {}) is True and enabled({"fork_server": True}, {}) is True
    assert enabled({"fork_server": True}, {ENV: "0"}) is False and enabled({}, {ENV: "1"}) is True
    assert reload_note(True, True) == reload_note(False, False) == ""
    assert reload_note(False, True) == "; fork_server is now on in hermes.yaml but stays off until the next `up`"
    env = server_env({"PATH": "/bin", "OPENAI_API_KEY": "k", "HOOK_SECRET": "s", "LC_ALL": "C", "PYTHONPATH": "x"})
    assert set(env) == {"PATH", "LC_ALL", "PYTHONPATH", "PYTHONUNBUFFERED", ROOM_ENV}
    room = (4096, 4096)
    agent_env = {"PATH": "/bin", "LC_ALL": "C", "PYTHONPATH": "x", "PYTHONUNBUFFERED": "1", "OPENAI_API_KEY": "k"}
    assert forkable(agent_argv(python), agent_env, env, python, room)
    assert not forkable((python, "-m", "something"), agent_env, env, python, room), "a command runtime"
    assert not forkable(agent_argv(python), {**agent_env, "PYTHONPATH": "y"}, env, python, room)
    assert not forkable(agent_argv(python), {**agent_env, "LD_PRELOAD": "z"}, env, python, room)
    assert not forkable(agent_argv(python), {**agent_env, "LANG": "de_DE.UTF-8"}, env, python, room)
    assert not forkable(agent_argv(python), {**agent_env, "HOME": "/elsewhere"}, env, python, room), "its site dir"
    assert forkable(agent_argv(python), {**agent_env, "HOMEPAGE": "x"}, env, python, room)
    assert not forkable(agent_argv(python), {**agent_env, "BIG": "x" * 5000}, env, python, room)
    assert preloads({"providers": {"a": {"kind": "anthropic"}, "b": {"kind": "auto"}}}) == ("anthropic",)
    assert preloads({"board": {"backend": "postgres"}}) == ("postgres",) and preloads({}) == ()
    assert block([b"A=1"], 8) == b"A=1\0\0\0\0\0" and block([b"A=1234"], 7) is None
    assert not forkable(agent_argv(python), {**agent_env, "BAD": "a\0b"}, env, python, room), "exec refuses it"


def test_the_servers_nonsense_never_raises_and_a_lost_status_is_no_success():
    import selectors
    import socket

    from hermes_sup.supervisor.forking import LOST_STATUS, Forked, ForkServer

    said: list[str] = []
    server = ForkServer(selectors.DefaultSelector(), said.append)
    deep = b"[" * 2000 + b"]" * 2000
    for reply in (deep, b'{"pid": true}', b'{"pid": "12"}', b"[1]"):
        assert server._answer(reply) is None, reply[:20]
    assert server.deaths == 2 and said[0].endswith("answered nonsense; agents start by exec until it is back")
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server.sock = ours
    server.selector.register(ours, selectors.EVENT_READ)
    for message in (deep, b'{"ready": true, "env_room": [[]]}'):
        theirs.send(message)
        server._on_message()
    assert not server.ready
    theirs.send(b'{"ready": true, "env_room": 10, "argv_room": 10}')
    server._on_message()
    assert server.ready and server.deaths == 2, "ready resets no death count: a fork does"
    server.close()
    theirs.close()
    lost = Forked(os.getpid())
    assert lost.poll() == LOST_STATUS and lost.lost, "not our child: its status is lost, never 0"


def _ask(sock, tmp_path: Path, name: str) -> tuple[int, int, Path]:
    """Ask the server for an agent as the supervisor does: its pid, the go pipe's write end, its log."""
    import socket

    log = tmp_path / name
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    go_read, go_write = os.pipe()
    request = {"argv": list(agent_argv(sys.executable)), "cwd": str(tmp_path), "env_size": 100, "cgroup": False}
    socket.send_fds(sock, [json.dumps(request).encode()], [fd, go_read])
    os.close(fd)
    os.close(go_read)
    return json.loads(sock.recv(4096))["pid"], go_write, log


# Whether a process of the same user without CAP_SYS_PTRACE (as root: that capability dropped from
# the effective set, kept permitted so the capability check still passes) may ptrace each pid: one
# that is not dumpable refuses it (EPERM). The tracer exits at once, which detaches it.
TRACER = r"""
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
if os.geteuid() == 0:
    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]
    header, data = Header(0x20080522, 0), (Data * 2)()
    assert libc.capget(ctypes.byref(header), data) == 0
    data[0].effective &= ~(1 << 19)  # CAP_SYS_PTRACE
    assert libc.capset(ctypes.byref(header), data) == 0, ctypes.get_errno()
PTRACE_SEIZE = 0x4206
print(json.dumps([libc.ptrace(PTRACE_SEIZE, int(pid), 0, 0) == 0 for pid in sys.argv[1:]]))
"""


def traceable_by_its_user(pids: list[int]) -> list[bool]:
    done = subprocess.run([sys.executable, "-c", TRACER, *map(str, pids)], capture_output=True, text=True,
                          timeout=30, check=True)
    return json.loads(done.stdout)


def _memory(pid: int) -> bytes:
    """What `pid` holds in its heap and anonymous mappings (read as its parent or root)."""
    found = []
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            fields = line.split()
            if "r" not in fields[1] or (len(fields) > 5 and fields[5] != "[heap]"):
                continue
            low, high = (int(x, 16) for x in fields[0].split("-"))
            try:
                mem.seek(low)
                found.append(mem.read(high - low))
            except OSError:
                continue
    return b"".join(found)


def test_a_forked_agent_runs_nothing_until_the_supervisor_says_go_and_its_env_never_passes_the_server(
        tmp_path):
    """The server alone, asked as the supervisor asks it: an agent whose pid the supervisor never
    learnt (it gave up on the server) exits before running anything; one told to go gets its
    environment then, from the supervisor, and runs the agent; no key it was given stays in the
    server's memory or in that of an agent forked later; nonsense costs the server nothing."""
    import secrets
    import socket

    from hermes_sup.agents.forkchild import go_message

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server = subprocess.Popen([sys.executable, "-P", "-m", "hermes_sup.agents.forkserver", str(theirs.fileno()),
                               str(os.getpid())], env=server_env(os.environ), pass_fds=[theirs.fileno()])
    theirs.close()
    try:
        assert json.loads(ours.recv(4096))["ready"] is True
        for nonsense in (b"[" * 2000 + b"]" * 2000, b"{}", b'{"argv": ["x"], "cwd": "/", "env_size": true}'):
            socket.send_fds(ours, [nonsense], [0, 1])
            assert "error" in json.loads(ours.recv(4096)), nonsense[:20]
        secret = "sk-" + secrets.token_hex(16)
        results = []
        for go in (b"", go_message({"PATH": os.environ["PATH"], "MINE": "1", "OPENAI_API_KEY": secret})):
            pid, go_write, log = _ask(ours, tmp_path, f"log{len(go)}")
            assert psutil.Process(pid).ppid() == os.getpid(), "reparented to the subreaper (here, the test)"
            expected = sorted([os.devnull, str(log), str(log), f"pipe:[{os.fstat(go_write).st_ino}]"])
            wait_until(lambda p=pid, e=expected: open_files(p) == e, timeout=5)  # the server's closed
            assert os.getsid(pid) == pid
            assert "MINE" not in environ(pid), "its environment comes with go, not before"
            assert traceable_by_its_user([server.pid, pid]) == [False, False], \
                "no process of its user may ptrace the server, nor a forked one before its go (nor so open its pipe)"
            os.write(go_write, go)
            os.close(go_write)
            results.append((os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), log.read_text()))
        assert results[0] == (127, ""), "never told to go: it ran nothing"
        assert results[1][0] == 2 and "started outside a supervisor" in results[1][1], "told to go: the agent ran"
        later, go_write, _log = _ask(ours, tmp_path, "later")
        try:
            for pid in (server.pid, later):
                assert secret.encode() not in _memory(pid), f"the key is in the memory of {pid}"
        finally:
            os.close(go_write)
            os.waitpid(later, 0)
    finally:
        ours.close()
        server.wait(timeout=10)


def test_a_server_that_does_not_answer_is_given_up_and_started_again(monkeypatch, tmp_path):
    """Asked in-process as the supervisor asks it: an agent's key never reaches the server's memory or
    a later agent's; one exiting before go is its own failed start; a stopped server costs the bound,
    then the agent is exec'd (spawn says None), the server is killed and started again later."""
    import secrets
    import selectors

    from hermes_sup.supervisor import forking

    monkeypatch.setattr(forking, "REPLY_WITHIN", 0.2)
    said: list[str] = []
    selector = selectors.DefaultSelector()
    server = forking.ForkServer(selector, said.append)
    server.start(os.environ)
    try:
        while not server.ready:
            for key, _ in selector.select(10):
                key.data()
        stuck = server.pid
        assert stuck is not None
        log = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        secret = "sk-" + secrets.token_hex(16)
        forked = server.spawn(agent_argv(sys.executable), {**env, "OPENAI_API_KEY": secret}, str(tmp_path), log, None)
        assert forked is not None and server.deaths == 0
        assert os.waitstatus_to_exitcode(os.waitpid(forked, 0)[1]) == 2, "the agent ran, outside a supervisor"
        later, go_write, _log = _ask(server.sock, tmp_path, "later")
        try:
            for pid in (stuck, later):  # the key went straight to the agent, never through the server
                assert secret.encode() not in _memory(pid), f"the key is in the memory of {pid}"
        finally:
            os.close(go_write)
            os.waitpid(later, 0)
        gone_cwd = server.spawn(agent_argv(sys.executable), env, str(tmp_path / "missing"), log, None)
        assert gone_cwd is not None and server.proc is not None and server.deaths == 0, \
            "its failed start, not the server's"
        assert os.waitstatus_to_exitcode(os.waitpid(gone_cwd, 0)[1]) == 127
        # (whether it was gone before "go" was written, EPIPE, or after, it is the same failed start)
        assert "FileNotFoundError" in (tmp_path / "log").read_text(), "its log says why"
        nul = {**env, "BAD": "a\0b"}
        assert server.spawn(agent_argv(sys.executable), nul, str(tmp_path), log, None) is None, "exec'd: refused"
        os.kill(stuck, signal.SIGSTOP)
        assert server.spawn(agent_argv(sys.executable), env, str(tmp_path), log, None) is None
        os.close(log)
        assert said[-1] == "supervisor: fork server did not answer within 0.2 s; agents start by exec until it is back"
        assert server.proc is None and gone(stuck) and server.restart_at is not None
        server.due(server.restart_at, os.environ)
        assert server.pid not in (None, stuck), "started again"
    finally:
        server.close()


# Forks two children as the fork server does, after imports that read the environment once (the
# SDKs' log switches, tempfile's folder, the host name, random's state), then gives each its own
# environment and runs what a forked agent runs once it has come (forkfresh.refresh).
REFRESHED = r"""
import ctypes, json, logging, os, random, sys, tempfile, time
import anthropic, openai
from hermes_sup.agents.forkfresh import refresh
from hermes_sup.kanban import Board
tempfile.gettempdir()
board = Board(sys.argv[1])
# The host renamed since the imports (in a UTS namespace of this process's own; root only).
libc = ctypes.CDLL(None, use_errno=True)
renamed = libc.unshare(0x04000000) == 0 and libc.sethostname(b"renamed-host", 12) == 0
children = []
for n in range(2):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.environ.update(TZ=f"ZN{'AB'[n]}-3", OPENAI_LOG="debug", ANTHROPIC_LOG="info", TMPDIR=sys.argv[2 + n])
        refresh()
        drawn = random.random()  # first: the board's work below may draw too
        board.add({"id": f"t{n}", "title": "t", "role": f"r{n}"})
        claim = board.claim(f"a{n}", roles=[f"r{n}"])["claim"]
        os.write(write, json.dumps({
            "tz": time.tzname[0], "tmp": tempfile.gettempdir(), "renamed": renamed, "claimed_on": claim["host"],
            "openai": logging.getLogger("openai").level, "anthropic": logging.getLogger("anthropic").level,
            "random": drawn}).encode())
        os._exit(0)
    os.close(write)
    children.append((pid, read))
out = []
for pid, read in children:
    os.waitpid(pid, 0)
    out.append(json.loads(os.read(read, 4096)))
print(json.dumps({"children": out, "parent": random.random()}))
"""


def test_a_forked_agent_reads_again_what_the_server_read_once(tmp_path):
    import logging
    import socket

    temps = [tmp_path / "tmp0", tmp_path / "tmp1"]
    for temp in temps:
        temp.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("TZ", "OPENAI_LOG", "ANTHROPIC_LOG")}
    done = subprocess.run([sys.executable, "-c", REFRESHED, str(tmp_path / "kanban"), *map(str, temps)],
                          env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    for n, child in enumerate(result["children"]):
        assert child["tz"] == f"ZN{'AB'[n]}" and child["tmp"] == str(temps[n])
        assert child["claimed_on"] == ("renamed-host" if child["renamed"] else socket.gethostname()), \
            "its claims say the host's name now, not at the server's imports"
        assert (child["openai"], child["anthropic"]) == (logging.DEBUG, logging.INFO)
    draws = [child["random"] for child in result["children"]] + [result["parent"]]
    assert len(set(draws)) == 3, "each forked agent draws its own random numbers (os.fork reseeds random)"
