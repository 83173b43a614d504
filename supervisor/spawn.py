"""Starting an agent's process: forked from the fork server where one is ready and the agent runs the
agent runtime, else exec'd; either way in a session of its own and, in cgroup mode, its own cgroup
from its first instruction on (if joining it fails, in its session only, and said so)."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

from . import cgroups
from .child import Child
from .forking import Forked, ForkServer
from .sessions import open_log
from .spares import Spares
from .spec import ChildSpec

Proc = subprocess.Popen[bytes] | Forked


def spawn(spec: ChildSpec, env: dict[str, str], base: Path | None, forks: ForkServer | None,
          say: Callable[[str], None], spares: Spares | None = None,
          dead: Path | None = None) -> tuple[Proc, Path | None]:
    """The agent's new process and its cgroup (None: its session only): its spare where it has one
    waiting (spares.py). `base`: the workspace's cgroup; `dead`: the last instance's (cgroups.joiner)."""
    spare = spares.take(spec.name, spec.argv, env, str(spec.workdir)) if spares is not None else None
    if spare is not None and spares is not None and spares.go(spare, env, say):
        return Forked(spare.pid), spare.cgroup
    fd, folder, join, where = None, None, None, None
    if base is not None:
        try:
            where, folder, fd, join = cgroups.joiner(cgroups.agent_cgroups(base, spec.name), dead)
        except OSError as exc:
            say(f"{spec.name}: cannot use its cgroup ({exc.strerror}); process group only")
            where = None
    try:
        # The agent writes to its own log file, never to a pipe we must drain.
        log = open_log(spec.workdir / "agent.log", say)
        try:
            pid = (forks.spawn(spec.argv, env, str(spec.workdir), log, folder)
                   if forks is not None and spec.forkable else None)
            if pid is not None:
                return Forked(pid), where
            return subprocess.Popen(
                spec.argv, cwd=spec.workdir, env=env, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True, close_fds=True, preexec_fn=join,
            ), where
        finally:
            os.close(log)
    except subprocess.SubprocessError as exc:  # the preexec function failed: nothing was started
        if join is None:
            raise
        say(f"{spec.name}: cannot join its cgroup ({exc}); process group only")
    finally:
        for opened in (fd, folder):
            if opened is not None:
                os.close(opened)
    log = open_log(spec.workdir / "agent.log", say)
    try:
        return subprocess.Popen(spec.argv, cwd=spec.workdir, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True, close_fds=True), None
    finally:
        os.close(log)


def abandon(child: Child, selector: selectors.BaseSelector) -> None:
    """Undo a spawn that failed half-way: a process started without its pidfd would be
    unsupervised, so it goes."""
    if child.pidfd is not None:
        with contextlib.suppress(KeyError, ValueError):
            selector.unregister(child.pidfd)
        os.close(child.pidfd)
        child.pidfd = None
    if child.proc is not None and child.proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.proc.pid, signal.SIGKILL)  # its own session and group, just made
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.proc.wait(timeout=5)
    child.proc = None
