"""The supervisor's board work (giving dead agents' claims back) on a thread of its own.

The board lock can be held by any process of the user (a `board` command paused with Ctrl-Z, a
stalled disk), and the event loop must never wait for it: an agent's exit would go unhandled while
it waits. So the loop only asks for a recovery; this thread takes the lock when it can, retries
while it cannot, and hands its messages back through a pipe the loop watches.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading

from hermes_sup.kanban import Board

RETRY_EVERY = 2.0  # seconds between attempts while the board cannot be changed


class BoardWork:
    def __init__(self, board: Board, *, retry_every: float = RETRY_EVERY) -> None:
        self.board = board
        self.retry_every = retry_every
        self.messages: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.wake_fd, self._wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._wanted = threading.Event()
        self._stopping = threading.Event()
        self._failing = False
        self._thread = threading.Thread(target=self._run, name="board-work", daemon=True)
        self._thread.start()

    def recover(self) -> None:
        """Ask for a recovery of dead claims (requests made before it runs are merged into one)."""
        self._wanted.set()

    def drain(self) -> list[str]:
        """The messages posted since the last drain (called by the loop when wake_fd is readable)."""
        with contextlib.suppress(BlockingIOError):
            os.read(self.wake_fd, 4096)
        lines = []
        while True:
            try:
                lines.append(self.messages.get_nowait())
            except queue.Empty:
                return lines

    def stop(self, timeout: float) -> bool:
        """Stop the thread; False if it is still inside a board call after `timeout` seconds (the
        board must then stay open: closing it would pull the lock's descriptor from under it)."""
        self._stopping.set()
        self._wanted.set()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def close(self) -> None:
        """Close the wake-up pipe (after `stop` returned True and the last messages were drained)."""
        os.close(self.wake_fd)
        os.close(self._wake_write)

    def _post(self, line: str) -> None:
        self.messages.put(line)
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_write, b"!")

    def _run(self) -> None:
        while True:
            self._wanted.wait()
            if self._stopping.is_set():
                return
            self._wanted.clear()
            try:
                recovered = self.board.recover()
            except Exception as exc:  # a BoardError, a full disk, a damaged file: retried
                if not self._failing:
                    self._failing = True
                    self._post(f"board: cannot recover claims now ({exc}); agents are still supervised, "
                               f"retrying every {self.retry_every:g} s")
                self._wanted.set()
                self._stopping.wait(self.retry_every)
                continue
            if self._failing:
                self._failing = False
                self._post("board: recovering claims works again")
            for item in recovered:
                self._post(f"board: {item['task']} back to {item['to']} ({item['reason']})")
