"""The shared task board: a protocol (`store`), a factory (`backends`), pure rules (`rules`) and the file backend.

Callers outside the package open a board with `backends.open_board` and use the `BoardStore` verbs;
the README's "Architecture" section names every module in one line. Imports only the standard
library, watchdog, psutil and pyyaml; never `supervisor` or `agents`.
"""

from .board import Board
from .errors import BoardError, ClaimLost, InvalidTransition, TaskNotFound
from .ingest import IngestReport
from .store import BoardStore
from .task import STATUSES, TaskError

__all__ = [
    "STATUSES",
    "Board",
    "BoardError",
    "BoardStore",
    "ClaimLost",
    "IngestReport",
    "InvalidTransition",
    "TaskError",
    "TaskNotFound",
]
