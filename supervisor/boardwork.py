"""The supervisor's board work (giving dead agents' claims back, and ingesting drops while no agent
runs to) on a thread of its own.

The board lock can be held by any process of the user (a `board` command paused with Ctrl-Z, a
stalled disk), and the event loop must never wait for it: an agent's exit would go unhandled while
it waits. So the loop only asks for a recovery; this thread takes the lock when it can, retries
while it cannot, and hands its messages back through a pipe the loop watches.
"""

from __future__ import annotations

import contextlib
import threading

from ..kanban import BoardStore
from .loopthread import LoopThread

RETRY_EVERY = 2.0  # seconds between attempts while the board cannot be changed


class BoardWork(LoopThread):
    name = "board-work"

    def __init__(self, board: BoardStore, *, retry_every: float = RETRY_EVERY) -> None:
        super().__init__()
        self.board = board
        self.retry_every = retry_every
        self._wanted = threading.Event()
        self._recover = threading.Event()
        self._ingest = threading.Event()
        self._failing = False
        self.start()

    def recover(self) -> None:
        """Ask for a recovery of dead claims (requests made before it runs are merged into one)."""
        self._recover.set()
        self._wanted.set()

    def ingest(self) -> None:
        """Ask for the drops in inbox/ to be made tasks: agents ingest them while they wait for work;
        with none running (all stopped by hand, fatal, or still queued to start), the supervisor does."""
        self._ingest.set()
        self._wanted.set()

    def _wake_thread(self) -> None:
        self._wanted.set()

    def _run(self) -> None:
        while True:
            self._wanted.wait()
            if self._stopping.is_set():
                return
            self._wanted.clear()
            if self._ingest.is_set():
                self._ingest.clear()
                with contextlib.suppress(Exception):  # a board that cannot ingest now: asked again soon
                    self.board.ingest()
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
