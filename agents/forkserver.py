"""The fork server: a process that has imported the agent runtime once and forks agents on request.

The supervisor starts it (`python -P -m hermes_sup.agents.forkserver FD PARENT [PRELOAD...]`) with an
environment holding no secret and one socket (a SOCK_SEQPACKET socketpair end, FD). It imports what
`python -m hermes_sup.agents run` imports, the file board, and what is named (openai, anthropic:
the SDKs an agent imports at its first model call; postgres: that board's backend), says it is
ready, then answers requests: a JSON {argv, cwd, env_size, cgroup} with, as descriptors, the
agent's log, the read end of a pipe the supervisor writes "go" and then the agent's environment to
once it knows the agent's pid (an agent whose pid it never learnt, the server having timed out,
reads end of file and exits before running anything) and, optionally, its cgroup's folder.
The environment never passes through here: freed memory is not wiped, and every agent forked later
is a copy of this process's memory. The agent is cloned as the supervisor's child, born in its cgroup
(forkclone.py); where the kernel refuses that, the server double-forks: the middle process joins the
cgroup (so the agent is born in it), forks the agent and exits at once, and the agent is reparented
to the supervisor (a child subreaper), whose child it then is as if it had been exec'd. The reply is
{"pid": N, "via": "clone3" or "fork"}, once the agent is the supervisor's child (and "killed_at_birth":
the pid of a clone the kernel killed, whose zombie is the supervisor's to reap), or {"error": why}.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import json
import os
import signal
import socket
import sys
import threading

from .forkchild import become_agent, room
from .forkclone import KilledAtBirth, Unsupported, clone, probe

# What `python -m hermes_sup.agents run` imports, and the file board it opens first thing (25 ms of a
# forked agent's start otherwise); the supervisor adds the SDKs its providers need (an agent imports
# one at its first model call; openai takes half a second, anthropic over one) and the PostgreSQL
# board's backend if that is the board.
RUNTIME = ("hermes_sup.kanban.redact", "hermes_sup.agents.worker", "hermes_sup.kanban.board")
PRELOADS = {"openai": "openai", "anthropic": "anthropic", "postgres": "hermes_sup.kanban.pg"}
MAX_REQUEST = 1 << 20
_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4


def _die_with(parent: int) -> None:
    """SIGKILL when the supervisor dies (its thread that started us, the loop's, ends with it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # it died before the prctl: nobody would ever ask us anything
        os._exit(0)


def _undumpable() -> None:
    """No process of the user (an agent) may ptrace this one or write its memory: what it put there
    would run in every agent forked later. Its children inherit it; a forked agent undoes it."""
    if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        os._exit(1)  # refused: better no server (agents are exec'd) than one any agent may take over


def _import_runtime(preloads: list[str]) -> None:
    for name in (*RUNTIME, *(PRELOADS[what] for what in preloads if what in PRELOADS)):
        with contextlib.suppress(ImportError):  # one not installed: the agent imports it (or not) itself
            importlib.import_module(name)


def parse(data: bytes, fds: list[int], env_room: int) -> dict[str, object]:
    """The request in `data`, checked; ValueError says what is wrong with it (pure)."""
    try:
        request = json.loads(data)
    except Exception as exc:  # RecursionError too: a request nested too deep
        raise ValueError(f"not a JSON request ({type(exc).__name__})") from None
    if not isinstance(request, dict):
        raise ValueError("a request is a JSON object")
    argv, cwd, size = request.get("argv"), request.get("cwd"), request.get("env_size")
    if not (isinstance(argv, list) and argv and all(isinstance(arg, str) for arg in argv)):
        raise ValueError("argv must be a list of strings")
    if not isinstance(cwd, str) or type(size) is not int:
        raise ValueError("cwd must be a string and env_size an integer")
    if size >= env_room:
        raise ValueError(f"the agent's environment does not fit in the fork server's ({env_room} bytes)")
    if len(fds) != (3 if request.get("cgroup") else 2):
        raise ValueError(f"{len(fds)} descriptors sent")
    return request


def spawn(request: dict[str, object], fds: list[int], tid_offset: int | None) -> dict[str, object]:
    """Fork the agent of `request`: the reply, once the agent is the supervisor's child. `tid_offset`:
    forkclone.probe's answer."""
    # A thread holding a lock at fork would leave the agent deadlocked on it: there must be none (a
    # native one included, which the threading module does not count).
    if threading.active_count() != 1 or len(os.listdir("/proc/self/task")) != 1:
        raise RuntimeError("the fork server runs a thread: it cannot fork safely")
    log_fd, go_fd, cgroup_fd = fds[0], fds[1], (fds[2] if request.get("cgroup") else None)
    me = os.getpid()
    try:
        agent = clone(cgroup_fd, tid_offset)
    except Unsupported as exc:
        killed = {"killed_at_birth": exc.pid} if isinstance(exc, KilledAtBirth) else {}
        return {"pid": _double_fork(request, log_fd, go_fd, cgroup_fd), "via": "fork", **killed}
    if agent == 0:
        become_agent(request, log_fd, go_fd, parent=me)  # never returns
    return {"pid": agent, "via": "clone3"}


def _double_fork(request: dict[str, object], log_fd: int, go_fd: int, cgroup_fd: int | None) -> int:
    """The agent forked by a middle process that joins its cgroup and exits: its pid, once the middle
    process has been reaped (so the agent has been reparented)."""
    read_end, write_end = os.pipe()
    middle = os.fork()
    if middle == 0:  # the middle process: never returns
        status = 1
        try:
            os.close(read_end)
            if cgroup_fd is not None:
                procs = os.open("cgroup.procs", os.O_WRONLY, dir_fd=cgroup_fd)
                os.write(procs, b"0")  # "0": this process; what it forks is born in the cgroup
                os.close(procs)
            me = os.getpid()
            agent = os.fork()
            if agent == 0:
                become_agent(request, log_fd, go_fd, parent=me)  # never returns
            os.write(write_end, str(agent).encode())
            status = 0
        except BaseException as exc:  # anything: said to the server, never returned from
            try:
                os.write(write_end, b"E" + str(exc).encode(errors="replace")[:500])
            finally:
                os._exit(1)
        os._exit(status)
    os.close(write_end)
    try:
        os.waitpid(middle, 0)
        answer = b""
        while chunk := os.read(read_end, 4096):
            answer += chunk
    finally:
        os.close(read_end)
    if not answer.isdigit():
        raise OSError(answer[1:].decode(errors="replace") or "the middle process died")
    return int(answer)


def serve(sock: socket.socket, tid_offset: int | None) -> int:
    env_room, argv_room = room()
    sock.send(json.dumps({"ready": True, "pid": os.getpid(), "env_room": env_room,
                          "argv_room": argv_room}).encode())
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, MAX_REQUEST, 3)
        except OSError:
            return 0
        if not data:  # the supervisor closed its end: `down`, or it is gone
            return 0
        reply: dict[str, object]
        try:
            reply = spawn(parse(data, fds, env_room), fds, tid_offset)
        except Exception as exc:  # any: one bad request must not end the server
            reply = {"error": str(exc)[:500]}
        finally:
            for fd in fds:
                os.close(fd)
        try:
            sock.send(json.dumps(reply).encode())
        except OSError:
            return 0


def main(argv: list[str]) -> int:
    fd, parent = int(argv[1]), int(argv[2])
    _die_with(parent)
    _undumpable()
    _import_runtime(argv[3:])
    # What the imports made is never collected in an agent: a collection there would walk (and so
    # copy) every page of it, which is about a sixth of each agent's own memory and 5 ms of its start.
    gc.freeze()
    return serve(socket.socket(fileno=fd), probe())


if __name__ == "__main__":
    sys.exit(main(sys.argv))
