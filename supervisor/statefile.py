"""State files (supervisor.json, each agent's state.json): written without a failed write ever stopping
the supervision, and read without a hostile one ever crashing or blocking the reader.

A full disk (or a read-only remount, or a quota) must not kill the supervisor: the agents still
need it. A failed write is said once, retried on a timer, and its recovery is said once too.
Anything in runs/ may have been rewritten by an agent (it runs as the same user): a file is read
only if it is a regular file of a bounded size, and JSON too deep or too long is no state at all.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..kanban.fsio import write_json_atomic
from ..kanban.liveness import holder_alive

SUPERVISOR_FILE = "supervisor.json"  # in runs/: the supervisor's pid, start time and its agents
RETRY_EVERY = 2.0  # seconds between attempts while writes fail
# A change that is only an agent's current task (it took one, it finished one) is written at most
# this often: in a drain each task's start and end rewrote the whole file twice, most of the
# supervisor's CPU; anything else (a start, an exit, a state) is still written at once.
TASK_WRITE_EVERY = 0.25
STATE_MAX = 1 << 20  # a state file is a few KiB; a delegating agent's, with its children, well under this


def read_state(path: Path, limit: int = STATE_MAX) -> Any:
    """The JSON document in a state file; None if it is missing or unusable: a symlink (not followed:
    one to /dev/zero never ends), not a regular file (a FIFO would block the reader), over `limit`
    bytes, or not JSON (nested too deep, a number too long, not UTF-8)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            data = handle.read(limit + 1)
        except OSError:
            return None
    if len(data) > limit:
        return None
    try:
        return json.loads(data)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None


def task_write_at(written_at: float, now: float, every: float = TASK_WRITE_EVERY) -> float:
    """When a change that is only an agent's current task may be written (pure; monotonic times): at
    once if the file was last written `every` seconds ago or longer, else that long after it."""
    return max(now, written_at + every)


class StateWriter:
    def __init__(self, path: Path, say: Callable[[str], None], *, retry_every: float = RETRY_EVERY) -> None:
        self.path = path
        self.say = say
        self.retry_every = retry_every
        self.failing = False
        self.retry_at: float | None = None  # when a failed write may be tried again
        self.written_at = float("-inf")  # when the last write succeeded (monotonic)

    def due(self, now: float) -> bool:
        """Whether a pending write may be tried now (at once normally, on the timer while failing)."""
        return self.retry_at is None or now >= self.retry_at

    def write(self, doc: dict[str, Any], now: float) -> bool:
        """Write `doc` atomically; False (said once per failing stretch) if the disk refused."""
        try:
            write_json_atomic(self.path, doc, fsync=False)
        except OSError as exc:
            self.retry_at = now + self.retry_every
            if not self.failing:
                self.failing = True
                self.say(f"supervisor: cannot write {self.path.name} ({exc.strerror or exc}); the agents are still "
                         f"supervised, retrying every {self.retry_every:g} s")
            return False
        self.retry_at = None
        self.written_at = now
        if self.failing:
            self.failing = False
            self.say(f"supervisor: writing {self.path.name} works again")
        return True


def quiet(say: Callable[[str], None]) -> Callable[[str], None]:
    """`say` that never raises: the supervisor's own log may be on the disk that just filled up, and
    a line is never worth the supervision (whatever the console does with it)."""

    def said(line: str) -> None:
        with contextlib.suppress(Exception):
            say(line)

    return said


def supervisor_alive(state: dict[str, Any]) -> bool:
    """The process supervisor.json names still runs: its pid AND start time (without a start time a pid
    names nothing: `down` would signal whatever process reuses it)."""
    pid, started = state.get("pid"), state.get("pid_started")
    if not isinstance(pid, int) or pid <= 0 or not isinstance(started, (int, float)) or not started:
        return False
    return holder_alive(pid, started, None) is True
