"""One ingester at a time per inbox: a waiting claimer tries and goes on; the one ingesting looks again at the end.

Every waiting agent woke for every drop and went to ingest it: on the file board each read the
drop and took the board lock to find it gone (16 agents: 16 reads and 16 lock holds a drop), on
a PostgreSQL board each listed the inbox and looked for the drops' writers in /proc. The turn is an
flock on `<root>/.ingest.lock`; a drop that arrives while one process ingests is taken by that
one, which looks at the inbox again once it let go (the others, woken for it, found the lock
taken). Both backends' ingest run their pass through `SoleIngester.run`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from . import drops
from .lock import BoardLock, LockTimeout
from .watch import INGEST_LOCK

MAX_ROUNDS = 10  # passes of one ingest while drops keep coming in as it works


class SoleIngester:
    """The ingest turn of the inbox under `root` (a board's folder, or a host's drop folder)."""

    def __init__(self, root: Path, timeout: float) -> None:
        self.root = root
        self.lock = BoardLock(root / INGEST_LOCK, timeout)
        self._thread_lock = threading.Lock()  # flock is per open file: threads of one process need this too

    def run(self, one_pass: Callable[[], set[str]], *, wait: bool) -> None:
        """Run `one_pass` (it ingests what is ready and returns the names in inbox/ it looked at)
        holding the turn; with `wait=False` do nothing while another process holds it."""
        for _round in range(MAX_ROUNDS):
            if not self._thread_lock.acquire(blocking=wait):
                return
            try:
                taken = self._take(wait)
                if taken is False:
                    return
                try:
                    seen = one_pass()
                finally:
                    if taken:
                        self.lock.release()
            finally:
                self._thread_lock.release()
            if not {drop.path.name for drop in drops.scan(self.root)} - seen:
                return

    def _take(self, wait: bool) -> bool | None:
        """True taken, False another process has it; None when it cannot be had at all (its file
        made a folder by hand, say): then the pass runs without it, as before there was a turn
        (each drop is still taken under the board's own guard)."""
        try:
            if wait:
                self.lock.acquire()
                return True
            return self.lock.try_acquire()
        except (LockTimeout, OSError):
            return None

    def close(self) -> None:
        self.lock.close()
