"""The supervisor's side of the fork server (agents/forkserver.py): starting and supervising it, asking
it for an agent, and the Popen-like handle of a forked agent. Its death costs nothing but speed:
agents are then started by exec, and it is started again later."""

from __future__ import annotations

import contextlib
import json
import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..agents.forkchild import ROOM_BYTES, ROOM_ENV, block, go_message
from .spec import RUNTIME_ARGS

ENV = "HERMES_SUP_FORK_SERVER"  # 1 or 0: overrides hermes.yaml's fork_server
MAX_REQUEST = 16 * 1024  # bytes: argv and cwd; the server reads up to 1 MiB, the socket sends far less
REPLY_WITHIN = 2.0  # seconds for the server's answer; after that it is taken for dead
GO_WITHIN = 2.0  # seconds a forked agent has to read its go message (microseconds unless it is stopped)
WARM_UP = 10.0  # seconds `up` waits for the server's imports before starting agents by exec
RESTART_FIRST, RESTART_MAX = 1.0, 60.0  # seconds before it is started again, doubling while it dies unready
# What the server's environment keeps of the supervisor's: nothing secret, only what imports may read.
KEPT = frozenset({"PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "VIRTUAL_ENV",
                  "SSL_CERT_FILE", "SSL_CERT_DIR"})
# Variables read when a Python starts (the interpreter's flags and paths, the dynamic loader, the C
# locale), not later: an agent whose own differ from the server's is exec'd. HOME too: Python's start
# finds the user's site-packages (on sys.path) from it.
AT_EXEC = ("PYTHON", "LD_", "LC_", "LANG")
AT_EXEC_NAMES = frozenset({"HOME"})
_PR_SET_CHILD_SUBREAPER = 36
LOST_STATUS = 255  # the exit code of a forked agent whose status was reaped elsewhere (lost)
CLOSE_WITHIN = 5.0  # seconds `close` waits for the killed server


def enabled(config: Mapping[str, Any], environ: Mapping[str, str]) -> bool:
    """hermes.yaml's top-level `fork_server` (default on: only `false` turns it off), overridden by
    $HERMES_SUP_FORK_SERVER (pure)."""
    value = environ.get(ENV, "")
    if value in ("0", "1"):
        return value == "1"
    return config.get("fork_server") is not False


def reload_note(at_up: bool, wanted: bool) -> str:
    """What a reload says when hermes.yaml's fork_server no longer says what `up` read (pure): the
    server is started or ended only by `up` and `down`."""
    if at_up == wanted:
        return ""
    return (f"; fork_server is now {'on' if wanted else 'off'} in hermes.yaml but stays "
            f"{'on' if at_up else 'off'} until the next `up`")


def preloads(config: Mapping[str, Any]) -> tuple[str, ...]:
    """What the fork server imports beyond the runtime (pure): the SDKs of the provider kinds hermes.yaml
    names, and the PostgreSQL board's backend if it is the board. `auto` names no SDK: which one it
    resolves to is the agent's to find out, and it imports that one itself."""
    providers = config.get("providers") or {}
    kinds = {spec.get("kind") for spec in providers.values() if isinstance(spec, Mapping)}
    board = config.get("board")
    backend = board.get("backend") if isinstance(board, Mapping) else None
    board_ = ("postgres",) if backend == "postgres" else ()
    return (*(sdk for sdk in ("openai", "anthropic") if sdk in kinds), *board_)


def agent_argv(python: str) -> tuple[str, ...]:
    return (python, *RUNTIME_ARGS)


def server_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The fork server's environment: the few variables imports may read, none a secret (pure)."""
    env = {k: v for k, v in environ.items() if k in KEPT or k.startswith(("LC_", "PYTHON", "LD_"))}
    # Room in its environment block for an agent's, shown as the agent's /proc/<pid>/environ.
    return {**env, "PYTHONUNBUFFERED": "1", ROOM_ENV: "x" * ROOM_BYTES}


def forkable(argv: Sequence[str], env: Mapping[str, str], server: Mapping[str, str], python: str,
             room: tuple[int, int]) -> bool:
    """Whether an agent with `argv` and `env` can be forked from a server started with `server` (pure):
    the agent runtime's argv, the same variables read at a Python's start, and room to show its own."""
    if tuple(argv) != agent_argv(python):
        return False
    if any("\0" in text for pair in env.items() for text in pair):  # exec refuses it: a failed start
        return False
    names = {k for k in (*env, *server) if (k.startswith(AT_EXEC) or k in AT_EXEC_NAMES) and k != ROOM_ENV}
    if any(env.get(k) != server.get(k) for k in names):
        return False
    return (block([os.fsencode(f"{k}={v}") for k, v in env.items()], room[0]) is not None
            and block([os.fsencode(arg) for arg in argv], room[1]) is not None)


