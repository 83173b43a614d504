"""Spare agent processes: forked ahead by the fork server for agents that have been restarted, each
waiting in its agent's other cgroup for the word to become that agent, so that its next restart costs
a write on a pipe, not a fork and its reply (3-5 ms of a restart's 5 on a busy 2-core machine).

A spare is what the fork server makes for any agent (agents/forkchild.py): a process with the agent's
log, working directory and argv, in a session of its own, born in the agent's cgroup that the running
instance is not in (cgroups.agent_cgroups), holding nothing else and running nothing of the agent's
until it is told to go, with its environment (keys included) then, as every forked agent is. It is
our child from birth. Only restarted agents get one (an agent that crashed once is the one likely to
again), SPARE_AFTER after their start, never beside it; it is dropped (its go pipe closed: it exits
without running anything) once its agent is stopped, given up on or removed, and at `down`.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from . import cgroups
from .child import Child
from .forking import ForkServer, forkable, tell_go
from .sessions import open_log

ENV = "HERMES_SUP_SPARES"  # 0: no spares (every restart forks anew), for measuring what they save
SPARE_AFTER = 0.2  # seconds after an agent's start before its spare is forked: not beside its imports
RETRY_AFTER = 5.0  # seconds before a spare that could not be made is tried again
KEPT_FOR = ("starting", "running", "backoff", "stopping")  # an agent in any other state drops its spare


@dataclass
class Spare:
    pid: int
    pidfd: int
    go: int  # the write end of its go pipe
    cgroup: Path | None
    cwd: str
    argv: tuple[str, ...]
    log: tuple[int, int]  # device and inode of the log it writes to: still agent.log when it goes?
    folder: tuple[int, int]  # and of its working directory: still the agent's folder?

    def current(self) -> bool:
        """Whether its log and folder are still its agent's (the agent rotates its log: a spare writing
        to agent.log.1 would hide every line, and keep a removed log on disk)."""
        return (self.log == _file_id(Path(self.cwd) / "agent.log")
                and self.folder == _file_id(Path(self.cwd)))

    def exited(self) -> bool:
        poller = select.poll()  # not select(): the pidfd may be numbered past 1024
        poller.register(self.pidfd, select.POLLIN)
        return bool(poller.poll(0))


def wanted_at(child: Child, has_spare: bool, failed_at: float | None) -> float | None:
    """When `child` should get a spare, or None (pure): a restarted agent of the runtime that is
    running and has none, SPARE_AFTER after it started (RETRY_AFTER after a failed try)."""
    if has_spare or child.restarts == 0 or child.state != "running" or not child.spec.forkable:
        return None
    return max(child.started + SPARE_AFTER, (failed_at or 0.0) + RETRY_AFTER)


def _file_id(path: Path) -> tuple[int, int] | None:
    try:
        info = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return info.st_dev, info.st_ino


class Spares:
    """The spare processes of `forks`' agents, by agent name."""

    def __init__(self, forks: ForkServer, say: Callable[[str], None], environ: Mapping[str, str] = os.environ) -> None:
        self.forks, self.say = forks, say
        self.kept: dict[str, Spare] = {}
        self.failed: dict[str, float] = {}
        self.on = environ.get(ENV, "1") != "0"

    def deadline(self, children: Iterable[Child]) -> float | None:
        if not self.on:
            return None
        times = [at for child in children
                 if (at := wanted_at(child, child.spec.name in self.kept, self.failed.get(child.spec.name)))]
        return min(times, default=None)

    def due(self, now: float, children: Mapping[str, Child], base: Path | None) -> None:
        """Drop the spares of agents that will not start again; make one for each agent whose time has come."""
        for name in [name for name, spare in self.kept.items()
                     if name not in children or children[name].state not in KEPT_FOR or not spare.current()]:
            self.drop(name)
        for child in children.values():
            at = wanted_at(child, child.spec.name in self.kept, self.failed.get(child.spec.name))
            if self.on and at is not None and now >= at:
                self.make(child, base, now)

    def make(self, child: Child, base: Path | None, now: float) -> None:
        spec = child.spec
        if not self.forks.can_fork(spec.argv, None):
            self.failed[spec.name] = now
            return
        where, folder = None, None
        try:
            if base is not None:
                where, folder, procs, _join = cgroups.joiner(cgroups.agent_cgroups(base, spec.name))
                os.close(procs)
                # Never in its agent's own (killed when that exits), nor in one a dying process still holds.
                if where == child.cgroup or cgroups.populated(where):
                    self.failed[spec.name] = now
                    return
            log = open_log(spec.workdir / "agent.log", self.say)
            try:
                info, place = os.fstat(log), os.stat(spec.workdir)
                forked = self.forks.fork(spec.argv, str(spec.workdir), log, folder, 0)
            finally:
                os.close(log)
        except OSError as exc:
            self.say(f"{spec.name}: cannot make a spare process ({exc.strerror or exc}); restarts fork anew")
            self.failed[spec.name] = now
            return
        finally:
            if folder is not None:
                os.close(folder)
        if forked is None:
            self.failed[spec.name] = now
            return
        pid, go = forked
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            os.close(go)  # it reads end of file and exits; reaped as an orphan is
            self.failed[spec.name] = now
            return
        self.failed.pop(spec.name, None)
        self.kept[spec.name] = Spare(pid, pidfd, go, where, str(spec.workdir), tuple(spec.argv),
                                     (info.st_dev, info.st_ino), (place.st_dev, place.st_ino))

    def take(self, name: str, argv: tuple[str, ...], env: Mapping[str, str], cwd: str) -> Spare | None:
        """The spare of agent `name`, if it has one still waiting that can be it with `argv`, `env`
        and `cwd`; one that cannot is dropped."""
        spare = self.kept.pop(name, None)
        if spare is None:
            return None
        server = self.forks
        try:
            usable = ((spare.argv, spare.cwd) == (tuple(argv), cwd) and spare.current() and not spare.exited()
                      and forkable(argv, env, server.env, server.python, server.room))
        except Exception:
            usable = False
        if not usable:
            self._end(spare)
            return None
        os.close(spare.pidfd)
        return spare

    def go(self, spare: Spare, env: Mapping[str, str], say: Callable[[str], None]) -> bool:
        """Tell `spare` to become its agent, with `env`; False if it had exited meanwhile, or did not
        take its go (then it is killed: forking.tell_go)."""
        return tell_go(spare.go, env, spare.pid, say)

    def drop(self, name: str) -> None:
        spare = self.kept.pop(name, None)
        if spare is not None:
            self._end(spare)

    def close(self) -> None:
        for name in list(self.kept):
            self.drop(name)

    @staticmethod
    def _end(spare: Spare) -> None:
        """End it: its go pipe closed (it exits before running anything), and SIGKILL besides (it may be
        stopped). Its exit is reaped with the orphans'."""
        os.close(spare.go)
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(spare.pidfd, signal.SIGKILL)
        os.close(spare.pidfd)
