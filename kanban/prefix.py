"""Naming a task by a unique prefix of its id, with "did you mean" for a typo and the candidates of an
ambiguous prefix (`resolve_id` is pure; `resolve_task_id` asks a board for its ids, through the protocol)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import TYPE_CHECKING

from .errors import TaskNotFound
from .task import is_valid_id

if TYPE_CHECKING:
    from .store import BoardStore

MAX_LISTED = 10        # candidates named in one message; the rest are counted
MAX_SUGGESTIONS = 3
SUGGEST_CUTOFF = 0.6   # difflib's similarity below which an id is no suggestion
MAX_SHOWN = 80         # characters of what was typed echoed back (it may be anything)
MAX_COMPARED = 200     # longer text is no typo of an id (at most 64 characters); not compared


class UnknownTaskId(TaskNotFound):
    """Text that names no task, or more than one; the message says which ids were meant."""

    def __init__(self, message: str, candidates: list[str], *, ambiguous: bool = False) -> None:
        super().__init__(message)
        self.candidates = candidates
        self.ambiguous = ambiguous


def _shown(text: str) -> str:
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN] + "..."


def _listed(ids: list[str]) -> str:
    more = len(ids) - MAX_LISTED
    return ", ".join(ids[:MAX_LISTED]) + (f" and {more} more" if more > 0 else "")


def resolve_id(ids: Iterable[str], text: str, where: str = "the board") -> str:
    """The id `text` names: itself, else the one id it is a prefix of. UnknownTaskId lists the ids
    an ambiguous prefix starts, or the ids close to a typo (difflib), or says there is none."""
    known = sorted(set(ids))
    if text in known:
        return text
    if not text:
        raise UnknownTaskId("a task id must not be empty", [])
    matches = [task_id for task_id in known if task_id.startswith(text)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise UnknownTaskId(f"'{_shown(text)}' is the start of {len(matches)} task ids: {_listed(matches)}; "
                            f"give more of it", matches, ambiguous=True)
    close = difflib.get_close_matches(text, known, n=MAX_SUGGESTIONS, cutoff=SUGGEST_CUTOFF) \
        if len(text) <= MAX_COMPARED else []
    raise UnknownTaskId(f"no task '{_shown(text)}' on {where}{_hint(close)}", close)


def _hint(close: list[str]) -> str:
    return f"; did you mean {' or '.join(close)}?" if close else ""


def resolve_task_id(board: BoardStore, text: str) -> str:
    """The id of the task `text` names on `board` (see resolve_id), among the ids the board itself
    keeps (its `task_ids` verb): whatever holds its tasks, never a folder that may hold others (a
    file board left behind by a migration to PostgreSQL)."""
    missing: TaskNotFound | None = None
    if is_valid_id(text):
        try:
            return str(board.get(text)["id"])  # the exact id, whatever longer ids it starts
        except TaskNotFound as exc:
            missing = exc
    try:
        return resolve_id(board.task_ids(), text)
    except UnknownTaskId as exc:
        if exc.ambiguous or missing is None:
            raise
        # The board's own words for a task it does not have (the file board names its folder).
        raise UnknownTaskId(f"{missing}{_hint(exc.candidates)}", exc.candidates) from None