def env_size(env: Mapping[str, str]) -> int:
    """The bytes `env` takes as an environment block, NULs included (pure)."""
    return sum(len(os.fsencode(f"{k}={v}")) + 1 for k, v in env.items())


def become_subreaper() -> bool:
    """Make this process the reaper of its descendants' orphans (forked agents are reparented to it)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def children() -> set[int]:
    """This process's children, from every thread's /proc children list."""
    found: set[int] = set()
    with contextlib.suppress(OSError):
        for task in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError), open(f"/proc/self/task/{task}/children") as handle:
                found.update(int(pid) for pid in handle.read().split())
    return found


def reap_orphans(known: set[int]) -> list[int]:
    """Reap every exited child that is not one of `known` (orphans reparented to this subreaper);
    a known child's status is its handle's to read, never taken here."""
    reaped = []
    for pid in children() - known:
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                reaped.append(pid)
    return reaped


def tell_go(go: int, env: Mapping[str, str], pid: int, say: Callable[[str], None]) -> bool:
    """Tell the process forked as `pid` (our child) to go, with its environment, and close `go`; False
    if it had exited (its log says why: its failed start, not the server's) or did not take the whole
    message within GO_WITHIN, stopped say, with a pipe too small for it (then it is SIGKILLed: the loop
    never waits on a process of the user's)."""
    data = memoryview(go_message(env))
    deadline = time.monotonic() + GO_WITHIN
    poller = select.poll()
    poller.register(go, select.POLLOUT)
    try:
        os.set_blocking(go, False)
        while data:
            try:
                data = data[os.write(go, data):]
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                    say(f"supervisor: the agent forked as pid {pid} did not take its go within {GO_WITHIN:g} s; "
                        "killed")
                    return False
                poller.poll(left * 1000)
        return True
    except BrokenPipeError:
        say(f"supervisor: the agent forked as pid {pid} exited before it was told to go")
        return False
    finally:
        os.close(go)


class Forked:
    """A forked agent as Child.proc uses a Popen: pid, poll(), wait(timeout), returncode."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.lost = False  # its status was reaped elsewhere: returncode is LOST_STATUS, not what it exited with

    def _reap(self, flags: int) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, flags)
            except ChildProcessError:  # reaped elsewhere: its status is lost, so never taken for success
                self.returncode, self.lost = LOST_STATUS, True
            else:
                if pid == self.pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def poll(self) -> int | None:
        return self._reap(os.WNOHANG)

    def wait(self, timeout: float | None = None) -> int:
        if timeout is None:
            code = self._reap(0)
            assert code is not None
            return code
        deadline = time.monotonic() + timeout
        while (code := self.poll()) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(min(0.01, left))
        return code


class ForkServer:
    """The fork server process as the supervisor keeps it: started, ready, asked, lost, started again."""

    def __init__(self, selector: selectors.BaseSelector, say: Callable[[str], None], *,
                 python: str = sys.executable, preloads: tuple[str, ...] = ()) -> None:
        self.selector, self.say, self.python, self.preloads = selector, say, python, preloads
        self.proc: subprocess.Popen[bytes] | None = None
        self.sock: socket.socket | None = None
        self.env: dict[str, str] = {}
        self.ready = False
        self.room = (0, 0)
        self.started = 0.0
        self.restart_at: float | None = None
        self.deaths = 0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self, environ: Mapping[str, str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.env = server_env(environ)
        try:
            self.proc = subprocess.Popen(
                [self.python, "-P", "-m", "hermes_sup.agents.forkserver", str(theirs.fileno()), str(os.getpid()),
                 *self.preloads],
                env=self.env, stdin=subprocess.DEVNULL, pass_fds=[theirs.fileno()], start_new_session=True,
                cwd="/")
        except OSError as exc:
            ours.close()
            self._lost(f"cannot start ({exc.strerror or exc})")
            return
        finally:
            theirs.close()
        self.sock, self.ready, self.started, self.restart_at = ours, False, time.monotonic(), None
        self.selector.register(ours, selectors.EVENT_READ, self._on_message)

    def wanted(self, environ: Mapping[str, str]) -> None:
        """Start it if it never was: only once an agent of the built-in runtime is to start. A team of
        `command` or `runtime:` agents, which it cannot speed up, never pays for its imports (about
        0.7 s of CPU and 50 MB); one lost is started again by `due`, on its backoff."""
        if self.sock is None and self.restart_at is None and self.deaths == 0:
            self.start(environ)

    def warming(self, now: float) -> bool:
        """Whether agents should wait for it a little (it was started, is importing, not for long yet)."""
        return self.sock is not None and not self.ready and now < self.started + WARM_UP

    def deadline(self) -> float | None:
        """When the loop must look at it next: the end of its warm-up (once: a server slower than that
        must not keep the loop awake), or when it is started again."""
        if self.warming(time.monotonic()):
            return self.started + WARM_UP
        return self.restart_at

    def due(self, now: float, environ: Mapping[str, str]) -> None:
        if self.restart_at is not None and now >= self.restart_at:
            self.start(environ)

    def _on_message(self) -> None:
        """What it says unasked: that it is ready, or (end of file) that it is gone."""
        assert self.sock is not None
        try:
            data = self.sock.recv(4096, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError as exc:
            data, why = b"", exc.strerror
        else:
            why = "exited"
        if not data:
            self._lost(why or "exited")
            return
        with contextlib.suppress(Exception):  # RecursionError too: nonsense is ignored, never raised
            message = json.loads(data)
            if message.get("ready"):
                # Its death count is reset by a fork, not here: one dying after ready still backs off.
                self.room = (int(message["env_room"]), int(message["argv_room"]))
                self.ready = True
                self.say(f"supervisor: fork server ready (pid {self.pid})")

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], cwd: str, log: int,
              cgroup: int | None) -> int | None:
        """The pid of the agent it forked, our child; None to start it by exec instead."""
        if not self.can_fork(argv, env):
            return None
        forked = self.fork(argv, cwd, log, cgroup, env_size(env))
        if forked is None:
            return None
        pid, go = forked
        tell_go(go, env, pid, self.say)  # one that exited first is seen exiting: its failed start
        return pid

    def can_fork(self, argv: Sequence[str], env: Mapping[str, str] | None) -> bool:
        """Whether it is ready and an agent of `argv` and `env` (None: not known yet) can be forked from it."""
        return self.sock is not None and self.ready and (
            forkable(argv, env, self.env, self.python, self.room) if env is not None
            else tuple(argv) == agent_argv(self.python))

    def fork(self, argv: Sequence[str], cwd: str, log: int, cgroup: int | None,
             size: int) -> tuple[int, int] | None:
        """A process forked to be an agent (our child, `size` bytes of environment to come), waiting for
        its go: its pid and the write end of its go pipe (tell_go); None to start it by exec instead."""
        # The environment (keys included) never goes to the server: it would stay in its freed memory,
        # which every agent forked later copies. It goes on the go pipe, straight to the agent.
        request = json.dumps({"argv": list(argv), "cwd": cwd, "env_size": size,
                              "cgroup": cgroup is not None}).encode()
        if self.sock is None or len(request) > MAX_REQUEST:
            return None
        # The agent runs nothing until we write "go": one we never learn the pid of reads end of file and exits.
        go_read, go_write = os.pipe2(os.O_CLOEXEC)
        try:
            try:
                socket.send_fds(self.sock, [request], [log, go_read] + ([] if cgroup is None else [cgroup]))
            finally:
                os.close(go_read)
            ready, _, _ = select.select([self.sock], [], [], REPLY_WITHIN)
            pid = self._answer(self.sock.recv(4096) if ready else None)
        except OSError as exc:
            os.close(go_write)
            self._lost(f"cannot be asked ({exc.strerror or exc})")
            return None
        if pid is None:
            os.close(go_write)
            return None
        self.deaths = 0
        return pid, go_write

    def _answer(self, data: bytes | None) -> int | None:
        """The pid in the server's reply, or None (the server then taken for lost, or its error said)."""
        if data is None:
            self._lost(f"did not answer within {REPLY_WITHIN:g} s")
            return None
        try:
            reply = json.loads(data) if data else None
        except Exception:  # RecursionError too (a reply nested too deep): nonsense
            reply = None
        if not isinstance(reply, dict):
            self._lost("exited" if not data else "answered nonsense")
            return None
        pid = reply.get("pid")
        if type(pid) is int and pid > 0:  # not a bool
            return pid
        self.say(f"supervisor: the fork server could not fork an agent ({reply.get('error')}); started by exec")
        return None

    def _lost(self, why: str) -> None:
        """It died or failed: agents start by exec until it is started again, later."""
        self.say(f"supervisor: fork server {why}; agents start by exec until it is back")
        self.close()
        self.deaths += 1
        self.restart_at = time.monotonic() + min(RESTART_MAX, RESTART_FIRST * 2 ** (self.deaths - 1))

    def close(self) -> None:
        """End it (at `down`, or once lost): its socket closed, then SIGKILL if it lingers."""
        if self.sock is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(self.sock)
            self.sock.close()
            self.sock = None
        self.ready = False
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)  # its session and group: a middle process too
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=CLOSE_WITHIN)
            self.proc = None
