"""A test hook: `HERMES_SUP_FAULT=POINT` (or `POINT:N`) makes a process SIGKILL itself the Nth time
it reaches POINT, so the crash tests can stop the board or an agent between any two steps. Unset,
it costs one string comparison."""

from __future__ import annotations

import os
import signal

FAULT_ENV = "HERMES_SUP_FAULT"
# Read at the first fault() of this process, not at import: an agent forked from the fork server
# imported this module before it had its environment.
_armed: list[str | int] = []  # [point, calls left]
os.register_at_fork(after_in_child=_armed.clear)


def fault(point: str) -> None:
    if not _armed:
        name, _, nth = os.environ.get(FAULT_ENV, "").partition(":")
        _armed[:] = [name, int(nth or 1)]
    if point == _armed[0]:
        left = int(_armed[1]) - 1
        _armed[1] = left
        if left <= 0:
            os.kill(os.getpid(), signal.SIGKILL)
