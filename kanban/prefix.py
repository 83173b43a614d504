"""Naming a task by a unique prefix of its id, with "did you mean" for a typo and the candidates of an
ambiguous prefix (`resolve_id` is pure; `resolve_task_id` looks at a board's folders)."""

from __future__ import annotations

import contextlib
import difflib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import TaskNotFound
from .task import STATUSES, is_valid_id

if TYPE_CHECKING:
    from .board import Board

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
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    raise UnknownTaskId(f"no task '{_shown(text)}' on {where}{hint}", close)


def task_ids(root: Path) -> set[str]:
    """The ids of the task files in a board's status folders (names only: nothing is read)."""
    found: set[str] = set()
    for status in STATUSES:
        with contextlib.suppress(FileNotFoundError, NotADirectoryError), os.scandir(root / status) as entries:
            for entry in entries:
                stem = entry.name[:-5] if entry.name.endswith(".json") else ""
                if is_valid_id(stem):
                    found.add(stem)
    return found


def resolve_task_id(board: Board, text: str) -> str:
    """The id of the task `text` names on `board` (see resolve_id)."""
    if is_valid_id(text):
        with contextlib.suppress(TaskNotFound):
            return str(board.get(text)["id"])  # the exact id; get's locked retry sees a task mid-move
    where = f"the board {board.root}"
    try:
        return resolve_id(task_ids(board.root), text, where)
    except UnknownTaskId as exc:
        if exc.ambiguous:
            raise  # no move makes it less so
    # A task moving between two folders is, for an instant, in neither as a lock-free scan visits
    # them in turn; every move is made under the board's lock, so a scan holding it sees them all.
    with board._locked():
        return resolve_id(task_ids(board.root), text, where)
