"""The fork server with real processes: agents forked from it work a task end to end, each holding
only its own environment and descriptors, in its own session and cgroup; a SIGKILLed one is restarted
by a fork again; the server holds no key, is no agent, and its death costs nothing but speed; an orphan
reparented to the supervisor is reaped."""

from __future__ import annotations

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
from hermes_sup.supervisor.forking import ENV, agent_argv, enabled, forkable, sdks, server_env
from hermes_sup.supervisor.procs import marked

from .conftest import CLI, ROOT, gone, supervisor_state, wait_until

# A `command` agent whose child leaves an orphan behind (reparented to the supervisor, a subreaper)
# that exits a moment later: its zombie is the supervisor's to reap.
ORPHANER = ("import os, time\n"
            "if os.fork() == 0:\n"
            "    orphan = os.fork()\n"
            "    if orphan == 0:\n"
            "        time.sleep(0.3); os._exit(0)\n"
            "    print('orphan', orphan, flush=True); os._exit(0)\n"
            "os.wait(); time.sleep(300)\n")


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
        if "hermes_sup.agents.forkserver" in child.cmdline():
            return child.pid
    return None


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


def workspace(tmp_path: Path, llm_url: str) -> Path:
    ws = tmp_path / "ws"
    subprocess.run([*CLI, "init", str(ws)], check=True, capture_output=True, cwd=ROOT)
    (ws / "hermes.yaml").write_text(
        "fork_server: true\n"
        f"providers:\n  scripted: {{kind: openai, base_url: '{llm_url}/v1', model: m}}\n"
        "tiers: {cheap: [scripted], standard: [scripted], premium: [scripted]}\n"
        "defaults: {stop_timeout: 5}\n"
        "agents:\n"
        "  - {name: alpha, roles: [think], env: {ALPHA_SECRET: alpha-only}}\n"
        "  - {name: beta, roles: [other], env: {BETA_SECRET: beta-only}}\n"
        f"  - {{name: orphaner, roles: [none], command: [{sys.executable}, -c, {json.dumps(ORPHANER)}]}}\n")
    return ws


def test_forked_agents_work_alone_in_their_session_and_cgroup_and_a_killed_one_is_forked_again(
        tmp_path, up, monkeypatch):
    from .llm_server import ScriptedLLM, openai_reply

    monkeypatch.setenv(ENV, "1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-supervisors-key")  # the agents get it; the fork server must not
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
        assert server not in {p.pid for p in marked(ws)}, "the fork server is no agent's process"
        assert server not in {a["pid"] for a in supervisor_state(ws)["agents"].values()}
        base = cgroups.base_path(ws)
        for name, pid in pids.items():
            other = "beta" if name == "alpha" else "alpha"
            env = environ(pid)  # what /proc shows is the agent's own environment, marker included
            assert env[f"{name.upper()}_SECRET"] == f"{name}-only" and f"{other.upper()}_SECRET" not in env
            assert env["OPENAI_API_KEY"] == "sk-supervisors-key" and ROOM_ENV not in env
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

        log = ws / "runs/orphaner/agent.log"
        orphan = int(wait_until(lambda: (t := log.read_text()).startswith("orphan") and t.split()[1], timeout=10))
        wait_until(lambda: not psutil.pid_exists(orphan), timeout=5)  # exited and reaped: no zombie left

        os.kill(pids["alpha"], signal.SIGKILL)
        wait_until(lambda: agent(ws, "alpha").get("restarts") == 1 and agent(ws, "alpha")["pid"] != pids["alpha"],
                   timeout=10)
        assert agent(ws, "alpha")["last_exit"].startswith("killed by SIGKILL"), "its status was the supervisor's"
        assert [e.get("start") for e in started(ws, "alpha")] == ["fork", "fork"]
        assert not [p for p in psutil.Process(sup).children() if p.status() == psutil.STATUS_ZOMBIE]


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
    assert enabled({}, {}) is False and enabled({"fork_server": True}, {}) is True
    assert enabled({"fork_server": True}, {ENV: "0"}) is False and enabled({}, {ENV: "1"}) is True
    env = server_env({"PATH": "/bin", "OPENAI_API_KEY": "k", "HOOK_SECRET": "s", "LC_ALL": "C", "PYTHONPATH": "x"})
    assert set(env) == {"PATH", "LC_ALL", "PYTHONPATH", "PYTHONUNBUFFERED", ROOM_ENV}
    room = (4096, 4096)
    agent_env = {"PATH": "/bin", "LC_ALL": "C", "PYTHONPATH": "x", "PYTHONUNBUFFERED": "1", "OPENAI_API_KEY": "k"}
    assert forkable(agent_argv(python), agent_env, env, python, room)
    assert not forkable((python, "-m", "something"), agent_env, env, python, room), "a command runtime"
    assert not forkable(agent_argv(python), {**agent_env, "PYTHONPATH": "y"}, env, python, room)
    assert not forkable(agent_argv(python), {**agent_env, "LD_PRELOAD": "z"}, env, python, room)
    assert not forkable(agent_argv(python), {**agent_env, "LANG": "de_DE.UTF-8"}, env, python, room)
    assert not forkable(agent_argv(python), {**agent_env, "BIG": "x" * 5000}, env, python, room)
    assert sdks({"providers": {"a": {"kind": "anthropic"}, "b": {"kind": "auto"}}}) == ("anthropic",)
    assert sdks({}) == ()
    assert block([b"A=1"], 8) == b"A=1\0\0\0\0\0" and block([b"A=1234"], 7) is None


