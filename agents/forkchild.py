"""A process forked by the fork server made into the agent a fresh `python -m hermes_sup.agents run` would be.

Before any agent code runs it leads a session of its own, has the log as stdout and stderr and
/dev/null as stdin, the agent's working directory and environment, no other descriptor, the default
signal mask, and the supervisor as its parent; once its environment has come, what a Python reads
once at its start is read again from it (forkfresh.py). Its environment comes from the supervisor on the go
pipe, after the go byte, never through the server (whose freed heap every later agent would inherit).
It is also written over the block the kernel shows as /proc/<pid>/environ (and its argv over
/proc/<pid>/cmdline): the supervisor finds an agent's processes by the marker there, and a forked
process would otherwise show the server's.
"""

from __future__ import annotations

import atexit
import ctypes
import io
import json
import os
import runpy
import signal
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from typing import Any, NoReturn

from .forkfresh import dumpable, refresh

# The variable the supervisor gives the fork server to make its environment block large enough to
# hold an agent's environment once written over it (/proc/<pid>/environ shows that block).
ROOM_ENV = "HERMES_SUP_FORK_ROOM"
ROOM_BYTES = 64 * 1024
REPARENT_WAIT = 5.0  # seconds: the middle process exits at once, so this is only ever a bound
GO = b"1"
LENGTH_BYTES = 4  # the encoded environment's length after the go byte, big-endian


def go_message(env: Mapping[str, str]) -> bytes:
    """What the supervisor writes on the go pipe: the go byte, then the agent's environment (pure)."""
    data = json.dumps(dict(env)).encode()
    return GO + len(data).to_bytes(LENGTH_BYTES, "big") + data


def _read_exactly(fd: int, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            raise EOFError("the go pipe ended early")
        data += chunk
    return data


def _blocks() -> tuple[int, int, int, int]:
    """arg_start, arg_end, env_start, env_end of this process (proc(5) /proc/self/stat fields 48-51)."""
    with open("/proc/self/stat", "rb") as handle:
        fields = handle.read().rsplit(b")", 1)[1].split()
    return int(fields[45]), int(fields[46]), int(fields[47]), int(fields[48])


def room() -> tuple[int, int]:
    """How many bytes of environment and of argv (NULs included) a forked agent can show."""
    arg_start, arg_end, env_start, env_end = _blocks()
    return env_end - env_start, arg_end - arg_start


def block(entries: list[bytes], size: int) -> bytes | None:
    """`entries` NUL-terminated, padded with NULs to `size`; None if they do not fit (pure)."""
    data = b"".join(entry + b"\0" for entry in entries)
    return data.ljust(size, b"\0") if len(data) < size else None


def _show(what: str, entries: list[bytes]) -> None:
    """Write `entries` over the block the kernel shows for this process's "environment" or "argv"."""
    arg_start, arg_end, env_start, env_end = _blocks()
    start, end = (env_start, env_end) if what == "environment" else (arg_start, arg_end)
    data = block(entries, end - start)
    if data is None:
        raise OSError(f"the agent's {what} does not fit in the fork server's ({end - start} bytes)")
    ctypes.memmove(start, data, len(data))


def _stream(fd: int, errors: str) -> io.TextIOWrapper:
    """Unbuffered text on `fd`, as PYTHONUNBUFFERED=1 makes sys.stdout and sys.stderr."""
    raw = io.FileIO(fd, "w", closefd=False)
    return io.TextIOWrapper(raw, encoding=sys.__stdout__.encoding if sys.__stdout__ else "utf-8",
                            errors=errors, write_through=True)


def _exit_code(code: Any) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def become_agent(request: dict[str, Any], log_fd: int, go_fd: int, *, parent: int) -> NoReturn:
    """Make this process the agent of `request` and run it once the supervisor says go (it knows our
    pid then); never returns (os._exit with its status)."""
    try:
        argv = [str(arg) for arg in request["argv"]]
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.chdir(str(request["cwd"]))
        _show("argv", [os.fsencode(arg) for arg in argv])  # at once: until then it looks like the server
        # Nothing of the server's is kept (its socket, its pipe to the middle process, whose end of
        # file its reply waits for), then the supervisor's word is awaited.
        os.closerange(3, go_fd)
        os.closerange(go_fd + 1, os.sysconf("SC_OPEN_MAX"))
        if os.read(go_fd, 1) != GO:  # the supervisor gave up on this request: nobody would supervise us
            os._exit(127)
        size = int.from_bytes(_read_exactly(go_fd, LENGTH_BYTES), "big")
        env = {str(k): str(v) for k, v in json.loads(_read_exactly(go_fd, size)).items()}
        os.close(go_fd)
        # Only now, as exec makes a process: until its go has been read, no process of the user may
        # open its go pipe through /proc (to read the keys, or fill it) or ptrace it; a spare waits
        # long (supervisor/spares.py). /proc shows it as root's until then.
        dumpable()
        os.environ.clear()
        os.environ.update(env)
        _show("environment", [os.fsencode(f"{k}={v}") for k, v in env.items()])
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        # The server installs no handler, so every disposition is a fresh interpreter's already.
        deadline = time.monotonic() + REPARENT_WAIT
        while os.getppid() == parent:  # the middle process is exiting: then we are the supervisor's
            if time.monotonic() > deadline:
                os._exit(127)
            time.sleep(0.0002)
        sys.stdout = sys.__stdout__ = _stream(1, "strict")
        sys.stderr = sys.__stderr__ = _stream(2, "backslashreplace")
        sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
        sys.argv = [argv[0], *argv[4:]]  # python -P -m hermes_sup.agents run: ["<...>/__main__.py", "run"]
        refresh()
    except BaseException:  # nothing of the agent ran: say why in its log, and never return to the server
        try:
            traceback.print_exc()
        finally:
            os._exit(127)
    os._exit(_run())


def _run() -> int:
    """Run the agent as `python -m hermes_sup.agents` would, and end as the interpreter would."""
    try:
        runpy.run_module("hermes_sup.agents", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        code = 130
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # what the interpreter does at exit: join threads
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
    except BaseException:
        traceback.print_exc()
    return code
