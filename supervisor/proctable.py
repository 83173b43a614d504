"""The process table read once from /proc: each process's parent, start time, CPU time and resident memory.

`status` of 256 agents asked psutil about each agent several times over (alive? started when? its
CPU, its tree's memory from a scan of every process): about 5,000 file reads, half a second of
its second on a busy 2-core machine. One read of /proc/<pid>/stat per process answers all of it.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import psutil

from ..kanban.liveness import START_TIME_TOLERANCE

TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
_SYS_KCMP = {"x86_64": 312, "aarch64": 272}.get(os.uname().machine)
_KCMP_VM = 1
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    started: float  # seconds since the epoch, as psutil's create_time() computes it
    cpu: float  # user + system seconds
    rss: int  # bytes: the kernel's per-CPU approximate count (statm's, see resident(), is exact)
    zombie: bool


def parse_stat(pid: int, text: str, boot: float) -> Proc | None:
    """A /proc/<pid>/stat line as a Proc (pure); None if it is not one. The command name, in
    parentheses, may hold spaces and parentheses itself: the fields start after the last ')'."""
    try:
        fields = text.rsplit(")", 1)[1].split()
        return Proc(pid=pid, ppid=int(fields[1]), started=boot + int(fields[19]) / TICKS,
                    cpu=(int(fields[11]) + int(fields[12])) / TICKS, rss=int(fields[21]) * PAGE,
                    zombie=fields[0] in ("Z", "X"))
    except (IndexError, ValueError):
        return None


def read(pid: int, boot: float | None = None) -> Proc | None:
    """One process, or None if it is gone. Any other failure (out of descriptors, say) is raised:
    a table missing processes it could not read would undercount an agent's memory."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, ProcessLookupError):
        return None
    try:
        text = os.read(fd, 4096).decode("utf-8", "replace")
    except ProcessLookupError:  # exited between the open and the read
        return None
    finally:
        os.close(fd)
    return parse_stat(pid, text, psutil.boot_time() if boot is None else boot)


def table() -> dict[int, Proc]:
    """Every process that could be read, by pid."""
    boot = psutil.boot_time()
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            proc = read(int(name), boot)
            if proc is not None:
                found[proc.pid] = proc
    return found


def alive(procs: Mapping[int, Proc], pid: object, started: object) -> bool:
    """Whether `pid` is a live (not zombie) process started at `started` (pure; any start time
    when None), as kanban.liveness.holder_alive judges it for this host."""
    proc = procs.get(pid) if isinstance(pid, int) else None
    if proc is None or proc.zombie:
        return False
    return not isinstance(started, (int, float)) or abs(proc.started - started) <= START_TIME_TOLERANCE


def resident(proc: Proc) -> int:
    """A process's exact resident memory in bytes (/proc/PID/statm, read for the processes of the
    trees asked about only); the stat line's approximate count if it is gone meanwhile."""
    try:
        fd = os.open(f"/proc/{proc.pid}/statm", os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, ProcessLookupError):
        return proc.rss
    try:
        return int(os.read(fd, 256).split()[1]) * PAGE
    except (ProcessLookupError, IndexError, ValueError):
        return proc.rss
    finally:
        os.close(fd)


def same_memory(a: int, b: int) -> bool:
    """Whether processes `a` and `b` share one address space (kcmp(2)): an agent and its keeper
    (agents/keeper.py), whose memory is counted once. False when it cannot be told."""
    if _SYS_KCMP is None:
        return False
    return _libc.syscall(_SYS_KCMP, ctypes.c_long(a), ctypes.c_long(b), _KCMP_VM, 0, 0) == 0


def trees_rss_mb(procs: Mapping[int, Proc], pids: Iterable[int], size: Callable[[Proc], int] = resident,
                 shares: Callable[[int, int], bool] = same_memory) -> dict[int, float]:
    """The resident memory of each of `pids` and everything it started, in MB (0 if gone); a process
    sharing its parent's memory (`shares`) adds none. Pure given `size` and `shares`."""
    children: dict[int, list[int]] = {}
    for proc in procs.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    found = {}
    for pid in pids:
        total, stack, seen = 0, [pid] if pid in procs else [], set()
        while stack:
            current = stack.pop()
            if current in seen:
                continue
            seen.add(current)
            if current == pid or not shares(procs[current].ppid, current):
                total += size(procs[current])
            stack += children.get(current, [])
        found[pid] = total / (1 << 20)
    return found
