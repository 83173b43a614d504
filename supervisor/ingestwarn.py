"""The supervisor's warning, at once, about a dropped task no agent of its team could ever claim.

Agents ingest the drops while the team runs, so the supervisor learns of a new task from the board's
events: a thread tails events.jsonl (a stat every POLL seconds, the new lines only), reads each task
ingested since, judges it with kanban/why.py against the team the supervisor runs, and hands its
lines back through a pipe the event loop watches (as boardwork.py does: the loop never waits for a
board read). Anyone who can write the log can write a line there: only the task read from the board
is judged.
"""

from __future__ import annotations

import contextlib
from typing import Any

from hermes_sup.kanban import Board, BoardError
from hermes_sup.kanban.events import EventTail
from hermes_sup.kanban.task import STATUSES, is_valid_id
from hermes_sup.kanban.why import Member, Team, claim_warnings

from .loopthread import LoopThread

POLL = 0.5  # seconds between looks at events.jsonl's size


def ingested(records: list[dict[str, Any]]) -> list[str]:
    """The ids of the tasks the records say were ingested from the drop zone (pure)."""
    return [str(record["task"]) for record in records
            if record.get("by") == "ingest" and record.get("from") == "inbox" and record.get("to") in STATUSES
            and is_valid_id(record.get("task"))]


def team_of(specs: Any) -> Team:
    """The team of the supervisor's child specs, as judged for claimability (names and roles)."""
    return Team(members=tuple(Member(name=spec.name, roles=spec.roles, tier=spec.tier) for spec in specs))


class IngestWarnings(LoopThread):
    name = "ingest-warnings"

    def __init__(self, board: Board, team: Team, *, poll: float = POLL) -> None:
        super().__init__()
        self.board = board
        self.team = team  # replaced whole (one assignment) by the loop after a reload
        self.poll = poll
        self._tail = EventTail(board.events_path)
        self._tail.seek_end()  # what was ingested before this supervisor started was judged then
        self._size = self._tail.offset
        self.start()

    def _grew(self) -> bool:
        try:
            size = self.board.events_path.stat().st_size
        except OSError:
            return False
        grew, self._size = size != self._size, size
        return grew

    def _run(self) -> None:
        while not self._stopping.wait(self.poll):
            if not self._grew():
                continue
            try:
                self.check(ingested(self._tail.read_new()))
            except Exception as exc:  # a board read failing is no reason to stop warning later
                self._post(f"board: could not check the tasks just ingested ({type(exc).__name__}: {exc})")

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
