"""The event readers of this process (the supervisor's alert sender), and how far behind the log each is:
told here by each reader, read by /metrics at a scrape (dashboard/metrics.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# The event readers of this process (the supervisor's alert sender), by name: each one's cursor and
# the log's inode it read (None while it is not reading). Told here by the reader, read at a scrape.
_readers: dict[str, Callable[[], tuple[int, int | None] | None]] = {}
BEHIND_MAX = 10_000  # events counted behind a reader at most: a scrape reads no more of the log


def track_reader(name: str, position: Callable[[], tuple[int, int | None] | None]) -> None:
    _readers[name] = position


def readers_behind(board: Any) -> dict[str, int]:
    """How many events each reader of this process has yet to read (at most BEHIND_MAX)."""
    behind = {}
    for name, position in list(_readers.items()):
        where = position()
        if where is None:
            continue
        try:
            behind[name] = len(board.events_since(where[0], max_events=BEHIND_MAX, inode=where[1]).events)
        except Exception:  # a log being rotated, a database away: that reader is left out of this scrape
            continue
    return behind
