"""Each agent in a cgroup (v2) of its own where the machine allows it, so that stopping an agent kills
every process it started, even one that left its session with `setsid`; else its session's groups.

The cgroups are created under the supervisor's own cgroup (what a delegated systemd unit or root may
write), one folder per workspace and in it one per agent: <own>/hermes-sup-<ws hash>/<agent>-<hash>.
Nothing needs a controller: only cgroup.procs (to join) and cgroup.kill (to kill, Linux >= 5.14; on an
older kernel the members are killed one by one).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .procs import workspace_key
from .proctable import same_memory

PREFIX = "hermes-sup-"
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
OFF_ENV = "HERMES_SUP_NO_CGROUPS"  # set (to anything but "" or "0") for process groups only


@dataclass(frozen=True)
class Containment:
    mode: str  # "cgroup" or "session"
    base: Path | None  # the workspace's cgroup folder in cgroup mode
    detail: str  # for `doctor` and the supervisor's log


def cgroup2_mount(mountinfo: str) -> Path | None:
    """Where the cgroup v2 hierarchy is mounted, from /proc/self/mountinfo (pure)."""
    for line in mountinfo.splitlines():
        before, sep, after = line.partition(" - ")
        fields = before.split()
        if sep and after.split()[:1] == ["cgroup2"] and len(fields) > 4:
            return Path(fields[4].replace("\\040", " "))
    return None


def cgroup2_options(mountinfo: str) -> set[str]:
    """The cgroup v2 mount's options, the mount's and the filesystem's, from /proc/self/mountinfo (pure)."""
    for line in mountinfo.splitlines():
        before, sep, after = line.partition(" - ")
        fields, theirs = before.split(), after.split()
        if sep and theirs[:1] == ["cgroup2"] and len(fields) > 5:
            return set(fields[5].split(",")) | set((theirs[2] if len(theirs) > 2 else "").split(","))
    return set()


def join_note(options: set[str], kernel: str) -> str:
    """Why each exec'd agent's start is slower than it need be, or "" (pure; `kernel` as os.uname().release
    says it). Moving a process into a cgroup takes a lock whose writers wait for an RCU grace period,
    15-40 ms on a 2-core machine, unless the hierarchy favours such moves: Linux 6.0's favordynmods
    mount option. A forked agent is born in its cgroup (clone3) and moves nowhere, unless the kernel
    refuses clone3 (a seccomp profile)."""
    try:
        major, minor = (int(part) for part in kernel.split(".")[:2])
    except ValueError:
        return ""
    if "favordynmods" in options or (major, minor) < (6, 0):
        return ""
    return ("each agent started by exec (or by the fork server where clone3 is refused) waits about 15 ms "
            "for the kernel as it joins its cgroup; "
            "`mount -o remount,favordynmods <the cgroup2 mount>` (as root) removes that wait")


def own_cgroup(proc_cgroup: str) -> str | None:
    """A process's cgroup v2 path from /proc/<pid>/cgroup (the "0::" line), if it has one (pure)."""
    for line in proc_cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:]
    return None


def base_name(root: Path) -> str:
    return PREFIX + hashlib.sha256(workspace_key(root).encode()).hexdigest()[:12]


def agent_name(agent: str) -> str:
    """A folder name for an agent: readable, safe whatever the agent is called, distinct per name (pure)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", agent)[:40].lstrip(".") or "agent"
    return f"{safe}-{hashlib.sha256(agent.encode()).hexdigest()[:8]}"


def _read(path: str) -> str:
    # Three system calls, not open()'s nine and its buffered text layer: the memory check reads two
    # files per agent every 5 s, most of an idle supervisor's own work besides heartbeats.
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "surrogateescape")


def base_path(root: Path) -> Path | None:
    """Where this process would put the workspace's cgroups (nothing is created), or None."""
    try:
        mount = cgroup2_mount(_read("/proc/self/mountinfo"))
        own = own_cgroup(_read("/proc/self/cgroup"))
    except OSError:
        return None
    return None if mount is None or own is None else mount / own.lstrip("/") / base_name(root)


def detect(root: Path, *, keep: bool = True) -> Containment:
    """Cgroup mode if a cgroup for the workspace's agents can be created here, else session mode and
    why. With keep False (doctor), a folder created only to find out is removed again."""
    if os.environ.get(OFF_ENV, "") not in ("", "0"):
        return Containment("session", None, f"process groups only: ${OFF_ENV} is set")
    try:
        mount = cgroup2_mount(_read("/proc/self/mountinfo"))
        own = own_cgroup(_read("/proc/self/cgroup"))
    except OSError as exc:
        return Containment("session", None, f"process groups only: cannot read /proc: {exc.strerror}")
    if mount is None:
        return Containment("session", None, "process groups only: no cgroup v2 filesystem is mounted")
    if own is None:
        return Containment("session", None, "process groups only: this process is in no cgroup v2")
    parent = mount / own.lstrip("/")
    base = parent / base_name(root)
    existed = base.is_dir()
    try:
        base.mkdir(exist_ok=True)
    except OSError as exc:
        return Containment("session", None,
                           f"process groups only: cannot create a cgroup in {parent} ({exc.strerror}); "
                           "run as root or in a delegated cgroup (systemd Delegate=yes)")
    how = "cgroup.kill" if (base / "cgroup.kill").exists() else "killing its members one by one"
    if not keep and not existed:
        with contextlib.suppress(OSError):
            base.rmdir()
    return Containment("cgroup", base, f"cgroup v2: each agent in a cgroup of its own in {base}, stopped by {how}")


