"""Wake-ups for claimers: one dedicated LISTEN connection per store, reconnected when it drops.

A notification only shortens a wait; claimers also poll (jittered, about once a second), so a lost
notification, a dropped connection or a pooler that forwards none never strands a task.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Callable
from typing import Any

from ..watch import ChangeSignal

CHANNEL = "hermes_sup_work"
RECONNECT_DELAY = (0.2, 2.0)


class Listener:
    """A thread holding one LISTEN connection; `generation` grows with every notification."""

    def __init__(self, connect: Callable[[], Any], channel: str, *, signal: ChangeSignal | None = None) -> None:
        self._connect = connect
        self._signal = signal  # the store's, bumped too: its waiters wake with the claimers
        self.channel = channel
        self._cond = threading.Condition()
        self.generation = 0
        self.connects = 0
        self.backend_pid: int | None = None
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._conn: Any = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="board-listen", daemon=True)
        self._thread.start()

    def wait_ready(self, timeout: float) -> bool:
        """Whether the first LISTEN is in place (tests wait for it before they notify)."""
        return self._ready.wait(timeout)

    def bump(self) -> None:
        with self._cond:
            self.generation += 1
            self._cond.notify_all()
        if self._signal is not None:
            self._signal.bump()

    def wait(self, seen: int, timeout: float) -> None:
        """Sleep until a notification newer than `seen` or `timeout` seconds."""
        with self._cond:
            self._cond.wait_for(lambda: self.generation != seen or self._stop.is_set(), timeout)

    def _run(self) -> None:
        delay = RECONNECT_DELAY[0]
        while not self._stop.is_set():
            try:
                conn = self._connect()
            except Exception as exc:  # any failure to connect: retry, never die
                self.last_error = type(exc).__name__
                self._stop.wait(delay * random.uniform(0.5, 1.5))
                delay = min(delay * 2, RECONNECT_DELAY[1])
                continue
            self._conn = conn
            try:
                conn.execute(f'LISTEN "{self.channel}"')
                self.backend_pid = conn.info.backend_pid
                self.connects += 1
                delay = RECONNECT_DELAY[0]
                self._ready.set()
                # Work may have been added while no connection listened.
                self.bump()
                while not self._stop.is_set():
                    for _note in conn.notifies(timeout=1.0):
                        self.bump()
            except Exception as exc:  # the connection died (terminated, server restarted): reconnect
                self.last_error = type(exc).__name__
            finally:
                self._conn = None
                with contextlib.suppress(Exception):
                    conn.close()
            self.bump()

    def close(self) -> None:
        self._stop.set()
        self.bump()
        self._thread.join(timeout=5)
