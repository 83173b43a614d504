"""The shared task board: task documents as JSON files in status folders, one lock, a watcher.

Modules: `task` (schema, validation, pure transitions), `parse` (dropped files to fields),
`drops` (drop zones and when a file is finished), `index` (in-process claim index),
`events` (events.jsonl), `fsio` (atomic writes), `lock` (the board's flock), `liveness` (is a
claim's holder alive), `fsinfo` (filesystem type, inotify limits), `watch` (watchdog wake-ups),
`store` (the protocol a board backend implements), `board` (the filesystem backend).

Imports only the standard library, watchdog, psutil and pyyaml; never `supervisor`
or `agents`.
"""

from .board import Board, BoardError, ClaimLost, IngestReport, InvalidTransition, TaskNotFound
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
