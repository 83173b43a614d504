"""Shared fixtures. Every process a test starts is killed by the end of the session, and each test's
own subprocesses at its end, so the suite never leaves anything running."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from hermes_sup.kanban import Board

# The session's throw-away PostgreSQL server, for the tests of the shared board (kanban/pg).
from .pgserver import pg_server  # noqa: F401

# The command line as a module, so a test runs the checkout's code whichever `hermes-sup` is on PATH.
CLI = (sys.executable, "-m", "hermes_sup.supervisor")
ROOT = Path(__file__).resolve().parent.parent
WORKERS = Path(__file__).resolve().parent / "workers.py"
PR_SET_CHILD_SUBREAPER = 36


def _become_subreaper() -> None:
    """Orphans of the processes a test starts (agents of a SIGKILLed supervisor, say) are reparented
    to this process instead of init, so the cleanup below still finds and reaps them."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


_become_subreaper()


def _kill_tree(parent: psutil.Process) -> None:
    children = parent.children(recursive=True)
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(children, timeout=5)
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


@pytest.fixture(scope="session", autouse=True)
def no_leftover_processes() -> Iterator[None]:
    yield
    _kill_tree(psutil.Process())


# Variables that would hand a test a provider from outside the suite.
KEY_SUFFIXES = ("_API_KEY",)


@pytest.fixture(autouse=True)
def hermetic(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test, and every process it starts, sees no API key from the machine and lets `auto`
    probe no port: a model server someone runs on 8080, or a key in the shell, must not decide a
    test. A test that wants either sets it (monkeypatch.setenv, HERMES_SUP_AUTO_PORTS=<port>). Nor
    does a key an earlier test registered for redaction."""
    from hermes_sup.agents.keys import AUTO_KEYS
    from hermes_sup.agents.routing import AUTO_PORTS_ENV
    from hermes_sup.kanban import redact

    for name in list(os.environ):
        if name.endswith(KEY_SUFFIXES) or name in AUTO_KEYS:
            monkeypatch.delenv(name)
    monkeypatch.setenv(AUTO_PORTS_ENV, "")
    # The keys a test made this process redact are forgotten with the test (see kanban/redact.py).
    monkeypatch.setattr(redact, "_known", ())


@pytest.fixture
def board(tmp_path: Path) -> Iterator[Board]:
    with Board(tmp_path / "kanban") as b:
        yield b


class Spawner:
    """Starts worker subprocesses (tests/workers.py, or `script`) and kills whatever is left at teardown."""

    def __init__(self, script: Path = WORKERS) -> None:
        self.script = script
        self.procs: list[subprocess.Popen[bytes]] = []

    def __call__(self, *args: str, env: dict[str, str] | None = None, **kwargs) -> subprocess.Popen[bytes]:
        full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
        proc = subprocess.Popen([sys.executable, str(self.script), *args], env=full_env, **kwargs)
        self.procs.append(proc)
        return proc

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)


@pytest.fixture
def spawn() -> Iterator[Spawner]:
    spawner = Spawner()
    yield spawner
    spawner.cleanup()


def wait_until(predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.01,
               longest: float = 0.05) -> object:
    """Poll `predicate` until it is truthy; fail the test at the deadline. The pause between looks
    grows from `interval` to `longest`: three test processes each polling a board or a state file
    100 times a second through a minute-long wait took a core's share from the processes under test."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)
        interval = min(max(interval, longest), interval * 1.5)


def init_workspace(ws: Path, *options: str) -> None:
    """`hermes-sup init` as a test's set-up: the command itself, run in this process. As a process of
    its own it cost a third of a second of CPU each, 300 times a run; `init`'s own tests run it so."""
    from click.testing import CliRunner
    from hermes_sup.supervisor.cli import main

    umask = os.umask(0o022)  # the command narrows the process's umask: this process's is put back
    os.umask(umask)
    try:
        done = CliRunner().invoke(main, ["init", *options, str(ws)])
    finally:
        os.umask(umask)
    assert done.exit_code == 0, (done.output, done.exception)


def stop_process(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """SIGTERM a process still running, SIGKILL it if it has not exited within `timeout`, and reap it."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def open_files(pid: int) -> list[str] | None:
    """What `pid`'s descriptors point at, sorted; None while one closes as they are read (a process
    closing its inherited descriptors, say): ask again."""
    try:
        return sorted(os.readlink(f"/proc/{pid}/fd/{n}") for n in os.listdir(f"/proc/{pid}/fd"))
    except FileNotFoundError:
        return None


def gone(pid: int) -> bool:
    """True once `pid` has exited: an orphan reparented to this subreaper stays a zombie until the
    session's cleanup reaps it, and a zombie runs nothing."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def marked_sleep() -> str:
    """A `sleep` whose command line no other process has: a sandboxed command's `$$` and `$!` are pids
    of its own namespace, so a test finds what it started by this mark (running())."""
    return f"sleep {300 + int.from_bytes(os.urandom(3), 'big') / 1e7:.7f}"


def running(mark: str) -> list[int]:
    """The pids (of this machine) of the live processes whose command line holds `mark`."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        with contextlib.suppress(psutil.Error, TypeError):
            if proc.info["status"] != psutil.STATUS_ZOMBIE and mark in " ".join(proc.info["cmdline"] or ()):
                found.append(proc.pid)
    return found


def supervisor_state(ws: Path) -> dict:
    """runs/supervisor.json, or {} while there is none (or it is being replaced)."""
    try:
        return json.loads((ws / "runs" / "supervisor.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Callable[[Path], subprocess.Popen[str]]]:
    """Start `hermes-sup up` in the foreground for a workspace (its output in tmp_path/up.log); stop
    it, its agents, and whatever a SIGKILLed supervisor left (and its cgroups) after the test."""
    from hermes_sup.supervisor.sweep import sweep

    procs, workspaces = [], []

    def start(ws: Path) -> subprocess.Popen[str]:
        log = open(tmp_path / "up.log", "w")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen([*CLI, "-w", str(ws), "up"], stdout=log,
                                stderr=subprocess.STDOUT, text=True, cwd=ROOT)
        procs.append((proc, log))
        workspaces.append(ws)
        wait_until(lambda: supervisor_state(ws).get("pid") == proc.pid, timeout=30)
        return proc

    yield start
    for proc, log in procs:
        stop_process(proc)
        log.close()
    for ws in workspaces:
        sweep(ws, ws / "runs", 0)
