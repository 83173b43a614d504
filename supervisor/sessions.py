"""An agent's process as a session: its log descriptor (never a FIFO or a link), its age, and the
process groups of its session, signalled together."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

import psutil


def open_log(path: Path, say: Callable[[str], None]) -> int:
    """A descriptor appending to an agent's log. The agent owns its folder, so what is found there is
    checked: a FIFO would block the loop in open() (or the agent on a full pipe) and a symlink would
    send the output elsewhere; anything but a regular file is set aside and a fresh log begun."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENXIO):  # a symlink; a FIFO nobody reads
            raise
    else:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
        os.close(fd)
    aside = path.with_name(f"{path.name}.suspect-{time.time_ns()}")
    os.rename(path, aside)
    say(f"{path.parent.name}: {path.name} was not a regular file; set aside as {aside.name}")
    return os.open(path, flags | os.O_EXCL, 0o644)


def process_age(pid: int) -> float:
    """Seconds since `pid` started (0 when it cannot be told)."""
    try:
        return max(0.0, time.time() - psutil.Process(pid).create_time())
    except (psutil.Error, OSError):  # OSError: no descriptors left to read /proc
        return 0.0


def session_table() -> dict[int, set[int]]:
    """Every session's process groups, from one pass over /proc ({} when /proc cannot be listed).
    Read once for a signal to many agents: `down` of 256 agents read all of /proc once an agent,
    and its answer came after the CLI had given up waiting (10 s on 2 cores)."""
    table: dict[int, set[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:  # out of descriptors, say: each agent's own group still gets the signal
        return table
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if len(fields) > 4:  # after the name: state, ppid, pgrp, session
            table.setdefault(int(fields[3]), set()).add(int(fields[2]))
    return table


def session_groups(sid: int, table: dict[int, set[int]] | None = None) -> set[int]:
    """The process groups of session `sid`: an agent leads its session, and what it starts in a
    group of its own (a terminal command, a delegated child) stays in that session. `table`: a
    session_table() read for many sessions at once."""
    return {sid} | (session_table() if table is None else table).get(sid, set())


def signal_session(sid: int, signum: int, table: dict[int, set[int]] | None = None) -> None:
    """Signal every process group of an agent's session (the group of the agent itself first)."""
    for group in sorted(session_groups(sid, table), key=lambda g: g != sid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signum)
