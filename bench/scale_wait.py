"""Waiting for a drain to finish, giving up once it has stopped moving."""

from __future__ import annotations

import time
from collections.abc import Callable

# No task finished for this long: the drain is stuck (a lost task, a dead worker), not slow.
STALL_TIMEOUT = 300.0


def wait_drained(done: Callable[[], int], count: int, poll: float, what: str,
                 alive: Callable[[], None] | None = None) -> None:
    """Sleep `poll` between looks until done() reaches `count`; RuntimeError once it stalls.
    `alive` raises when what drains has died meanwhile."""
    last, moved = -1, time.monotonic()
    while (now := done()) < count:
        if now != last:
            last, moved = now, time.monotonic()
        elif time.monotonic() - moved > STALL_TIMEOUT:
            raise RuntimeError(f"{what}: {now} of {count} tasks done, none for {STALL_TIMEOUT:g} s")
        if alive is not None:
            alive()
        time.sleep(poll)
