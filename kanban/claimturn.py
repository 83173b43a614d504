"""A claimer's wait for work on the file board: its look, its watch, and its turn among the waiters."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from . import waiting
from .waitloop import recover_due
from .waitloop import wait_for_work as wait_loop
from .watchslots import wait_in_turn

if TYPE_CHECKING:
    from .base import TaskDoc
    from .board import Board


def wait_for_work(board: Board, agent: str, *, roles: Iterable[str], timeout: float | None, lease: float | None,
                  stop: threading.Event | None, steps_only: bool, assigned_only: bool,
                  ingest: bool) -> TaskDoc | None:
    """Board.wait_for_work (see the protocol, kanban/store.py)."""
    waiting.start_watching(board.disk, claims_only=True, inbox=ingest)

    def ingest_only() -> None:
        if ingest:
            board.ingest(wait=False)  # while another process ingests, it takes the drops

    def look_after() -> None:
        ingest_only()
        now = time.monotonic()
        if recover_due(board.last_recover, now):
            board.recover(sweep=recover_due(board.txn.last_sweep, now, waiting.SWEEP_INTERVAL))

    def claim() -> TaskDoc | None:
        return board.claim(agent, roles=roles, lease=lease, steps_only=steps_only, assigned_only=assigned_only)

    def watching(left: float | None) -> TaskDoc | None:
        board.disk.watcher.resume()  # asks for a rescan too: what was moved in by hand woke no one
        return wait_loop(board.signal, look_after=look_after, claim=claim, nap=lambda: waiting.nap(board.disk),
                         timeout=left, stop=stop)

    def once(after: Callable[[], None], take: Callable[[], TaskDoc | None]) -> TaskDoc | None:
        return wait_loop(board.signal, look_after=after, claim=take, nap=lambda: 0.0, timeout=0.0, stop=stop)

    def looking() -> TaskDoc | None:
        # Without a slot, dead claims and rescans are left to the waiters that hold one: 256 agents
        # each recovering and rescanning every 2 s took the board lock over a hundred times a second.
        return once(ingest_only, lambda: board.claims.claim(agent, roles=roles, lease=lease, steps_only=steps_only,
                                                            assigned_only=assigned_only, lock_free=True))

    def eager() -> TaskDoc | None:
        # A busy claimer's look, as a watcher's round after its watch resumed: the rescan that finds
        # tasks moved or edited by hand is asked for as resume() asks for it (rescans keep their share).
        board.signal.full_rescan_due = True
        return once(look_after, claim)

    doc = wait_in_turn(board.slots, watching=watching, looking=looking, unwatched=board.disk.watcher.pause,
                       timeout=timeout, stop=stop, eager=eager)
    if doc is not None:  # busy until it waits again: arrivals need not wake it (kanban/watch.py)
        board.disk.watcher.pause()
    return doc
