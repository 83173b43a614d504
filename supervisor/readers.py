"""The event readers of this process (the alert sender, the ingest warnings, the dashboard's event
streams), and how far behind the log each is: told here by each reader, read by /metrics at a scrape
(dashboard/metrics.py)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import Any

Position = Callable[[], tuple[int, int | None] | None]  # (cursor, the log's inode it read), None while not reading

# A reader's name is a label value of hermes_sup_events_behind: one of these, so the labels are
# bounded whatever a process runs. Readers of one kind that come and go (a stream per browser) share
# their name: the scrape reports the one furthest behind.
READERS = ("alerts", "ingest-warnings", "dashboard-streams")
BEHIND_MAX = 10_000  # events counted behind a reader at most: a scrape reads no more of the log (per inode)
MAX_TRACKED = 4096  # positions tracked at most (streams are few; a leak must not grow a scrape without end)

_readers: dict[str, dict[int, Position]] = {}
_lock = threading.Lock()  # streams join and leave on the dashboard's event loop, a scrape reads on a thread
_ids = itertools.count()


def track_reader(name: str, position: Position) -> Callable[[], None]:
    """Report `position` as one reader named `name` (one of READERS); returns the call that stops it."""
    if name not in READERS:
        raise ValueError(f"unknown event reader {name!r}: a label of hermes_sup_events_behind is one of {READERS}")
    key = next(_ids)
    with _lock:
        if sum(map(len, _readers.values())) < MAX_TRACKED:
            _readers.setdefault(name, {})[key] = position

    def untrack() -> None:
        with _lock:
            _readers.get(name, {}).pop(key, None)

    return untrack


def furthest(positions: list[tuple[int, int | None]]) -> list[tuple[int, int | None]]:
    """Of readers' positions, the one furthest behind on each log they read (pure): the least cursor
    per inode, so a scrape reads the log once per inode, not once per reader."""
    least: dict[int | None, int] = {}
    for cursor, inode in positions:
        least[inode] = min(cursor, least.get(inode, cursor))
    return [(cursor, inode) for inode, cursor in least.items()]


def readers_behind(board: Any) -> dict[str, int]:
    """How many events each reader of this process has yet to read (at most BEHIND_MAX), by name: for
    several readers of a name, the one furthest behind; a name none of whose readers reads is left out."""
    with _lock:
        tracked = {name: list(group.values()) for name, group in _readers.items()}
    behind = {}
    for name, group in tracked.items():
        positions = [where for where in (position() for position in group) if where is not None]
        counts = []
        for cursor, inode in furthest(positions):
            try:
                counts.append(len(board.events_since(cursor, max_events=BEHIND_MAX, inode=inode).events))
            except Exception:  # a log being rotated, a database away: that reader is left out of this scrape
                continue
        if counts:
            behind[name] = max(counts)
    return behind
