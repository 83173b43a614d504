"""Wake-ups for claimers: one LISTEN connection per store, reconnected when it drops, listening while a claimer waits.

A notification only shortens a wait; claimers also poll (jittered, about once a second), so a lost
notification, a dropped connection or a pooler that forwards none never strands a task.
"""

from __future__ import annotations

import contextlib
import os
import random
import select
import threading
from collections.abc import Callable
from typing import Any

from psycopg import pq

from ..watch import ChangeSignal

CHANNEL = "hermes_sup_work"
RECONNECT_DELAY = (0.2, 2.0)
# How long a resuming waiter waits for its LISTEN to be in place before it looks anyway (the
# connection is down, say: its polls still find the work).
RESUME_WAIT = 2.0


class Listener:
    """A thread holding one LISTEN connection; `generation` grows with every notification.

    `pause` has it UNLISTEN (a claimer at work, or one whose turn to watch has not come: with 16
    agents, each listening connection and its thread woke for every task's notification) and
    `resume` LISTEN again, returning once the LISTEN is in place so that the look that follows
    misses nothing. Only the thread touches the connection."""

    def __init__(self, connect: Callable[[], Any], channel: str, *, signal: ChangeSignal | None = None) -> None:
        self._connect = connect
        self._signal = signal  # the store's, bumped too: its waiters wake with the claimers
        self.channel = channel
        self._cond = threading.Condition()
        self.generation = 0
        self.connects = 0
        self.backend_pid: int | None = None
        self.last_error: str | None = None
        self.listening = False  # as the server has it, set by the thread
        self._sending = True  # what the thread's last (or current) LISTEN/UNLISTEN asks for
        self._wanted = True
        self._stop = threading.Event()
        self._conn: Any = None
        self._ready = threading.Event()
        self._wake = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
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

    def pause(self) -> None:
        """Stop listening (soon: the thread's next turn); notifications meanwhile wake no one."""
        with self._cond:
            if not self._wanted:
                return
            self._wanted = False
        self._poke()

    def resume(self) -> None:
        """Listen again, returning once the server has the LISTEN (or after RESUME_WAIT)."""
        with self._cond:
            self._wanted = True
            if self._settled():
                return
        self._poke()
        with self._cond:
            self._cond.wait_for(lambda: self._settled() or self._stop.is_set(), RESUME_WAIT)

    def _settled(self) -> bool:
        # Listening, and no UNLISTEN under way: one sent just before a resume would end it.
        return self.listening and self._sending

    def _poke(self) -> None:
        with contextlib.suppress(OSError):
            os.eventfd_write(self._wake, 1)

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
                self.backend_pid = conn.info.backend_pid
                self.connects += 1
                delay = RECONNECT_DELAY[0]
                self._serve(conn)
            except Exception as exc:  # the connection died (terminated, server restarted): reconnect
                self.last_error = type(exc).__name__
            finally:
                self._conn = None
                with self._cond:
                    self.listening = False
                with contextlib.suppress(Exception):
                    conn.close()
            self.bump()
            self._stop.wait(RECONNECT_DELAY[0] * random.uniform(0.5, 1.5))  # never a tight loop

    def _serve(self, conn: Any) -> None:
        first = True
        # Notifications that come while a LISTEN or UNLISTEN is sent are psycopg's to hand over:
        # without a handler it would keep them all, for a notifies() never called.
        conn.add_notify_handler(lambda _note: self.bump() if self.listening else None)
        # poll, not select: a process with over 1,024 descriptors open is no reason to fail.
        poller = select.poll()
        poller.register(conn.fileno(), select.POLLIN)
        poller.register(self._wake, select.POLLIN)
        while not self._stop.is_set():
            with self._cond:
                wanted = self._wanted
                changing = wanted != self.listening
                if changing:
                    self._sending = wanted
            if changing:
                conn.execute(f'{"LISTEN" if wanted else "UNLISTEN"} "{self.channel}"')
                with self._cond:
                    self.listening = wanted
                    self._cond.notify_all()
                if wanted and first:
                    first = False
                    self._ready.set()
                    self.bump()  # work may have been added while no connection listened
                continue  # a pause or resume asked for meanwhile is applied before it sleeps
            for fd, _event in poller.poll(None):
                if fd == self._wake:
                    with contextlib.suppress(OSError):
                        os.eventfd_read(self._wake)
                elif not self._notified(conn):
                    raise ConnectionError("the listening connection was closed")

    def _notified(self, conn: Any) -> bool:
        """Take what the server sent; bump for notifications. False once the connection is gone."""
        pgconn = conn.pgconn
        pgconn.consume_input()  # raises once the server has gone
        got = False
        while pgconn.notifies() is not None:
            got = True
        if got and self.listening:
            self.bump()
        return pgconn.status == pq.ConnStatus.OK

    def close(self) -> None:
        self._stop.set()
        self._poke()
        self.bump()
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            with contextlib.suppress(OSError):
                os.close(self._wake)
