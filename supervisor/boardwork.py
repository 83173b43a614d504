"""The supervisor's board work (giving dead agents' claims back, and ingesting the drops for its
agents) on threads of their own.

The board lock can be held by any process of the user (a `board` command paused with Ctrl-Z, a
stalled disk), and the event loop must never wait for it: an agent's exit would go unhandled while
it waits. So the loop only asks for a recovery; this thread takes the lock when it can, retries
while it cannot, and hands its messages back through a pipe the loop watches.

Drops are ingested here as they arrive, whether agents run or not: the supervisor's agents leave
them to it (kanban/store.py, wait_for_work's `ingest`). An agent that ingested a burst of drops
worked no task meanwhile, and 2,000 drops kept one of two agents at it for two seconds.
"""

from __future__ import annotations

import threading
import time

from ..kanban import BoardStore
from .loopthread import LoopThread

RETRY_EVERY = 2.0  # seconds between attempts while the board cannot be changed
# Seconds between looks at inbox/ when no event says a drop arrived: a file written in place by a
# process this one cannot see is taken once it has been quiet (kanban/drops.py), and events can be lost.
LOOK_EVERY = 2.0


class BoardWork(LoopThread):
    name = "board-work"

    def __init__(self, board: BoardStore, *, retry_every: float = RETRY_EVERY) -> None:
        super().__init__()
        self.board = board
        self.retry_every = retry_every
        self._wanted = threading.Event()
        self._recover = threading.Event()
        self._failing = False
        self._drops = threading.Thread(target=self._ingest_drops, name="drop-ingest", daemon=True)
        self.start()

    def start(self) -> None:
        super().start()
        self._drops.start()

    def stop(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        stopped = super().stop(timeout)
        self._drops.join(max(0.0, deadline - time.monotonic()))
        return stopped and not self._drops.is_alive()

    def recover(self) -> None:
        """Ask for a recovery of dead claims (requests made before it runs are merged into one)."""
        self._recover.set()
        self._wanted.set()

    def _wake_thread(self) -> None:
        self._wanted.set()
        self.board.wake()  # ends wait_for_drops

    def _ingest_drops(self) -> None:
        failing = False
        while not self._stopping.is_set():
            try:
                self.board.wait_for_drops(LOOK_EVERY)
                if self._stopping.is_set():
                    return
                self.board.ingest()
            except Exception as exc:  # a BoardError, a full disk, the ingest turn held too long: retried
                if not failing:
                    self._post(f"board: cannot ingest drops now ({type(exc).__name__}: {exc}); "
                               f"retrying every {self.retry_every:g} s")
                failing = True
                self._stopping.wait(self.retry_every)
                continue
            if failing:
                failing = False
                self._post("board: ingesting drops works again")

    def _run(self) -> None:
        while True:
            self._wanted.wait()
            if self._stopping.is_set():
                return
            self._wanted.clear()
            if not self._recover.is_set():
                continue
            self._recover.clear()
            try:
                recovered = self.board.recover()
            except Exception as exc:  # a BoardError, a full disk, a damaged file: retried
                if not self._failing:
                    self._failing = True
                    self._post(f"board: cannot recover claims now ({exc}); agents are still supervised, "
                               f"retrying every {self.retry_every:g} s")
                self._recover.set()
                self._wanted.set()
                self._stopping.wait(self.retry_every)
                continue
            if self._failing:
                self._failing = False
                self._post("board: recovering claims works again")
            for item in recovered:
                self._post(f"board: {item['task']} back to {item['to']} ({item['reason']})")