def test_a_forked_agent_runs_nothing_until_the_supervisor_says_go(tmp_path):
    """The server alone, asked as the supervisor asks it: an agent whose pid the supervisor never
    learnt (it gave up on the server) exits before running anything; one told to go runs the agent."""
    import socket

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server = subprocess.Popen([sys.executable, "-P", "-m", "hermes_sup.agents.forkserver", str(theirs.fileno()),
                               str(os.getpid())], env=server_env(os.environ), pass_fds=[theirs.fileno()])
    theirs.close()
    try:
        assert json.loads(ours.recv(4096))["ready"] is True
        results = []
        for go in (b"", b"1"):
            log = tmp_path / f"log{len(go)}"
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            go_read, go_write = os.pipe()
            request = {"argv": list(agent_argv(sys.executable)), "env": {"PATH": os.environ["PATH"], "MINE": "1"},
                       "cwd": str(tmp_path), "cgroup": False}
            socket.send_fds(ours, [json.dumps(request).encode()], [fd, go_read])
            os.close(fd)
            os.close(go_read)
            pid = json.loads(ours.recv(4096))["pid"]
            assert psutil.Process(pid).ppid() == os.getpid(), "reparented to the subreaper (here, the test)"
            wait_until(lambda p=pid: environ(p).get("MINE") == "1", timeout=5)
            held = sorted(os.readlink(f"/proc/{pid}/fd/{n}") for n in os.listdir(f"/proc/{pid}/fd"))
            assert held == sorted([os.devnull, str(log), str(log), f"pipe:[{os.fstat(go_write).st_ino}]"]), held
            assert os.getsid(pid) == pid
            os.write(go_write, go)
            os.close(go_write)
            results.append((os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), log.read_text()))
        assert results[0] == (127, ""), "never told to go: it ran nothing"
        assert results[1][0] == 2 and "started outside a supervisor" in results[1][1], "told to go: the agent ran"
    finally:
        ours.close()
        server.wait(timeout=10)


def test_a_server_that_does_not_answer_is_given_up_and_started_again(monkeypatch, tmp_path):
    """Asked in-process as the supervisor asks it: a stopped server costs the bound, then the agent is
    exec'd (spawn says None), the server is killed and started again later."""
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
        os.kill(stuck, signal.SIGSTOP)
        log = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        assert server.spawn(agent_argv(sys.executable), env, str(tmp_path), log, None) is None
        os.close(log)
        assert said[-1] == "supervisor: fork server did not answer within 0.2 s; agents start by exec until it is back"
        assert server.proc is None and gone(stuck) and server.restart_at is not None
        server.due(server.restart_at, os.environ)
        assert server.pid not in (None, stuck), "started again"
    finally:
        server.close()
