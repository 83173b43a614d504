"""A thread that does slow work for the supervisor's event loop and hands it lines through a pipe.

The loop must never wait on the board (its lock may be held by any process of the user, a disk may
stall), so such work runs on a thread of its own; the loop watches `wake_fd` and drains the lines.
boardwork.py and ingestwarn.py are the two.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading


class LoopThread:
    """Subclasses implement `_run`, which returns once `_stopping` is set, and call `_post`."""

    name = "loop-thread"

    def __init__(self) -> None:
        self.messages: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.wake_fd, self._wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)

    def start(self) -> None:
        self._thread.start()

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
        self._wake_thread()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def close(self) -> None:
        """Close the wake-up pipe (after `stop` returned True and the last messages were drained)."""
        os.close(self.wake_fd)
        os.close(self._wake_write)

    def _wake_thread(self) -> None:
        """Wake `_run` from whatever it waits on, so that it sees `_stopping` (none by default)."""

    def _post(self, line: str) -> None:
        self.messages.put(line)
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_write, b"!")

    def _run(self) -> None:
        raise NotImplementedError
