"""The supervisor's word, at once, on a drop rejected and on a dropped task no agent could ever claim.

Drops are ingested by another thread (boardwork.py), and tasks are added by the CLI and by agents, so
the supervisor learns of a new task from the board's events: a thread tails events.jsonl (woken by
each append where the board can watch its log, else a look every POLL seconds; the new lines only),
reads each task ingested since that its event does not show claimable (`to_judge`), judges it
with kanban/why.py against the team the supervisor runs, and hands its lines back through a pipe
the event loop watches (as boardwork.py does: the loop never waits for a board read). Anyone who
can write the log can write a line there: only the task read from the board is judged.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from pathlib import Path
from typing import Any

from ..kanban import BoardError, BoardStore
from ..kanban.index import carried_meta
from ..kanban.task import STATUSES, is_valid_id
from ..kanban.why import Member, Team, claim_warnings, structural
from .loopthread import LoopThread
from .readers import track_reader

POLL = 0.5  # seconds between looks at events.jsonl's size where the board cannot watch it
# Where it can, the log is read when an append wakes the thread, and this rarely besides: a wake-up
# missed (inotify's queue overflowed) delays a warning, never loses it; an idle team wakes nobody.
RECHECK_WATCHED = 30.0
NAME_CHARS, REASON_CHARS = 120, 300


def ingested(records: list[dict[str, Any]]) -> list[str]:
    """The ids of the tasks the records say were ingested from the drop zone (pure)."""
    return [str(record["task"]) for record in records
            if record.get("by") == "ingest" and record.get("from") == "inbox" and record.get("to") in STATUSES
            and is_valid_id(record.get("task"))]


def to_judge(records: list[dict[str, Any]], team: Team | None) -> list[str]:
    """The ids of the tasks ingested (`ingested`) whose events leave a warning possible (pure).
    Each event carries its task's role, assignee and dependencies (kanban/index.py, `carried`):
    one with none of the latter two, and a role some agent has, is claimable by this team as
    ingested, and its task is not read (in a drain, each drop's task was looked for across the
    status folders, opened and parsed once more). Any other, or an event without a well-formed
    carry, is read and judged from the board: an event may be written by anyone who can write
    the log, so one can spare a read here, never make a warning."""
    chosen = []
    for record in records:
        if not ingested([record]):
            continue
        task_id = str(record["task"])
        meta = carried_meta(record, task_id)
        if meta is None or team is None or meta["assignee"] is not None or meta["depends_on"] \
                or structural({"id": task_id, "role": meta["role"]}, {}, team) is not None:
            chosen.append(task_id)
    return chosen


def rejections(records: list[dict[str, Any]]) -> list[str]:
    """A line for each drop or task file the records say was set aside in rejected/, with its reason,
    cut short: anyone who can write the log can write a record (pure)."""
    return [f"rejected {str(record['task'])[:NAME_CHARS]}: "
            f"{str(record.get('note') or 'no reason given')[:REASON_CHARS]}"
            for record in records if record.get("to") == "rejected" and isinstance(record.get("task"), str)]


def team_of(specs: Any) -> Team:
    """The team of the supervisor's child specs, as judged for claimability (names and roles)."""
    return Team(members=tuple(Member(name=spec.name, roles=spec.roles, tier=spec.tier) for spec in specs))


class IngestWarnings(LoopThread):
    name = "ingest-warnings"

    def __init__(self, board: BoardStore, team: Team, *, poll: float = POLL) -> None:
        super().__init__()
        self.board = board
        self.team = team  # replaced whole (one assignment) by the loop after a reload
        self.poll = poll
        self._cursor = board.events_end()  # what was ingested before this supervisor started was judged then
        self._inode: int | None = None
        self._untrack = track_reader("ingest-warnings",  # /metrics: how far behind the log it is
                                     lambda: (self._cursor, self._inode) if self._thread.is_alive() else None)
        self.start()

    def _run(self) -> None:
        try:
            self._follow()
        finally:
            self._untrack()

    def _wake_thread(self) -> None:
        self.board.wake()  # it may be waiting on the board's signal

    def _follow(self) -> None:
        stop_watching = self.board.watch_events()
        try:
            self._read_on(self.poll if stop_watching is None else RECHECK_WATCHED)
        finally:
            if stop_watching is not None:
                stop_watching()

    def _read_on(self, recheck: float) -> None:
        signal = self.board.signal
        while not self._stopping.is_set():
            seen = signal.generation
            try:
                batch = self.board.events_since(self._cursor, inode=self._inode)
                self._cursor, self._inode = batch.cursor, batch.inode
                records = [record for _end, record in batch.events]
                for line in rejections(records):  # said at once: the drop is gone from inbox/
                    self._post(line)
                self.check(to_judge(records, self.team))
            except Exception as exc:  # a board read failing is no reason to stop warning later
                self._post(f"board: could not check the tasks just ingested ({type(exc).__name__}: {exc})")
            # An append made while the log was read has bumped the generation: no wait then.
            signal.wait(seen, recheck)

    def check(self, task_ids: list[str]) -> None:
        team = self.team
        for task_id in task_ids:
            try:
                doc = self.board.get(task_id)
            except BoardError:
                continue  # gone already (claimed and done, cancelled): nothing to warn about
            statuses = {}
            for dep in doc.get("depends_on") or ():
                with contextlib.suppress(BoardError):
                    statuses[dep] = self.board.get(dep)["status"]
            for line in claim_warnings(doc, statuses, team):
                self._post(f"ingest: warning: {line}")


ERROR_SUFFIX = ".error.txt"  # the board's note beside each file it set aside (kanban/board.py)
NOTE_BYTES = 1024


def recent_rejections(folder: Path, count: int = 5) -> tuple[list[dict[str, str]], int]:
    """The newest `count` notes in rejected/ (name, first line, and when it was written, newest first)
    and how many there are. A planted FIFO or device named *.error.txt is passed over without being read."""
    found = []
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for entry in entries:
            if entry.name.endswith(ERROR_SUFFIX):
                with contextlib.suppress(OSError):
                    info = entry.stat(follow_symlinks=False)
                    if stat.S_ISREG(info.st_mode):
                        found.append((info.st_mtime, entry.name))
    found.sort(reverse=True)
    notes = []
    for mtime, name in found[:count]:
        try:
            fd = os.open(folder / name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as handle:
                text = handle.read(NOTE_BYTES).decode("utf-8", "replace")
        except OSError:
            continue
        notes.append({"file": name[: -len(ERROR_SUFFIX)], "note": (text.splitlines() or [""])[0][:REASON_CHARS],
                      "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(mtime))})
    return notes, len(found)
