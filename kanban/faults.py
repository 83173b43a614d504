"""A test hook: `HERMES_SUP_FAULT=POINT` (or `POINT:N`) makes a process SIGKILL itself the Nth time
it reaches POINT, so the crash tests can stop the board or an agent between any two steps. Unset,
it costs one string comparison."""

from __future__ import annotations

import os
import signal

FAULT_ENV = "HERMES_SUP_FAULT"
_point, _, _nth = os.environ.get(FAULT_ENV, "").partition(":")
_left = int(_nth or 1)


def fault(point: str) -> None:
    global _left
    if point == _point:
        _left -= 1
        if _left <= 0:
            os.kill(os.getpid(), signal.SIGKILL)