def agent_cgroups(base: Path, agent: str) -> tuple[Path, Path]:
    """The two cgroups an agent's instances take turns in (pure). A killed agent's keeper (agents/keeper.py)
    and what else it left are still dying in one when its replacement starts, and a process cannot
    be born into a cgroup that cgroup.kill was written to (below), so the replacement goes into the
    other. The second's name ends in "-b", which no agent's first ends in (that ends in hex)."""
    first = base / agent_name(agent)
    return first, first.with_name(first.name + "-b")


def joiner(paths: tuple[Path, ...], dead: Path | None = None) -> tuple[Path, int, int, Callable[[], None]]:
    """The first of `paths` that is empty and not `dead` (the cgroup of the instance just exited, whose
    leftovers are killed after the replacement runs: leftovers.exited), made anew, open as a folder
    (what clone3 is born into), its cgroup.procs open, and the preexec function that moves the new
    process into it before it runs anything: so not even its first fork escapes. The caller closes
    both. The function only writes prepared bytes to an open fd: nothing that could wait on a lock
    after fork."""
    # An empty one is made anew: on some kernels (6.18) a process cloned into a cgroup that was ever
    # killed through cgroup.kill is killed at birth (the fork server's clone3; forkclone.py). When none
    # is free, `dead`'s leftovers go first and the first is used, populated or not (the server then
    # forks the slower way).
    path = next((candidate for candidate in paths if candidate != dead and _removed(candidate)), None)
    if path is None:
        if dead is not None:
            kill(dead)
        path = paths[0]
        _removed(path)
    path.mkdir(exist_ok=True)
    folder = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fd = os.open("cgroup.procs", os.O_WRONLY | os.O_CLOEXEC, dir_fd=folder)
    except OSError:
        os.close(folder)
        raise

    def join() -> None:
        os.write(fd, b"0")  # "0": the writing process itself

    return path, folder, fd, join


def _removed(path: Path) -> bool:
    """Remove the cgroup `path` if it is empty: whether it is gone (or never was)."""
    try:
        path.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return not path.is_dir()  # populated, or holding a cgroup someone made in it
    return True


def populated(path: Path) -> bool:
    try:
        return "populated 1" in _read(str(path / "cgroup.events"))
    except OSError:
        return False


def members(path: Path) -> list[int]:
    """The live processes in a cgroup (cgroup.procs also lists the zombies nobody has reaped yet)."""
    try:
        pids = [int(line) for line in _read(str(path / "cgroup.procs")).split()]
    except (OSError, ValueError):
        return []
    return [pid for pid in pids if not _zombie(pid)]


def rss_mb(path: Path) -> float | None:
    """The resident memory of a cgroup's processes, in MB (what the agent's process tree is, and also
    what it started that left the tree), or None when its member list cannot be read; a member
    sharing its parent's address space (an agent's keeper) adds none. A few small reads per member:
    the memory check of 20 agents scanned the whole process table every 5 s otherwise, most of an
    idle supervisor's CPU."""
    try:
        pids = [int(pid) for pid in _read(str(path / "cgroup.procs")).split()]
    except (OSError, ValueError):
        return None
    members, pages = set(pids), 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            # One kcmp at most per member, with its parent: whatever the members, the check stays linear.
            parent = int(_read(f"/proc/{pid}/stat").rsplit(")", 1)[1].split()[1])
            if parent in members and same_memory(parent, pid):
                continue
            pages += int(_read(f"/proc/{pid}/statm").split()[1])  # resident pages; a zombie's are 0
    return pages * PAGE_SIZE / (1 << 20)


def _zombie(pid: int) -> bool:
    try:
        return _read(f"/proc/{pid}/stat").rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True  # gone already


def kill(path: Path) -> None:
    """SIGKILL every process in the cgroup (and, with cgroup.kill, any it is forking right now)."""
    try:
        with open(path / "cgroup.kill", "w") as handle:
            handle.write("1")
        return
    except FileNotFoundError:
        if not path.is_dir():
            return
    except OSError:
        pass
    for _ in range(10):  # a member may fork while we go: look again until none is left
        pids = members(path)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def remove(path: Path, timeout: float = 2.0) -> bool:
    """Remove an agent's (or the workspace's) cgroup once nothing lives in it; False if it stays."""
    deadline = time.monotonic() + timeout
    while True:
        for sub in [p for p in path.iterdir() if p.is_dir()] if path.is_dir() else []:
            with contextlib.suppress(OSError):
                sub.rmdir()
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)


def mount_point() -> Path | None:
    try:
        return cgroup2_mount(_read("/proc/self/mountinfo"))
    except OSError:
        return None


def workspace_cgroups(root: Path) -> set[Path]:
    """The agent cgroups of the workspace at `root` that hold a process, wherever the supervisor that made
    them ran: found from the processes' own /proc/<pid>/cgroup."""
    name = base_name(root)
    mount = mount_point()
    if mount is None:
        return set()
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        where = cgroup_of(int(entry), mount)
        if where is not None and where.parent.name == name:
            found.add(where)
    return found


def cgroup_of(pid: int, mount: Path | None = None) -> Path | None:
    """The cgroup v2 folder a process is in, or None (`mount`: the cgroup2 mount point, if known)."""
    mount = mount or mount_point()
    try:
        own = own_cgroup(_read(f"/proc/{pid}/cgroup"))
    except OSError:
        return None
    return None if mount is None or own is None else mount / own.lstrip("/")
