"""The board-alone peers' claimer processes: forked, released together, and all stopped however it ends.

Forked from the bench, which has already imported the board, not started as fresh interpreters:
256 interpreters importing the board and psycopg take over a minute of a 2-core machine, which
once ran out a fixed start deadline, and the bench then left 165 claimers polling for a signal that
never came. Here the wait for readiness follows progress, a claimer dies with the bench
(PR_SET_PDEATHSIG), and every claimer still running when the measurement ends, however it ends, is
killed and reaped.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import queue
import signal
import time
from collections.abc import Callable, Sequence
from typing import Any

PR_SET_PDEATHSIG = 1
# How long the claimers may go without one more of them becoming ready, and how long the work may
# go without one more of them finishing, before the measurement is given up.
STALL_SECONDS = 60.0

# prepare(*args) runs in the claimer before the clock starts (open the board, connect) and returns
# the work, run at the go; what the work returns is the claimer's result.
Prepare = Callable[..., Callable[[], Any]]


def run(prepare: Prepare, args: Sequence[tuple[Any, ...]], stall: float = STALL_SECONDS) -> tuple[float, list[Any]]:
    """Fork one claimer per entry of `args`, wait until every one is prepared, release them at once
    and wait for them all: (the seconds from the release to the last result, the results). Raises
    RuntimeError if a claimer fails or the claimers stop making progress for `stall` seconds."""
    ctx = multiprocessing.get_context("fork")
    ready: Any = ctx.Queue()
    results: Any = ctx.Queue()
    go = ctx.Event()
    parent = os.getpid()
    children = [ctx.Process(target=_child, args=(parent, prepare, each, ready, go, results), daemon=True)
                for each in args]
    try:
        for child in children:
            child.start()
        _gather(ready, children, len(children), stall, "prepared")
        start = time.perf_counter()
        go.set()
        out = _gather(results, children, len(children), stall, "finished")
        elapsed = time.perf_counter() - start
        for child in children:
            child.join(timeout=stall)
        return elapsed, out
    finally:
        for child in children:
            if child.is_alive():
                child.kill()
            child.join(timeout=10)


def _gather(source: Any, children: list[Any], count: int, stall: float, what: str) -> list[Any]:
    """`count` messages from `source`, each within `stall` seconds of the last; a claimer's failure
    (a message ("error", text)) or its death without a message ends the wait at once."""
    got: list[Any] = []
    last = time.monotonic()
    while len(got) < count:
        try:
            kind, value = source.get(timeout=0.5)
        except queue.Empty:
            dead = [c for c in children if c.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"{len(dead)} claimer(s) died (exit {dead[0].exitcode}) with {len(got)} of "
                                   f"{count} {what}") from None
            if time.monotonic() - last > stall:
                raise RuntimeError(f"only {len(got)} of {count} claimers {what} after {stall:.0f} s "
                                   "without progress") from None
            continue
        if kind == "error":
            raise RuntimeError(f"a claimer failed: {value}")
        got.append(value)
        last = time.monotonic()
    return got


def _child(parent: int, prepare: Prepare, args: tuple[Any, ...], ready: Any, go: Any, results: Any) -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the bench died before the line above took effect
        os._exit(1)
    try:
        work = prepare(*args)
        ready.put(("ready", os.getpid()))
        go.wait()
        results.put(("done", work()))
    except Exception as exc:  # reported to the bench, which stops the others and says why
        results.put(("error", f"{type(exc).__name__}: {exc}"))
        ready.put(("error", f"{type(exc).__name__}: {exc}"))
        raise
