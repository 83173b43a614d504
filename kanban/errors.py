"""The board's exceptions, in a module of their own so that every part of the board can raise them."""

from __future__ import annotations


class BoardError(Exception):
    """A board operation that cannot be done; the message says why."""

    # A database board's error carries the driver's SQLSTATE, and whether the server had ended the
    # connection before the statement ran (then the verb is run again: kanban/pg/retry.py).
    sqlstate: str | None = None
    ended_by_server: bool = False


class BoardLocked(BoardError):
    """The board lock stayed held by another process for the whole wait."""


class TaskNotFound(BoardError):
    pass


class ClaimLost(BoardError):
    """The caller's claim token no longer holds the task (its lease expired and it was reclaimed)."""


class InvalidTransition(BoardError):
    pass


class Damaged(BoardError):
    """A task file that cannot be read as a task document; it is moved aside, never guessed at."""
