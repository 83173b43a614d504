"""Is a claim's holder still alive? A pid alone is not an identity: pids are reused, so a holder
is the pair (pid, process start time) on a named host, checked with psutil.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping
from typing import Any

import psutil

from .rules import lease_expired

# Read by attribute (liveness.HOST), never imported by name: a forked agent sets its own (agents/forkfresh.py).
HOST = socket.gethostname()
# psutil derives the start time from clock ticks since boot, so the same process reads the same
# value each time; a small tolerance absorbs float rounding only.
START_TIME_TOLERANCE = 0.05


def start_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, ValueError):
        return None
    except psutil.AccessDenied:
        return 0.0


def holder_alive(pid: int, started: float | None, host: str | None) -> bool | None:
    """True or False for a holder on this host; None when it runs elsewhere (only its lease tells)."""
    if host and host != HOST:
        return None
    actual = start_time(pid)
    if actual is None:
        return False
    if started is None or actual == 0.0:
        return True
    if abs(actual - started) > START_TIME_TOLERANCE:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def stale_reason(
    claim: Mapping[str, Any] | None,
    now: float,
    alive: Callable[[int, float | None, str | None], bool | None] = holder_alive,
) -> str | None:
    """Why a claim must be recovered, or None if it stands. Pure given `alive`."""
    if not claim:
        return "task is in doing/ without a claim"
    pid = claim.get("pid")
    if isinstance(pid, int) and alive(pid, claim.get("pid_started"), claim.get("host")) is False:
        return f"holder {claim.get('agent')} (pid {pid}) is gone"
    if lease_expired(claim, now):
        return f"lease of {claim.get('agent')} expired"
    return None
