"""The shared task board: a protocol (`store`), a factory (`backends`), pure rules (`rules`) and the file backend.

Callers outside the package open a board with `backends.open_board` and use the `BoardStore` verbs;
the README's "Architecture" section names every module in one line. Imports only the standard
library, psutil and pyyaml; never `supervisor` or `agents`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .board import Board
    from .errors import BoardError, ClaimLost, InvalidTransition, TaskNotFound
    from .ingest import IngestReport
    from .store import BoardStore
    from .task import STATUSES, TaskError

# Where each name lives: loaded on first use, so that importing one small module of the package (the
# key redactor, the errors) does not load the whole file board (a skill's call pays for every import).
_HOMES = {"STATUSES": "task", "Board": "board", "BoardError": "errors", "BoardStore": "store", "ClaimLost": "errors",
          "IngestReport": "ingest", "InvalidTransition": "errors", "TaskError": "task", "TaskNotFound": "errors"}
__all__ = ["STATUSES", "Board", "BoardError", "BoardStore", "ClaimLost", "IngestReport", "InvalidTransition",
           "TaskError", "TaskNotFound"]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
    globals()[name] = value
    return value
