"""Which processes belong to a workspace's agents, found by a marker in their environment, and stopping them.

Every agent is started with $HERMES_SUP_INSTANCE (workspace, agent name, a nonce new for each start);
whatever it starts inherits it, so the processes of an agent are found even after the supervisor that
started them crashed before saving their pids, and even when one left the agent's session (`setsid`).
A process is identified by its pid AND its start time, and is only ever signalled through a pidfd opened
after that check, so a reused pid is never signalled.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..kanban.liveness import START_TIME_TOLERANCE, start_time
from . import proctable

MARKER_ENV = "HERMES_SUP_INSTANCE"
# What a scan of /proc can run out of: then it saw only part of the processes, which is not "none".
SHORT_OF = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})


class ScanIncomplete(OSError):
    """/proc could not be read whole (no descriptors or memory left): what was found is not all there is,
    so nothing may be concluded from what was not found. Worth retrying once resources come back."""


def _short(exc: OSError) -> OSError:
    """`exc` as a ScanIncomplete if it means running out of something, else unchanged."""
    if isinstance(exc, ScanIncomplete) or exc.errno not in SHORT_OF:
        return exc
    return ScanIncomplete(exc.errno, exc.strerror, exc.filename)


def _start_time(pid: int) -> float | None:
    """start_time, with a lack of descriptors said as ScanIncomplete rather than any other OSError."""
    try:
        return start_time(pid)
    except OSError as exc:
        raise _short(exc) from None


@dataclass(frozen=True)
class Marker:
    workspace: str
    agent: str
    nonce: str


@dataclass(frozen=True)
class Marked:
    """A live process carrying a marker, identified by pid and start time."""

    pid: int
    started: float
    marker: Marker


def workspace_key(root: Path) -> str:
    """The workspace as markers name it: resolved, so a symlinked path finds the same agents."""
    return str(Path(root).resolve())


def new_marker(root: Path, agent: str) -> Marker:
    return Marker(workspace_key(root), agent, os.urandom(8).hex())


def marker_value(marker: Marker) -> str:
    return json.dumps({"ws": marker.workspace, "agent": marker.agent, "nonce": marker.nonce}, sort_keys=True)


def parse_environ(environ: bytes) -> Marker | None:
    """The marker in a process's environment block (NUL-separated KEY=VALUE), if any (pure)."""
    prefix = MARKER_ENV.encode() + b"="
    for entry in environ.split(b"\0"):
        if entry.startswith(prefix):
            try:
                data = json.loads(entry[len(prefix):])
                return Marker(str(data["ws"]), str(data["agent"]), str(data["nonce"]))
            except (ValueError, KeyError, TypeError):
                return None
    return None


def read_marker(pid: int) -> Marker | None:
    """The marker a process was started with (its environment at exec; what it does to os.environ later
    does not matter). None for a process of another user we may not read, a zombie, or no marker;
    ScanIncomplete if it could not be read for want of descriptors (it may well carry one)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return parse_environ(handle.read())
    except OSError as exc:
        if exc.errno in SHORT_OF:
            raise _short(exc) from None
        return None


def environ_names(pid: int) -> frozenset[str] | None:
    """The names of the variables a process was started with; None when they cannot be read."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            block = handle.read()
    except OSError:
        return None
    return frozenset(entry.split(b"=", 1)[0].decode(errors="replace") for entry in block.split(b"\0") if entry)


def marked(root: Path) -> list[Marked]:
    """Every live process (but this one) carrying a marker of the workspace at `root`. ScanIncomplete
    (an OSError) when /proc could not be read whole: an empty answer then would be a lie."""
    key = workspace_key(root)
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError as exc:
        raise _short(exc) from None
    for entry in entries:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        pid = int(entry)
        marker = read_marker(pid)
        if marker is None or marker.workspace != key:
            continue
        started = _start_time(pid)
        if started:  # None: gone already; 0.0: not ours to read
            found.append(Marked(pid, started, marker))
    return found


def strays(found: Iterable[Marked], keep: set[str], agent: str | None = None) -> list[Marked]:
    """The marked processes whose agent instance (nonce) is not one to keep, of one agent or all (pure)."""
    return [p for p in found if p.marker.nonce not in keep and (agent is None or p.marker.agent == agent)]


def is_agent_process(pid: int, started: float | None, root: Path, agent: str) -> Marker | None:
    """The marker of `pid` if it is still the process started at `started` and belongs to `agent` of the
    workspace at `root`; None otherwise (gone, a reused pid, or not one of ours). ScanIncomplete if
    that cannot be told for want of descriptors."""
    if started is None:
        return None
    actual = _start_time(pid)
    if not actual or abs(actual - started) > START_TIME_TOLERANCE:
        return None
    marker = read_marker(pid)
    if marker is None or marker.workspace != workspace_key(root) or marker.agent != agent:
        return None
    return marker


def _open(proc: Marked) -> int | None:
    """A pidfd for `proc` if the pid still names that very process (checked after the open, so the
    pidfd cannot point at a newer process reusing the pid)."""
    try:
        fd = os.pidfd_open(proc.pid)
    except OSError:
        return None
    actual = start_time(proc.pid)
    if not actual or abs(actual - proc.started) > START_TIME_TOLERANCE:
        os.close(fd)
        return None
    return fd


def _exited(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def _wait(fds: list[int], timeout: float) -> None:
    """Until every process has exited or `timeout` passed. A pidfd turns readable once its process
    has exited (a zombie of its parent is enough), and stays so."""
    deadline = time.monotonic() + timeout
    while (pending := [fd for fd in fds if not _exited(fd)]) and (left := deadline - time.monotonic()) > 0:
        select.select(pending, [], [], min(left, 0.5))


def stop_all(procs: Iterable[Marked], timeout: float) -> int:
    """SIGTERM each process, SIGKILL those still there after `timeout` (0: SIGKILL at once); returns
    how many were signalled. Waits (bounded) until they have exited. Those it could not open for want
    of descriptors are left alone, and ScanIncomplete says so once the others were dealt with."""
    fds: list[int] = []
    short: ScanIncomplete | None = None
    for proc in procs:
        try:
            fd = _open(proc)
        except ScanIncomplete as exc:
            short = exc
            continue
        if fd is not None:
            fds.append(fd)
    try:
        first = signal.SIGKILL if timeout <= 0 else signal.SIGTERM
        for fd in fds:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                signal.pidfd_send_signal(fd, first)
        _wait(fds, timeout)
        for fd in fds:
            if not _exited(fd):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
        _wait(fds, 5.0)
    finally:
        for fd in fds:
            os.close(fd)
    if short is not None:
        raise short
    return len(fds)


def tree_rss_mb(pid: int) -> float:
    """The resident memory of a process and everything it started, in MB (0 if it is gone)."""
    return trees_rss_mb([pid])[pid]


def trees_rss_mb(pids: Iterable[int]) -> dict[int, float]:
    """tree_rss_mb of each of `pids`, from one read of the process table: psutil's children() scans
    it once per call, and `status` of 256 agents took 6.6 s so (the supervisor's memory check too)."""
    return proctable.trees_rss_mb(proctable.table(), pids)
