"""The wait-for-work loop every backend runs: look after the board, claim, else sleep until a change or the next look.

The decisions (is recovery due, how long to sleep) are pure functions; the loop gets the backend's
I/O as callables, so the file board and the PostgreSQL board wait by the same rules.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from .errors import BoardError

TaskDoc = dict[str, Any]

# How often a waiting claimer takes back dead claims (each backend's `recover`).
RECOVER_INTERVAL = 2.0
# A waiter whose looks keep finding nothing lets changes gather before its next look: from this
# long after its first fruitless look, doubling, to at most LOOK_BACKOFF_MAX (look_delay).
LOOK_BACKOFF_FIRST = 0.002
LOOK_BACKOFF_MAX = 0.1


class Wakeable(Protocol):
    """What a waiter sleeps on: a generation that grows with every change (watch.ChangeSignal, pg's Listener)."""

    generation: int

    def wait(self, seen: int, timeout: float) -> Any: ...


def recover_due(last_recover: float, now: float, interval: float = RECOVER_INTERVAL) -> bool:
    """Whether a waiting claimer recovers dead claims this round (pure; monotonic times)."""
    return now - last_recover >= interval


def look_delay(fruitless: int) -> float:
    """How long a waiter woken by a change waits before it looks, after `fruitless` looks in a row
    that claimed nothing (pure). 64 waiting agents each looked at every task arriving, all but one
    in vain, and on 2 cores that took the time the ingest of the next ones needed: a waiter that
    keeps losing looks less often, and one waking after a quiet spell looks at once."""
    if fruitless <= 0:
        return 0.0
    return min(LOOK_BACKOFF_MAX, LOOK_BACKOFF_FIRST * 2 ** min(fruitless - 1, 30))


def nap_for(nap: float, deadline: float | None, now: float) -> float | None:
    """How long to sleep before the next round: `nap`, cut short by the deadline; None once the
    deadline has passed (pure; monotonic times)."""
    if deadline is None:
        return nap
    remaining = deadline - now
    if remaining <= 0:
        return None
    return min(nap, remaining)


def wait_for_work(waker: Wakeable, *, look_after: Callable[[], None], claim: Callable[[], TaskDoc | None],
                  nap: Callable[[], float], timeout: float | None, stop: threading.Event | None,
                  tolerate: Callable[[BoardError], bool] = lambda exc: False) -> TaskDoc | None:
    """Claim a task, waiting for one; None on timeout or when `stop` is set.

    Each round runs `look_after` (ingest drops, recover dead claims: a board needs no other process
    to make progress) and `claim`; a BoardError that `tolerate` accepts (a connection lost, which the
    next round makes again) counts as nothing claimed. Between rounds it sleeps on `waker` for at
    most `nap()` seconds. The generation is read before the round, so a change made during it ends
    the sleep at once instead of being missed.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    fruitless = 0
    while True:
        seen = waker.generation
        if stop is not None and stop.is_set():
            return None
        try:
            look_after()
            if stop is not None and stop.is_set():
                return None
            doc = claim()
        except BoardError as exc:
            if not tolerate(exc):
                raise
            doc = None
        if doc is not None:
            return doc
        if stop is not None and stop.is_set():
            return None
        wait = nap_for(nap(), deadline, time.monotonic())
        if wait is None:
            return None
        waker.wait(seen, wait)
        if waker.generation == seen:  # a quiet spell: the next change is looked at at once
            fruitless = 0
            continue
        fruitless += 1
        delay = nap_for(look_delay(fruitless), deadline, time.monotonic())
        if delay:
            if stop is not None:
                stop.wait(delay)
            else:
                time.sleep(delay)
